"""The pure planning of ``dsdprof sweep --budget`` (:mod:`dsdprof.jobs.budget`): the budget, what
the rows so far say (:class:`Ledger`), a batch size's status and the next pass's cells."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from dsdprof.errors import InputError
from dsdprof.formats.measurements import MODE_DSD, MODE_FIXED, MODE_VANILLA, STATUS_OK
from dsdprof.measure.engine import Cell, balanced_order

DEFAULT_MIN_REPEATS = 2
MAX_PASSES = 64
SETTLED = ("decided", "within tolerance")
STATUSES = (*SETTLED, "unconfirmed", "open", "no data")


@dataclass(frozen=True)
class Budget:
    """Engine seconds or measured waves (exactly one is set)."""

    seconds: float | None = None
    waves: int | None = None

    def __str__(self) -> str:
        return f"{self.waves} waves" if self.waves is not None else f"{self.seconds:g} engine s"


def parse_budget(text: str) -> Budget:
    """``3600``, ``3600s``, ``90m``, ``2h`` (engine time) or ``400w`` (measured waves)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhw]?)\s*", str(text).lower())
    if not m or float(m.group(1)) <= 0:
        raise InputError("--budget", text,
                         "must be engine seconds (3600, 3600s, 90m, 2h) or waves (400w), > 0")
    value, unit = float(m.group(1)), m.group(2)
    if unit == "w":
        if value != int(value):
            raise InputError("--budget", text, "waves must be a whole number")
        return Budget(waves=int(value))
    return Budget(seconds=value * {"": 1, "s": 1, "m": 60, "h": 3600}[unit])


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
        wall = pd.to_numeric(self.rows.get("wall_s", pd.Series(dtype=float)), errors="coerce")
        return float(wall.fillna(0).sum())

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
        reps = ([int(r) for k, r in zip(self._keys(), self.rows["repeat"]) if k == key]
                if len(self.rows) else [])
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
        if cell.group and len(r) and "design" in r and (
                (r["design"].astype(str) == "paired") & (r["repeat"].astype(int) == cell.repeat)
                & (r["batch_size"].astype(int) == cell.batch_size)).any():
            return True
        if budget.waves is not None:
            return self.spent_waves + self.waves_per_cell <= budget.waves
        assert budget.seconds is not None  # exactly one is set
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
        def key(k: int, b: int = b) -> Key:
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
                kinds = [(MODE_VANILLA, 0)] + [(MODE_DSD, k) for k in ks]
                cells.extend(Cell(rep, b, m, k, group=tuple(ks)) for m, k in kinds)
    else:
        for i, b in enumerate(batch_sizes):
            block = [cell_for(mode, b, k, 0) for k in wanted.get(b, [])]
            for j in balanced_order(len(block), pass_index + i):
                cells.append(replace(block[j], repeat=ledger.next_repeat(block[j])))
    return cells, status
