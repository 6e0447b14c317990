"""Chain drafters: AL(K) of every K from the largest K's per-position acceptance.

A chain drafter (``draft_model``, ``eagle``, ``eagle3``, ``mtp``) proposes draft token i the same
way whatever K is, so the largest K's per-position acceptance ``p_i`` predicts every smaller K:
``AL(K) = 1 + (AL(K_max) - 1) * sum_{i<=K} p_i / sum_{i<=K_max} p_i`` (scaled to the largest K's
delivered AL). :func:`chain_check` compares that prediction with each measured cell inside its
bootstrap interval; :func:`with_chain_acceptance` swaps it in, point and replicates, so the
acceptance noise is shared by every K and cancels in the ratios between them. n-gram and suffix
drafters do not have this structure and are measured per K.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from dsdprof.decide.bootstrap import BatchReplicates, interval

CHAIN_METHODS = ("draft_model", "eagle", "eagle3", "mtp")
CHAIN_SLACK = 0.01  # relative AL difference tolerated between the chain prediction and a measured cell


def chain_fractions(per_pos: Sequence[float], ks: Sequence[int]) -> np.ndarray | None:
    """Share of AL(K_max) - 1 a chain drafter delivers at each K: sum_{i<=K} p_i / sum_{i<=K_max} p_i."""
    p = np.asarray(per_pos, dtype=float)
    kmax = max(ks)
    if p.size < kmax or not np.isfinite(p[:kmax]).all() or p[:kmax].sum() <= 0:
        return None
    cum = np.concatenate([[0.0], np.cumsum(p[:kmax])])
    return cum[np.asarray(ks, dtype=int)] / cum[kmax]


def with_chain_acceptance(rep: BatchReplicates, fractions: np.ndarray,
                          shares: np.ndarray | None = None) -> BatchReplicates:
    """AL(K) = 1 + (AL(K_max) - 1) * fraction(K) in the point and in every replicate: the
    largest K's acceptance, shaped by its per-position acceptance, stands in for every smaller K.
    ``shares`` (replicates x Ks, :func:`share_replicates`): the fractions drawn anew in each
    replicate; without it every replicate keeps ``fractions`` (the shares' own noise is then left
    out of the intervals)."""
    top = int(np.argmax(rep.ks))
    point_al = 1.0 + (rep.point_al[top] - 1.0) * fractions
    per_rep = fractions[None, :] if shares is None else shares
    al = None if rep.al is None else 1.0 + (rep.al[:, [top]] - 1.0) * per_rep
    return replace(rep, point_al=point_al, al=al)


def share_replicates(rows: pd.DataFrame, rep: BatchReplicates, seed: int) -> np.ndarray | None:
    """(replicates x Ks) chain fractions, each from the largest K's rows at this batch size
    (its repeats) resampled with replacement and their per-position acceptance averaged; None
    when fewer than 2 of them carry it (then nothing measures the shares' noise)."""
    if rep.al is None or "acceptance_per_pos" not in rows.columns:
        return None
    kmax = int(rep.ks.max())
    top = rows[(rows["batch_size"] == rep.batch_size) & (rows["num_spec_tokens"] == kmax)]
    lists = [np.asarray(v, dtype=float).ravel()[:kmax] for v in top["acceptance_per_pos"]
             if v is not None and np.size(v) >= kmax]
    if len(lists) < 2 or kmax <= 0:
        return None
    per_pos = np.stack(lists)
    rng = np.random.default_rng((int(seed), int(rep.batch_size), 2))
    draw = rng.integers(0, len(lists), size=(rep.al.shape[0], len(lists)))
    cum = np.concatenate([np.zeros((draw.shape[0], 1)), np.cumsum(per_pos[draw].mean(axis=1), axis=1)],
                         axis=1)
    if (cum[:, kmax] <= 0).any():
        return None
    return cum[:, rep.ks.astype(int)] / cum[:, [kmax]]


def fractions_at(per_pos: pd.DataFrame, batch_size: int, ks: np.ndarray) -> np.ndarray | None:
    """:func:`chain_fractions` from the median per-position acceptance of the largest K at this batch size."""
    if per_pos.empty or ks.max() <= 0:
        return None
    top = per_pos[(per_pos["batch_size"] == batch_size) & (per_pos["num_spec_tokens"] == int(ks.max()))]
    if top.empty:
        return None
    return chain_fractions(top["acceptance_per_pos"].iloc[0], [int(k) for k in ks])


def chain_check(reps: dict[int, BatchReplicates], per_pos: pd.DataFrame,
                confidence: float, slack: float = CHAIN_SLACK) -> pd.DataFrame:
    """Measured AL(K) against the chain prediction 1 + (AL(K_max) - 1) * sum_{i<=K} p_i / sum p_i
    from the largest K's per-position acceptance, per (batch size, K < K_max). ``consistent``:
    the interval of (measured - predicted) reaches within ``slack`` (relative) of 0; None when
    intervals are unknown (then only the point difference is shown)."""
    records = []
    for b, rep in reps.items():
        fr = fractions_at(per_pos, b, rep.ks)
        if fr is None:
            continue
        chained = with_chain_acceptance(rep, fr)
        for i, k in enumerate(int(x) for x in rep.ks):
            if k == 0 or k == int(rep.ks.max()):
                continue
            meas, pred = float(rep.point_al[i]), float(chained.point_al[i])
            lo = hi = math.nan
            consistent = None
            if rep.al is not None and chained.al is not None:
                lo, hi = (float(x) for x in interval(rep.al[:, i] - chained.al[:, i], confidence))
                consistent = bool(lo <= slack * meas and hi >= -slack * meas)
            records.append({"batch_size": b, "k": k, "al_measured": meas, "al_predicted": pred,
                            "diff_low": lo, "diff_high": hi, "consistent": consistent})
    return pd.DataFrame.from_records(records, columns=["batch_size", "k", "al_measured", "al_predicted",
                                                       "diff_low", "diff_high", "consistent"])
