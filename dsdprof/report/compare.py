"""Compare vanilla, fixed-K, DSD and adaptive serving per batch size: pure functions over a DataFrame.

Input: measurement rows (the :mod:`dsdprof.formats.measurements` columns) of a ``dsdprof validate`` run, with
``mode`` = ``vanilla`` | ``fixed`` | ``dsd`` | ``adaptive`` (optional), ``batch_size``,
``num_spec_tokens`` (the fixed K, the table's K at that batch size for ``dsd``, the engine's largest
K for ``adaptive``) and a per-user speed: ``tokens_per_s_per_user``
(else ``1 / tpot_s``, else ``acceptance_length / itl_s``). Rows whose ``status`` is not ``ok`` are
ignored; repeats are aggregated with the median.

Per batch size, :func:`compare` reports:

* ``tops_vanilla``, ``tops_k<K>`` (one per fixed K), ``tops_dsd``: tokens/s per user;
* ``regret``: ``1 - tops_dsd / tops_best_fixed`` where ``tops_best_fixed`` is the best fixed K
  (negative when DSD beats every fixed K);
* ``regret_vs_oracle``: the same against the best of vanilla and every fixed K;
* ``speedup_vs_vanilla``: ``tops_dsd / tops_vanilla``;
* ``noise``: the relative noise band, ``max(noise_floor, half-range / median)`` over the repeats
  of the vanilla and DSD cells at that batch size;
* ``below_vanilla``: DSD slower than vanilla by more than ``noise``; ``note`` says why it matters
  (a K=0 range still pays the drafter's overhead, vLLM issue 49548);
* ``regret_lo``, ``regret_hi``: the central ``confidence`` interval of ``regret`` from the
  bootstrap of :mod:`dsdprof.decide.bootstrap` (per variant, the waves pooled over repeats, or the repeats;
  small samples widened to t intervals), on the ratio of mean AL / mean ITL of the DSD cells to
  those of the best fixed K (chosen by the point estimate); NaN when a variant has a single
  sample (one repeat of one wave) -- the intervals are then unknown. Rows of validate's paired
  design (the default: the variants' waves interleaved one by one) are resampled wave by wave,
  one draw for every variant, so the drift between waves cancels in the ratio.

With ``adaptive`` rows (``dsdprof validate --adaptive``) the same for the adaptive plugin:
``tops_adaptive``, ``adaptive_regret`` (+ ``_lo``/``_hi``), ``adaptive_speedup_vs_vanilla`` and
``adaptive_k_observed`` (draft tokens per draft: the K it ran on average).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dsdprof.config.defaults import DEFAULT_CONFIDENCE
from dsdprof.decide.bootstrap import bootstrap_batch, check_confidence, interval, row_blocks, row_samples
from dsdprof.errors import InputError
from dsdprof.formats.measurements import MODE_ADAPTIVE, MODE_DSD, MODE_FIXED, MODE_VANILLA, MODES, STATUS_OK

DEFAULT_NOISE_FLOOR = 0.05
K0_NOTE = "K=0 range still runs the drafter (vLLM issue 49548): serve it without speculation"


@dataclass(frozen=True)
class FlaggedRange:
    """Consecutive profiled batch sizes where DSD runs below vanilla beyond noise."""

    first_bs: int
    last_bs: int
    worst_speedup: float
    note: str

    def label(self) -> str:
        one = self.first_bs == self.last_bs
        span = f"BS {self.first_bs}" if one else f"BS {self.first_bs}-{self.last_bs}"
        return f"{span}: DSD at {self.worst_speedup:.2f}x vanilla ({self.note})"


def user_speed(df: pd.DataFrame) -> pd.Series:
    """Tokens/s seen by one request, from the best column available."""
    if "tokens_per_s_per_user" in df.columns:
        s = pd.to_numeric(df["tokens_per_s_per_user"], errors="coerce")
        if s.notna().all():
            return s.astype("float64")
    if "tpot_s" in df.columns:
        t = pd.to_numeric(df["tpot_s"], errors="coerce")
        if (t > 0).all():
            return 1.0 / t
    if {"acceptance_length", "itl_s"} <= set(df.columns):
        al = pd.to_numeric(df["acceptance_length"], errors="coerce")
        return al / pd.to_numeric(df["itl_s"], errors="coerce")
    raise InputError("columns", sorted(df.columns)[:8],
                     "need tokens_per_s_per_user, tpot_s or acceptance_length and itl_s")


def _clean(df: pd.DataFrame) -> pd.DataFrame:
    for col in ("mode", "batch_size", "num_spec_tokens"):
        if col not in df.columns:
            raise InputError("columns", col, "validate results need mode, batch_size and num_spec_tokens")
    if "status" in df.columns:
        df = df[df["status"].astype(str) == STATUS_OK]
    df = df.copy()
    df["mode"] = df["mode"].astype(str)
    bad = ~df["mode"].isin(MODES)
    if bad.any():
        raise InputError("mode", df.loc[bad, "mode"].iloc[0], f"must be one of {', '.join(MODES)}")
    df["tops"] = user_speed(df)
    bad = ~np.isfinite(df["tops"]) | (df["tops"] <= 0)
    if bad.any():
        raise InputError("tokens_per_s_per_user", df.loc[bad, "tops"].iloc[0], "must be a finite number > 0")
    df["batch_size"] = df["batch_size"].astype("int64")
    df["num_spec_tokens"] = df["num_spec_tokens"].astype("int64")
    return df


def _spread(values: pd.Series) -> float:
    """Half-range over median: the relative noise band seen across repeats (0 for one sample)."""
    if len(values) < 2:
        return 0.0
    med = float(values.median())
    return float((values.max() - values.min()) / 2.0 / med) if med > 0 else 0.0


def _k_observed(rows: pd.DataFrame) -> float:
    if "num_drafts" not in rows.columns or "num_draft_tokens" not in rows.columns:
        return math.nan
    drafts = pd.to_numeric(rows["num_drafts"], errors="coerce").sum()
    toks = pd.to_numeric(rows["num_draft_tokens"], errors="coerce").sum()
    return float(toks / drafts) if drafts > 0 else 0.0


def _interleaved_cells(frames: list[pd.DataFrame]) -> list | None:
    """Validate's paired designs (every row ``design = paired`` with a ``sample_block`` per sample):
    per frame, per repeat, (row AL, row ITL, AL samples, ITL samples) aligned so that sample ``i`` of
    every frame ran in the same stretch of time. Where every frame of a repeat has the same blocks
    (the steps design's arms: one engine's waves) the samples pair one by one; otherwise (wave by
    wave across engines, or vanilla beside the steps design's arms, one wave per block) the samples
    of a block are averaged and the blocks every frame has pair. None when a row is not of such a
    design (cell by cell: the variants' waves are resampled each on its own)."""
    per = []
    for rows in frames:
        if "design" not in rows.columns or not (rows["design"].astype(str) == "paired").all():
            return None
        samples = row_samples(rows)
        blocks = row_blocks(rows, samples)
        if blocks is None:
            return None
        repeats = rows["repeat"].astype(int).to_list() if "repeat" in rows.columns else [0] * len(rows)
        by_repeat: dict[int, tuple] = {}
        for r, a, t, (s_al, s_itl), waves in zip(repeats, rows["acceptance_length"], rows["itl_s"], samples,
                                                 blocks):
            if r in by_repeat:
                return None
            by_repeat[r] = (float(a), float(t), np.asarray(waves), np.asarray(s_al), np.asarray(s_itl))
        per.append(by_repeat)
    cells: list[tuple[int, list[Any]]] = [(i, []) for i in range(len(per))]
    for r in sorted(set.intersection(*(set(d) for d in per))):
        first = per[0][r][2]
        same = all(d[r][2].shape == first.shape and (d[r][2] == first).all() for d in per)
        common = sorted(set.intersection(*(set(d[r][2].tolist()) for d in per)))
        for (_, units), d in zip(cells, per):
            a, t, waves, s_al, s_itl = d[r]
            if not same:
                s_al = np.array([s_al[waves == w].mean() for w in common])
                s_itl = np.array([s_itl[waves == w].mean() for w in common])
            units.append((a, t, s_al, s_itl))
    return cells if cells[0][1] and all(u[2].size for u in cells[0][1]) else None


def regret_intervals(batch_size: int, best: pd.DataFrame, variants: list[pd.DataFrame],
                     confidence: float = DEFAULT_CONFIDENCE) -> list[tuple[float, float]]:
    """Per variant, the ``confidence`` interval of ``1 - goodput(variant) / goodput(best)``
    (:func:`dsdprof.decide.bootstrap.bootstrap_batch`; NaN when any of them has a single sample).
    Rows of validate's paired design are resampled **wave by wave, one draw for every variant**
    (their waves ran interleaved, so drift between waves cancels in the ratio); other rows each
    on their own."""
    cells = _interleaved_cells([best, *variants])
    paired = cells is not None
    if cells is None:
        cells = []
        for i, rows in enumerate([best, *variants]):
            samples = row_samples(rows)
            cells.append((i, [(float(a), float(t), s[0], s[1])
                              for a, t, s in zip(rows["acceptance_length"], rows["itl_s"], samples)]))
    rep = bootstrap_batch(batch_size, cells, confidence=confidence, paired=paired)
    g = rep.goodput
    if not rep.known or g is None:
        return [(math.nan, math.nan)] * len(variants)
    out = []
    for i in range(1, len(cells)):
        lo, hi = interval(1.0 - g[:, i] / g[:, 0], confidence)
        out.append((float(lo), float(hi)))
    return out


def compare(df: pd.DataFrame, noise_floor: float = DEFAULT_NOISE_FLOOR,
            confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """One row per batch size that has vanilla, DSD and at least one fixed K (see module doc)."""
    if not (0.0 <= noise_floor < 1.0) or math.isnan(noise_floor):
        raise InputError("noise_floor", noise_floor, "must be in [0, 1)")
    check_confidence(confidence)
    df = _clean(df)
    fixed_ks = sorted(int(k) for k in df.loc[df["mode"] == MODE_FIXED, "num_spec_tokens"].unique())
    records = []
    for b, g in df.groupby("batch_size", sort=True):
        van = g.loc[g["mode"] == MODE_VANILLA, "tops"]
        dsd = g[g["mode"] == MODE_DSD]
        fixed = g[g["mode"] == MODE_FIXED]
        if van.empty or dsd.empty or fixed.empty:
            continue
        rec: dict = {"batch_size": int(b), "dsd_k": int(dsd["num_spec_tokens"].mode().iloc[0]),
                     "tops_vanilla": float(van.median())}
        by_k = {int(k): float(s.median()) for k, s in fixed.groupby("num_spec_tokens")["tops"]}
        for k in fixed_ks:
            rec[f"tops_k{k}"] = by_k.get(k, np.nan)
        rec["tops_dsd"] = float(dsd["tops"].median())
        best_k = max(by_k, key=lambda k: (by_k[k], -k))
        rec["best_fixed_k"] = best_k
        rec["tops_best_fixed"] = by_k[best_k]
        rec["regret"] = 1.0 - rec["tops_dsd"] / rec["tops_best_fixed"]
        oracle = max(rec["tops_best_fixed"], rec["tops_vanilla"])
        rec["regret_vs_oracle"] = 1.0 - rec["tops_dsd"] / oracle
        rec["speedup_vs_vanilla"] = rec["tops_dsd"] / rec["tops_vanilla"]
        rec["repeats"] = int(min(len(van), len(dsd)))
        rec["noise"] = max(noise_floor, _spread(van), _spread(dsd["tops"]))
        rec["below_vanilla"] = bool(rec["speedup_vs_vanilla"] < 1.0 - rec["noise"])
        if rec["below_vanilla"]:
            slower = f"table's K={rec['dsd_k']} is slower than no speculation here"
            rec["note"] = K0_NOTE if rec["dsd_k"] == 0 else slower
        else:
            rec["note"] = ""
        if "num_drafts" in dsd.columns and "num_draft_tokens" in dsd.columns:
            rec["dsd_k_observed"] = _k_observed(dsd)
        adaptive = g[g["mode"] == MODE_ADAPTIVE]
        variants = [dsd] if adaptive.empty else [dsd, adaptive]
        if {"acceptance_length", "itl_s"} <= set(g.columns):
            best_rows = fixed[fixed["num_spec_tokens"] == best_k]
            intervals = regret_intervals(int(b), best_rows, variants, confidence)
        else:
            intervals = [(math.nan, math.nan)] * len(variants)
        rec["regret_lo"], rec["regret_hi"] = intervals[0]
        if not adaptive.empty:
            rec["tops_adaptive"] = float(adaptive["tops"].median())
            rec["adaptive_regret"] = 1.0 - rec["tops_adaptive"] / rec["tops_best_fixed"]
            rec["adaptive_regret_lo"], rec["adaptive_regret_hi"] = intervals[1]
            rec["adaptive_speedup_vs_vanilla"] = rec["tops_adaptive"] / rec["tops_vanilla"]
            rec["adaptive_k_observed"] = _k_observed(adaptive)
        records.append(rec)
    if not records:
        raise InputError("rows", len(df), "no batch size has ok vanilla, fixed-K and DSD rows")
    return pd.DataFrame.from_records(records)


def fixed_k_columns(comparison: pd.DataFrame) -> list[int]:
    """The fixed Ks present in a :func:`compare` result, ascending."""
    return sorted(int(c.removeprefix("tops_k")) for c in comparison.columns if c.startswith("tops_k"))


def regret_exceeds(comparison: pd.DataFrame, pct: float) -> list[int]:
    """Batch sizes whose regret is above ``pct`` percent."""
    return [int(b) for b, r in zip(comparison["batch_size"], comparison["regret"]) if r * 100.0 > pct]


def below_vanilla_ranges(comparison: pd.DataFrame) -> list[FlaggedRange]:
    """Group consecutive flagged batch sizes (with the same note) into ranges."""
    out: list[FlaggedRange] = []
    cur: list[tuple[int, float, str]] = []
    for b, flag, sp, note in zip(comparison["batch_size"], comparison["below_vanilla"],
                                 comparison["speedup_vs_vanilla"], comparison["note"]):
        if flag and (not cur or cur[-1][2] == note):
            cur.append((int(b), float(sp), note))
            continue
        if cur:
            out.append(FlaggedRange(cur[0][0], cur[-1][0], min(s for _, s, _ in cur), cur[0][2]))
        cur = [(int(b), float(sp), note)] if flag else []
    if cur:
        out.append(FlaggedRange(cur[0][0], cur[-1][0], min(s for _, s, _ in cur), cur[0][2]))
    return out


def verdict_lines(comparison: pd.DataFrame, adaptive_note: str = "") -> list[str]:
    """The verdict under a comparison (``validate-report``'s lines, the report page's headline): the
    worst regret against the best fixed K, DSD's speedup range over vanilla, the adaptive plugin's
    worst regret (``adaptive_note`` appended), then one ``flag ...`` line per range below vanilla."""
    worst = comparison.loc[comparison["regret"].idxmax()]
    speedup = comparison["speedup_vs_vanilla"]
    lines = [f"max regret vs best fixed K: {worst['regret'] * 100:+.1f}% at BS {int(worst['batch_size'])}; "
             f"DSD vs vanilla: {speedup.min():.2f}x .. {speedup.max():.2f}x"]
    if "adaptive_regret" in comparison.columns and comparison["adaptive_regret"].notna().any():
        aw = comparison.loc[comparison["adaptive_regret"].idxmax()]
        lines.append(f"adaptive: max regret vs best fixed K {aw['adaptive_regret'] * 100:+.1f}% at BS "
                     f"{int(aw['batch_size'])} (static table there: {aw['regret'] * 100:+.1f}%)"
                     + adaptive_note)
    return lines + [f"flag {r.label()}" for r in below_vanilla_ranges(comparison)]
