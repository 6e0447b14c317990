"""Vanilla as a candidate in a validate run: where an engine without speculation beat every
speculative variant (each fixed K, the table's DSD, the adaptive plugin) beyond its interval.

See :mod:`dsdprof.decide.vanilla` for why (vLLM's K=0 still runs the drafter) and for the same
comparison over a sweep. Goodput here is mean AL / mean ITL of a variant's ok rows; intervals are
:func:`dsdprof.report.compare.regret_intervals` against vanilla (paired wave by wave where the
design interleaved the variants' waves). :func:`vanilla_line` is ``analyze``'s line for a sweep
(from the analysis' ``vanilla_*`` columns).
"""

from __future__ import annotations

import math

import pandas as pd

from dsdprof.export.table import gap_text
from dsdprof.formats.measurements import MODE_VANILLA
from dsdprof.report.compare import regret_intervals

GAP_COLUMNS = ["batch_size", "gain", "gain_low", "gain_high", "variant"]


def _goodput(rows: pd.DataFrame) -> float:
    return float(rows["acceptance_length"].mean() / rows["itl_s"].mean())


def validate_vanilla(df: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """Per batch size where vanilla beat **every** variant beyond its interval: ``gain`` = goodput of
    vanilla / the fastest variant's - 1, ``gain_low``/``gain_high`` its interval (from that
    variant's regret against vanilla), ``variant`` (``fixed-3``, ``dsd``, ``adaptive``)."""
    ok = df[df["status"].astype(str) == "ok"] if "status" in df.columns else df
    if not {"acceptance_length", "itl_s", "mode", "batch_size"} <= set(ok.columns):
        return pd.DataFrame(columns=GAP_COLUMNS)
    out = []
    for b, g in ok.groupby("batch_size", sort=True):
        modes = g["mode"].astype(str)
        van = g[modes == MODE_VANILLA]
        groups = [(f"{m}-{int(k)}" if m == "fixed" else str(m), rows)
                  for (m, k), rows in g[modes != MODE_VANILLA].groupby(["mode", "num_spec_tokens"])]
        if van.empty or not groups:
            continue
        # 1 - variant / vanilla
        regrets = regret_intervals(int(b), van, [rows for _, rows in groups], confidence)
        if not all(math.isfinite(lo) and lo > 0 for lo, _ in regrets):
            continue
        speeds = [_goodput(rows) for _, rows in groups]
        i = max(range(len(groups)), key=lambda j: speeds[j])
        lo, hi = regrets[i]
        out.append({"batch_size": int(b), "gain": _goodput(van) / speeds[i] - 1.0,
                    "gain_low": lo / (1.0 - lo),
                    "gain_high": hi / (1.0 - hi) if hi < 1 else math.inf, "variant": groups[i][0]})
    return pd.DataFrame(out, columns=GAP_COLUMNS)


def validate_vanilla_line(gaps: pd.DataFrame, confidence: float) -> str | None:
    """One line for the validate report (None when vanilla led nowhere beyond the intervals)."""
    if not len(gaps):
        return None
    return (f"vanilla beats every speculative variant beyond its {confidence:.0%} interval at "
            f"{_gaps_at(gaps, 'gain', over='variant')} "
            "(goodput of vanilla / the fastest variant - 1): serve these batch sizes without speculation "
            "(docs/ktable.md#vanilla)")


def _gaps_at(rows: pd.DataFrame, gain: str, over: str = "") -> str:
    """``BS b +g % [lo, hi]`` (``over`` the row's ``over`` column) per row, ``; ``-joined; ``gain``
    names the gain column, its interval in ``{gain}_low`` / ``{gain}_high``."""
    return "; ".join(f"BS {int(r['batch_size'])} {gap_text(r[gain], r[gain + '_low'], r[gain + '_high'])}"
                     + (f" over {r[over]}" if over else "") for _, r in rows.iterrows())


def vanilla_line(optimal: pd.DataFrame, confidence: float) -> str | None:
    """One line for ``analyze``: where no speculation beat every K beyond its interval, or None."""
    if "vanilla_faster" not in optimal.columns:
        return None
    hits = optimal[optimal["vanilla_faster"].astype(bool)]
    if not len(hits):
        return None
    return (f"vanilla (no speculative config) beats every K beyond its {confidence:.0%} interval at "
            f"{_gaps_at(hits, 'vanilla_gain')} (vanilla goodput / best K's - 1). vLLM's K=0 still runs the "
            "drafter: serve these batch sizes without speculation (docs/ktable.md#vanilla)")
