"""One K table per (model, draft, hardware, TP) of a fleet, and an index of them.

``OUT/tables/<run>.json`` is the run's ``dsdprof.ktable/v1`` table (exactly what ``dsdprof
export RUN`` writes), ``OUT/tables/<run>.vllm.json`` vLLM's speculative config for it (when some
batch size speculates), and ``OUT/tables/index.json``::

    {"schema": "dsdprof.fleet-index/v1", "fleet": OUT, "created_at": ..., "tolerance": 0.02,
     "tables": [{"run", "model", "draft_model", "method", "hardware", "tensor_parallel_size", "engine",
                 "measured_hardware", "table", "vllm_config", "num_speculative_tokens", "ranges",
                 "shape", "cells", "ok"}],
     "skipped": [{"run", "reason"}]}

``table`` and ``vllm_config`` are paths relative to the index. A serving stack picks its table
by (model, draft_model, hardware, tensor_parallel_size).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.errors import InputError
from dsdprof.export.api import optional_vllm_config, table_from_source
from dsdprof.fleet.store import FLEET_DIR, TABLES_DIR, FleetStore, RunRecord
from dsdprof.formats.jsontypes import Scalar
from dsdprof.formats.versions import FLEET_INDEX_SCHEMA
from dsdprof.io.runs import open_run
from dsdprof.io.store import utc_now

INDEX_SCHEMA = FLEET_INDEX_SCHEMA
INDEX_NAME = "index.json"


class IndexEntry(TypedDict):
    """One exported run in the index: its key fields, its table and vLLM config files."""

    model: str | None
    draft_model: str | None
    method: str | None
    hardware: str | None
    tensor_parallel_size: int | None
    run: str
    engine: str | None
    measured_hardware: Scalar
    table: str
    vllm_config: str | None
    num_speculative_tokens: int
    ranges: list[list[int]]
    shape: str
    cells: int | None
    ok: int | None


class Skipped(TypedDict):
    run: str
    reason: str


class IndexDoc(TypedDict):
    """``tables/index.json``: every run's table, or why it has none."""

    schema: str
    fleet: str
    created_at: str
    tolerance: float
    tables: list[IndexEntry]
    skipped: list[Skipped]


@dataclass(frozen=True)
class FleetIndex:
    path: str  # where the index was written (a local path or the store's URL)
    doc: IndexDoc


def _records(store: FleetStore) -> list[RunRecord]:
    names = [n for n in sorted(store.list_files(f"{FLEET_DIR}/runs")) if n.endswith(".json")]
    records = [store.read_json(f"{FLEET_DIR}/runs/{n}") for n in names]
    return [cast(RunRecord, r) for r in records if r]  # the orchestrator's records (run_record)


def _run_dir(store: FleetStore, run: str, scratch: Path) -> Path:
    """A local directory holding the run's files (OUT itself, or a download of it)."""
    if not store.remote:
        return store.local_path(run)
    local = scratch / run
    local.mkdir(parents=True, exist_ok=True)
    for name in store.list_files(run):
        if name.endswith((".parquet", ".json")) and not name.startswith("."):
            store.get_file(f"{run}/{name}", local / name)
    return local


def export_fleet(out: str, staging: str | None = None, tolerance: float = DEFAULT_TOLERANCE) -> FleetIndex:
    """Analyze every finished run of the fleet in ``out``; write its table and the index."""
    from dsdprof.io.atomic import write_json_atomic

    store = FleetStore(out, staging)
    records = _records(store)
    if not records:
        raise InputError("fleet", out, f"holds no fleet runs (no {FLEET_DIR}/runs/*.json)")
    tables_local = store.tables_dir()
    entries: list[IndexEntry] = []
    skipped: list[Skipped] = []
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="dsdprof-fleet-export-") as scratch:
        for rec in sorted(records, key=lambda r: r["run"]):
            run = rec["run"]
            if rec.get("state") != "done":
                skipped.append({"run": run, "reason": f"run is {rec.get('state', 'unknown')}"
                                + (f" ({rec['error']})" if rec.get("error") else "")})
                continue
            try:
                opened = open_run(_run_dir(store, run, Path(scratch)), "export")  # read once
                table = table_from_source(opened, tolerance, label=store.describe(run))[0]
            except InputError as err:
                skipped.append({"run": run, "reason": str(err)})
                continue
            table_path = write_json_atomic(tables_local / f"{run}.json", table, force=True)
            written.append(table_path)
            cfg = optional_vllm_config(table)
            if cfg is not None:
                written.append(write_json_atomic(tables_local / f"{run}.vllm.json", cfg, force=True))
            entries.append({"model": rec.get("model"), "draft_model": rec.get("draft_model"),
                            "method": rec.get("method"), "hardware": rec.get("hardware"),
                            "tensor_parallel_size": rec.get("tensor_parallel_size"),
                            "run": run, "engine": rec.get("engine"),
                            "measured_hardware": table["provenance"].get("hardware", ""),
                            "table": f"{run}.json", "vllm_config": f"{run}.vllm.json" if cfg else None,
                            "num_speculative_tokens": table["num_speculative_tokens"],
                            "ranges": table["ranges"],
                            "shape": table["shape"], "cells": rec.get("cells"), "ok": rec.get("ok")})
    doc: IndexDoc = {"schema": INDEX_SCHEMA, "fleet": out, "created_at": utc_now(), "tolerance": tolerance,
                     "tables": entries, "skipped": skipped}
    index_path = write_json_atomic(tables_local / INDEX_NAME, doc, force=True)
    if store.remote:
        for path in written + [index_path]:
            store.put_file(path, f"{TABLES_DIR}/{path.name}")
        return FleetIndex(store.describe(f"{TABLES_DIR}/{INDEX_NAME}"), doc)
    return FleetIndex(str(index_path), doc)


def current_index(store: FleetStore, tolerance: float, runs: list[str]) -> FleetIndex | None:
    """The stored index, if it was made with ``tolerance`` and covers every one of ``runs``."""
    rel = f"{TABLES_DIR}/{INDEX_NAME}"
    try:
        doc = store.read_json(rel)
    except InputError:
        return None
    if not doc or doc.get("schema") != INDEX_SCHEMA or doc.get("tolerance") != tolerance:
        return None
    index = cast(IndexDoc, doc)  # an index this module wrote (its schema)
    covered = ({e.get("run") for e in index.get("tables", [])}
               | {s.get("run") for s in index.get("skipped", [])})
    if not set(runs) <= covered:
        return None
    return FleetIndex(store.describe(rel) if store.remote else str(store.local_path(rel)), index)


def find_index(path: str | Path) -> Path | None:
    """The fleet index ``path`` names: the file itself, or ``tables/index.json`` of a fleet
    directory. None when ``path`` is something else (e.g. a K table)."""
    p = Path(path)
    if p.is_dir():
        for cand in (p / TABLES_DIR / INDEX_NAME, p / INDEX_NAME):
            if cand.is_file():
                return cand
        return None
    if p.suffix != ".json" or not p.is_file():
        return None
    try:
        doc = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    return p if isinstance(doc, dict) and doc.get("schema") == INDEX_SCHEMA else None


def load_index(path: str | Path) -> IndexDoc:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise InputError("index", str(p), f"unreadable ({err})") from None
    if not isinstance(doc, dict) or doc.get("schema") != INDEX_SCHEMA:
        raise InputError("index.schema", doc.get("schema") if isinstance(doc, dict) else None,
                         f"not a {INDEX_SCHEMA} file")
    if not isinstance(doc.get("tables"), list) or not isinstance(doc.get("skipped"), list):
        raise InputError("index.tables", type(doc.get("tables")).__name__, "must be a list")
    return cast(IndexDoc, doc)  # checked above: what the readers use
