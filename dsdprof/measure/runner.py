"""Run a sweep: plan cells, run each on an engine, write one durable row per cell.

A cell that raises (engine start failure, engine death, OOM, timeout) becomes a row with
``status = "failed"`` and the error; the sweep goes on. Progress is reported through a callback so
the CLI (rich) and tests can watch without this module knowing about either.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

from dsdprof import __version__
from dsdprof.config.spec import SweepSpec
from dsdprof.formats.jsontypes import JSONObject, ProvenanceRecord
from dsdprof.formats.measurements import (
    MODE_DSD,
    MODE_VANILLA,
    STATUS_FAILED,
    STATUS_OK,
    MeasurementRow,
    empty_row,
    row_values,
)
from dsdprof.io.store import SweepWriter, provenance_dict, utc_now
from dsdprof.measure.engine import Cell, CellMeasurement, Engine, iter_cells, vanilla_waves


@dataclass(frozen=True)
class SweepProgress:
    """One progress event. ``phase``: begin (the run directory is ours, before the engine starts
    or any cell is built: ``message`` sums up the grid) | plan | start | done | skip."""

    phase: str
    index: int  # cells finished so far (done + skipped)
    total: int
    cell: Cell | None = None
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


def measurement_row(cell: Cell, m: CellMeasurement | None, prov: ProvenanceRecord,
                    error: str = "") -> MeasurementRow:
    """One Parquet row for a finished (or failed) cell."""
    row = empty_row()
    row.update(row_values(prov, strict=False))  # the provenance the columns store
    row.update(MeasurementRow(cell_id=cell.cell_id, mode=cell.mode, batch_size=cell.batch_size,
                              num_spec_tokens=cell.num_spec_tokens, repeat=cell.repeat,
                              design="paired" if cell.group or cell.interleave else "cells",
                              dsdprof_version=__version__, created_at=utc_now()))
    if cell.context_len:  # a context sweep's rows carry their context (the optional column)
        row["context_len"] = cell.context_len
    if m is None:
        row.update(MeasurementRow(status=STATUS_FAILED, error=error or "unknown error"))
        return row
    row.update(row_values(asdict(m)))  # every field of a measurement is a column
    if math.isnan(m.acceptance_length_own):  # every design but the paired one: its own steps' value
        row["acceptance_length_own"] = m.acceptance_length
    row.update(MeasurementRow(acceptance_per_pos=list(m.acceptance_per_pos),
                              sample_acceptance_length=list(m.sample_acceptance_length),
                              sample_itl_s=list(m.sample_itl_s), sample_block=list(m.sample_block),
                              status=STATUS_OK, error="", consistent=not m.checks_failed))
    return row


class Planner(Protocol):
    """What a kind of run decides; :func:`run_plan` does the rest (lock, engine, rows, progress).

    ``start`` readies the engine and names the run's speculation mode; ``plan`` returns the next
    cells to run given every row so far (resumed ones included), ``[]`` when the run is over;
    ``admit`` may refuse a cell that has not run yet (a budget), which ends the run; ``finish``
    sees every row once the run is over. A planner may also have ``summary() -> str``: one line
    about the run, sent as the ``begin`` event before the engine starts (the first line a user sees),
    and ``one_pass = True`` when its first plan is its only one: the engine may then hand back a
    measurement still being analysed (a :class:`~concurrent.futures.Future`; the vLLM engine's paired
    groups, their replay run beside the next unit's waves), and is released before the last ones
    are awaited.
    """

    def start(self, engine: Engine, done: set[str]) -> str: ...

    def plan(self, rows: list[MeasurementRow]) -> list[Cell]: ...

    def admit(self, cell: Cell, rows: list[MeasurementRow]) -> bool: ...

    def describe(self, cells: list[Cell], mode: str) -> str: ...

    def finish(self, rows: list[MeasurementRow]) -> None: ...


@dataclass(frozen=True)
class RunResult(SweepSummary):
    """What :func:`run_plan` did in this session (``skipped``: cells already on disk)."""

    provenance: ProvenanceRecord
    stopped: bool  # a cell was refused by ``Planner.admit``


def _measure_one(cell: Cell, engine: Engine, prov: ProvenanceRecord) -> MeasurementRow | Future:
    """The cell's row (or its measurement's future, see :class:`Planner`); an engine error becomes a
    failed row with the error (the run goes on)."""
    t0 = time.perf_counter()
    try:
        m = engine.measure(cell)
        return m if isinstance(m, Future) else measurement_row(cell, m, prov)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - a failed cell is a row, not a dead sweep
        row = measurement_row(cell, None, prov, error=f"{type(err).__name__}: {err}")
        row["wall_s"] = time.perf_counter() - t0
        return row


def _settled_row(cell: Cell, future: Future, prov: ProvenanceRecord) -> MeasurementRow:
    """The row of a measurement awaited (:func:`_measure_one`): its error, if any, as a failed row."""
    try:
        return measurement_row(cell, future.result(), prov)
    except Exception as err:  # noqa: BLE001 - a failed analysis is a failed row
        return measurement_row(cell, None, prov, error=f"{type(err).__name__}: {err}")


def incomplete_units(cells: list[Cell], done: set[str]) -> set[tuple]:
    """Paired units (:attr:`Cell.unit`) with a cell not ok on disk: a resumed run re-measures such a
    unit whole, its rows already on disk included (their waves are the unit's blocks: rows of two
    runs of a unit never pair with each other)."""
    return {c.unit for c in cells if c.unit is not None and c.cell_id not in done}


def _read_rows(out: Path) -> list[MeasurementRow]:
    from dsdprof.io.readers import read_measurements

    if not any(out.glob("part-*.parquet")):
        return []
    return read_measurements(out, allow_mixed=True).to_dict("records")


def run_plan(planner: Planner, spec_dump: JSONObject, out_dir: str | Path,
             make_engine: Callable[[], Engine], *, resume: bool = False,
             on_progress: ProgressCallback | None = None,
             batching: Batching | None = None) -> RunResult:
    """The one cell loop behind ``sweep``, ``sweep --budget`` and ``validate``.

    Locks ``out_dir`` and refuses to overwrite it, to resume a run of another ``spec_dump`` or to
    share it, before any work (:class:`~dsdprof.io.store.SweepWriter`); starts the engine; writes
    one durable row per cell (failed cells included), skipping cells already on disk; stops the
    engine whatever happens. ``batching`` buffers rows (the analytic engine's microsecond cells).
    """
    notify = on_progress or (lambda _event: None)
    out = Path(out_dir)
    with SweepWriter(out, spec_dump, resume=resume, **(batching or {})) as writer:
        if (summary := getattr(planner, "summary", None)) is not None:  # first line: before engine and cells
            notify(SweepProgress("begin", 0, 0, message=summary()))
        rows = _read_rows(out) if resume else []
        engine = make_engine()
        try:
            mode = planner.start(engine, writer.done)
            prov = provenance_dict(engine.provenance())
            writer.start(prov)
            total = ok = failed = skipped = 0
            stopped = False
            # measurements still being analysed (one-pass planners only), oldest first
            one_pass = bool(getattr(planner, "one_pass", False))
            if hasattr(engine, "defer_analysis"):
                engine.defer_analysis = one_pass
            pending: list[tuple[int, int, Cell, Future]] = []

            def record(i: int, n: int, cell: Cell, row: MeasurementRow) -> None:
                nonlocal total, ok, failed
                writer.write_row(row)
                rows.append(row.copy())
                total += 1
                ok, failed = (ok + 1, failed) if row["status"] == STATUS_OK else (ok, failed + 1)
                notify(SweepProgress("done", i + 1, n, cell, status=row["status"] or "",
                                     message=row["error"] or "",
                                     acceptance_length=row["acceptance_length"] or math.nan,
                                     itl_s=row["itl_s"] or math.nan))

            def settle(wait: bool) -> None:  # write the awaited rows that are ready (all: ``wait``)
                while pending and (wait or pending[0][3].done()):
                    i, n, cell, fut = pending.pop(0)
                    record(i, n, cell, _settled_row(cell, fut, prov))

            while not stopped and (cells := planner.plan(rows)):
                notify(SweepProgress("plan", 0, len(cells), message=planner.describe(cells, mode)))
                redo = incomplete_units(cells, writer.done) if writer.done else set()
                for i, cell in enumerate(cells):
                    settle(wait=False)
                    if cell.cell_id in writer.done and cell.unit not in redo:
                        skipped += 1
                        total += 1
                        notify(SweepProgress("skip", i + 1, len(cells), cell, status="skipped"))
                        continue
                    if not planner.admit(cell, rows):
                        stopped = True
                        break
                    notify(SweepProgress("start", i, len(cells), cell))
                    row = _measure_one(cell, engine, prov)
                    if isinstance(row, Future):
                        pending.append((i, len(cells), cell, row))
                    else:
                        record(i, len(cells), cell, row)
                if pending and one_pass and (release := getattr(engine, "release", None)) is not None:
                    release()  # no engine waits on the last analyses
                settle(wait=True)
            planner.finish(rows)
            return RunResult(out, total, ok, failed, skipped, mode, prov, stopped)
        finally:
            engine.close()


class GridCells:
    """A grid's cells in :func:`~dsdprof.measure.engine.iter_cells` order, built as a loop reaches
    them: a sweep of a million cells runs its first cell at once, and its size (``len``) and engine
    waves are counted from the spec's sizes, without building a cell."""

    def __init__(self, sweep: Any, mode: str, paired: bool = False) -> None:
        self.sweep, self.mode = sweep, mode
        self.ks = list(sweep.num_spec_tokens) if max(sweep.num_spec_tokens) > 0 else []
        # iter_cells pairs DSD blocks with Ks, and never over a context axis
        self.paired = paired and mode == MODE_DSD and bool(self.ks) and not sweep.context_lens
        self.blocks = len(sweep.batch_sizes) * sweep.repeats * len(sweep.context_lens or [0])
        self.per_block = 1 + (len(self.ks) if mode == MODE_DSD else sum(1 for k in self.ks if k != 0))

    def __len__(self) -> int:
        return self.blocks * self.per_block

    def __iter__(self) -> Iterator[Cell]:
        s = self.sweep
        return iter_cells(s.batch_sizes, self.ks, s.repeats, self.mode, context_lens=s.context_lens,
                          paired=self.paired)

    def engine_waves(self, waves: int, warmup: int) -> int:
        """:func:`engine_waves` of these cells, counted: a paired block runs its DSD group's waves
        once and its vanilla cell one K's share; every other cell its own."""
        if self.paired:
            return self.blocks * ((waves + warmup) + (vanilla_waves(waves, len(self.ks)) + warmup))
        return len(self) * (waves + warmup)


class GridPlanner:
    """The plain sweep: every cell of the grid once, in :func:`plan_cells` order (:class:`GridCells`)."""

    one_pass = True  # its first plan is its only one (see Planner)

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self._planned = False
        self._paired = False

    def summary(self) -> str:
        """The grid from the spec's sizes (the run's first line, before the engine and any cell)."""
        s = self.spec.sweep
        cells = GridCells(s, MODE_DSD)
        ctx = f" x {len(s.context_lens)} contexts" if s.context_lens else ""
        return (f"grid {len(s.batch_sizes)} batch sizes x ({len(cells.ks)} K + vanilla) x {s.repeats} "
                f"repeat(s){ctx} = {len(cells):,} cells; starting engine {self.spec.engine.name}")

    def start(self, engine: Engine, done: set[str]) -> str:
        self._mode = engine.speculation_mode
        # paired design: the engine runs a batch size's Ks inside the same waves (vLLM, DSD mode)
        self._paired = bool(getattr(engine, "paired", False)) and self._mode == MODE_DSD
        return self._mode

    def cells(self, mode: str, paired: bool = False) -> GridCells:
        return GridCells(self.spec.sweep, mode, paired)

    def plan(self, rows: list[MeasurementRow]) -> Any:
        if self._planned:
            return []
        self._planned = True
        return self.cells(self._mode, self._paired)

    def admit(self, cell: Cell, rows: list[MeasurementRow]) -> bool:
        return True

    def describe(self, cells: Any, mode: str) -> str:
        design = "paired (every K in the same waves)" if self._paired else "cell by cell"
        return f"{len(cells):,} cells, speculation mode {mode}, design {design}"

    def finish(self, rows: list[MeasurementRow]) -> None:
        pass


# --dry-run's estimate for a real engine: an assumed step time (stated with the estimate).
ASSUMED_STEP_S = 0.02


@dataclass(frozen=True)
class SweepPlan:
    """What ``dsdprof sweep --dry-run`` prints: the grid, the cells and an estimated duration.

    Cells are planned in DSD mode (the engine may fall back to fixed mode, one engine per K).
    ``decode_steps`` is an upper bound: engine waves x output_len, as if no draft token were ever
    accepted. Engine waves (warm-up included): per cell ``waves + warmup`` in the cells design; in
    the paired design ``waves + warmup`` per batch size and repeat for the whole DSD group and
    ``vanilla_waves(waves, len(Ks)) + warmup`` for its vanilla cell."""

    engine: str
    batch_sizes: tuple[int, ...]
    ks: tuple[int, ...]
    repeats: int
    cells: int
    decode_steps: int
    est_seconds: float
    assumption: str
    design: str = "cells"
    engine_waves: int = 0


def engine_waves(cells: list[Cell], waves: int, warmup: int) -> int:
    """Waves the engines run for ``cells`` (warm-up included): a paired unit's DSD group runs its
    ``waves`` once for every K, its vanilla cell one K's share (:func:`vanilla_waves`)."""
    total, seen = 0, set()
    for c in cells:
        if not c.group:
            total += waves + warmup
        elif c.mode == MODE_VANILLA:
            total += vanilla_waves(waves, len(c.group)) + warmup
        elif c.unit not in seen:
            seen.add(c.unit)
            total += waves + warmup
    return total


def plan_sweep(spec: SweepSpec) -> SweepPlan:
    """The plan of ``spec``'s sweep, without starting an engine."""

    s = spec.sweep
    paired = s.design == "paired" and spec.engine.name != "sim"  # the analytic engine runs cell by cell
    cells = GridPlanner(spec).cells(MODE_DSD, paired)  # counted from the sizes: no cell is built
    n_waves = cells.engine_waves(s.waves, s.warmup)
    steps = n_waves * s.output_len
    design = "paired" if cells.paired else "cells"
    if spec.engine.name == "sim":
        est, assumption = 0.005 * len(cells), "analytic predictions: milliseconds per cell"
    else:
        est = steps * ASSUMED_STEP_S
        how = (f"paired design: per batch size and repeat {s.waves} + {s.warmup} waves shared by every K, "
               f"vanilla "
               f"{vanilla_waves(s.waves, len(s.num_spec_tokens))} + {s.warmup}" if design == "paired"
               else f"cells design: {s.waves} + {s.warmup} waves per cell")
        assumption = (f"at an assumed {ASSUMED_STEP_S * 1e3:.0f} ms per decode step, steps an upper bound "
                      f"({n_waves} engine waves x output_len; {how}), plus engine loads")
    return SweepPlan(spec.engine.name, tuple(s.batch_sizes), tuple(s.num_spec_tokens), s.repeats, len(cells),
                     steps, est, assumption, design, n_waves)


# The analytic engine predicts a cell in microseconds: buffer its rows (see dsdprof.io.store).
SIM_FLUSH_ROWS = 2000
SIM_FLUSH_INTERVAL_S = 1.0


class Batching(TypedDict, total=False):
    """Row buffering (:class:`~dsdprof.io.store.SweepWriter`'s keywords)."""

    flush_rows: int
    flush_interval_s: float


def batching_for(spec: SweepSpec) -> Batching:
    """Row buffering for ``spec``'s engine (the analytic engine's rows are buffered)."""
    if spec.engine.name == "sim":
        return Batching(flush_rows=SIM_FLUSH_ROWS, flush_interval_s=SIM_FLUSH_INTERVAL_S)
    return Batching()


def default_engine(spec: SweepSpec, out_dir: str | Path,
                   stream_engine_log: bool = False) -> Callable[[], Engine]:
    def make() -> Engine:
        from dsdprof.measure.factory import make_engine

        return make_engine(spec, out_dir=out_dir, stream_engine_log=stream_engine_log)
    return make


def run_sweep(spec: SweepSpec, out_dir: str | Path, resume: bool = False,
              on_progress: ProgressCallback | None = None,
              engine: Engine | None = None, stream_engine_log: bool = False) -> SweepSummary:
    """Run (or resume) ``spec``'s grid into ``out_dir``. ``engine`` defaults to the spec's engine.

    ``out_dir`` is locked for the whole run; a resume must be the same run (spec, versions and
    provenance, see :mod:`dsdprof.io.manifest`). Rows of the analytic engine are buffered.
    """
    from dsdprof.io.manifest import normalised_spec_dump

    planner = GridPlanner(spec)
    res = run_plan(planner, normalised_spec_dump(spec), out_dir,
                   (lambda: engine) if engine is not None
                   else default_engine(spec, out_dir, stream_engine_log),
                   resume=resume, on_progress=on_progress,
                   batching=batching_for(spec))
    return SweepSummary(res.out, res.total, res.ok, res.failed, res.skipped, res.speculation_mode)
