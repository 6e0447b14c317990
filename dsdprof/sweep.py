"""Run a sweep: plan cells, run each on an engine, write one durable row per cell.

A cell that raises (engine start failure, engine death, OOM, timeout) becomes a row with
``status = "failed"`` and the error; the sweep goes on. Progress is reported through a callback so
the CLI (rich) and tests can watch without this module knowing about either.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from dsdprof import __version__
from dsdprof.engines.base import Cell, CellMeasurement, Engine, plan_cells
from dsdprof.schema import MODE_DSD, STATUS_FAILED, STATUS_OK, empty_row
from dsdprof.spec import SweepSpec
from dsdprof.storage import SweepWriter, provenance_dict, utc_now


@dataclass(frozen=True)
class SweepProgress:
    """One progress event. ``phase``: plan | start | done | skip."""

    phase: str
    index: int  # cells finished so far (done + skipped)
    total: int
    cell: Optional[Cell] = None
    status: str = ""
    message: str = ""
    acceptance_length: float = math.nan
    itl_s: float = math.nan


@dataclass(frozen=True)
class SweepSummary:
    out: Path
    total: int
    ok: int
    failed: int
    skipped: int
    speculation_mode: str


ProgressCallback = Callable[[SweepProgress], None]


def measurement_row(cell: Cell, m: CellMeasurement | None, prov: dict[str, Any],
                    tolerance: float, error: str = "") -> dict[str, Any]:
    """One Parquet row for a finished (or failed) cell."""
    row = empty_row()
    row.update({k: v for k, v in prov.items() if k in row})
    row.update(cell_id=cell.cell_id, mode=cell.mode, batch_size=cell.batch_size,
               num_spec_tokens=cell.num_spec_tokens, repeat=cell.repeat,
               dsdprof_version=__version__, created_at=utc_now())
    if m is None:
        row.update(status=STATUS_FAILED, error=error or "unknown error")
        return row
    row.update(asdict(m))
    for name in ("acceptance_per_pos", "sample_acceptance_length", "sample_itl_s"):
        row[name] = list(row[name])
    row.update(status=STATUS_OK, error="", consistent=not m.checks_failed)
    return row


def run_cells(cells: list[Cell], writer: SweepWriter, measure_row: Callable[[Cell], dict[str, Any]],
              prov: dict[str, Any], tolerance: float, notify: ProgressCallback) -> tuple[int, int, int]:
    """Run ``cells`` in order, one durable row each; skip cells ``writer`` already holds.

    ``measure_row(cell)`` returns the cell's row; if it raises, the cell is written as a failed
    row with the error and the loop goes on. Returns (ok, failed, skipped).
    """
    total = len(cells)
    ok = failed = skipped = 0
    for i, cell in enumerate(cells):
        if cell.cell_id in writer.done:
            skipped += 1
            notify(SweepProgress("skip", i + 1, total, cell, status="skipped"))
            continue
        notify(SweepProgress("start", i, total, cell))
        t0 = time.perf_counter()
        try:
            row = measure_row(cell)
        except KeyboardInterrupt:
            raise
        except Exception as err:  # noqa: BLE001 - a failed cell is a row, not a dead sweep
            row = measurement_row(cell, None, prov, tolerance, error=f"{type(err).__name__}: {err}")
            row["wall_s"] = time.perf_counter() - t0
        writer.write_row(row)
        if row["status"] == STATUS_OK:
            ok += 1
        else:
            failed += 1
        notify(SweepProgress("done", i + 1, total, cell, status=row["status"], message=row["error"],
                             acceptance_length=row["acceptance_length"] or math.nan,
                             itl_s=row["itl_s"] or math.nan))
    return ok, failed, skipped


# The analytic engine predicts a cell in microseconds: buffer its rows (see dsdprof.storage).
SIM_FLUSH_ROWS = 2000
SIM_FLUSH_INTERVAL_S = 1.0


def run_sweep(spec: SweepSpec, out_dir: str | Path, resume: bool = False,
              on_progress: ProgressCallback | None = None,
              engine: Engine | None = None) -> SweepSummary:
    """Run (or resume) ``spec`` into ``out_dir``. ``engine`` defaults to the spec's engine.

    ``out_dir`` is locked for the whole run; a resume must be the same run (spec, versions and
    provenance, see :mod:`dsdprof.manifest`). Rows of the analytic engine are buffered.
    """
    from dsdprof.manifest import normalised_spec_dump

    notify = on_progress or (lambda _event: None)
    spec_dump = normalised_spec_dump(spec)
    batching = {"flush_rows": SIM_FLUSH_ROWS, "flush_interval_s": SIM_FLUSH_INTERVAL_S} \
        if spec.engine.name == "sim" else {}
    # Refuses to overwrite, to resume another run, or to share OUT, before any work.
    with SweepWriter(out_dir, spec_dump, resume=resume, **batching) as writer:
        if engine is None:
            from dsdprof.engines import make_engine

            engine = make_engine(spec, out_dir=out_dir)
        try:
            mode = engine.speculation_mode
            ks = spec.sweep.num_spec_tokens if max(spec.sweep.num_spec_tokens) > 0 else []
            cells = plan_cells(spec.sweep.batch_sizes, ks, spec.sweep.repeats, mode)
            if mode == MODE_DSD and not ks:
                cells = [c for c in cells if c.mode != MODE_DSD]
            prov = provenance_dict(engine.provenance())
            writer.start(prov)
            total = len(cells)
            notify(SweepProgress("plan", 0, total, message=f"{total} cells, speculation mode {mode}"))
            ok, failed, skipped = run_cells(
                cells, writer, lambda cell: measurement_row(
                    cell, engine.measure(cell), prov, spec.sweep.consistency_tolerance),
                prov, spec.sweep.consistency_tolerance, notify)
            return SweepSummary(Path(out_dir), total, ok, failed, skipped, mode)
        finally:
            engine.close()
