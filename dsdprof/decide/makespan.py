"""Replay: a rollout's makespan per variant, predicted from a K table's step-time grid, no engine.

A rollout is its requests' output lengths (from a run's rows, a lengths file, or the batch size
per step of a vanilla rollout, :func:`dsdprof.measure.live_workload.lengths_from_batch_sizes`).
The replay walks the engine step by step as vLLM runs it:

* step 0 is the prefill: every request gets its first token, in ``prefill_s`` seconds (measured:
  the run's vanilla prefill; a file: the option, else one vanilla step at batch size N);
* each later step runs every unfinished request (batch size ``B``) at the K vLLM scheduled for it
  in the step before (its ``dynamic_sd_lookup`` at that step's batch size: K lags the batch by one
  step) and takes ``itl(B, K)`` seconds: the table's cell, linear in log B between measured batch
  sizes, the nearest outside them, times ``scale`` (a machine factor; 1 = the table's machine as
  it was measured);
* each request gains ``1 + accepted`` tokens, accepted drawn from the chain of the cell's per-position
  acceptance (``P(>= j accepted)`` per position, the table's ``acceptance_per_pos``; conditional
  rate ``p_j / p_(j-1)``), capped at its length.

The makespan is the mean over ``runs`` seeded Monte Carlo replays (the tail is set by the last
requests' acceptance luck, which a mean-token replay would shorten). The variants: ``vanilla``
(K = 0), ``fixed-K`` for every K of the grid (the best fixed K of this workload is the smallest),
``dsd`` (the table's schedule) and ``adaptive`` (predicted as the table's schedule: the plugin's
own K changes are not modelled). Pure: plain values in and out.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from dsdprof.errors import InputError


class StepGrid(Protocol):
    """What a replay steps with: the table's :class:`Grid` or a fitted :class:`FittedEngine`."""

    def itl(self, b: int, k: int) -> float: ...

    def conditional(self, b: int, k: int) -> tuple[float, ...]: ...


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
    the table's :class:`Grid` or a variant's :class:`FittedEngine` (the same two methods)."""
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
    from dsdprof.decide.live_stats import tail_time

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
        _quantile(sorted(a[0] for a in acc), 0.05),
        _quantile(sorted(a[0] for a in acc), 0.95),
    )


def _quantile(s: Sequence[float], q: float) -> float:
    x = q * (len(s) - 1)
    i = int(x)
    return s[i] if i + 1 >= len(s) else s[i] + (x - i) * (s[i + 1] - s[i])


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
    model: StepModel | None = None,
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


@dataclass(frozen=True)
class StepSample:
    """One measured decode step: the variant's engine, requests decoding, K drafted, seconds."""

    variant: str
    batch_size: int
    k: int
    seconds: float


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


class StepModel:
    """Step and prefill seconds per variant, fitted on measured rollouts (``dsdprof replay --fit``).

    The table's grid was measured on steady batches, on the machine of the sweep's day, on one engine
    that switches K per step; a rollout's engines step at their own cost. Per (variant, K): seconds =
    a + b * B, least squares (b >= 0) over the median step time at each batch size the variant
    decoded at K; at one batch size, that median times the grid's shape in B; a K the variant never
    served (or a variant not fitted): the grid's time times the median measured / grid ratio of the
    variant's steps (of all steps). Prefill: the median over the variant's rollouts of the prefill
    step, times ``N / fit N`` when the rollout has another number of requests (else vanilla's)."""

    def __init__(self, grid: Grid, samples: Sequence[StepSample], prefill: Mapping[str, Sequence[float]],
                 num_requests: int) -> None:
        self.grid = grid
        self.num_requests = num_requests
        self.prefill = {v: _median(xs) for v, xs in prefill.items() if xs}
        by: dict[tuple[str, int], dict[int, list[float]]] = {}
        ratios: dict[str, list[float]] = {}
        for s in samples:
            by.setdefault((s.variant, s.k), {}).setdefault(s.batch_size, []).append(s.seconds)
            ratios.setdefault(s.variant, []).append(s.seconds / grid.itl(s.batch_size, s.k))
        if not by:
            raise InputError("--fit", "0 steps", "the fitted run has no decode steps")
        self.ratio = {v: _median(r) for v, r in ratios.items()}
        self.ratio_all = _median([x for r in ratios.values() for x in r])
        self.lines = {key: self._line(key[1], pts) for key, pts in by.items()}
        self.reject: dict[str, float] = {}  # per variant: factor on the grid's rejection probabilities

    def _line(self, k: int, pts: Mapping[int, list[float]]) -> tuple[float, float, int, int]:
        """(a, b, smallest B, largest B) over the per-batch-size medians, weighted by steps."""
        xs = sorted(pts)
        ws = [len(pts[b]) for b in xs]
        ys = [_median(pts[b]) for b in xs]
        w = sum(ws)
        mx = sum(wi * x for wi, x in zip(ws, xs)) / w
        my = sum(wi * y for wi, y in zip(ws, ys)) / w
        sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(ws, xs))
        if sxx <= 0:  # one batch size: the grid's shape in B through it
            return my / self.grid.itl(xs[0], k), -1.0, xs[0], xs[0]
        b = max(0.0, sum(wi * (x - mx) * (y - my) for wi, x, y in zip(ws, xs, ys)) / sxx)
        return my - b * mx, b, xs[0], xs[-1]

    def seconds(self, variant: str, b: int, k: int) -> float:
        line = self.lines.get((variant, k))
        if line is None:
            return self.grid.itl(b, k) * self.ratio.get(variant, self.ratio_all)
        a, slope, lo, _ = line
        if slope < 0:  # fitted at one batch size: a is the ratio to the grid there
            return a * self.grid.itl(b, k)
        return max(a + slope * b, 0.5 * (a + slope * lo))

    def engine(self, variant: str, reject: float | None = None) -> FittedEngine:
        """The variant's engine for :func:`predict` (pass it as the grid)."""
        return FittedEngine(self, variant, self.reject.get(variant, 1.0) if reject is None else reject)

    def fit_reject(self, variant: str, k_of: Callable[[int], int],
                   rollouts: Sequence[tuple[Sequence[int], int]], runs: int = 100) -> float:
        """The factor on the grid's per-position rejection probabilities that makes the mean
        predicted decode steps of ``rollouts`` ((lengths, measured decode steps) of ``variant``)
        equal the measured mean (bisection; fewer steps = more accepted). Stored for the variant."""
        want = sum(n for _, n in rollouts) / len(rollouts)

        def steps(r: float) -> float:
            eng = self.engine(variant, r)
            return sum(predict(ls, k_of, eng, 0.0, variant, 1.0, runs, 0).steps
                       for ls, _ in rollouts) / len(rollouts)

        lo, hi = 0.05, 4.0
        for _ in range(14):
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if steps(mid) < want else (lo, mid)
        self.reject[variant] = (lo * hi) ** 0.5
        return self.reject[variant]

    def prefill_s(self, variant: str, num_requests: int) -> float:
        base = self.prefill.get(variant, self.prefill.get("vanilla", 0.0))
        return base * num_requests / self.num_requests if self.num_requests else base

    def variants(self) -> list[str]:
        return sorted({v for v, _ in self.lines})


@dataclass(frozen=True)
class FittedEngine:
    """One variant of a :class:`StepModel`, with a :class:`Grid`'s two methods (for :func:`predict`)."""

    model: StepModel
    variant: str
    reject: float = 1.0

    def itl(self, b: int, k: int) -> float:
        return self.model.seconds(self.variant, b, k)

    def conditional(self, b: int, k: int) -> tuple[float, ...]:
        return tuple(min(1.0, max(0.0, 1.0 - (1.0 - p) * self.reject))
                     for p in self.model.grid.conditional(b, k))
