"""Live statistics behind :class:`dsdprof.serve.adaptive.AdaptiveKSelector`. Stdlib only.

* :func:`check_counts` / :func:`check_seconds`: a step's counts and time are checked before
  anything changes; anything else is ignored and counted, nothing on this path raises.
* :class:`AcceptanceStats`: one standardized ratio per draft position, against the profile of
  the batch size the step ran at, decayed by drafts, shrunk toward the shallower position, with a
  two-sided CUSUM per position that detects shifts both ways.
* :class:`StepTimes`: per profiled (batch size, K) the observed step time with the table as
  prior, a scale-and-slope fit in K per batch size, K effects shared across batch sizes
  (:meth:`StepTimes._k_effects`), the machine factor (a slowdown common to every K is the
  machine's, not a K's: step times are compared within the same time window, as ratios), the
  step-to-step noise (:meth:`StepTimes.noise_sd`) and when each cell was last timed (``tick``).

The estimators, their constants below and the runs that set them: docs/adaptive.md ("The math").
"""


from __future__ import annotations

import math
from collections.abc import Sequence
from operator import index as _index
from typing import Any, TypeGuard

MAX_DRAFTS_PER_STEP = 1 << 24
MAX_STEP_S = 3600.0
MAX_POSITIONS = 128  # dsdprof.formats.schema.MAX_K: longer per-position lists are refused unread
Q_FLOOR = 1e-3  # conditional profile below this is treated as this when standardizing
DETECT_Z = 5.0  # CUSUM threshold, in standard errors of the run's expected acceptances
# ratio drift per expected acceptance the CUSUM tolerates (shifts < ~0.05 are not "shifts")
DETECT_SLACK = 0.025
DETECT_MIN_EVIDENCE = 8.0  # expected acceptances in a run before it may count as a shift
RESET_WEIGHT = 32.0  # expected acceptances the evidence keeps after a detected shift
STEP_CAP_FRACTION = 1.0 / 8.0  # one step counts as at most half_life / 8 drafts
STEP_CLIP = 4.0
# steps of evidence: shared, batch size, K, K smoothness (StepTimes._k_effects)
K_EFFECT_RIDGE = (0.25, 16.0, 8.0, 8.0)
K_EFFECT_ROUNDS = 6
MACHINE_HALF_LIFE = 8.0  # served steps: the machine factor follows a common slowdown in ~this many
MACHINE_MIN_STEPS = 4.0  # a served cell's own mean counts as its level once it holds this many steps
MACHINE_STEP = 0.5  # one step moves the machine factor by at most this much log residual (a spike)
SIDE_HALF_LIFE = 32.0  # engine steps between two cells' last timings that halve their contrast's evidence


def _count(x: Any) -> int:
    if type(x) is int:
        return x
    if isinstance(x, bool):
        raise TypeError
    return _index(x)  # numpy integers; floats, str, None raise TypeError


def check_counts(num_drafts: Any, accepted: Any, drafted: Any) -> bool:
    """True when one step's counts are a valid chain (module docstring); never raises."""
    try:
        n = _count(num_drafts)
        if (not 0 < n <= MAX_DRAFTS_PER_STEP or not isinstance(accepted, (list, tuple))
                or not 0 < len(accepted) <= MAX_POSITIONS):
            return False
        if drafted is not None and (not isinstance(drafted, (list, tuple)) or len(drafted) != len(accepted)):
            return False
        prev_a = prev_d = n
        for i, a in enumerate(accepted):
            a = _count(a)
            if drafted is not None:
                d = _count(drafted[i])
                if not 0 <= d <= prev_d:
                    return False
                prev_d = d
            if not 0 <= a <= prev_a or a > prev_d:
                return False
            prev_a = a
        return True
    except (TypeError, ValueError, OverflowError):
        return False


def check_seconds(seconds: Any) -> TypeGuard[float]:
    return (type(seconds) is float or (isinstance(seconds, (int, float)) and not isinstance(seconds, bool))) \
        and 0.0 < seconds <= MAX_STEP_S  # NaN fails both comparisons


class AcceptanceStats:
    """Per-position standardized acceptance ratios (module docstring)."""

    __slots__ = ("depth", "half_life", "prior_weight", "cap", "S", "E", "cusum", "resets")

    def __init__(self, depth: int, half_life: float, prior_weight: float) -> None:
        self.depth, self.half_life, self.prior_weight = depth, half_life, prior_weight
        self.cap = half_life * STEP_CAP_FRACTION
        self.S, self.E = [0.0] * depth, [0.0] * depth
        # per position: [down statistic, its successes, its expectation, up statistic, successes, expectation]
        self.cusum = [[0.0] * 6 for _ in range(depth)]
        self.resets = 0

    def update(self, n: int, accepted: Sequence[int], drafted: Sequence[int] | None,
               q0: Sequence[float]) -> bool:
        """Add one checked step (``q0``: floored conditional profile of its batch size).
        Returns True when a shift was detected (the evidence was reset to the post-shift part)."""
        S, E, w = self.S, self.E, self.prior_weight
        cap = min(self.cap, w + E[0])  # one step weighs at most what the estimate already holds
        scale = 1.0 if n <= cap else cap / n
        d = 0.5 ** (n * scale / self.half_life)
        for i in range(self.depth):
            S[i] *= d
            E[i] *= d
        prev_a = prev_d = float(n)
        r = 1.0
        for i in range(min(len(accepted), self.depth)):
            a = float(accepted[i])
            if drafted is None:
                x = prev_a
            else:
                dr = float(drafted[i])
                x = prev_a * dr / prev_d if prev_d > 0 else 0.0
                prev_d = dr
            if x <= 0:
                break
            e, s = x * q0[i] * scale, a * scale
            r = (S[i] + w * r) / (E[i] + w)  # the estimate before this step
            S[i] += s
            E[i] += e
            prev_a = a
            c = self.cusum[i]
            slack = DETECT_SLACK * e
            clip = 2.0 * math.sqrt(max(r, 0.05) * e) + 1.0  # one step moves the statistic <= ~2 sd
            for j, excess in ((0, r * e - s - slack), (3, s - r * e - slack)):  # down, up
                g = c[j] + (excess if excess < clip else clip)
                if g <= 0.0:
                    c[j] = c[j + 1] = c[j + 2] = 0.0
                    continue
                c[j], c[j + 1], c[j + 2] = g, c[j + 1] + s, c[j + 2] + e
                run_e = c[j + 2]
                if run_e >= DETECT_MIN_EVIDENCE and g * g > DETECT_Z * DETECT_Z * max(r, 0.05) * run_e:
                    self._reset(i, c[j + 1], run_e)
                    return True
        return False

    def _reset(self, i: int, s: float, e: float) -> None:
        """A shift at position i: keep only its evidence since the shift began, at a weight of at most
        ``RESET_WEIGHT`` (the run may include a few steps from before the shift); forget deeper ones."""
        c = min(1.0, RESET_WEIGHT / e)
        self.S[i], self.E[i] = s * c, e * c
        for j in range(i + 1, self.depth):
            self.S[j] = self.E[j] = 0.0
        for j in range(i, self.depth):
            self.cusum[j] = [0.0] * 6
        self.resets += 1

    def ratios(self) -> list[float]:
        """r_1..r_depth: live / profiled conditional acceptance, each shrunk toward the one before."""
        out, prev, w = [], 1.0, self.prior_weight
        for s, e in zip(self.S, self.E):
            prev = (s + w * prev) / (e + w)
            out.append(prev)
        return out

    def intervals(self, z: float = 1.96) -> list[tuple[float, float]]:
        """Approximate (lo, hi) of each ratio (Poisson standard error on its evidence + prior)."""
        return [(max(0.0, r - z * math.sqrt(r / (e + self.prior_weight))),
                 r + z * math.sqrt(r / (e + self.prior_weight))) for r, e in zip(self.ratios(), self.E)]


class StepTimes:
    """Live step time per (profiled batch size, K) with the table as prior (module docstring)."""

    __slots__ = ("table", "n", "s", "est", "decay", "prior_weight", "slope_weight", "cell_weight", "scales",
                 "noise", "fits", "pooled", "dirty", "k_effect", "ks", "near", "machine", "machine_rate",
                 "tick", "last", "seen")

    def __init__(self, table: list[dict[int, float]], half_life: float, prior_weight: float = 2.0,
                 slope_weight: float = 0.25, cell_weight: float = 1.0) -> None:
        self.table = table
        self.n = [dict.fromkeys(t, 0.0) for t in table]
        self.s = [dict.fromkeys(t, 0.0) for t in table]
        self.est = [dict(t) for t in table]
        self.decay = 0.5 ** (1.0 / half_life)
        self.prior_weight, self.slope_weight, self.cell_weight = prior_weight, slope_weight, cell_weight
        self.scales = [0.0] * len(table)
        self.noise = [[0.0, 0.0] for _ in table]  # decayed (weight, sum of squared log residuals)
        self.fits = [(0.0, 0.0)] * len(table)  # (alpha, weight) of each bucket's last fit
        self.pooled = 0.0
        self.ks = sorted({k for t in table for k in t})
        self.k_effect = dict.fromkeys(self.ks, 0.0)  # d_K: log(live / table) shared by every batch size
        # each speculative K's speculative neighbours (the smoothing in _k_effects); none for K=0
        ks = self.ks
        self.near = {k: [ks[j] for j in (i - 1, i + 1) if k >= 1 and 0 <= j < len(ks) and ks[j] >= 1]
                     for i, k in enumerate(ks)}
        self.dirty = set(range(len(table)))
        self.machine = 0.0  # log of the machine factor: what every K's steps share right now
        self.machine_rate = 1.0 - 0.5 ** (1.0 / MACHINE_HALF_LIFE)
        self.tick = 0  # engine steps seen at any batch size (the selector counts the untimed ones too)
        self.last = [dict.fromkeys(t, 0) for t in table]  # the tick each cell was last timed at
        self.seen: tuple[int, dict[int, tuple[float, int]]] = (-1, {})  # everywhere()'s, at its tick

    def update(self, bucket: int, k: int, seconds: float, served: bool = True) -> bool:
        """One pure step (verified and drafted ``k``) of ``seconds`` at ``bucket``; False if no such cell.
        ``served``: ``k`` is the K served at ``bucket`` (not a probe); only such steps move the machine
        factor, and every step enters the cell divided by the factor of its time (module docstring)."""
        n, s = self.n[bucket], self.s[bucket]
        if k not in n:
            return False
        est = self.est[bucket][k]
        if served and n[k] > MACHINE_MIN_STEPS:  # the served K's step against its own mean: the machine now
            resid = math.log(seconds * n[k] / s[k]) - self.machine
            self.machine += self.machine_rate * max(-MACHINE_STEP, min(MACHINE_STEP, resid))
        seconds /= math.exp(self.machine)  # the step as on the machine the estimates are in
        seconds = min(max(seconds, est / STEP_CLIP), est * STEP_CLIP)
        d = self.decay
        noise = self.noise[bucket]
        if n[k] > 4.0:  # the residual against the cell's own mean: the step-to-step noise (against the
            resid = math.log(seconds * n[k] / s[k])  # estimate, a table far off read as noise)
            noise[0] = noise[0] * d + 1.0
            noise[1] = noise[1] * d + resid * resid
        for kk in n:
            n[kk] *= d
            s[kk] *= d
        n[k] += 1.0
        s[k] += seconds
        self.tick += 1
        self.last[bucket][k] = self.tick
        self.dirty.add(bucket)
        return True

    def everywhere(self) -> dict[int, tuple[float, int]]:
        """K -> (its decayed step count summed over the batch sizes, the tick it was last timed at
        anywhere): the evidence a K effect rests on. Computed once per tick (a rebuild's buckets)."""
        if self.seen[0] != self.tick:
            out: dict[int, tuple[float, int]] = {}
            for n, last in zip(self.n, self.last):
                for k, w in n.items():
                    w0, t0 = out.get(k, (0.0, 0))
                    out[k] = (w0 + w, max(t0, last[k]))
            self.seen = (self.tick, out)
        return self.seen[1]

    def noise_sd(self, bucket: int) -> float:
        """Step-to-step relative noise of the step times seen at this bucket (0 until settled);
        an estimate's relative standard error is about this over sqrt(1 + its cell's weight)."""
        w, ss = self.noise[bucket]
        return math.sqrt(ss / w) if w > 2.0 else 0.0

    def refit(self) -> None:
        """Re-derive the estimates of the buckets observed since the last refit (all of them when the
        pooled scale, the prior of every bucket's scale, or a K effect moved)."""
        if self.dirty and self._k_effects():
            self.dirty = set(range(len(self.table)))
        while self.dirty:
            dirty, self.dirty = self.dirty, set()
            for b in dirty:
                self._estimate(b)
            num = sum(w * a for a, w in self.fits)
            pooled = num / (sum(w for _, w in self.fits) + self.prior_weight)
            if abs(pooled - self.pooled) > 1e-3:
                self.pooled = pooled
                self.dirty = set(range(len(self.table)))

    def _k_effects(self) -> bool:
        """Fit log(mean observed / table) = A + e_b + d_K over every observed cell (weights: its
        decayed step counts), ridge-regularised, by a few rounds of backfitting: A, the deviation
        every batch size shares (the machine), weakly (``K_EFFECT_RIDGE[0]`` steps); e_b, a batch
        size's own, strongly ([1]); d_K, a K's own, in between ([2]), each d_K (K >= 1) also pulled
        toward its neighbours ([3]). A K seen at one batch size to run off the table, while other
        batch sizes run their own K as profiled, is then mostly that K's (a table whose speculative
        steps are all 2x too slow is corrected at a batch size served K=0); seen alone, mostly the
        machine's. A cell never run at its batch size is its batch size's fit times exp(d_K - the
        mean d of the Ks run there): what the other batch sizes saw of that K. True when some d_K
        moved."""
        ks, (lam_a, lam_e, lam_d, lam_s) = self.ks, K_EFFECT_RIDGE
        cells = [(b, k, w, math.log(self.s[b][k] / w / self.table[b][k]))
                 for b, n in enumerate(self.n) for k, w in n.items() if w > 1e-3]
        if not cells:
            return False
        d = dict(self.k_effect)
        shared, e = 0.0, [0.0] * len(self.table)
        # the weights per batch size and K are the same every round; the shared term's share of the
        # batch sizes' sums is subtracted after the pass that also sums it (two passes a round)
        wsum, w_b, w_k = 0.0, [0.0] * len(e), dict.fromkeys(ks, 0.0)
        for b, k, w, _ in cells:
            wsum += w
            w_b[b] += w
            w_k[k] += w
        for _ in range(K_EFFECT_ROUNDS):
            num, sum_b = 0.0, [0.0] * len(e)
            for b, k, w, y in cells:
                t = w * (y - d[k])
                num += t - w * e[b]
                sum_b[b] += t
            shared = num / (wsum + lam_a)
            e = [(sb - shared * wb) / (wb + lam_e) for sb, wb in zip(sum_b, w_b)]
            num_k = dict.fromkeys(ks, 0.0)
            for b, k, w, y in cells:
                num_k[k] += w * (y - e[b])
            prev = dict(d)
            for k in ks:
                near = self.near[k]
                d[k] = ((num_k[k] - shared * w_k[k] + lam_s * sum(prev[j] for j in near))
                        / (w_k[k] + lam_d + lam_s * len(near)))
        moved = max(abs(d[k] - self.k_effect[k]) for k in ks) > 1e-3
        if moved:
            self.k_effect = d
        return moved

    def _estimate(self, b: int) -> None:
        alpha, beta, kc, weight = self._fit(b, self.pooled)
        self.fits[b] = (alpha, weight)
        self.scales[b] = alpha
        table, n, s, est, d = self.table[b], self.n[b], self.s[b], self.est[b], self.k_effect
        tbar = sum(table.values()) / len(table)
        seen = sum(w for w in n.values() if w > 1e-3)
        d_seen = sum(w * d[k] for k, w in n.items() if w > 1e-3) / seen if seen else 0.0
        for k, t in table.items():
            pred = max(t * (1.0 + alpha) + beta * tbar * (k - kc), 0.25 * t * max(1.0 + alpha, 0.05))
            nk = n[k]
            if nk > 1e-3:
                est[k] = (s[k] + self.cell_weight * pred) / (nk + self.cell_weight)
            else:  # never run here: what the other batch sizes saw of this K against the Ks run here
                est[k] = pred * math.exp(d[k] - d_seen)

    def _fit(self, b: int, alpha0: float) -> tuple[float, float, float, float]:
        """(alpha, beta, Kc, total weight) of the ridge fit at bucket b, alpha shrunk toward alpha0."""
        table, n, s = self.table[b], self.n[b], self.s[b]
        tbar = sum(table.values()) / len(table)
        wsum = sum(n.values())
        if wsum <= 1e-3:
            return alpha0, 0.0, 0.0, 0.0
        kc = sum(w * k for k, w in n.items()) / wsum
        ra, rb = self.prior_weight * tbar * tbar, self.slope_weight * tbar * tbar
        a11, a12, a22, b1, b2 = ra, 0.0, rb, ra * alpha0, 0.0
        for k, w in n.items():
            if w <= 1e-3:
                continue
            x1, x2 = table[k], tbar * (k - kc)
            y = s[k] / w - x1
            a11 += w * x1 * x1
            a12 += w * x1 * x2
            a22 += w * x2 * x2
            b1 += w * x1 * y
            b2 += w * x2 * y
        det = a11 * a22 - a12 * a12
        return (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det, kc, wsum


# ---------------------------------------------------------------- option checks (the selector's settings)

def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}={value!r}: must be a number in [0, 1)")
    return float(value)


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0
                                                                              and math.isfinite(value)):
        raise ValueError(f"{name}={value!r}: must be a finite number > 0")
    return float(value)


def _check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name}={value!r}: must be an integer >= {lo}")
    return value
