"""Decisions with known confidence: bootstrap intervals, the K rule, the curve's shape.

Pure functions over numpy arrays and DataFrames (no I/O). :func:`dsdprof.decide.analysis.analyze` calls
them; :mod:`dsdprof.jobs.budget` uses them to decide where more waves are worth it.

**Samples.** A candidate cell (one batch size, one K) has one row per repeat. A row's wave samples
are its ``sample_acceptance_length`` / ``sample_itl_s`` lists (schema v2: one value per measured
wave); a row without them (v1, or any Parquet with just the contract columns) is one sample.

**Bootstrap** (ratio of means). The point estimate of a cell is mean AL / mean ITL over its
repeats. Each replicate resamples, per cell, with replacement, at the level the data support:

* the **waves**, pooled over the cell's repeats, when a one-way F test on the log wave values
  finds no difference between the repeats beyond their waves' noise (p >= 0.25), or when there is
  a single repeat (AL and ITL of a wave stay paired);
* else the **repeats** (their row values; v1 rows and contract-only Parquet always take this path).

A cell's replicate is its point scaled by (resampled mean / sample mean) of AL and of ITL. Resampling
both levels at once would count the wave noise twice (it is already in the repeats' means), and a
percentile bootstrap of a few samples is too narrow: each cell's replicate deviations (in log) are
widened by ``t_{n-1}(q) / z(q) * sqrt(n / (n-1))`` for its ``n`` resampled samples, so that its
interval is a small-sample t interval (3 repeats: x2.2; 20 waves: x1.08). Random numbers come from
``numpy.random.default_rng((seed, batch_size))``, so a batch size's intervals do not depend on the
other batch sizes' data.

A cell with a single sample (one repeat, at most one wave) has no interval: the batch size's
intervals are then *unknown* and nothing there is called decided. Rows from the analytic engine
(``engine = "sim"``) are deterministic predictions: their intervals are exact (zero width).

**Rule** at one batch size, with ``r_k`` = goodput(K) / goodput(best K) per replicate and
``[lo, hi]`` its central ``confidence`` interval: start from the best K (highest point goodput);
the chosen K is the smallest K with ``lo_k >= 1 - tolerance`` (the best K always qualifies).
The K* the data still allow (``admissible``) are the chosen K, every smaller K with
``hi_k >= 1 - tolerance`` (it may be within tolerance) and every larger K against which the
chosen one is not confidently within tolerance (``lo(g_chosen / g_k) < 1 - tolerance``). The
point is ``decided`` when that set is the chosen K alone. Where intervals are unknown the old point
rule applies (smallest K within tolerance of the best point goodput) and every K is admissible.

**Shape.** The curve is ``moe-like`` only when the rise of K* with batch size exceeds its
intervals: every sequence taking an admissible K at every batch size rises somewhere, or, pairwise,
for some b1 < b2 with rule K k1 < k2, k1 beats k2 by more than the tolerance at b1 and k2 beats k1
by more than the tolerance at b2, at the stated confidence. Otherwise the exported K is the
non-increasing admissible sequence with the least point regret beyond tolerance, then the fewest
points changed from the rule's choice, then the least point regret, then the smallest K (decided
points never change): ``flat`` when that is one K, else ``dense-like``. Where a curve's decisions
are not separable, the exported K does not rise with batch size. A moe-like curve keeps the rule's
K except where an admissible K removes a rise at no point regret beyond tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from dsdprof.config.defaults import DEFAULT_CONFIDENCE, DEFAULT_REPLICATES, DEFAULT_SEED  # noqa: F401 - re-exported
from dsdprof.errors import InputError

SAMPLE_COLUMNS = ("sample_acceptance_length", "sample_itl_s")

SHAPE_MOE, SHAPE_DENSE, SHAPE_FLAT = "moe-like", "dense-like", "flat"


def check_confidence(confidence: float) -> float:
    if not (0.5 <= confidence < 1.0) or math.isnan(confidence):
        raise InputError("confidence", confidence, "must be in [0.5, 1)")
    return float(confidence)


# ----------------------------------------------------------------------------- samples

def _sample_list(value: object, field_name: str) -> Optional[np.ndarray]:
    """A row's wave samples as a float array, or None when the row has none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        arr = np.asarray(value, dtype="float64").ravel()
    except (TypeError, ValueError):
        raise InputError(field_name, value, "must be a list of numbers") from None
    if arr.size == 0:
        return None
    if not np.isfinite(arr).all():
        raise InputError(field_name, value, "must hold finite numbers")
    return arr


def row_samples(rows: pd.DataFrame) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row, (AL wave samples, ITL wave samples); the row's own values when it has none."""
    al_col, itl_col = rows["acceptance_length"].to_list(), rows["itl_s"].to_list()
    has = all(c in rows.columns for c in SAMPLE_COLUMNS)
    s_al_col = rows[SAMPLE_COLUMNS[0]].to_list() if has else [None] * len(rows)
    s_itl_col = rows[SAMPLE_COLUMNS[1]].to_list() if has else [None] * len(rows)
    out = []
    for al, itl, raw_al, raw_itl in zip(al_col, itl_col, s_al_col, s_itl_col):
        s_al = _sample_list(raw_al, SAMPLE_COLUMNS[0])
        s_itl = _sample_list(raw_itl, SAMPLE_COLUMNS[1])
        if s_al is None or s_itl is None:
            out.append((np.array([float(al)]), np.array([float(itl)])))
            continue
        if s_al.size != s_itl.size:
            raise InputError(SAMPLE_COLUMNS[1], s_itl.size, f"needs one value per wave like {SAMPLE_COLUMNS[0]} ({s_al.size})")
        if (s_itl <= 0).any():
            raise InputError(SAMPLE_COLUMNS[1], s_itl.tolist(), "wave ITL must be > 0")
        if (s_al < 1.0 - 1e-9).any():
            raise InputError(SAMPLE_COLUMNS[0], s_al.tolist(), "wave AL must be >= 1")
        out.append((s_al, s_itl))
    return out


@dataclass(frozen=True)
class BatchReplicates:
    """Bootstrap of one batch size: ``ks`` candidate Ks, point AL/ITL per K, replicate matrices
    ``al`` and ``itl`` (replicates x Ks; None when the intervals are unknown)."""

    batch_size: int
    ks: np.ndarray
    point_al: np.ndarray
    point_itl: np.ndarray
    al: Optional[np.ndarray]
    itl: Optional[np.ndarray]
    exact: bool = False

    @property
    def known(self) -> bool:
        return self.al is not None

    @property
    def point_goodput(self) -> np.ndarray:
        return self.point_al / self.point_itl

    @property
    def goodput(self) -> Optional[np.ndarray]:
        return None if self.al is None else self.al / self.itl


POOL_P_VALUE = 0.25  # pool a cell's waves across repeats unless repeats differ at this level (F test)


def _repeats_differ(units: Sequence[tuple[float, float, np.ndarray, np.ndarray]]) -> bool:
    """One-way F test on log wave values (ITL, and AL where it varies): do the repeats' means differ
    by more than their waves' noise explains (p < :data:`POOL_P_VALUE`)?"""
    from scipy.stats import f as f_dist

    for j in (3, 2):
        groups = [np.log(u[j]) for u in units]
        n, r = sum(g.size for g in groups), len(groups)
        grand = np.concatenate(groups).mean()
        ms_b = sum(g.size * (g.mean() - grand) ** 2 for g in groups) / (r - 1)
        ss_w = sum(((g - g.mean()) ** 2).sum() for g in groups)
        if ms_b <= 0:
            continue
        if ss_w <= 0 or f_dist.sf(ms_b / (ss_w / (n - r)), r - 1, n - r) < POOL_P_VALUE:
            return True
    return False


def small_sample_factor(n: int, confidence: float) -> float:
    """Widening of a percentile bootstrap of a mean of ``n`` samples to a t interval: the bootstrap
    variance is (n-1)/n of the usual estimate and its tails are normal, not Student t (n-1 df)."""
    from scipy.stats import norm, t

    q = 1.0 - (1.0 - confidence) / 2.0
    return float(t.ppf(q, n - 1) / norm.ppf(q) * math.sqrt(n / (n - 1)))


def bootstrap_batch(batch_size: int, cells: Sequence[tuple[int, list[tuple[float, float, np.ndarray, np.ndarray]]]],
                    replicates: int = DEFAULT_REPLICATES, seed: int = DEFAULT_SEED,
                    exact: bool = False, confidence: float = DEFAULT_CONFIDENCE) -> BatchReplicates:
    """Bootstrap of one batch size (see the module docstring).

    ``cells``: per K (ascending), the K and its repeats as (row AL, row ITL, AL waves, ITL waves).
    """
    ks = np.array([k for k, _ in cells], dtype=int)
    point_al = np.array([np.mean([u[0] for u in reps]) for _, reps in cells])
    point_itl = np.array([np.mean([u[1] for u in reps]) for _, reps in cells])
    if exact:  # deterministic predictions: the point is the only replicate
        return BatchReplicates(batch_size, ks, point_al, point_itl, point_al[None, :], point_itl[None, :], exact=True)
    s_al, s_itl = [], []  # per cell: the samples its replicates resample
    for _, reps in cells:
        if len(reps) == 1 or (all(u[2].size >= 2 for u in reps) and not _repeats_differ(reps)):
            s_al.append(np.concatenate([u[2] for u in reps]))  # waves (pooled over repeats)
            s_itl.append(np.concatenate([u[3] for u in reps]))
        else:
            s_al.append(np.array([u[0] for u in reps]))  # repeats
            s_itl.append(np.array([u[1] for u in reps]))
    counts = np.array([a.size for a in s_al])
    if (counts < 2).any():
        return BatchReplicates(batch_size, ks, point_al, point_itl, None, None)
    rng = np.random.default_rng((int(seed), int(batch_size)))
    flat_al, flat_itl = np.concatenate(s_al), np.concatenate(s_itl)
    off = np.concatenate([[0], np.cumsum(counts)[:-1]])
    cell_of = np.repeat(np.arange(len(cells)), counts)
    idx = off[cell_of] + (rng.random((int(replicates), flat_al.size)) * counts[cell_of]).astype(np.int64)
    ratio_al = np.add.reduceat(flat_al[idx], off, axis=1) / counts / np.array([a.mean() for a in s_al])
    ratio_itl = np.add.reduceat(flat_itl[idx], off, axis=1) / counts / np.array([a.mean() for a in s_itl])
    widen = np.array([small_sample_factor(int(n), confidence) for n in counts])
    al = point_al * np.exp(widen * np.log(ratio_al))
    itl = point_itl * np.exp(widen * np.log(ratio_itl))
    return BatchReplicates(batch_size, ks, point_al, point_itl, al, itl)


def batch_replicates(candidates: pd.DataFrame, replicates: int = DEFAULT_REPLICATES,
                     seed: int = DEFAULT_SEED, confidence: float = DEFAULT_CONFIDENCE) -> dict[int, BatchReplicates]:
    """:func:`bootstrap_batch` of every batch size's candidate rows (``engine = "sim"`` rows are exact)."""
    rows = candidates.sort_values(["batch_size", "num_spec_tokens", *(["repeat"] if "repeat" in candidates else [])],
                                  kind="stable")
    samples = row_samples(rows)
    exact_rows = (rows["engine"].astype(str) == "sim").to_numpy() if "engine" in rows else np.zeros(len(rows), bool)
    units = [(float(a), float(t), s[0], s[1]) for a, t, s in zip(rows["acceptance_length"], rows["itl_s"], samples)]
    out: dict[int, BatchReplicates] = {}
    keys = list(zip(rows["batch_size"].astype(int), rows["num_spec_tokens"].astype(int)))
    i = 0
    while i < len(keys):
        b = keys[i][0]
        cells: list[tuple[int, list]] = []
        exact = True
        while i < len(keys) and keys[i][0] == b:
            if not cells or cells[-1][0] != keys[i][1]:
                cells.append((keys[i][1], []))
            cells[-1][1].append(units[i])
            exact &= bool(exact_rows[i])
            i += 1
        out[b] = bootstrap_batch(b, cells, replicates, seed, exact=exact, confidence=confidence)
    return out


def interval(samples: np.ndarray, confidence: float, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Central ``confidence`` percentile interval along ``axis``."""
    a = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(samples, [a, 1.0 - a], axis=axis)
    return lo, hi


# ----------------------------------------------------------------------------- the rule

@dataclass(frozen=True)
class Decision:
    """The rule's outcome at one batch size (see the module docstring)."""

    batch_size: int
    k: int
    best_k: int
    admissible: tuple[int, ...]
    decided: bool
    known: bool
    ratio: dict[int, float]  # point goodput / best point goodput
    ratio_low: dict[int, float] = field(default_factory=dict)
    ratio_high: dict[int, float] = field(default_factory=dict)


def decide_batch(rep: BatchReplicates, tolerance: float, confidence: float) -> Decision:
    ks = [int(k) for k in rep.ks]
    g = rep.point_goodput
    best = int(np.argmax(g))  # first maximum: ties go to the smaller K
    ratio = {k: float(g[i] / g[best]) for i, k in enumerate(ks)}
    floor = 1.0 - tolerance
    if not rep.known:
        k = min(kk for kk in ks if ratio[kk] >= floor - 1e-12)
        return Decision(rep.batch_size, k, ks[best], tuple(ks), False, False, ratio)
    reps = rep.goodput
    lo, hi = interval(reps / reps[:, [best]], confidence)
    if rep.exact:
        lo = hi = np.array([ratio[k] for k in ks])
    chosen = min(i for i in range(len(ks)) if lo[i] >= floor - 1e-12)
    admissible = {ks[chosen]}
    for i, k in enumerate(ks):
        if i < chosen and hi[i] >= floor - 1e-12:
            admissible.add(k)
        elif i > chosen:
            vs = reps[:, chosen] / reps[:, i]
            low = float(g[chosen] / g[i]) if rep.exact else float(interval(vs, confidence)[0])
            if low < floor - 1e-12:
                admissible.add(k)
    return Decision(rep.batch_size, ks[chosen], ks[best], tuple(sorted(admissible)), len(admissible) == 1, True,
                    ratio, {k: float(lo[i]) for i, k in enumerate(ks)}, {k: float(hi[i]) for i, k in enumerate(ks)})


def regret_bound(rep: BatchReplicates, k: int, confidence: float) -> float:
    """Upper confidence bound of K's shortfall against any other K: 1 - min_j lo(g_k / g_j)
    (0 when K is confidently at least as good as every other K; NaN when intervals are unknown)."""
    ks = [int(x) for x in rep.ks]
    if not rep.known or len(ks) < 2:
        return math.nan if not rep.known else 0.0
    i = ks.index(k)
    g = rep.point_goodput if rep.exact else rep.goodput
    if rep.exact:
        return max(0.0, 1.0 - min(float(g[i] / g[j]) for j in range(len(ks)) if j != i))
    others = [j for j in range(len(ks)) if j != i]
    lo = interval(g[:, [i]] / g[:, others], confidence)[0]
    return max(0.0, 1.0 - float(np.min(lo)))


def contenders(rep: BatchReplicates, d: Decision, tolerance: float, confidence: float) -> tuple[int, ...]:
    """The Ks more data could still make the answer at this batch size: the admissible K*, the
    best K, and every K the chosen one is not confidently within tolerance of. All Ks when the
    intervals are unknown."""
    ks = [int(x) for x in rep.ks]
    if not rep.known:
        return tuple(ks)
    out = set(d.admissible) | {d.best_k, d.k}
    i = ks.index(d.k)
    g = rep.point_goodput if rep.exact else rep.goodput
    for j, k in enumerate(ks):
        if j == i:
            continue
        low = float(g[i] / g[j]) if rep.exact else float(interval(g[:, i] / g[:, j], confidence)[0])
        if low < 1.0 - tolerance - 1e-12:
            out.add(k)
    return tuple(sorted(out))


def margin(rep: BatchReplicates, k: int, confidence: float) -> tuple[Optional[int], float, float, float]:
    """(runner-up K, goodput(k) / goodput(runner-up), its interval) with the runner-up the best
    other K by point goodput; NaN interval when unknown."""
    ks = [int(x) for x in rep.ks]
    if len(ks) < 2:
        return None, math.nan, math.nan, math.nan
    i = ks.index(k)
    g = rep.point_goodput
    others = [j for j in range(len(ks)) if j != i]
    j = max(others, key=lambda jj: (g[jj], -ks[jj]))
    m = float(g[i] / g[j])
    if not rep.known:
        return ks[j], m, math.nan, math.nan
    if rep.exact:
        return ks[j], m, m, m
    lo, hi = interval(rep.goodput[:, i] / rep.goodput[:, j], confidence)
    return ks[j], m, float(lo), float(hi)


# ----------------------------------------------------------------------------- the curve

def fewest_rises_path(options: Sequence[dict[int, tuple[float, ...]]],
                      rises_first: bool = True) -> tuple[int, list[int]]:
    """One K per position, K from ``options[i]`` (K -> cost tuple). Minimises, lexicographically,
    (rises, summed cost) with ``rises_first``, else (summed cost[0], rises, summed cost[1:]);
    a rise is a position where K goes up. Returns (rises, Ks)."""
    def key(acc: tuple[float, ...]) -> tuple[float, ...]:
        return acc if rises_first else (acc[1], acc[0], *acc[2:])

    layers: list[dict[int, tuple[tuple[float, ...], Optional[int]]]] = []
    for i, opts in enumerate(options):
        layer: dict[int, tuple[tuple[float, ...], Optional[int]]] = {}
        for k, cost in opts.items():
            if i == 0:
                layer[k] = ((0.0, *cost), None)
                continue
            steps = [((float(k > kp) + c[0], *(a + b for a, b in zip(c[1:], cost))), kp)
                     for kp, (c, _) in layers[-1].items()]
            layer[k] = min(steps, key=lambda st: (key(st[0]), st[1]))
        layers.append(layer)
    k = min(layers[-1], key=lambda kk: (key(layers[-1][kk][0]), kk))
    rises = int(layers[-1][k][0][0])
    path = [k]
    for layer in reversed(layers[1:]):
        k = layer[k][1]
        path.append(k)
    return rises, path[::-1]


def _ratio_interval(rep: BatchReplicates, ka: int, kb: int, confidence: float) -> tuple[float, float]:
    """Interval of goodput(ka) / goodput(kb) at one batch size (NaN when unknown)."""
    ks = [int(x) for x in rep.ks]
    if not rep.known or ka not in ks or kb not in ks:
        return math.nan, math.nan
    i, j = ks.index(ka), ks.index(kb)
    if rep.exact:
        r = float(rep.point_goodput[i] / rep.point_goodput[j])
        return r, r
    lo, hi = interval(rep.goodput[:, i] / rep.goodput[:, j], confidence)
    return float(lo), float(hi)


def significant_rise(decisions: Sequence[Decision], reps: Optional[dict[int, BatchReplicates]],
                     confidence: float, tolerance: float) -> bool:
    """A rise of the rule's K that exceeds its intervals pairwise: for some b1 < b2 with rule K
    k1 < k2, k1 beats k2 by more than the tolerance at b1 AND k2 beats k1 by more than the
    tolerance at b2, both at the stated confidence (near-ties flipping by noise do not count)."""
    if not reps:
        return False
    for i, d1 in enumerate(decisions):
        for d2 in decisions[i + 1:]:
            if d1.k >= d2.k:
                continue
            lo1, _ = _ratio_interval(reps[d1.batch_size], d1.k, d2.k, confidence)
            _, hi2 = _ratio_interval(reps[d2.batch_size], d1.k, d2.k, confidence)
            if lo1 > 1.0 + tolerance and hi2 < 1.0 - tolerance:
                return True
    return False


def curve(decisions: Sequence[Decision], tolerance: float,
          reps: Optional[dict[int, BatchReplicates]] = None,
          confidence: float = DEFAULT_CONFIDENCE) -> tuple[str, list[int]]:
    """(shape, K per batch size) from per-batch-size decisions in ascending batch size."""
    floor = 1.0 - tolerance
    options = [{k: (max(0.0, floor - d.ratio[k]), float(k != d.k), 1.0 - d.ratio[k], float(k)) for k in d.admissible}
               for d in decisions]
    rises, path = fewest_rises_path(options)
    if not rises and not significant_rise(decisions, reps, confidence, tolerance):
        return (SHAPE_FLAT if len(set(path)) == 1 else SHAPE_DENSE), path
    return SHAPE_MOE, fewest_rises_path(options, rises_first=False)[1]


def regret(chosen: dict[int, int], truth_goodput: dict[int, dict[int, float]]) -> dict[int, float]:
    """Per batch size, 1 - truth goodput of the chosen K / the best truth goodput there."""
    out = {}
    for b, k in chosen.items():
        g = truth_goodput[b]
        out[b] = 1.0 - g[k] / max(g.values())
    return out
