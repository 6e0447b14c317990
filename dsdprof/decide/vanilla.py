"""Vanilla as a candidate: where an engine without speculation beats every K beyond its interval.

In vLLM's dynamic-SD mode K=0 still runs the drafter, so a vanilla engine (no speculative config)
can be faster than every K a DSD schedule can serve (docs/ktable.md, "Vanilla"). Per batch size,
against the sweep's vanilla rows: ``vanilla_gain`` (goodput(vanilla) / goodput(best point K) - 1,
slow steps weighed alike, :mod:`dsdprof.decide.speedup`), its interval ``vanilla_gain_low``/
``_high`` (from the best K's speedup interval) and ``vanilla_faster`` (every K's speedup over
vanilla has its upper bound below 1; never without vanilla rows or intervals).
:func:`vanilla_records` turns the flagged batch sizes into the table's ``vanilla_faster`` records;
the words are the readers' (:func:`dsdprof.report.vanilla.vanilla_line`,
:func:`dsdprof.export.table.vanilla_warning`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsdprof.decide.speedup import speedup_estimate
from dsdprof.formats.ktable import LAST_RANGE_END
from dsdprof.formats.ktable_types import VanillaRecord
from dsdprof.formats.measurements import MODE_VANILLA

VANILLA_COLUMNS = ("vanilla_gain", "vanilla_gain_low", "vanilla_gain_high", "vanilla_faster")


def has_vanilla(rows: pd.DataFrame) -> bool:
    """True when ``rows`` hold ok rows of a vanilla engine (not a K=0 stand-in)."""
    return "mode" in rows.columns and bool((rows["mode"].astype(str) == MODE_VANILLA).any())


def _gain(speedup: float) -> float:
    """goodput(K) / goodput(vanilla) -> goodput(vanilla) / goodput(K) - 1."""
    return 1.0 / speedup - 1.0 if speedup and math.isfinite(speedup) and speedup > 0 else math.nan


def vanilla_columns(optimal: pd.DataFrame, cells: pd.DataFrame, candidate_rows: pd.DataFrame,
                    baseline_rows: pd.DataFrame, replicates: int, seed: int,
                    confidence: float) -> pd.DataFrame:
    """``optimal`` with :data:`VANILLA_COLUMNS` (see the module docstring); NaN / False where the
    baseline is no vanilla engine. ``cells``: the analysis' cells (goodput per batch size and K)."""
    out = optimal.copy()
    if not has_vanilla(baseline_rows):
        for col in VANILLA_COLUMNS:
            out[col] = False if col == "vanilla_faster" else np.nan
        return out
    base = baseline_rows[baseline_rows["mode"].astype(str) == MODE_VANILLA]
    cand = candidate_rows[candidate_rows["mode"].astype(str) != MODE_VANILLA]
    records = []
    for b, base_goodput in zip(optimal["batch_size"], optimal["baseline_goodput"]):
        group = cells[cells["batch_size"] == b]
        base_b = base[base["batch_size"] == b]
        if group.empty or base_b.empty or not math.isfinite(base_goodput):
            records.append((math.nan, math.nan, math.nan, False))
            continue
        by_k = sorted(zip(group["goodput"], group["num_spec_tokens"].astype(int)), reverse=True)
        cand_b = cand[cand["batch_size"] == b]

        def estimate(k: int, base_b: pd.DataFrame = base_b,
                     cand_b: pd.DataFrame = cand_b) -> tuple[float, float, float, str]:
            rows = cand_b[cand_b["num_spec_tokens"] == k]
            return speedup_estimate(rows, base_b, replicates, seed, confidence, group=cand_b)
        best_goodput, best_k = by_k[0]
        point, lo, hi, _ = estimate(best_k)
        gain = _gain(point if math.isfinite(point) else best_goodput / base_goodput)
        # every K below vanilla beyond its interval: the best K first (the others need it only then)
        faster = math.isfinite(hi) and hi < 1.0 and all(estimate(k)[2] < 1.0 for _, k in by_k[1:])
        records.append((gain, _gain(hi), _gain(lo), bool(faster)))
    for i, col in enumerate(VANILLA_COLUMNS):
        out[col] = [r[i] for r in records]
    return out


def _edges(sizes: list[int]) -> list[tuple[int, int]]:
    """The batch sizes each profiled batch size serves in a table (as :func:`ranges_from_points`:
    the nearest on a log scale, the first from 1, the last up to :data:`LAST_RANGE_END`)."""
    out, start = [], 1
    for i, b in enumerate(sizes):
        end = math.isqrt(b * sizes[i + 1]) if i + 1 < len(sizes) else max(LAST_RANGE_END, b)
        out.append((start, end))
        start = end + 1
    return out


def vanilla_records(optimal: pd.DataFrame) -> list[VanillaRecord]:
    """The table's ``vanilla_faster`` records: one per profiled batch size where vanilla beat every
    K beyond its interval, ``{"start", "end", "batch_size", "gain", "ci_low", "ci_high", "k"}``
    (``start..end``: the batch sizes that profiled batch size serves in the table's ranges)."""
    if "vanilla_faster" not in optimal.columns or not len(optimal):
        return []
    opt = optimal.sort_values("batch_size")
    sizes = [int(b) for b in opt["batch_size"]]
    out: list[VanillaRecord] = []
    for (start, end), (_, row) in zip(_edges(sizes), opt.iterrows()):
        if bool(row["vanilla_faster"]):
            out.append({"start": start, "end": end, "batch_size": int(row["batch_size"]),
                        "gain": round(float(row["vanilla_gain"]), 6),
                        "ci_low": _round(row["vanilla_gain_low"]),
                        "ci_high": _round(row["vanilla_gain_high"]),
                        "k": int(row["k"])})
    return out


def _round(x: float | None) -> float | None:
    return round(float(x), 6) if x is not None and math.isfinite(float(x)) else None
