"""The K rule with intervals, and the curve's shape.

:func:`decide_batch` applies the K rule of :func:`dsdprof.formats.ktable.choose_k` (here
:func:`rule_index`, the same comparison over arrays) to bootstrap intervals (a
smaller K replaces the best only when the lower end of its goodput ratio clears the tolerance);
:func:`contenders`, :func:`margin` and :func:`regret_bound` say how sure that is; :func:`curve`
and :func:`significant_rise` label K*(batch size) dense-like or MoE-like. The intervals come from
:mod:`dsdprof.decide.bootstrap`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dsdprof.config.defaults import DEFAULT_CONFIDENCE
from dsdprof.decide.bootstrap import BatchReplicates, at_confidence, interval

SHAPE_MOE, SHAPE_DENSE, SHAPE_FLAT = "moe-like", "dense-like", "flat"

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


def decision_confidence(confidence: float, family: int = 1) -> float:
    """The level each batch size is decided at so that ``family`` decisions hold together at
    ``confidence`` (Bonferroni: 1 - (1 - confidence) / family)."""
    return 1.0 - (1.0 - float(confidence)) / max(1, int(family))


def decision_family(reps: dict[int, BatchReplicates]) -> int:
    """How many batch sizes are decided together: those with known, inexact intervals."""
    return max(1, sum(1 for r in reps.values() if r.known and not r.exact))


def rule_index(ratio: np.ndarray, tolerance: float) -> np.ndarray:
    """Per row of goodput ratios to that row's best K: index of the rule's K (smallest K within
    ``tolerance`` of the best)."""
    return np.argmax(ratio >= 1.0 - tolerance - 1e-12, axis=-1)


def point_rule(ks: list[int], ratio: dict[int, float], tolerance: float) -> int:
    """The K rule on point estimates (:func:`dsdprof.formats.ktable.choose_k` on goodput ratios to
    the best; ``ks`` ascending): :func:`rule_index` on one row."""
    return ks[int(rule_index(np.array([ratio[k] for k in ks]), tolerance))]


def _to_best(g: np.ndarray) -> np.ndarray:
    """Per replicate, goodput of each K / the best K's goodput in that replicate."""
    return g / g.max(axis=1, keepdims=True)


def _replicate_goodput(rep: BatchReplicates) -> np.ndarray:
    """The replicates' goodput (replicates x Ks); the caller checked ``rep.known``."""
    g = rep.goodput
    if g is None:
        raise ValueError(f"batch size {rep.batch_size}: bootstrap intervals are unknown")
    return g


def decide_batch(rep: BatchReplicates, tolerance: float, confidence: float, family: int = 1) -> Decision:
    """The rule at one batch size, applied inside every bootstrap replicate (module docstring of
    :mod:`dsdprof.decide.bootstrap`). ``family``: the number of batch sizes decided together;
    ``decided`` and ``admissible`` hold at ``confidence`` over all of them (Bonferroni)."""
    ks = [int(k) for k in rep.ks]
    g = rep.point_goodput
    best = int(np.argmax(g))  # first maximum: ties go to the smaller K
    ratio = {k: float(g[i] / g[best]) for i, k in enumerate(ks)}
    floor = 1.0 - tolerance
    if not rep.known:
        k = point_rule(ks, ratio, tolerance)
        return Decision(rep.batch_size, k, ks[best], tuple(ks), False, False, ratio)
    if rep.exact:
        k = point_rule(ks, ratio, tolerance)
        return Decision(rep.batch_size, k, ks[best], (k,), True, True, ratio, dict(ratio), dict(ratio))
    lo, hi = interval(_to_best(_replicate_goodput(rep)), confidence)
    chosen = min((i for i in range(best) if lo[i] >= floor - 1e-12), default=best)
    level = decision_confidence(confidence, family)
    picks = rule_index(_to_best(_replicate_goodput(at_confidence(rep, level))), tolerance)
    share = np.bincount(picks, minlength=len(ks)) / picks.size
    admissible, left = {ks[chosen]}, 1.0 - share[chosen]
    for i in sorted((i for i in range(len(ks)) if i != chosen), key=lambda i: -share[i]):
        if left <= (1.0 - level) / 2.0 + 1e-12:
            break
        admissible.add(ks[i])
        left -= share[i]
    return Decision(rep.batch_size, ks[chosen], ks[best], tuple(sorted(admissible)), len(admissible) == 1,
                    True, ratio, {k: float(lo[i]) for i, k in enumerate(ks)},
                    {k: float(min(hi[i], 1.0)) for i, k in enumerate(ks)})


def regret_bound(rep: BatchReplicates, k: int, confidence: float, family: int = 1) -> float:
    """Upper confidence bound of K's shortfall against the best K: 1 - lo(g_k / max_j g_j), the
    best taken inside each replicate, at the level of :func:`decision_confidence` (0 when K is
    confidently the best; NaN when intervals are unknown)."""
    ks = [int(x) for x in rep.ks]
    if not rep.known or len(ks) < 2:
        return math.nan if not rep.known else 0.0
    i = ks.index(k)
    if rep.exact:
        g = rep.point_goodput
        return max(0.0, 1.0 - float(g[i] / g.max()))
    level = decision_confidence(confidence, family)
    lo = interval(_to_best(_replicate_goodput(at_confidence(rep, level)))[:, i], level)[0]
    return max(0.0, 1.0 - float(lo))


def contenders(rep: BatchReplicates, d: Decision, tolerance: float, confidence: float,
               family: int = 1) -> tuple[int, ...]:
    """The Ks more data could still make the answer at this batch size: the admissible K*, the
    best K, and every K the chosen one is not confidently within tolerance of (at the level of
    :func:`decision_confidence`). All Ks when the intervals are unknown."""
    ks = [int(x) for x in rep.ks]
    if not rep.known:
        return tuple(ks)
    out = set(d.admissible) | {d.best_k, d.k}
    level = decision_confidence(confidence, family)
    at_level = at_confidence(rep, level)
    for k in ks:  # K* not confidently within tolerance of k
        if k != d.k and _ratio_interval(at_level, d.k, k, level)[0] < 1.0 - tolerance - 1e-12:
            out.add(k)
    return tuple(sorted(out))


def margin(rep: BatchReplicates, k: int, confidence: float) -> tuple[int | None, float, float, float]:
    """(runner-up K, goodput(k) / goodput(runner-up), its interval) with the runner-up the best
    other K by point goodput; NaN interval when unknown."""
    ks = [int(x) for x in rep.ks]
    if len(ks) < 2:
        return None, math.nan, math.nan, math.nan
    i = ks.index(k)
    g = rep.point_goodput
    others = [j for j in range(len(ks)) if j != i]
    j = max(others, key=lambda jj: (g[jj], -ks[jj]))
    return ks[j], float(g[i] / g[j]), *_ratio_interval(rep, k, ks[j], confidence)


# ----------------------------------------------------------------------------- the curve

def fewest_rises_path(options: Sequence[dict[int, tuple[float, ...]]],
                      rises_first: bool = True) -> tuple[int, list[int]]:
    """One K per position, K from ``options[i]`` (K -> cost tuple). Minimises, lexicographically,
    (rises, summed cost) with ``rises_first``, else (summed cost[0], rises, summed cost[1:]);
    a rise is a position where K goes up. Returns (rises, Ks)."""
    def key(acc: tuple[float, ...]) -> tuple[float, ...]:
        return acc if rises_first else (acc[1], acc[0], *acc[2:])

    layers: list[dict[int, tuple[tuple[float, ...], int | None]]] = []
    for i, opts in enumerate(options):
        layer: dict[int, tuple[tuple[float, ...], int | None]] = {}
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
        parent = layer[k][1]
        assert parent is not None  # every layer after the first names its parent
        k = parent
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
    g = _replicate_goodput(rep)
    lo, hi = interval(g[:, i] / g[:, j], confidence)
    return float(lo), float(hi)


def significant_rise(decisions: Sequence[Decision], reps: dict[int, BatchReplicates] | None,
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
          reps: dict[int, BatchReplicates] | None = None,
          confidence: float = DEFAULT_CONFIDENCE) -> tuple[str, list[int]]:
    """(shape, K per batch size) from per-batch-size decisions in ascending batch size."""
    floor = 1.0 - tolerance
    # Unknown intervals are not noise: such a point keeps its point rule's K (never forced monotone).
    options: list[dict[int, tuple[float, ...]]] = [
        {k: (max(0.0, floor - d.ratio[k]), float(k != d.k), 1.0 - d.ratio[k], float(k))
         for k in (d.admissible if d.known else (d.k,))} for d in decisions]
    rises, path = fewest_rises_path(options)
    if not rises and not significant_rise(decisions, reps, confidence, tolerance):
        return (SHAPE_FLAT if len(set(path)) == 1 else SHAPE_DENSE), path
    return SHAPE_MOE, fewest_rises_path(options, rises_first=False)[1]

