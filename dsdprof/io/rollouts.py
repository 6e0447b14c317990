"""The rollout row file (``OUT/rollout.parquet``, :mod:`dsdprof.formats.rollouts`): written whole,
atomically, after every finished run (rows are few and small), and read back with its version
checked."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError
from dsdprof.formats.measurements import columns_schema
from dsdprof.formats.rollouts import ROLLOUT_COLUMN_NAMES, ROLLOUT_COLUMNS, ROLLOUT_FILE
from dsdprof.formats.versions import PARQUET_METADATA_KEY, READABLE_ROLLOUT_VERSIONS, ROLLOUT_SCHEMA_VERSION
from dsdprof.io.atomic import write_bytes_atomic
from dsdprof.io.store import file_metadata


def rollout_path(path: str | Path) -> Path:
    """The row file of a run directory, or the file itself."""
    p = Path(path)
    return p / ROLLOUT_FILE if p.is_dir() else p


def write_rollout_rows(path: str | Path, rows: Sequence[Mapping[str, Any]],
                       provenance: dict[str, Any]) -> Path:
    """Every row, one Parquet file, replaced atomically (metadata: version + the run's provenance)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    schema = columns_schema(ROLLOUT_COLUMNS).with_metadata(file_metadata(provenance, ROLLOUT_SCHEMA_VERSION))
    table = pa.Table.from_pylist([{c: r.get(c) for c in ROLLOUT_COLUMN_NAMES} for r in rows], schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    write_bytes_atomic(p, buf.getvalue())
    return p


def read_rollout_rows(path: str | Path, data: bytes | None = None):  # -> pandas.DataFrame
    """The rows of a rollout run (directory or file), read from disk once (``data``: the file's
    bytes when the caller has read them); one line (InputError) for anything else."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = rollout_path(path)
    if not p.is_file():
        raise InputError("rollout", str(path), f"no {ROLLOUT_FILE} here (run dsdprof rollout first)")
    try:
        data = p.read_bytes() if data is None else data
        meta_raw = (pq.read_schema(pa.BufferReader(data)).metadata or {}).get(PARQUET_METADATA_KEY)
        meta = json.loads(meta_raw) if meta_raw else {}
    except Exception as err:  # noqa: BLE001 - any unreadable file is one line
        raise InputError("rollout", str(p), f"not a readable Parquet file ({type(err).__name__})") from None
    version = meta.get("schema_version") if isinstance(meta, dict) else None
    if version not in READABLE_ROLLOUT_VERSIONS:
        raise InputError(
            "schema_version",
            version,
            f"{p} is not a rollout file this dsdprof reads ({', '.join(READABLE_ROLLOUT_VERSIONS)})",
        )
    return pq.read_table(pa.BufferReader(data)).to_pandas()
