"""Reading measurement files: Parquet rows and the provenance stored in their metadata.

The one reader behind ``analyze``, ``export``, ``plot``, ``compare``, the budgeted sweep and the
analytic engine's calibration: it refuses files of a measurement version this dsdprof cannot read,
runs that mix provenance (unless asked), and rows that break the input contract.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from dsdprof.config.run import check_mixed, mixed_provenance, validate_measurements
from dsdprof.errors import InputError
from dsdprof.formats.jsontypes import ProvenanceRecord
from dsdprof.formats.measurements import STATUS_OK
from dsdprof.formats.versions import PARQUET_METADATA_KEY, READABLE_MEASUREMENT_VERSIONS

if TYPE_CHECKING:
    import pyarrow as pa


def _parquet_files(path: Path) -> list[Path]:
    """Parquet files of a run directory (skipping ``_``/``.`` names and folders) or one file."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet")
                       if not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts))
        if not files:
            raise InputError("measurements", str(path), "directory holds no .parquet files")
        return files
    if path.is_file():
        return [path]
    raise InputError("measurements", str(path), "no such file or directory")


def _file_metadata(f: Path, source: pa.BufferReader | None = None) -> ProvenanceRecord | None:
    """The dsdprof key-value metadata of one Parquet file (None for files dsdprof did not write);
    ``source``: the file's bytes when the caller has read them."""
    import pyarrow.parquet as pq

    raw = (pq.read_schema(f if source is None else source).metadata or {}).get(PARQUET_METADATA_KEY)
    if not raw:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise InputError("measurements", str(f), "its dsdprof metadata is not a JSON object")
    version = meta.get("schema_version")
    if version not in READABLE_MEASUREMENT_VERSIONS:
        raise InputError("schema_version", version, f"{f} has a measurement schema this dsdprof cannot read "
                         f"(it reads {', '.join(READABLE_MEASUREMENT_VERSIONS)})")
    return meta


def read_provenance(path: str | Path) -> ProvenanceRecord:
    """Provenance stored in the first dsdprof Parquet file under ``path`` (empty if none)."""
    for f in _parquet_files(Path(path)):
        try:
            meta = _file_metadata(f)
        except Exception:  # noqa: BLE001 - unreadable file or metadata: no provenance from it
            continue
        if meta:
            return meta
    return {}


def read_measurements(path: str | Path, allow_mixed: bool = False) -> pd.DataFrame:
    """All rows of a sweep directory or Parquet file, unvalidated.

    Files written by dsdprof must carry a readable measurement schema version. Rows of different
    provenance (:data:`MIXABLE_PROVENANCE`, or schema versions) are refused unless ``allow_mixed``.
    """
    files = read_files(path)
    df = pd.concat([f.rows for f in files], ignore_index=True) if len(files) > 1 else files[0].rows
    if not allow_mixed:
        check_mixed(path, mixed_provenance(df, {str(f.meta["schema_version"]) for f in files if f.meta}))
    return df


@dataclass(frozen=True)
class PartFile:
    """One Parquet file of a run, read once: its path, dsdprof metadata (None: not written by
    dsdprof) and rows."""

    path: Path
    meta: ProvenanceRecord | None
    rows: pd.DataFrame


def read_files(path: str | Path, data: bytes | None = None) -> list[PartFile]:
    """Every Parquet file under ``path``, each read from disk once (metadata and rows from the
    same bytes; ``data``: the bytes of ``path``, a file the caller has read); refuses unreadable
    files, unreadable schema versions and cells stored twice."""
    import pyarrow as pa

    files = _parquet_files(Path(path))
    out = []
    for f in files:
        try:
            raw = data if data is not None and f == Path(path) else f.read_bytes()
            meta = _file_metadata(f, pa.BufferReader(raw))
            out.append(PartFile(f, meta, pd.read_parquet(io.BytesIO(raw))))
        except InputError:
            raise
        except Exception as err:  # noqa: BLE001 - report which file is unreadable
            raise InputError("measurements", str(f),
                             f"not a readable Parquet file ({type(err).__name__})") from None
    check_no_duplicate_cells(Path(path), files, [f.rows for f in out])
    return out


def _run_dir_of(f: Path, root: Path) -> Path:
    """The run directory holding part file ``f``: the nearest folder (up to ``root``) with a run
    manifest, else ``f``'s folder."""
    for d in [f.parent, *f.parent.parents]:
        if (d / "_sweep.json").is_file():
            return d
        if d == root:
            break
    return f.parent


def check_no_duplicate_cells(root: Path, files: list[Path], frames: list[pd.DataFrame]) -> None:
    """One run stores each cell once: an ok row whose ``cell_id`` another part file of the same
    run also holds (a fleet resubmitted with other shards, a copied part file) is refused."""
    seen: dict[tuple[Path, str], Path] = {}
    for f, frame in zip(files, frames):
        if "cell_id" not in frame.columns:
            continue
        ok = frame if "status" not in frame.columns else frame[frame["status"].astype(str) == STATUS_OK]
        run = _run_dir_of(f, root)
        ids = ok["cell_id"].astype(str)
        if ids.duplicated().any():
            raise _stored_twice(run, ids[ids.duplicated()].iloc[0], f, f)
        for cell in ids:
            first = seen.setdefault((run, cell), f)
            if first != f:
                raise _stored_twice(run, cell, first, f)


def _stored_twice(run: Path, cell: str, first: Path, second: Path) -> InputError:
    where = first.name if first == second else f"{first.name} and {second.name}"
    return InputError("cell_id", cell, f"stored twice in run {run} ({where}); one run holds each cell once "
                      "(a fleet resubmitted with other shards?): remove the extra part files, or re-run "
                      "into a new --out")


def load_measurements(path: str | Path) -> pd.DataFrame:
    """Read and validate measurements (ok rows only) from a sweep dir or Parquet file."""
    return validate_measurements(read_measurements(path))
