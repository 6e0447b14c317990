"""Closed-loop simulator for :class:`dsdprof.serve.adaptive.AdaptiveKSelector`. Stdlib only.

An engine at one batch size b, step after step: it asks the selector for K (or the exploration
probe, :meth:`~dsdprof.serve.adaptive.AdaptiveKSelector.explore`), runs the step, and feeds back what
vLLM would report: the acceptance counts of the step's b drafts, drawn from a chain with the true
conditional acceptance of the current phase, and -- when the step verified and drafted the same
K (vLLM verifies in step n the K drafted in step n-1) -- the step's duration: the true step time
at (b, K) with log-normal noise; a step that changes K costs the mean of the two.

The truth is known, so every step's choice can be scored against the best fixed K (vanilla, K=0,
included): :func:`reach_step` (first step from which every served K is within a tolerance of the
best) and :func:`settle_drafts` (drafts until K reaches and keeps a value).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Phase:
    steps: int
    accept: tuple[float, ...]  # true conditional acceptance per position (chain), at least max K long
    slow: float = 1.0  # machine load: every step, whatever its K, takes this times its true time


@dataclass
class SimResult:
    batch_size: int
    ks: list[int] = field(default_factory=list)  # K served each step (the probe's K on probe steps)
    probe: list[bool] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)  # cumulative drafts before each step
    phase_start: list[int] = field(default_factory=list)  # step index where each phase starts
    tokens: float = 0.0
    seconds: float = 0.0


def chain_al(accept: Sequence[float], k: int) -> float:
    """Expected tokens per request per step at K for a chain with conditional acceptance ``accept``."""
    al, p = 1.0, 1.0
    for q in accept[:k]:
        p *= q
        al += p
    return al


def best_fixed(accept: Sequence[float], step_s: dict[int, float]) -> tuple[int, float]:
    """(K, goodput) of the best fixed K among ``step_s``'s Ks (tokens/s per request)."""
    g = {k: chain_al(accept, k) / t for k, t in step_s.items()}
    k = max(g, key=g.get)
    return k, g[k]


def _binomial(rng: random.Random, n: int, q: float) -> int:
    if n <= 0 or q <= 0:
        return 0
    if q >= 1:
        return n
    if n * q * (1 - q) > 25:  # normal approximation for large counts
        return min(n, max(0, round(rng.gauss(n * q, math.sqrt(n * q * (1 - q))))))
    return sum(rng.random() < q for _ in range(n))


def simulate(sel, batch_size: int, phases: Sequence[Phase], step_s: dict[int, float], *,
             seed: int = 0, noise: float = 0.03, max_batch_size: int = 256) -> SimResult:
    """Run ``phases`` at ``batch_size`` through ``sel``; ``step_s``: true seconds per step at each K."""
    rng = random.Random(seed)
    res = SimResult(batch_size)
    b, drafts, k_prev = batch_size, 0, None
    for phase in phases:
        res.phase_start.append(len(res.ks))
        for _ in range(phase.steps):
            probe = sel.explore(max_batch_size)
            k = probe[b] if probe is not None else sel.select(b)
            t = step_s[k] if k_prev in (None, k) else 0.5 * (step_s[k] + step_s[k_prev])
            t *= phase.slow * math.exp(rng.gauss(0.0, noise))
            if k_prev == k:
                sel.observe_step(b, k, t)
            res.ks.append(k)
            res.probe.append(probe is not None)
            res.drafts.append(drafts)
            tokens = b
            if k:
                accepted, prev = [], b
                for q in phase.accept[:k]:
                    prev = _binomial(rng, prev, q)
                    accepted.append(prev)
                tokens += sum(accepted)
                sel.observe(b, accepted, batch_size=b)
                drafts += b
            res.tokens += tokens / b
            res.seconds += t
            k_prev = k
    return res


def served_goodput(res: SimResult, accept: Sequence[float], step_s: dict[int, float], lo: int,
                   hi: int) -> float:
    """Expected tokens/s per request of the Ks served on steps [lo, hi) (probes included)."""
    tokens = sum(chain_al(accept, k) for k in res.ks[lo:hi])
    seconds = sum(step_s[k] for k in res.ks[lo:hi])
    return tokens / seconds


def reach_step(res: SimResult, accept: Sequence[float], step_s: dict[int, float], lo: int, hi: int,
               tolerance: float = 0.02) -> int | None:
    """First step in [lo, hi) from which every non-probe step serves a K within ``tolerance`` of
    the best fixed K (steps counted from ``lo``); None if it never settles there."""
    _, best = best_fixed(accept, step_s)
    ok = {k: chain_al(accept, k) / t >= (1 - tolerance) * best for k, t in step_s.items()}
    first = None
    for i in range(lo, hi):
        if res.probe[i]:
            continue
        if ok[res.ks[i]]:
            if first is None:
                first = i
        else:
            first = None
    return None if first is None else first - lo


def settle_drafts(res: SimResult, lo: int, hi: int, target: int) -> int | None:
    """Drafts from step ``lo`` until the served (non-probe) K is ``target`` and stays so until ``hi``."""
    first = None
    for i in range(lo, hi):
        if res.probe[i]:
            continue
        if res.ks[i] == target:
            if first is None:
                first = i
        else:
            first = None
    return None if first is None else res.drafts[first] - res.drafts[lo]


def synthetic_table(step_s: dict[int, dict[int, float]], accept: Sequence[float],
                    tolerance: float = 0.02) -> dict:
    """A ``dsdprof.ktable/v2`` table profiled at chain acceptance ``accept`` with step times
    ``step_s[b][K]``; K per batch size = the smallest within ``tolerance`` of the best (as dsdprof's)."""
    from dsdprof.formats.ktable import ranges_from_points

    cells, points = [], []
    for b, row in sorted(step_s.items()):
        g = {k: chain_al(accept, k) / t for k, t in row.items()}
        best = max(g.values())
        points.append((b, min(k for k, v in g.items() if v >= best * (1 - tolerance))))
        for k, t in sorted(row.items()):
            p, per_pos = 1.0, []
            for q in accept[:k]:
                p *= q
                per_pos.append(p)
            cells.append({"batch_size": b, "k": k, "itl_s": t, "acceptance_length": chain_al(accept, k),
                          "goodput": g[k], "acceptance_per_pos": per_pos})
    depth = max(k for row in step_s.values() for k in row)
    p, pooled = 1.0, []
    for q in accept[:depth]:
        p *= q
        pooled.append(p)
    return {"schema": "dsdprof.ktable/v2", "num_speculative_tokens": depth, "tolerance": tolerance,
            "ranges": ranges_from_points(points), "points": [{"batch_size": b, "k": k} for b, k in points],
            "cells": cells, "acceptance_per_pos": pooled}


def first_within(res: SimResult, accept: Sequence[float], step_s: dict[int, float], lo: int, hi: int,
                 tolerance: float = 0.02) -> int | None:
    """Drafts from step ``lo`` until the first non-probe step (before ``hi``) that serves a K within
    ``tolerance`` of the best fixed K for ``accept``; None if none does."""
    _, best = best_fixed(accept, step_s)
    for i in range(lo, hi):
        if not res.probe[i] and chain_al(accept, res.ks[i]) / step_s[res.ks[i]] >= (1 - tolerance) * best:
            return res.drafts[i] - res.drafts[lo]
    return None
