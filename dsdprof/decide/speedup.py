"""The speedup of a K over the baseline (vanilla, else K=0) with its interval.

:func:`speedup_estimate` returns the point and the central ``confidence`` interval of goodput(K) /
goodput(baseline) at one batch size; ``analyze`` reports it as ``speedup_vs_baseline`` with
``speedup_low``/``speedup_high`` and :mod:`dsdprof.decide.vanilla` turns it into vanilla's gain.
Slow steps weigh alike on both sides: vanilla's waves cannot be winsorized, so the K's side is its
plain mean (with its paired group: the K's winsorized waves x the group's slow-step factor).
``paired`` (rows with ``sample_block``): one draw of wave blocks for vanilla and the K, a t
interval on the blocks (:func:`t_half_width`), its high side widened by :func:`_vanilla_slow_var`;
``independent`` otherwise. Why, and what it measured: docs/measurement.md ("Speedup interval").
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from dsdprof.config.defaults import DEFAULT_CONFIDENCE, DEFAULT_REPLICATES, DEFAULT_SEED
from dsdprof.decide.bootstrap import (
    ROBUST_MIN_WAVES,
    robust_paired,
    row_blocks,
    row_samples,
    small_sample_factor,
)


def _units(rows: pd.DataFrame) -> tuple[list[Any], list[np.ndarray] | None, list[int]]:
    samples = row_samples(rows)
    units = [(float(a), float(t), s[0], s[1])
             for a, t, s in zip(rows["acceptance_length"], rows["itl_s"], samples)]
    repeat = rows["repeat"].astype(int).to_list() if "repeat" in rows else [0] * len(rows)
    return units, row_blocks(rows, samples), repeat


def _block_sums(unit: tuple[Any, ...], blocks: np.ndarray, keep: list[int]) -> np.ndarray:
    """(blocks x 3+): per block in ``keep``, sum of AL waves, sum of ITL waves (columns), waves."""
    itl = unit[3] if unit[3].ndim == 2 else unit[3][:, None]
    return np.array([[unit[2][blocks == j].sum(), *itl[blocks == j].sum(axis=0), float((blocks == j).sum())]
                     for j in keep])


def _paired(ku: list[Any], kb: list[Any], kr: list[int], bu: list[Any], bb: list[Any], br: list[int],
            rng: np.random.Generator, replicates: int, confidence: float,
            slow_var: float = 0.0) -> tuple[float, float, float] | None:
    """(point, low, high) over the blocks both sides share, or None when fewer than 2. ``slow_var``:
    the variance of one vanilla wave's slow-step share (:func:`_vanilla_slow_var`); the high side's
    spread of the log ratio is at least its share's over vanilla's waves in the shared blocks."""
    sums_k, sums_b, strata = [], [], []
    for r in sorted(set(kr)):
        i, j = kr.index(r), br.index(r)
        keep = sorted(set(kb[i].tolist()) & set(bb[j].tolist()))
        if keep:
            sums_k.append(_block_sums(ku[i], kb[i], keep))
            sums_b.append(_block_sums(bu[j], bb[j], keep))
            strata.append(len(keep))
    n = sum(strata)
    if n < 2:
        return None
    # blocks pooled over repeats (not stratified by repeat: with a repeat's 1-2 blocks a stratified
    # draw holds (m - 1) / m of the variance, none at m = 1), as the K intervals pool waves
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=int(replicates)).astype(float)
    sk, sb = np.concatenate(sums_k), np.concatenate(sums_b)

    def ratio(w: np.ndarray) -> np.ndarray:
        gk = (w @ sk[:, 0]) / (w @ sk[:, 1])  # sum AL / sum ITL over the same waves: goodput
        if sk.shape[1] == 5:  # winsorized K: x every K's winsorized / plain ITL (the slow-step factor)
            gk = gk * (w @ sk[:, 3]) / (w @ sk[:, 2])
        gb = (w @ sb[:, 0]) / (w @ sb[:, 1])
        return gk / gb

    point = float(ratio(np.ones(n)))
    dev = np.log(ratio(weights) / point)
    half = t_half_width(dev, n, confidence)
    # the slow steps' spread is the group's (its many waves), not the n blocks': a normal quantile
    high = max(half, NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
               * math.sqrt(slow_var / max(1.0, float(sb[:, -1].sum()))))
    return point, float(point * np.exp(-half)), float(point * np.exp(high))


def t_half_width(dev: np.ndarray, n: int, confidence: float) -> float:
    """Half-width (in log) of a t interval on ``n`` resampled units: Student's t_{n-1} quantile x the
    bootstrap's standard deviation of the log ratio, scaled by sqrt(n / (n - 1)) (the bootstrap's
    variance is (n - 1) / n of the usual estimate). With the few blocks a vanilla row has (one per
    ``len(Ks)`` waves) the percentile bootstrap's tails are a handful of distinct means, too narrow."""
    from scipy.stats import t

    q = 1.0 - (1.0 - confidence) / 2.0
    return float(t.ppf(q, n - 1) * np.std(dev) * math.sqrt(n / (n - 1)))


def _vanilla_slow_var(slow: list[np.ndarray], group: pd.DataFrame, base_rows: pd.DataFrame) -> float:
    """Variance (in log) of one vanilla wave's share of slow steps, from its group. The K side is the
    slow steps' expectation (the group's slow-step factor), vanilla's side the slow steps its few
    waves happened to draw: a rare-event count, often below its mean (none at all in a third of
    batch sizes for 1.1 expected), when its blocks show no spread and the speedup reads low by the
    slow steps' share; above its mean, the slow wave shows in the blocks' spread. So only the
    interval's high side is widened, to at least this spread (:func:`_paired`). A group wave's share
    is log(every K's plain / winsorized ITL); its variance across the group's waves x (the group's
    timed steps per wave / vanilla's, ``steady_steps``: a share's variance falls as 1 / steps; 1
    without them). 0 with fewer than 2 group waves."""
    plain = np.concatenate([x[:, 1] for x in slow])
    wins = np.concatenate([x[:, 2] for x in slow])
    if plain.size < 2:
        return 0.0
    share = np.log(plain / wins)
    steps = 1.0
    if "steady_steps" in group and "steady_steps" in base_rows:
        g_steps = pd.to_numeric(group["steady_steps"], errors="coerce").sum()
        b_steps = pd.to_numeric(base_rows["steady_steps"], errors="coerce").sum()
        b_waves = sum(np.asarray(s[1]).size for s in row_samples(base_rows))
        if g_steps > 0 and b_steps > 0 and b_waves > 0:
            steps = (g_steps / plain.size) / (b_steps / b_waves)
    return float(np.var(share, ddof=1) * steps)


def _slow_steps(group: pd.DataFrame, k: int, kr: list[int]) -> list[np.ndarray] | None:
    """Per repeat in ``kr``: (waves x 3) of K's winsorized ITL waves, and every K's plain and
    winsorized ITL waves summed (:func:`dsdprof.decide.bootstrap.robust_paired` over the group's
    paired rows); None unless every K has one row per repeat with the same waves."""
    units, _, repeats = _units(group)  # once for the group: no frame filtered per K and repeat
    row_ks = [int(x) for x in group["num_spec_tokens"]]
    ks = sorted(set(row_ks))
    out = []
    for r in kr:
        cells = [(kk, [u for u, uk, ur in zip(units, row_ks, repeats) if uk == kk and ur == r]) for kk in ks]
        if any(len(c) != 1 for _, c in cells) or len({c[0][3].size for _, c in cells}) != 1:
            return None
        robust = robust_paired(cells)
        out.append(np.column_stack([robust[ks.index(k)][1][0][3], np.sum([c[0][3] for _, c in cells], axis=0),
                                    np.sum([c[0][3] for _, c in robust], axis=0)]))
    return out


def speedup_estimate(k_rows: pd.DataFrame, base_rows: pd.DataFrame, replicates: int = DEFAULT_REPLICATES,
                     seed: int = DEFAULT_SEED, confidence: float = DEFAULT_CONFIDENCE,
                     group: pd.DataFrame | None = None) -> tuple[float, float, float, str]:
    """(point, low, high, how) of goodput(K) / goodput(baseline) at one batch size (module
    docstring); ``how``: ``paired`` | ``independent``; NaN bounds and ``""`` when either side has
    fewer than 2 units (the point then from the rows' plain means). ``group``: every candidate
    row at that batch size (paired: the K's slow steps read from the whole group)."""
    nan = math.nan
    if k_rows.empty or base_rows.empty:
        return nan, nan, nan, ""
    ku, kb, kr = _units(k_rows)
    bu, bb, br = _units(base_rows)
    rng = np.random.default_rng((int(seed), int(k_rows["batch_size"].iloc[0]), 1))
    if kb is not None and bb is not None and len(set(kr)) == len(kr) and sorted(kr) == sorted(br):
        slow = None
        if group is not None and all(u[3].size >= ROBUST_MIN_WAVES for u in ku):
            slow = _slow_steps(group, int(k_rows["num_spec_tokens"].iloc[0]), kr)
        paired_ku, slow_var = ku, 0.0  # the K winsorized x the group's slow-step factor (module docstring)
        if slow is not None and group is not None:  # (waves x 3 columns: only the paired path reads them)
            paired_ku = [(u[0], u[1], u[2], x) for u, x in zip(ku, slow)]
            slow_var = _vanilla_slow_var(slow, group, base_rows)
        got = _paired(paired_ku, kb, kr, bu, bb, br, rng, replicates, confidence, slow_var)
        if got is not None:
            return (*got, "paired")
    devs: list[np.ndarray | None] = []
    points: list[float] = []
    for units in (ku, bu):
        if len(units) == 1 or all(u[2].size >= 2 for u in units):
            al, itl = np.concatenate([u[2] for u in units]), np.concatenate([u[3] for u in units])
        else:
            al, itl = np.array([u[0] for u in units]), np.array([u[1] for u in units])
        points.append(al.mean() / itl.mean())
        if al.size < 2:
            devs.append(None)
            continue
        idx = (rng.random((int(replicates), al.size)) * al.size).astype(np.int64)
        g = al[idx].mean(axis=1) / itl[idx].mean(axis=1) / points[-1]
        devs.append(small_sample_factor(al.size, confidence) * np.log(g))
    point = float(points[0] / points[1])
    if devs[0] is None or devs[1] is None:
        return point, nan, nan, ""
    q = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(devs[0] - devs[1], [q, 1.0 - q])
    return point, float(point * np.exp(lo)), float(point * np.exp(hi)), "independent"
