"""``dsdprof sweep --budget``: spend engine time only where the K decision is still open.

Pass 0 runs the grid once (:func:`~dsdprof.measure.engine.plan_cells`). After each pass the rows
so far are analysed (:func:`dsdprof.decide.analysis.analyze`, ``acceptance="auto"``); a batch size is

* ``decided`` -- the data separate the chosen K from every other K at the stated confidence,
* ``within tolerance`` -- not separated, but the chosen K is, at that confidence, within the
  tolerance of every other K (serving it costs at most the tolerance), or
* ``unconfirmed`` -- one of the two above, but its chosen K or runner-up has fewer than
  ``min_repeats`` ok rows (default 2, so that repeat-to-repeat drift, not only wave-to-wave noise,
  is in their intervals; 1 for the analytic engine, whose predictions do not vary), or
* ``open`` -- also while a grid K has no ok row at that batch size yet (a budget smaller than
  pass 0 stops there).

The next pass runs one more repeat of the *contenders* of every open batch size (the Ks more data
could still make the answer, :func:`dsdprof.decide.rule.contenders`, plus those two); in the
paired design (vLLM, DSD mode) one more paired group of every K, and one group is enough to settle
(drift is shared by the Ks of a wave). It stops when every batch size is settled, when the next
cell would exceed the budget, or when nothing is left, and says which batch sizes are not settled.
Rows stay one per cell, so ``--resume`` continues a run from the rows on disk.

Budget: engine seconds (the cells' ``wall_s``: measured waves, not warm-up or engine start; for
the analytic engine the predicted seconds) or measured waves (``400w``; ``[sweep] waves`` per cell
or paired group). A cell runs only if its estimated cost (mean ``wall_s`` of earlier repeats of
it, else of its batch size, else of any cell) fits what is left.

Chain drafters (``draft_model``, ``eagle``, ``eagle3``, ``mtp``) whose measured AL(K) agrees with
the largest K's per-position prediction take AL(K) from it (less AL noise, fewer waves); n-gram,
suffix and drafters that disagree are measured per K (``Analysis.chain_check`` says where).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dsdprof.config.defaults import DEFAULT_CONFIDENCE, DEFAULT_TOLERANCE
from dsdprof.decide.analysis import analyze
from dsdprof.decide.chain import CHAIN_METHODS
from dsdprof.errors import InputError
from dsdprof.formats.measurements import MODE_DSD, STATUS_OK, MeasurementRow
from dsdprof.io.store import provenance_dict
from dsdprof.jobs.budget_plan import (
    DEFAULT_MIN_REPEATS,
    MAX_PASSES,
    SETTLED,
    STATUSES,
    Budget,
    Ledger,
    plan_pass,
)
from dsdprof.measure.engine import Cell, Engine, plan_cells
from dsdprof.measure.runner import SweepSummary

__all__ = ["BudgetPlanner", "BudgetSummary", "acceptance_note", "run_budgeted_sweep"]

# ----------------------------------------------------------------------------- the loop

@dataclass(frozen=True)
class BudgetSummary(SweepSummary):
    """What a budgeted sweep did; ``ok``/``failed``/``skipped`` count this session's cells."""

    budget: Budget
    passes: int
    spent_s: float
    spent_waves: int
    exhausted: bool
    status: dict[int, str] = field(default_factory=dict)
    acceptance: str = "measured"
    stop_reason: str = ""
    elapsed_s: float = 0.0
    acceptance_note: str = ""

    @property
    def unsettled(self) -> list[int]:
        return [b for b, s in self.status.items() if s not in SETTLED]

    def report(self) -> str:
        spent = (f"{self.spent_waves} waves" if self.budget.waves is not None
                 else f"{self.spent_s:.1f} engine s")
        lines = [f"budget {self.budget}: spent {spent} in {self.passes} passes; {self.stop_reason}"]
        for label in STATUSES:
            sizes = [str(b) for b, s in self.status.items() if s == label]
            if sizes:
                lines.append(f"  {label}: batch size {', '.join(sizes)}")
        if self.acceptance_note:
            lines.append(f"  {self.acceptance_note}")
        return "\n".join(lines)


def acceptance_note(analysis: Any) -> str:
    """Where AL per K came from, and why (chain prediction or measured per K)."""
    if analysis is None:
        return ""
    if analysis.acceptance == "chain":
        return "AL per K from the largest K's per-position acceptance (chain drafter; measured AL agrees)"
    method = str(analysis.provenance.get("method", ""))
    if method and method not in CHAIN_METHODS:
        return f"AL measured per K (method {method} is not a chain drafter)"
    check = analysis.chain_check
    if check is not None and len(check) and check["consistent"].eq(False).any():  # None = unknown
        bad = check[check["consistent"].eq(False)].iloc[0]
        return (f"AL measured per K: the chain prediction misses the measured AL at BS {int(bad.batch_size)} "
                f"K {int(bad.k)} ({bad.al_predicted:.2f} vs {bad.al_measured:.2f})")
    return "AL measured per K"


def _frame(rows: list[MeasurementRow]) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame(columns=["cell_id", "mode", "batch_size", "num_spec_tokens", "repeat", "status",
                                     "wall_s"])
    df = pd.DataFrame(rows)
    return df.drop_duplicates("cell_id", keep="last").reset_index(drop=True)


class BudgetPlanner:
    """Passes over :func:`dsdprof.measure.runner.run_plan`: pass 0 is the grid once; each later pass
    is :func:`plan_pass` on the analysis of every row so far; a cell that does not fit the budget
    ends the run."""

    def __init__(self, spec: Any, budget: Budget, tolerance: float, confidence: float, min_repeats: int,
                 max_passes: int) -> None:
        self.spec, self.budget, self.tolerance, self.confidence = spec, budget, tolerance, confidence
        self.min_repeats, self.max_passes = min_repeats, max_passes
        self.batch_sizes = list(spec.sweep.batch_sizes)
        self.waves = int(spec.sweep.waves)
        self.ks = list(spec.sweep.num_spec_tokens) if max(spec.sweep.num_spec_tokens) > 0 else []
        self.passes, self.exhausted, self.reason = 0, False, ""
        self.status: dict[int, str] = {}
        self.analysis: Any = None
        self.mode = ""
        self.engine: Engine | None = None
        self.paired = False
        self.spent_s, self.spent_waves = 0.0, 0

    def start(self, engine: Engine, done: set[str]) -> str:
        self.engine = engine
        self.mode = engine.speculation_mode
        self.paired = bool(getattr(engine, "paired", False)) and self.mode == MODE_DSD and bool(self.ks)
        if provenance_dict(engine.provenance()).get("engine") == "sim":
            self.min_repeats = 1  # predictions: a second repeat is the same number
        elif self.paired and self.min_repeats == DEFAULT_MIN_REPEATS:
            self.min_repeats = 1  # drift is shared by every K of a wave: one group's intervals carry it
        return self.mode

    def admit(self, cell: Cell, rows: list[MeasurementRow]) -> bool:
        if Ledger(_frame(rows), self.waves).fits(cell, self.budget):
            return True
        self.exhausted = True
        return False

    def describe(self, cells: list[Cell], mode: str) -> str:
        return f"pass {self.passes}: {len(cells)} cells (speculation mode {mode}, budget {self.budget})"

    def plan(self, rows: list[MeasurementRow]) -> list[Cell]:
        if self.passes == 0 and not self.exhausted:
            self.passes = 1
            cells = plan_cells(self.batch_sizes, self.ks, 1, self.mode, paired=self.paired)
            if self.mode == MODE_DSD and not self.ks:
                return [c for c in cells if c.mode != MODE_DSD]
            return cells
        cells = self._next_pass(rows)
        self.reason = self._stop_reason(cells)
        if self.reason:
            return []
        self.passes += 1
        return cells

    def finish(self, rows: list[MeasurementRow]) -> None:
        """After the last pass (or the cell the budget refused): status, reason and spending."""
        if self.exhausted:
            self.reason = self._stop_reason(self._next_pass(rows))
        final = Ledger(_frame(rows), self.waves)
        self.spent_s, self.spent_waves = final.spent_s, final.spent_waves

    def _next_pass(self, rows: list[MeasurementRow]) -> list[Cell]:
        frame = _frame(rows)
        if (frame["status"].astype(str) == STATUS_OK).any() and self.ks:
            prov = provenance_dict(self.engine.provenance()) if self.engine is not None else {}
            self.analysis = analyze(frame, self.tolerance, provenance=prov, confidence=self.confidence,
                                    acceptance="auto")
        cells, self.status = plan_pass(self.analysis, Ledger(frame, self.waves), self.mode, self.batch_sizes,
                                       self.ks, self.passes, self.tolerance, self.min_repeats,
                                       paired=self.paired)
        return cells

    def _stop_reason(self, cells: list[Cell]) -> str:
        if self.exhausted:
            return "budget spent before every batch size was settled" if cells else "budget spent"
        if not self.ks:
            return "no K > 0 in the grid: nothing to decide"
        if not cells:
            return ("every batch size settled" if all(s in SETTLED for s in self.status.values())
                    else "nothing left to run (failing cells)")
        if self.passes >= self.max_passes:
            return f"stopped after {self.max_passes} passes"
        return ""


def run_budgeted_sweep(spec: Any, out_dir: str | Path, budget: Budget, resume: bool = False,
                       on_progress: Callable[[Any], None] | None = None, engine: Engine | None = None,
                       tolerance: float = DEFAULT_TOLERANCE, confidence: float = DEFAULT_CONFIDENCE,
                       min_repeats: int = DEFAULT_MIN_REPEATS, max_passes: int = MAX_PASSES,
                       stream_engine_log: bool = False) -> BudgetSummary:
    """Run ``spec`` into ``out_dir`` within ``budget`` (see the module docstring)."""
    from dsdprof.io.manifest import normalised_spec_dump
    from dsdprof.measure.runner import batching_for, default_engine, run_plan

    if spec.sweep.context_lens:
        raise InputError("sweep.context_lens", spec.sweep.context_lens,
                         "a budgeted sweep has no context axis yet: run a plain sweep (no --budget)")
    t_start = time.perf_counter()
    planner = BudgetPlanner(spec, budget, tolerance, confidence, min_repeats, max_passes)
    make = (lambda: engine) if engine is not None else default_engine(spec, out_dir, stream_engine_log)
    res = run_plan(planner, normalised_spec_dump(spec), out_dir, make, resume=resume, on_progress=on_progress,
                   batching=batching_for(spec))
    final = planner.analysis
    return BudgetSummary(
        res.out, res.total, res.ok, res.failed, res.skipped, res.speculation_mode, budget, planner.passes,
        planner.spent_s, planner.spent_waves, planner.exhausted, planner.status,
        final.acceptance if final is not None else "measured", planner.reason,
        time.perf_counter() - t_start, acceptance_note(final))
