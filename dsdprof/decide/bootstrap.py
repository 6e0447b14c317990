"""Decisions with known confidence: bootstrap intervals, the K rule, the curve's shape.

Pure functions over numpy arrays and DataFrames (no I/O). :func:`dsdprof.decide.analysis.analyze` calls
them; :mod:`dsdprof.jobs.budget` uses them to decide where more waves are worth it. The method, why
each step is there and how it was measured: docs/decisions.md ("Samples and intervals", "The rule",
"The curve's shape"). In short: a cell's samples are its rows' waves (schema v2), else its rows;
heavy-tailed waves are winsorized first (:func:`robust_units`, per wave block for paired rows
:func:`robust_paired`), a row's ITL is the mean of its wave samples (one estimator for the point
and the replicates); each replicate resamples a cell's waves (pooled over repeats unless an F test
says the repeats differ) or its repeats, widened to a small-sample t interval
(:func:`small_sample_factor`) and by :func:`huber_factor`, with paired waves drawn as blocks.
Random numbers come from ``numpy.random.default_rng((seed, batch_size))``. A single-sample cell
has no interval (*unknown*); ``engine = "sim"`` rows are exact. The rule runs inside each
replicate at a Bonferroni level over the batch sizes with known intervals (:func:`at_confidence`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from dsdprof.config.defaults import DEFAULT_CONFIDENCE, DEFAULT_REPLICATES, DEFAULT_SEED
from dsdprof.errors import InputError

SAMPLE_COLUMNS = ("sample_acceptance_length", "sample_itl_s")


def check_confidence(confidence: float) -> float:
    if not (0.5 <= confidence < 1.0) or math.isnan(confidence):
        raise InputError("confidence", confidence, "must be in [0.5, 1)")
    return float(confidence)


# ----------------------------------------------------------------------------- samples

def _sample_list(value: object, field_name: str) -> np.ndarray | None:
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
            raise InputError(SAMPLE_COLUMNS[1], s_itl.size,
                             f"needs one value per wave like {SAMPLE_COLUMNS[0]} ({s_al.size})")
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
    al: np.ndarray | None
    itl: np.ndarray | None
    exact: bool = False
    counts: np.ndarray | None = None  # per K: samples each replicate resampled (for :func:`at_confidence`)
    confidence: float = DEFAULT_CONFIDENCE  # the level the replicates were widened for

    @property
    def known(self) -> bool:
        return self.al is not None

    @property
    def point_goodput(self) -> np.ndarray:
        return self.point_al / self.point_itl

    @property
    def goodput(self) -> np.ndarray | None:
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


ROBUST_CLIP = 3.0  # winsorize a wave beyond this many robust standard deviations from its row's median
ROBUST_MIN_WAVES = 5  # fewer waves in a cell: no robust scale, plain means


def robust_units(units: Sequence[tuple[float, float, np.ndarray, np.ndarray]], which: tuple[int, ...] = (2, 3)
                 ) -> list[tuple[float, float, np.ndarray, np.ndarray]]:
    """A cell's repeats with heavy-tailed waves winsorized (one-step Huber): per quantity (AL, ITL),
    each wave's relative deviation from its own row's median is pooled over the cell's rows (so
    drift between repeats is not mistaken for a tail), the robust scale is ``1.4826 * MAD`` of
    those deviations, and a wave beyond ``ROBUST_CLIP`` scales is clipped to that bound; the row's
    value is scaled by (clipped wave mean / wave mean). Clean Gaussian waves are left alone (3
    scales clip 0.3 % of them); one wave 3x slow moves its cell by at most 3 scales / waves instead
    of 2 / waves. Cells with fewer than ``ROBUST_MIN_WAVES`` waves (v1 rows) are returned as they are."""
    if sum(u[3].size for u in units) < ROBUST_MIN_WAVES or all(u[3].size < 2 for u in units):
        return list(units)
    out: list[list[Any]] = [list(u) for u in units]
    for j in which:
        dev = np.concatenate([np.asarray(u[j]) / np.median(u[j]) - 1.0 for u in units if np.size(u[j]) >= 2])
        scale = 1.4826 * float(np.median(np.abs(dev)))
        if scale <= 0.0:
            continue
        for row in out:
            x = row[j]
            if x.size < 2:
                continue
            med = float(np.median(x))
            clipped = np.clip(x, med * (1.0 - ROBUST_CLIP * scale), med * (1.0 + ROBUST_CLIP * scale))
            if j == 2:
                clipped = np.maximum(clipped, 1.0)
            if not np.array_equal(clipped, x):
                row[j - 2] = float(row[j - 2]) * float(clipped.mean() / x.mean())
                row[j] = clipped
    return [(r[0], r[1], r[2], r[3]) for r in out]


def robust_paired(cells: list[tuple[int, list[tuple[float, float, np.ndarray, np.ndarray]]]]
                  ) -> list[tuple[int, list[tuple[float, float, np.ndarray, np.ndarray]]]]:
    """Paired cells (every K's waves are the same waves) winsorized per wave block: AL as
    :func:`robust_units`; a wave's ITL at K is compared with what the **block** predicts for it,
    ``median_K`` (the K's median over its row's waves) x the block's factor (the median over the Ks
    of each K's wave / median_K), so drift that every K of a wave shares is neither mistaken for a
    tail nor widens the bound. The robust scale is per K (``1.4826 * MAD`` of its residuals, pooled
    over repeats), the bound ``ROBUST_CLIP`` scales. Fewer than 3 Ks or ``ROBUST_MIN_WAVES`` waves:
    :func:`robust_units` per cell."""
    reps0 = cells[0][1]
    if len(cells) < 3 or any(u[3].size < ROBUST_MIN_WAVES for u in reps0):
        return [(k, robust_units(reps)) for k, reps in cells]
    cells = [(k, robust_units(reps, (2,))) for k, reps in cells]
    out: list[list[list[Any]]] = [[list(u) for u in reps] for _, reps in cells]
    resid, pred = [], []  # per repeat: K x waves
    for r in range(len(reps0)):
        x = np.stack([reps[r][3] for _, reps in cells])
        med = np.median(x, axis=1, keepdims=True)
        factor = np.median(x / med, axis=0, keepdims=True)
        pred.append(med * factor)
        resid.append(x / pred[-1] - 1.0)
    scale = 1.4826 * np.median(np.abs(np.concatenate(resid, axis=1)), axis=1)
    for r in range(len(reps0)):
        for i in range(len(cells)):
            if scale[i] <= 0.0:
                continue
            x, p = out[i][r][3], pred[r][i]
            clipped = np.clip(x, p * (1.0 - ROBUST_CLIP * scale[i]), p * (1.0 + ROBUST_CLIP * scale[i]))
            if not np.array_equal(clipped, x):
                out[i][r][1] = float(out[i][r][1]) * float(clipped.mean() / x.mean())
                out[i][r][3] = clipped
    return [(k, [(u[0], u[1], u[2], u[3]) for u in rows]) for (k, _), rows in zip(cells, out)]


def huber_factor(raw: Sequence[tuple[int, list[Any]]], robust: Sequence[tuple[int, list[Any]]],
                 j: int) -> np.ndarray:
    """Per cell, the sandwich factor of its winsorized mean: waves / unclipped waves of quantity
    ``j`` (2: AL, 3: ITL). A clipped wave says nothing about where the cell's centre lies (Huber's
    ``E[psi^2] / E[psi']^2``: the variance of the clipped values over the share left unclipped,
    squared), so resampling the clipped values alone is too narrow by that share."""
    out = []
    for (_, before), (_, after) in zip(raw, robust):
        n = sum(u[j].size for u in before)
        clipped = sum(int((a[j] != b[j]).sum()) for a, b in zip(after, before) if a[j].size == b[j].size)
        out.append(n / max(1, n - clipped))
    return np.array(out)


@lru_cache(maxsize=4096)
def small_sample_factor(n: int, confidence: float) -> float:
    """Widening of a percentile bootstrap of a mean of ``n`` samples to a t interval: the bootstrap
    variance is (n-1)/n of the usual estimate and its tails are normal, not Student t (n-1 df)."""
    from scipy.stats import norm, t

    q = 1.0 - (1.0 - confidence) / 2.0
    return float(t.ppf(q, n - 1) / norm.ppf(q) * math.sqrt(n / (n - 1)))


def bootstrap_batch(batch_size: int,
                    cells: Sequence[tuple[int, list[tuple[float, float, np.ndarray, np.ndarray]]]],
                    replicates: int = DEFAULT_REPLICATES, seed: int = DEFAULT_SEED,
                    exact: bool = False, confidence: float = DEFAULT_CONFIDENCE,
                    paired: bool = False) -> BatchReplicates:
    """Bootstrap of one batch size (see the module docstring).

    ``cells``: per K (ascending), the K and its repeats as (row AL, row ITL, AL waves, ITL waves).
    ``paired``: the cells' waves are the same waves (paired design: wave ``i`` of every K of a
    repeat is one wave); when their wave counts agree, every replicate resamples the waves as
    blocks, one draw for every K, so what a wave shares across Ks (drift, a slow machine) cancels
    in the ratios between them.
    """
    ks = np.array([k for k, _ in cells], dtype=int)
    shapes = {tuple(u[3].size for u in reps) for _, reps in cells}
    paired = paired and len(shapes) == 1 and sum(next(iter(shapes))) >= 2
    raw = list(cells)
    if not exact:  # a row's ITL is its waves' mean: the estimator its samples resample (module docstring)
        raw = [(k, [(u[0], float(np.mean(u[3])), u[2], u[3]) for u in reps]) for k, reps in raw]
        cells = robust_paired(raw) if paired else [(k, robust_units(reps)) for k, reps in raw]
    point_al = np.array([np.mean([u[0] for u in reps]) for _, reps in cells])
    point_itl = np.array([np.mean([u[1] for u in reps]) for _, reps in cells])
    if exact:  # deterministic predictions: the point is the only replicate
        return BatchReplicates(batch_size, ks, point_al, point_itl, point_al[None, :], point_itl[None, :],
                               exact=True)
    s_al, s_itl = [], []  # per cell: the samples its replicates resample
    for _, reps in cells:
        if paired or len(reps) == 1 or (all(u[2].size >= 2 for u in reps) and not _repeats_differ(reps)):
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
    if paired:  # one draw of waves for every K: blocks
        draw = (rng.random((int(replicates), int(counts[0]))) * counts[0]).astype(np.int64)
        idx = np.concatenate([o + draw for o in off], axis=1)
    else:
        idx = off[cell_of] + (rng.random((int(replicates), flat_al.size)) * counts[cell_of]).astype(np.int64)
    ratio_al = np.add.reduceat(flat_al[idx], off, axis=1) / counts / np.array([a.mean() for a in s_al])
    ratio_itl = np.add.reduceat(flat_itl[idx], off, axis=1) / counts / np.array([a.mean() for a in s_itl])
    widen = np.array([small_sample_factor(int(n), confidence) for n in counts])
    al = point_al * np.exp(widen * huber_factor(raw, cells, 2) * np.log(ratio_al))
    itl = point_itl * np.exp(widen * huber_factor(raw, cells, 3) * np.log(ratio_itl))
    return BatchReplicates(batch_size, ks, point_al, point_itl, al, itl, counts=counts, confidence=confidence)


def at_confidence(rep: BatchReplicates, confidence: float) -> BatchReplicates:
    """``rep`` with its replicate deviations re-widened for ``confidence`` instead of the level they
    were drawn for (:func:`small_sample_factor` of each K's sample count): a decision at a
    Bonferroni-adjusted level reads its tails from t quantiles of that level."""
    if not rep.known or rep.exact or rep.counts is None or confidence == rep.confidence:
        return rep
    scale = np.array([small_sample_factor(int(n), confidence) / small_sample_factor(int(n), rep.confidence)
                      for n in rep.counts])
    al = rep.point_al * (rep.al / rep.point_al) ** scale
    itl = rep.point_itl * (rep.itl / rep.point_itl) ** scale
    return replace(rep, al=al, itl=itl, confidence=confidence)


def batch_replicates(candidates: pd.DataFrame, replicates: int = DEFAULT_REPLICATES,
                     seed: int = DEFAULT_SEED,
                     confidence: float = DEFAULT_CONFIDENCE) -> dict[int, BatchReplicates]:
    """:func:`bootstrap_batch` of every batch size's candidate rows (``engine = "sim"`` rows are exact)."""
    rows = candidates.sort_values(["batch_size", "num_spec_tokens",
                                   *(["repeat"] if "repeat" in candidates else [])],
                                  kind="stable")
    samples = row_samples(rows)
    exact_rows = ((rows["engine"].astype(str) == "sim").to_numpy() if "engine" in rows
                  else np.zeros(len(rows), bool))
    units = [(float(a), float(t), s[0], s[1])
             for a, t, s in zip(rows["acceptance_length"], rows["itl_s"], samples)]
    design = rows["design"].astype(str).to_numpy() if "design" in rows else np.full(len(rows), "cells")
    repeat = rows["repeat"].astype(int).to_numpy() if "repeat" in rows else np.zeros(len(rows), int)
    out: dict[int, BatchReplicates] = {}
    keys = list(zip(rows["batch_size"].astype(int), rows["num_spec_tokens"].astype(int)))
    i = 0
    while i < len(keys):
        b = keys[i][0]
        cells: list[tuple[int, list[Any]]] = []
        exact = paired = True
        repeats: dict[int, list[int]] = {}
        while i < len(keys) and keys[i][0] == b:
            if not cells or cells[-1][0] != keys[i][1]:
                cells.append((keys[i][1], []))
            cells[-1][1].append(units[i])
            repeats.setdefault(keys[i][1], []).append(int(repeat[i]))
            exact &= bool(exact_rows[i])
            paired &= design[i] == "paired"
            i += 1
        paired &= len({tuple(r) for r in repeats.values()}) == 1  # the same repeats (waves) at every K
        out[b] = bootstrap_batch(b, cells, replicates, seed, exact=exact, confidence=confidence,
                                 paired=paired)
    return out


BLOCK_COLUMN = "sample_block"


def row_blocks(rows: pd.DataFrame, samples: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray] | None:
    """Per row, the wave block of each sample (paired design, schema v5), or None when any row has none."""
    if BLOCK_COLUMN not in rows.columns:
        return None
    out = []
    for raw, (s_al, _) in zip(rows[BLOCK_COLUMN].to_list(), samples):
        if (raw is None or (isinstance(raw, float) and math.isnan(raw)) or len(raw) != s_al.size
                or s_al.size == 0):
            return None
        out.append(np.asarray(raw, dtype=np.int64).ravel())
    return out


def interval(samples: np.ndarray, confidence: float, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Central ``confidence`` percentile interval along ``axis``."""
    a = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(samples, [a, 1.0 - a], axis=axis)
    return lo, hi


# ----------------------------------------------------------------------------- the rule
