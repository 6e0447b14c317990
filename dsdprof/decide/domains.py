"""Acceptance and speedup by category (domain), and the K chosen for a traffic mix.

Input: one sweep per category of the same draft (``dsdprof compare-drafts`` writes them as
``OUT/<draft>/<category>/``). :func:`category_grid` reads each into rows of (category,
batch_size, K): acceptance length, per-position acceptance, and the speedup over the vanilla that
ran beside it with its interval (:func:`dsdprof.decide.speedup.speedup_estimate`).

**A mix** is a weight per category (summing to 1). A batch of mixed traffic is assumed to cost
what a batch of one category costs at the same (batch size, K) -- the step time depends on the
tokens in flight, not on their text -- so its goodput is ``sum_c w_c AL_c / ITL`` and its speedup
over vanilla ``sum_c w_c speedup_c``. The categories' sweeps are independent runs, so the mix's
interval adds the categories' weighted half-widths in quadrature (each side on its own).
:func:`mix_table` picks, per batch size, the K of the highest mixed speedup (ties: the smaller K);
:func:`category_regret` says what a table costs each category: ``1 - speedup_c(K_table) /
max_K speedup_c``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from dsdprof.config.run import Run, validate_measurements

GRID_COLUMNS = ["category", "batch_size", "num_spec_tokens", "acceptance_length", "itl_s",
                "acceptance_per_pos", "speedup", "speedup_low", "speedup_high", "vanilla_goodput",
                "drafted_per_step"]


def drafted_per_step(g: pd.DataFrame, k: int) -> float:
    """Draft tokens per request-step of a K's rows: K for a drafter that always drafts K (the paired
    design's rows); a drafter that proposes 0..K (n-gram, cells design, where every steady step of a
    row has exactly ``batch_size`` decoding requests) drafts ``num_draft_tokens / (steady_steps x
    batch_size)``, its effective K."""
    if "design" in g.columns and (g["design"] == "paired").all():
        return float(k)
    need = {"num_draft_tokens", "steady_steps"}
    if not need <= set(g.columns):
        return math.nan
    steps = (g["steady_steps"].astype(float) * g["batch_size"].astype(float)).sum()
    return float(g["num_draft_tokens"].astype(float).sum() / steps) if steps > 0 else math.nan


def grid_from_rows(rows: pd.DataFrame, category: str, confidence: float | None = None) -> pd.DataFrame:
    """One category's grid from its measurement rows (ok rows; vanilla or K=0 the baseline)."""
    from dsdprof.config.defaults import DEFAULT_CONFIDENCE
    from dsdprof.decide.analysis import split_baseline_candidates
    from dsdprof.decide.speedup import speedup_estimate

    conf = DEFAULT_CONFIDENCE if confidence is None else confidence
    base, cand = split_baseline_candidates(validate_measurements(rows))
    out = []
    for (b, k), g in cand.groupby(["batch_size", "num_spec_tokens"]):
        if int(k) == 0:
            continue
        bb = base[base["batch_size"] == b]
        point, lo, hi, _ = speedup_estimate(g, bb, confidence=conf)
        per_pos = None
        if "acceptance_per_pos" in g.columns:
            lists = [np.asarray(v, dtype=float) for v in g["acceptance_per_pos"]
                     if v is not None and np.size(v) == int(k)]
            per_pos = list(np.median(np.vstack(lists), axis=0)) if lists else None
        out.append({"category": category, "batch_size": int(b), "num_spec_tokens": int(k),
                    "acceptance_length": float(g["acceptance_length"].mean()),
                    "itl_s": float(g["itl_s"].mean()), "acceptance_per_pos": per_pos,
                    "speedup": point, "speedup_low": lo, "speedup_high": hi,
                    "vanilla_goodput": float((bb["acceptance_length"] / bb["itl_s"]).mean())
                    if len(bb) else math.nan, "drafted_per_step": drafted_per_step(g, int(k))})
    return pd.DataFrame(out, columns=GRID_COLUMNS)


def category_grid(runs: Mapping[str, Run]) -> pd.DataFrame:
    """The grids of several categories' runs (``{category: run}``, each opened by
    :func:`dsdprof.io.runs.open_run`), one frame with a ``category`` column."""
    frames = [grid_from_rows(run.rows, cat) for cat, run in runs.items()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=GRID_COLUMNS)


def check_weights(weights: Mapping[str, float], categories: list[str]) -> dict[str, float]:
    """Weights over ``categories`` (missing ones 0), normalised to sum 1."""
    w = {c: float(weights.get(c, 0.0)) for c in categories}
    total = sum(w.values())
    if total <= 0 or any(v < 0 or not math.isfinite(v) for v in w.values()):
        raise ValueError(f"weights must be finite, >= 0 and not all 0: {dict(weights)}")
    return {c: v / total for c, v in w.items()}


def _half(points: np.ndarray, bounds: np.ndarray, w: np.ndarray) -> float:
    d = np.abs(points - bounds) * w
    return float(np.sqrt(np.sum(d ** 2))) if np.all(np.isfinite(d)) else math.nan


def mixed_grid(grid: pd.DataFrame, weights: Mapping[str, float]) -> pd.DataFrame:
    """Per (batch size, K): the mix's speedup with its interval, AL and ITL (weighted means).

    Cells not measured for every category of positive weight are left out."""
    cats = sorted(grid["category"].unique())
    w = check_weights(weights, cats)
    used = [c for c in cats if w[c] > 0]
    out = []
    for (b, k), g in grid[grid["category"].isin(used)].groupby(["batch_size", "num_spec_tokens"]):
        if set(g["category"]) != set(used):
            continue
        ww = np.array([w[c] for c in g["category"]])
        s = g["speedup"].to_numpy(float)
        point = float(np.sum(ww * s))
        out.append({"batch_size": int(b), "num_spec_tokens": int(k), "speedup": point,
                    "speedup_low": point - _half(s, g["speedup_low"].to_numpy(float), ww),
                    "speedup_high": point + _half(s, g["speedup_high"].to_numpy(float), ww),
                    "acceptance_length": float(np.sum(ww * g["acceptance_length"].to_numpy(float))),
                    "itl_s": float(np.sum(ww * g["itl_s"].to_numpy(float)))})
    return pd.DataFrame(out, columns=["batch_size", "num_spec_tokens", "speedup", "speedup_low",
                                      "speedup_high", "acceptance_length", "itl_s"])


def best_k(grid: pd.DataFrame) -> pd.DataFrame:
    """Per batch size of a (mixed or one category's) grid: the K of the highest speedup (ties: the
    smaller K) with its speedup and interval."""
    rows = []
    for b, g in grid.groupby("batch_size"):
        g = g.sort_values("num_spec_tokens")
        i = int(np.argmax(g["speedup"].to_numpy(float)))
        r = g.iloc[i]
        rows.append({"batch_size": int(b), "k": int(r["num_spec_tokens"]), "speedup": float(r["speedup"]),
                     "speedup_low": float(r["speedup_low"]), "speedup_high": float(r["speedup_high"])})
    return pd.DataFrame(rows, columns=["batch_size", "k", "speedup", "speedup_low", "speedup_high"])


def mix_table(grid: pd.DataFrame, weights: Mapping[str, float]) -> pd.DataFrame:
    """The K per batch size for traffic of ``weights`` (see the module docstring)."""
    return best_k(mixed_grid(grid, weights))


def category_regret(grid: pd.DataFrame, table: Mapping[int, int]) -> pd.DataFrame:
    """Per (category, batch size): the table's K, the category's own best K, and the share of the
    category's best speedup the table's K gives up (``regret``, 0 when the table's K is its best)."""
    rows = []
    for (c, b), g in grid.groupby(["category", "batch_size"]):
        if int(b) not in table:
            continue
        by_k = dict(zip(g["num_spec_tokens"].astype(int), g["speedup"].astype(float)))
        own = max(sorted(by_k), key=lambda k: (by_k[k], -k))
        k = int(table[int(b)])
        got = by_k.get(k, math.nan)
        rows.append({"category": c, "batch_size": int(b), "table_k": k, "own_k": own,
                     "speedup_at_table_k": got, "own_speedup": by_k[own],
                     "regret": 1.0 - got / by_k[own] if by_k[own] > 0 else math.nan})
    return pd.DataFrame(rows, columns=["category", "batch_size", "table_k", "own_k",
                                       "speedup_at_table_k", "own_speedup", "regret"])


def per_position(grid: pd.DataFrame) -> pd.DataFrame:
    """AL per position per category: the per-position acceptance at each (category, batch size)'s
    largest K (the rows' ``acceptance_per_pos``: accepted at position i / drafted at i)."""
    rows: list[dict[str, object]] = []
    for (c, b), g in grid.groupby(["category", "batch_size"]):
        r = g.sort_values("num_spec_tokens").iloc[-1]
        rows.append({"category": c, "batch_size": int(b), "k": int(r["num_spec_tokens"]),
                     "acceptance_length": float(r["acceptance_length"]),
                     "acceptance_per_pos": r["acceptance_per_pos"]})
    return pd.DataFrame(rows, columns=["category", "batch_size", "k", "acceptance_length",
                                       "acceptance_per_pos"])
