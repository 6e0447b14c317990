"""Why a rollout's table or adaptive plugin fell behind: the table against the best fixed K (the
table's day and machine, prefill's share of the makespan, the K it served at the batch sizes the
rollout went through) and the adaptive plugin against the table in the same repeats (prefill,
step cost at the same batch size and K, steps at another K). Pure pandas over the rows of
:mod:`dsdprof.formats.rollouts`; :mod:`dsdprof.cli.rollout` renders it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from dsdprof.decide.live_stats import PairedRatio, paired_ratio
from dsdprof.formats.ktable_types import KTable
from dsdprof.formats.rollouts import KIND_ROLLOUT, KIND_SERVING
from dsdprof.report.rollout import _by_repeat, _ok, best_fixed_variant, decode_steps, prefill_seconds


@dataclass(frozen=True)
class KStretch:
    """The decode steps a rollout variant ran at one K, and what the best fixed K spent over the
    same batch sizes (medians over repeats)."""

    k: int
    bs_lo: int
    bs_hi: int
    steps: float
    seconds: float  # this variant's decode seconds at these batch sizes
    fixed_seconds: float  # the best fixed K's decode seconds at the same batch sizes


@dataclass(frozen=True)
class Shortfall:
    """What stands behind ``variant``'s makespan ratio to the best fixed K in a rollout."""

    variant: str
    best_fixed: str
    ratio: PairedRatio
    loses: bool  # the ratio's whole interval above 1
    table_day: str  # the table's measurement date ("" unknown)
    run_day: str
    age_days: float  # NaN unknown
    machine: float  # vanilla's decode steps here / the table's grid at the same batch sizes
    prefill_share: float  # the variant's prefill / makespan (median over repeats)
    fixed_prefill_share: float
    stretches: tuple[KStretch, ...]

    def reasons(self) -> list[str]:
        """One line per cause that applies (empty: none of the three stands out)."""
        out = []
        if (not math.isnan(self.age_days) and self.age_days >= 1) or (
                not math.isnan(self.machine) and abs(self.machine - 1) > 0.1):
            out.append(f"the table was measured on {self.table_day or 'another day'}"
                       + (f", {self.age_days:.0f} days before this run" if self.age_days >= 1 else "")
                       + (f"; vanilla's steps here ran {self.machine:.2f}x the table's grid (another "
                          "load or machine), so its K choice was made on other step costs"
                          if not math.isnan(self.machine) else ""))
        if not math.isnan(self.prefill_share) and self.prefill_share > 0.25:
            out.append(f"prefill is {self.prefill_share:.0%} of its makespan "
                       f"({self.best_fixed}: {self.fixed_prefill_share:.0%}); the table decides decode "
                       "steps only, so its gain is diluted and prefill noise sits in the ratio")
        worse = [s for s in self.stretches if s.seconds > 1.05 * s.fixed_seconds and s.fixed_seconds > 0]
        fixed_k = int(self.best_fixed.split("-", 1)[1]) if self.best_fixed.startswith("fixed-") else -1
        for s in worse:
            if s.k != fixed_k:
                out.append(f"at batch {s.bs_lo}-{s.bs_hi} it served K={s.k}: {s.seconds:.2f} s over "
                           f"{s.steps:.0f} steps, {self.best_fixed} {s.fixed_seconds:.2f} s there (the "
                           "table's K is the steady-batch optimum, not a draining batch's)")
        return out


def _day(iso: str) -> str:
    return iso[:10] if iso else ""


def _age_days(table_iso: str, run_iso: str) -> float:
    try:
        return (datetime.fromisoformat(run_iso) - datetime.fromisoformat(table_iso)).total_seconds() / 86400
    except (TypeError, ValueError):
        return math.nan


def machine_factor(d: pd.DataFrame, table: KTable) -> float:
    """Median over vanilla's decode steps of measured seconds / the table's grid at that batch size
    (NaN with no vanilla rollout or no grid): the machine and load today against the table's."""
    from dsdprof.decide.makespan import grid_from_table
    from dsdprof.errors import InputError

    try:
        grid = grid_from_table(table)
    except InputError:
        return math.nan
    r = [sec / grid.itl(b, 0) for _, row in d[d["variant"] == "vanilla"].iterrows()
         for b, _, sec in decode_steps(row)]
    return statistics.median(r) if r else math.nan


def _stretches(d: pd.DataFrame, variant: str, best: str) -> tuple[KStretch, ...]:
    """Per K the variant served: its decode steps' batch sizes, steps and seconds, and the best fixed
    K's decode seconds over the same batch sizes (medians over repeats)."""
    per_rep: dict[int, dict[int, list[tuple[int, float]]]] = {}
    for _, row in d[d["variant"] == variant].iterrows():
        rep = per_rep.setdefault(int(row["repeat"]), {})
        for b, k, sec in decode_steps(row):
            rep.setdefault(k, []).append((b, sec))
    fixed: dict[int, list[tuple[int, float]]] = {}
    for _, row in d[d["variant"] == best].iterrows():
        fixed[int(row["repeat"])] = [(b, sec) for b, _, sec in decode_steps(row)]
    out = []
    for k in sorted({k for rep in per_rep.values() for k in rep}, reverse=True):
        sizes = [b for rep in per_rep.values() for b, _ in rep.get(k, [])]
        lo, hi = min(sizes), max(sizes)
        steps = statistics.median(len(rep.get(k, [])) for rep in per_rep.values())
        secs = statistics.median(sum(s for _, s in rep.get(k, [])) for rep in per_rep.values())
        fsecs = (statistics.median(sum(s for b, s in st if lo <= b <= hi) for st in fixed.values())
                 if fixed else math.nan)
        out.append(KStretch(k, lo, hi, steps, secs, fsecs))
    return tuple(out)


def shortfall(df: pd.DataFrame, table: KTable | None, variant: str = "dsd") -> Shortfall | None:
    """``variant``'s rollout against the best fixed K, with what stands behind it (None: no such
    variant or no fixed K ran)."""
    d = _ok(df, KIND_ROLLOUT)
    best = best_fixed_variant(d)
    if not best or not (d["variant"] == variant).any():
        return None
    ratio = paired_ratio(_by_repeat(d, variant, "makespan_s"), _by_repeat(d, best, "makespan_s"), variant,
                         best)
    prov = table.get("provenance") if table is not None else None
    table_iso = str(prov.get("created_at") or "") if prov else ""
    run_iso = str(d["created_at"].dropna().min() or "") if "created_at" in d else ""

    def share(v: str) -> float:
        xs = [prefill_seconds(r) / float(r["makespan_s"]) for _, r in d[d["variant"] == v].iterrows()
              if float(r["makespan_s"]) > 0]
        xs = [x for x in xs if not math.isnan(x)]
        return statistics.median(xs) if xs else math.nan

    return Shortfall(variant, best, ratio, bool(ratio.lo > 1), _day(table_iso), _day(run_iso),
                     _age_days(table_iso, run_iso) if table_iso and run_iso else math.nan,
                     machine_factor(d, table) if table else math.nan, share(variant), share(best),
                     _stretches(d, variant, best))


@dataclass(frozen=True)
class PluginCost:
    """The adaptive plugin against the table (``dsd``) in the same repeats: ratios and where the
    rollout time differs (medians over repeats, adaptive minus dsd, seconds)."""

    rollout: PairedRatio | None  # makespan, adaptive / dsd (< 1: the plugin faster)
    serving: tuple[tuple[float, PairedRatio], ...]  # (rate, tokens/s adaptive / dsd: > 1 faster)
    prefill_s: float
    decode_s: float
    step_ratio: float  # median over (repeat, batch size, K) of the step seconds, adaptive / dsd
    steps: tuple[float, float]  # median decode steps (adaptive, dsd)
    other_k_steps: float  # median per rollout of the plugin's steps at a K the table does not serve there


def _table_k(d: pd.DataFrame) -> dict[int, int]:
    """The table's K per lookup batch size, as the dsd engine served it."""
    out: dict[int, int] = {}
    for _, row in d[d["variant"] == "dsd"].iterrows():
        for b, k in zip(row["step_batch_size"], row["step_k"]):
            out.setdefault(int(b), int(k))
    return out


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def plugin_cost(df: pd.DataFrame) -> PluginCost | None:
    """:class:`PluginCost` of a run with both ``dsd`` and ``adaptive`` (None otherwise)."""
    ok = df[df["status"] == "ok"]
    if not {"dsd", "adaptive"} <= set(ok["variant"]):
        return None
    d = _ok(df, KIND_ROLLOUT)
    roll = None
    pre, dec, ratios, other = [], [], [], []
    steps_a, steps_d = [], []
    if {"dsd", "adaptive"} <= set(d["variant"]):
        roll = paired_ratio(_by_repeat(d, "adaptive", "makespan_s"), _by_repeat(d, "dsd", "makespan_s"),
                            "adaptive", "dsd")
        table_k = _table_k(d)
        for _, g in d.groupby("repeat"):
            a, t = g[g["variant"] == "adaptive"], g[g["variant"] == "dsd"]
            if a.empty or t.empty:
                continue
            ra, rt = a.iloc[0], t.iloc[0]
            pa, pt = prefill_seconds(ra), prefill_seconds(rt)
            if not (math.isnan(pa) or math.isnan(pt)):
                pre.append(pa - pt)
            sa, st = decode_steps(ra), decode_steps(rt)
            dec.append(sum(s for *_, s in sa) - sum(s for *_, s in st))
            steps_a.append(len(sa))
            steps_d.append(len(st))
            by_t: dict[tuple[int, int], list[float]] = {}
            for b, k, s in st:
                by_t.setdefault((b, k), []).append(s)
            by_a: dict[tuple[int, int], list[float]] = {}
            for b, k, s in sa:
                by_a.setdefault((b, k), []).append(s)
            ratios += [_median(by_a[key]) / _median(by_t[key]) for key in by_a if key in by_t]
            other.append(sum(1 for b, k in zip(ra["step_batch_size"], ra["step_k"])
                             if int(b) in table_k and int(k) != table_k[int(b)]))
    serving = []
    s = _ok(df, KIND_SERVING)
    for rate, g in s.groupby("rate_per_s"):
        if {"dsd", "adaptive"} <= set(g["variant"]):
            r = paired_ratio(_by_repeat(g, "adaptive", "tokens_per_s"), _by_repeat(g, "dsd", "tokens_per_s"),
                             "adaptive", "dsd")
            serving.append((float(rate), r))
    return PluginCost(roll, tuple(serving), _median(pre), _median(dec), _median(ratios),
                      (_median(steps_a), _median(steps_d)), _median(other))
