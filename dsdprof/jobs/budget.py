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

import math
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

import pandas as pd

from dsdprof.config.defaults import DEFAULT_CONFIDENCE, DEFAULT_TOLERANCE
from dsdprof.decide.analysis import analyze
from dsdprof.decide.chain import CHAIN_METHODS
from dsdprof.io.store import provenance_dict
from dsdprof.measure.engine import Cell, Engine, balanced_order, plan_cells
from dsdprof.errors import InputError
from dsdprof.formats.measurements import MODE_DSD, MODE_FIXED, MODE_VANILLA, STATUS_OK
from dsdprof.measure.runner import SweepSummary

DEFAULT_MIN_REPEATS = 2
MAX_PASSES = 64
SETTLED = ("decided", "within tolerance")
STATUSES = (*SETTLED, "unconfirmed", "open", "no data")


@dataclass(frozen=True)
class Budget:
    """Engine seconds or measured waves (exactly one is set)."""

    seconds: Optional[float] = None
    waves: Optional[int] = None

    def __str__(self) -> str:
        return f"{self.waves} waves" if self.waves is not None else f"{self.seconds:g} engine s"


def parse_budget(text: str) -> Budget:
    """``3600``, ``3600s``, ``90m``, ``2h`` (engine time) or ``400w`` (measured waves)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhw]?)\s*", str(text).lower())
    if not m or float(m.group(1)) <= 0:
        raise InputError("--budget", text, "must be engine seconds (3600, 3600s, 90m, 2h) or waves (400w), > 0")
    value, unit = float(m.group(1)), m.group(2)
    if unit == "w":
        if value != int(value):
            raise InputError("--budget", text, "waves must be a whole number")
        return Budget(waves=int(value))
    return Budget(seconds=value * {"": 1, "s": 1, "m": 60, "h": 3600}[unit])


# ----------------------------------------------------------------------------- pure planning

Key = tuple[str, int, int]  # (mode, batch_size, K)


def cell_for(mode: str, batch_size: int, k: int, repeat: int) -> Cell:
    """The cell that measures candidate K in this speculation mode (fixed mode: K=0 is vanilla)."""
    if mode == MODE_FIXED and k == 0:
        return Cell(repeat, batch_size, MODE_VANILLA, 0)
    return Cell(repeat, batch_size, mode, k)


@dataclass
class Ledger:
    """What the rows so far say about cost, repeats and failures."""

    rows: pd.DataFrame
    waves_per_cell: int

    def _keys(self) -> list[Key]:
        r = self.rows
        return list(zip(r["mode"].astype(str), r["batch_size"].astype(int), r["num_spec_tokens"].astype(int)))

    @property
    def spent_s(self) -> float:
        return float(pd.to_numeric(self.rows.get("wall_s", pd.Series(dtype=float)), errors="coerce").fillna(0).sum())

    @property
    def spent_waves(self) -> int:
        """Waves run: a cell's ``waves``; a paired group's ``waves`` once for all its rows."""
        if not len(self.rows):
            return 0
        paired = self.rows["design"].astype(str) == "paired" if "design" in self.rows else pd.Series(False)
        n_paired = int(paired.sum())
        groups = self.rows[paired].groupby(["repeat", "batch_size"]).ngroups if n_paired else 0
        return (len(self.rows) - n_paired + groups) * self.waves_per_cell

    def next_repeat(self, cell: Cell) -> int:
        key = (cell.mode, cell.batch_size, cell.num_spec_tokens)
        reps = [int(r) for k, r in zip(self._keys(), self.rows["repeat"]) if k == key] if len(self.rows) else []
        return max(reps) + 1 if reps else 0

    def ok_repeats(self, key: Key) -> int:
        if not len(self.rows):
            return 0
        ok = self.rows["status"].astype(str) == STATUS_OK
        return sum(1 for k, good in zip(self._keys(), ok) if k == key and good)

    def failures(self, key: Key) -> int:
        if not len(self.rows):
            return 0
        bad = self.rows["status"].astype(str) != STATUS_OK
        return sum(1 for k, b in zip(self._keys(), bad) if k == key and b)

    def estimate_s(self, cell: Cell) -> float:
        if not len(self.rows) or "wall_s" not in self.rows:
            return 0.0
        wall = pd.to_numeric(self.rows["wall_s"], errors="coerce")
        keys = self._keys()
        key = (cell.mode, cell.batch_size, cell.num_spec_tokens)
        for pick in ([k == key for k in keys], [k[1] == cell.batch_size for k in keys], [True] * len(keys)):
            vals = wall[pd.Series(pick, index=wall.index)].dropna()
            if len(vals):
                return float(vals.mean())
        return 0.0

    def fits(self, cell: Cell, budget: Budget) -> bool:
        """Whether ``cell`` fits what is left; a paired group's first cell is costed for the whole
        group and its siblings always fit (the engine ran them with it)."""
        r = self.rows
        if cell.group and len(r) and "design" in r and ((r["design"].astype(str) == "paired")
                                                        & (r["repeat"].astype(int) == cell.repeat)
                                                        & (r["batch_size"].astype(int) == cell.batch_size)).any():
            return True
        if budget.waves is not None:
            return self.spent_waves + self.waves_per_cell <= budget.waves
        return self.spent_s + len(cell.group or (0,)) * self.estimate_s(cell) <= budget.seconds + 1e-9


def batch_status(opt_row: Any, tolerance: float, repeats_ok: Callable[[int], int], min_repeats: int) -> str:
    """``decided`` | ``within tolerance`` | ``unconfirmed`` | ``open`` for one row of ``Analysis.optimal``."""
    if not bool(opt_row["interval_known"]):
        return "open"
    bound = float(opt_row["regret_bound"])
    if bool(opt_row["decided"]):
        state = "decided"
    elif not math.isnan(bound) and bound <= tolerance + 1e-12:
        state = "within tolerance"
    else:
        return "open"
    needed = [int(opt_row["k"])]
    if opt_row["runner_up"] is not None and not pd.isna(opt_row["runner_up"]):
        needed.append(int(opt_row["runner_up"]))
    return "unconfirmed" if any(repeats_ok(k) < min_repeats for k in needed) else state


def plan_pass(analysis: Any, ledger: Ledger, mode: str, batch_sizes: list[int], ks: list[int],
              pass_index: int, tolerance: float, min_repeats: int = DEFAULT_MIN_REPEATS,
              max_failures: int = 2, paired: bool = False) -> tuple[list[Cell], dict[int, str]]:
    """The next pass (cells, in run order) and every batch size's status.

    Open batch sizes get one more repeat of each contender (and of the chosen K and runner-up);
    grid Ks with no ok row yet are retried until they failed ``max_failures`` times. ``paired``
    (DSD mode): an open batch size gets one more paired group of every K instead (every K inside
    the same waves, so the repeat pairs with the earlier ones).
    """
    opt = {int(r["batch_size"]): r for _, r in analysis.optimal.iterrows()} if analysis is not None else {}
    status: dict[int, str] = {}
    wanted: dict[int, list[int]] = {}
    for b in batch_sizes:
        def key(k: int) -> Key:
            c = cell_for(mode, b, k, 0)
            return (c.mode, b, k)

        def repeats_ok(k: int) -> int:
            return ledger.ok_repeats(key(k))

        missing = [k for k in ks if repeats_ok(k) == 0 and ledger.failures(key(k)) < max_failures]
        row = opt.get(b)
        if row is None:
            status[b] = "no data"
            wanted[b] = missing
            continue
        state = batch_status(row, tolerance, repeats_ok, min_repeats)
        # a grid K never measured here (and still retryable) could be the answer: nothing is settled
        # until it ran (a budget smaller than pass 0 stops with such batch sizes)
        status[b] = "open" if missing else state
        if state in SETTLED:
            wanted[b] = missing
            continue
        ks_here = set(int(k) for k in row["contenders"]) | {int(row["k"])}
        if row["runner_up"] is not None and not pd.isna(row["runner_up"]):
            ks_here.add(int(row["runner_up"]))
        wanted[b] = sorted((ks_here | set(missing)) & set(ks))
    cells: list[Cell] = []
    if mode == MODE_FIXED:  # one engine per K: group by K, rotate the order of the groups
        all_ks = sorted({k for v in wanted.values() for k in v})
        for j in balanced_order(len(all_ks), pass_index):
            k = all_ks[j]
            for b in batch_sizes:
                if k in wanted.get(b, []):
                    c = cell_for(mode, b, k, 0)
                    cells.append(replace(c, repeat=ledger.next_repeat(c)))
    elif paired and mode == MODE_DSD:
        for b in batch_sizes:
            if wanted.get(b):
                rep = max(ledger.next_repeat(cell_for(mode, b, k, 0)) for k in ks)  # vanilla rides along
                cells.extend(Cell(rep, b, m, k, group=tuple(ks)) for m, k in [(MODE_VANILLA, 0)] + [(MODE_DSD, k) for k in ks])
    else:
        for i, b in enumerate(batch_sizes):
            block = [cell_for(mode, b, k, 0) for k in wanted.get(b, [])]
            for j in balanced_order(len(block), pass_index + i):
                cells.append(replace(block[j], repeat=ledger.next_repeat(block[j])))
    return cells, status


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
        spent = f"{self.spent_waves} waves" if self.budget.waves is not None else f"{self.spent_s:.1f} engine s"
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
    if check is not None and len(check) and (check["consistent"] == False).any():  # noqa: E712 - None = unknown
        bad = check[check["consistent"] == False].iloc[0]  # noqa: E712
        return (f"AL measured per K: the chain prediction misses the measured AL at BS {int(bad.batch_size)} "
                f"K {int(bad.k)} ({bad.al_predicted:.2f} vs {bad.al_measured:.2f})")
    return "AL measured per K"


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame(columns=["cell_id", "mode", "batch_size", "num_spec_tokens", "repeat", "status", "wall_s"])
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
        self.engine: Optional[Engine] = None
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

    def admit(self, cell: Cell, rows: list[dict[str, Any]]) -> bool:
        if Ledger(_frame(rows), self.waves).fits(cell, self.budget):
            return True
        self.exhausted = True
        return False

    def describe(self, cells: list[Cell], mode: str) -> str:
        return f"pass {self.passes}: {len(cells)} cells (speculation mode {mode}, budget {self.budget})"

    def plan(self, rows: list[dict[str, Any]]) -> list[Cell]:
        if self.passes == 0 and not self.exhausted:
            self.passes = 1
            cells = plan_cells(self.batch_sizes, self.ks, 1, self.mode, paired=self.paired)
            return [c for c in cells if c.mode != MODE_DSD] if self.mode == MODE_DSD and not self.ks else cells
        cells = self._next_pass(rows)
        self.reason = self._stop_reason(cells)
        if self.reason:
            return []
        self.passes += 1
        return cells

    def finish(self, rows: list[dict[str, Any]]) -> None:
        """After the last pass (or the cell the budget refused): status, reason and spending."""
        if self.exhausted:
            self.reason = self._stop_reason(self._next_pass(rows))
        final = Ledger(_frame(rows), self.waves)
        self.spent_s, self.spent_waves = final.spent_s, final.spent_waves

    def _next_pass(self, rows: list[dict[str, Any]]) -> list[Cell]:
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
                       on_progress: Optional[Callable[[Any], None]] = None, engine: Optional[Engine] = None,
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
    res = run_plan(planner, normalised_spec_dump(spec), out_dir,
                   (lambda: engine) if engine is not None else default_engine(spec, out_dir, stream_engine_log),
                   resume=resume, on_progress=on_progress,
                   batching=batching_for(spec))
    final = planner.analysis
    return BudgetSummary(
        res.out, res.total, res.ok, res.failed, res.skipped, res.speculation_mode, budget, planner.passes,
        planner.spent_s, planner.spent_waves, planner.exhausted, planner.status,
        final.acceptance if final is not None else "measured", planner.reason,
        time.perf_counter() - t_start, acceptance_note(final))
