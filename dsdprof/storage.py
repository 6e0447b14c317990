"""Crash-safe sweep output: one Parquet part file per finished cell.

Layout of ``OUT``::

    OUT/_sweep.json                       spec, provenance, schema version (written first)
    OUT/part-00000-dsd-bs1-k3-r0.parquet  one row per finished cell (ok or failed)

``pandas.read_parquet(OUT)`` returns every measurement row (files starting with ``_`` are
skipped by pyarrow). Each part file is written to a temp name, fsynced and renamed, so a killed
sweep loses at most the cell in flight. ``--resume`` skips cells that have an ``ok`` row.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError
from dsdprof.schema import (
    COLUMN_NAMES, MEASUREMENT_SCHEMA_VERSION, PARQUET_METADATA_KEY, STATUS_OK, arrow_schema,
)

SWEEP_META = "_sweep.json"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class SweepWriter:
    """Owns one sweep output directory."""

    def __init__(self, out_dir: str | Path, spec_dump: dict[str, Any], resume: bool = False) -> None:
        self.out = Path(out_dir)
        self.spec_dump = spec_dump
        self.done: set[str] = set()
        self._next_index = 0
        if self.out.exists() and not self.out.is_dir():
            raise InputError("out", str(self.out), "exists and is not a directory")
        existing = self.out.is_dir() and any(self.out.iterdir())
        if existing and not resume:
            raise InputError("out", str(self.out), "exists and is not empty; pass --resume to continue it or choose another --out")
        if existing:
            self._load_existing()

    def _load_existing(self) -> None:
        meta_path = self.out / SWEEP_META
        if not meta_path.is_file():
            raise InputError("out", str(self.out), f"is not a dsdprof sweep (no {SWEEP_META}); refusing to resume into it")
        try:
            stored = json.loads(meta_path.read_text())
        except ValueError as err:
            raise InputError(SWEEP_META, str(meta_path), f"unreadable ({err})") from None
        for section in ("engine", "workload"):
            if stored.get("spec", {}).get(section) != self.spec_dump.get(section):
                raise InputError(f"spec.{section}", self.spec_dump.get(section),
                                 f"differs from the [{section}] of the sweep being resumed in {self.out}")
        import pyarrow.parquet as pq

        parts = sorted(self.out.glob("part-*.parquet"))
        for part in parts:
            try:
                table = pq.read_table(part, columns=["cell_id", "status"])
            except Exception:  # noqa: BLE001 - a torn file from a crash: drop it, redo the cell
                part.rename(part.with_name("_corrupt-" + part.name))
                continue
            for cell_id, status in zip(table.column("cell_id").to_pylist(), table.column("status").to_pylist()):
                if status == STATUS_OK:
                    self.done.add(cell_id)
        self._next_index = len(parts)
        for tmp in self.out.glob(".*.tmp"):
            tmp.unlink()

    def start(self, provenance: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        meta_path = self.out / SWEEP_META
        meta = {"schema_version": MEASUREMENT_SCHEMA_VERSION, "spec": self.spec_dump,
                "provenance": provenance, "started_at": utc_now()}
        if meta_path.is_file():
            old = json.loads(meta_path.read_text())
            meta["started_at"] = old.get("started_at", meta["started_at"])
            meta["resumed_at"] = utc_now()
        _write_bytes_atomic(meta_path, json.dumps(meta, indent=2, default=str).encode())
        self.provenance = provenance

    def write_row(self, row: dict[str, Any]) -> Path:
        """Durably write one cell's row as its own part file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        unknown = set(row) - set(COLUMN_NAMES)
        if unknown:
            raise ValueError(f"unknown measurement columns {sorted(unknown)}")
        schema = arrow_schema()
        meta = {"schema_version": MEASUREMENT_SCHEMA_VERSION, **self.provenance}
        schema = schema.with_metadata({PARQUET_METADATA_KEY: json.dumps(meta, default=str).encode()})
        table = pa.Table.from_pylist([{c: row.get(c) for c in COLUMN_NAMES}], schema=schema)
        name = f"part-{self._next_index:05d}-{row['cell_id']}.parquet"
        self._next_index += 1
        path = self.out / name
        tmp = self.out / f".{name}.tmp"
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.out)
        if row.get("status") == STATUS_OK:
            self.done.add(row["cell_id"])
        return path


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def provenance_dict(prov) -> dict[str, Any]:
    d = asdict(prov)
    extra = d.pop("extra", {}) or {}
    d.update({f"extra_{k}": v for k, v in extra.items()})
    return d
