"""Replay: a rollout's makespan per variant, predicted from a K table's step-time grid, no engine.

A rollout is its requests' output lengths (from a run's rows, a lengths file, or the batch size
per step of a vanilla rollout, :func:`dsdprof.measure.live_workload.lengths_from_batch_sizes`).
The replay walks the engine step by step as vLLM runs it: step 0 is the prefill (``prefill_s``);
each later step runs every unfinished request (batch size ``B``) at the K vLLM scheduled for it
in the step before (K lags the batch by one step) and takes ``itl(B, K)`` seconds (the table's
cell, linear in log B between measured batch sizes, times ``scale``); each request gains
``1 + accepted`` tokens, drawn from the chain of the cell's per-position acceptance. The makespan
is the mean over ``runs`` seeded Monte Carlo replays. The variants: ``vanilla``, ``fixed-K`` for
every K of the grid, ``dsd`` and ``adaptive`` (with a fitted
:class:`~dsdprof.decide.step_model.StepModel`, the K the plugin served per batch size in the
fitted run). The user's account: docs/rollouts.md ("Replay"). Pure: plain values in and out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dsdprof.decide.live_stats import percentile, tail_time
from dsdprof.errors import InputError


class StepGrid(Protocol):
    """What a replay steps with: the table's :class:`Grid` or a fitted
    :class:`~dsdprof.decide.step_model.FittedEngine`."""

    def itl(self, b: int, k: int) -> float: ...

    def conditional(self, b: int, k: int) -> tuple[float, ...]: ...


class FittedModel(Protocol):
    """What :func:`predict_all` needs of a fitted :class:`~dsdprof.decide.step_model.StepModel`."""

    def engine(self, variant: str) -> StepGrid: ...

    def schedule(self, variant: str, k_of: Callable[[int], int]) -> Callable[[int], int]: ...

    def prefill_s(self, variant: str, num_requests: int) -> float: ...

    def variants(self) -> list[str]: ...


@dataclass(frozen=True)
class GridCell:
    batch_size: int
    k: int
    itl_s: float
    p_at_least: tuple[float, ...]  # P(>= j drafts accepted), j = 1..k


@dataclass(frozen=True)
class Prediction:
    variant: str
    makespan_s: float
    tail_s: float
    steps: float  # mean decode steps (prefill not counted)
    mean_k: float  # mean K over decode request-steps
    lo: float = math.nan  # 5th percentile of the replays' makespans (acceptance luck)
    hi: float = math.nan  # 95th percentile


class Grid:
    """The table's step-time and acceptance grid over (batch size, K)."""

    def __init__(self, cells: Sequence[GridCell]) -> None:
        self.cells = {(c.batch_size, c.k): c for c in cells}
        self.ks = sorted({c.k for c in cells})
        self.sizes = {k: sorted(b for b, kk in self.cells if kk == k) for k in self.ks}
        if not self.cells or 0 not in self.ks:
            raise InputError(
                "table.cells", f"K={self.ks}", "the replay needs the table's grid with K=0 (v2 table)"
            )

    def _k(self, k: int) -> int:
        if k in self.sizes:
            return k
        return min(self.ks, key=lambda kk: (abs(kk - k), -kk))  # the nearest measured K

    def itl(self, b: int, k: int) -> float:
        k = self._k(k)
        sizes = self.sizes[k]
        if b <= sizes[0]:
            return self.cells[(sizes[0], k)].itl_s
        if b >= sizes[-1]:
            return self.cells[(sizes[-1], k)].itl_s
        hi = next(s for s in sizes if s >= b)
        lo = max(s for s in sizes if s <= b)
        if hi == lo:
            return self.cells[(lo, k)].itl_s
        w = (math.log(b) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return (1 - w) * self.cells[(lo, k)].itl_s + w * self.cells[(hi, k)].itl_s

    def conditional(self, b: int, k: int) -> tuple[float, ...]:
        """Per position j: P(j accepted | j - 1 accepted), at the measured batch size nearest in log."""
        k = self._k(k)
        if k == 0:
            return ()
        sizes = self.sizes[k]
        near = min(sizes, key=lambda s: abs(math.log(s) - math.log(max(b, 1))))
        p = self.cells[(near, k)].p_at_least
        out, prev = [], 1.0
        for x in p:
            out.append(min(1.0, max(0.0, x / prev)) if prev > 0 else 0.0)
            prev = x
        return tuple(out)


def grid_from_table(table: Mapping[str, Any]) -> Grid:
    """The grid of a v2 K table's ``cells`` (``itl_s``, ``acceptance_length``, ``acceptance_per_pos``;
    a cell without per-position acceptance gets the table's pooled curve scaled to its AL)."""
    cells = table.get("cells") or []
    if not cells:
        raise InputError(
            "table",
            table.get("schema"),
            "the replay needs a v2 table (its cells: step time per batch size and K)",
        )
    pooled = list(table.get("acceptance_per_pos") or [])
    out = []
    for c in cells:
        k = int(c["k"])
        per_pos = list(c.get("acceptance_per_pos") or [])
        if k and len(per_pos) < k:
            if len(pooled) < k:
                raise InputError("table.cells", f"bs {c['batch_size']} k {k}", "no per-position acceptance")
            base = 1.0 + sum(pooled[:k])
            f = (float(c["acceptance_length"]) - 1.0) / (base - 1.0) if base > 1 else 0.0
            per_pos = [min(1.0, x * f) for x in pooled[:k]]
        out.append(
            GridCell(int(c["batch_size"]), k, float(c["itl_s"]), tuple(float(x) for x in per_pos[:k]))
        )
    return Grid(out)


def replay_once(
    lengths: Sequence[int],
    k_of: Callable[[int], int],
    grid: StepGrid,
    prefill_s: float,
    scale: float,
    rng: random.Random,
) -> tuple[float, float, int, float]:
    """(makespan, tail, decode steps, mean K) of one replay (see the module docstring). ``grid``:
    the table's :class:`Grid` or a variant's ``FittedEngine`` (the same two methods)."""
    remaining = [max(0, n - 1) for n in lengths]  # the prefill delivers each request's first token
    finish = [prefill_s] * len(lengths)
    t = prefill_s
    k = k_of(len(lengths))  # K scheduled by the prefill step (lookup at its batch size)
    steps = req_steps = k_sum = 0
    cond_cache: dict[tuple[int, int], tuple[float, ...]] = {}
    while True:
        active = [i for i, r in enumerate(remaining) if r > 0]
        if not active:
            break
        b = len(active)
        key = (b, k)
        cond = cond_cache.get(key)
        if cond is None:
            cond = cond_cache[key] = grid.conditional(b, k)
        t += grid.itl(b, k) * scale
        steps += 1
        req_steps += b
        k_sum += b * k
        for i in active:
            acc = 0
            for p in cond:
                if rng.random() >= p:
                    break
                acc += 1
            remaining[i] -= 1 + acc
            if remaining[i] <= 0:
                finish[i] = t
        k = k_of(b)  # what this step's lookup schedules for the next
    return t, tail_time(finish), steps, (k_sum / req_steps if req_steps else 0.0)


def predict(
    lengths: Sequence[int],
    k_of: Callable[[int], int],
    grid: StepGrid,
    prefill_s: float,
    variant: str,
    scale: float = 1.0,
    runs: int = 200,
    seed: int = 0,
) -> Prediction:
    """Mean over ``runs`` seeded replays; ``lo`` and ``hi``: their 5th and 95th percentile."""
    if not lengths:
        raise InputError("lengths", [], "need at least one request")
    rng = random.Random(seed)
    acc = [replay_once(lengths, k_of, grid, prefill_s, scale, rng) for _ in range(runs)]
    n = len(acc)
    return Prediction(
        variant,
        sum(a[0] for a in acc) / n,
        sum(a[1] for a in acc) / n,
        sum(a[2] for a in acc) / n,
        sum(a[3] for a in acc) / n,
        percentile([a[0] for a in acc], 0.05),
        percentile([a[0] for a in acc], 0.95),
    )


def variant_schedules(
    table: Mapping[str, Any], grid: Grid, fixed_ks: Sequence[int] | None = None
) -> dict[str, Callable[[int], int]]:
    """Variant name -> K as a function of batch size: vanilla, fixed-K (every K of the grid, or
    ``fixed_ks``), dsd and adaptive (the table's ranges)."""
    from dsdprof.formats.ktable import k_for_batch_size

    ranges = [list(r) for r in table["ranges"]]
    out: dict[str, Callable[[int], int]] = {"vanilla": lambda b: 0}
    for k in fixed_ks if fixed_ks is not None else [k for k in grid.ks if k > 0]:
        out[f"fixed-{k}"] = (lambda kk: lambda b: kk)(k)
    out["dsd"] = lambda b: k_for_batch_size(ranges, b)
    out["adaptive"] = out["dsd"]
    return out


def predict_all(
    table: Mapping[str, Any],
    lengths: Sequence[int],
    prefill_s: float | None = None,
    scale: float = 1.0,
    runs: int = 200,
    seed: int = 0,
    fixed_ks: Sequence[int] | None = None,
    model: FittedModel | None = None,
) -> list[Prediction]:
    """Every variant's prediction for ``lengths``; ``prefill_s`` None: one vanilla step at batch N
    (with ``model``: the variant's fitted prefill). ``model``: step seconds, prefill and acceptance
    fitted on a measured run instead of the table's grid (its variants' fixed K by default)."""
    grid = grid_from_table(table)
    if model is not None and fixed_ks is None:
        fixed_ks = sorted(int(v.split("-")[1]) for v in model.variants() if v.startswith("fixed-"))
    out = []
    for name, k_of in variant_schedules(table, grid, fixed_ks).items():
        eng: StepGrid = grid if model is None else model.engine(name)
        if model is not None:
            k_of = model.schedule(name, k_of)
        if prefill_s is not None:
            pre = prefill_s
        elif model is not None:
            pre = model.prefill_s(name, len(lengths)) * scale
        else:
            pre = grid.itl(len(lengths), 0) * scale
        out.append(predict(lengths, k_of, eng, pre, name, scale, runs, seed))
    return out


def best_fixed_k(predictions: Sequence[Prediction]) -> int:
    """The fixed K with the smallest predicted makespan."""
    fixed = [p for p in predictions if p.variant.startswith("fixed-")]
    if not fixed:
        raise InputError("fixed_ks", [], "no fixed K predicted")
    return int(min(fixed, key=lambda p: p.makespan_s).variant.split("-", 1)[1])
