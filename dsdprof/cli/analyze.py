"""Rendering of ``dsdprof analyze`` (rich lives only in CLI modules)."""

from __future__ import annotations

import json
import math

from rich.console import Console
from rich.table import Table

from dsdprof.decide.decision import BatchDecision
from dsdprof.report.text import fmt_number


def _interval(point: float, lo: float, hi: float) -> str:
    if math.isnan(lo) or math.isnan(hi):
        return f"{fmt_number(point)} [?]"
    return f"{fmt_number(point)} [{fmt_number(lo)}, {fmt_number(hi)}]"


def analysis_json(result, **extra: object) -> str:
    """The ``--json`` document: shape, decision settings, per-BS points and per-cell intervals
    (``extra`` keys last)."""
    cells = result.cells.drop(columns=[c for c in ("acceptance_per_pos",) if c in result.cells.columns])
    return json.dumps({
        "shape": result.shape, "monotonic": result.monotonic, "tolerance": result.tolerance,
        "confidence": result.confidence, "acceptance": result.acceptance,
        "decision_family": getattr(result, "family", 1),
        "intervals_known": result.intervals_known, "undecided": result.undecided,
        "optimal": json.loads(result.optimal.to_json(orient="records")),
        "cells": json.loads(cells.to_json(orient="records")),
        "coverage": None if result.coverage is None else result.coverage.record(),
        "provenance": {k: str(v) for k, v in result.provenance.items()},
        "synthetic_truth": _truth_records(result),
        "warnings": list(result.warnings), **extra,
    }, indent=2)


def _truth_records(result) -> list | None:
    """Synthetic acceptance: per (design, BS, K) the measured and the implied AL (decide/truth.py)."""
    truth = getattr(result, "truth", None)
    return None if truth is None else json.loads(truth.to_json(orient="records"))


def truth_table(truth) -> Table:
    """Measured AL(K) beside the AL the synthetic rates imply, with the model's standard error."""
    from rich import box

    t = Table(title="Synthetic acceptance: measured AL vs the rates' AL", box=box.SIMPLE_HEAD,
              padding=(0, 1), pad_edge=False, show_edge=False)
    for col in ("design", "BS", "K", "AL", "true AL", "AL/true", "SE", "z", "req-steps"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in truth.itertuples():
        t.add_row(r.design, str(r.batch_size), str(r.k), f"{r.acceptance_length:.4f}", f"{r.truth:.4f}",
                  f"{100 * r.error:+.2f}%", "-" if math.isnan(r.se) else f"{100 * r.se:.2f}%",
                  "-" if math.isnan(r.z) else f"{r.z:+.1f}", str(r.n))
    return t


def truth_lines(truth) -> list[str]:
    """Under the truth table: what lies beyond 3 standard errors, and the waves 0.5 % at 3 SE needs."""
    from dsdprof.decide.truth import TOLERANCE, Z

    far, unknown = truth[truth["z"].abs() > Z], int(truth["z"].isna().sum())
    lines = [f"{len(far)} of {len(truth) - unknown} rows beyond {Z:g} standard errors of the rates' AL"
             + (": " + ", ".join(f"{r.design} BS {r.batch_size} K {r.k}" for r in far.itertuples())
                if len(far) else "")
             + (f"; {unknown} without a standard error (no request-step counted)" if unknown else "")]
    short = truth[truth["se"] > TOLERANCE / Z]
    if len(short):
        need = ", ".join(f"{d} {int(g['waves_needed'].max())} (now {int(g['waves'].max())})"
                         for d, g in short.groupby("design"))
        lines.append(f"to resolve {TOLERANCE:.1%} at {Z:g} SE at every row: waves >= {need}")
    return lines


def shape_line(result) -> str:
    conf = f"{result.confidence:.0%}"
    if result.shape == "moe-like" and not result.intervals_known:
        return ("K* vs BS is non-monotonic (MoE-like) in the point estimates; intervals unknown, so not "
                "shown beyond noise")
    return {
        "moe-like": f"K* vs BS is non-monotonic (MoE-like): K* rises with batch size beyond its {conf} "
                    "intervals",
        "flat": "K* vs BS is flat (one K at every batch size; monotonic)",
    }.get(result.shape, "K* vs BS is monotonic non-increasing (dense-like)")


def _runner_up(d: BatchDecision) -> str:
    """``K=3 +1.9% [+0.4,+3.1]``: the runner-up and how much better the chosen K is (goodput ratio)."""
    if d.runner_up is None:
        return "-"
    txt = f"K={d.runner_up} {fmt_pct(d.margin - 1)}"
    lo, hi = d.interval
    if not d.interval_known or math.isnan(lo) or math.isnan(hi):
        return txt + " [?]"
    lo_txt, hi_txt = fmt_pct(lo - 1, sign=True, unit=""), fmt_pct(hi - 1, sign=True, unit="")
    return txt if lo_txt == hi_txt else f"{txt} [{lo_txt},{hi_txt}]"


def _decided(d: BatchDecision) -> str:
    return "yes" if d.decided else ("?" if not d.interval_known else "no")


def fmt_pct(x: float, sign: bool = True, unit: str = "%") -> str:
    """``+1.9%``; whole percents from 10 % on (``+364%``), so a row stays within 80 columns."""
    if x is None or math.isnan(x):
        return "-"
    digits = 0 if abs(x) >= 0.0995 else 1
    return f"{x * 100:{'+' if sign else ''}.{digits}f}{unit}"


def title_line(result) -> str:
    prov = result.provenance
    title = " / ".join(str(prov[k]) for k in ("model", "draft_model", "hardware") if prov.get(k))
    if prov.get("engine") == "sim":
        title += "  (sim: predicted)"
    from dsdprof.formats.provenance import is_synthetic

    if is_synthetic(prov):  # [engine] synthetic_acceptance_rates: AL configured, step times measured
        title += "  (synthetic acceptance)"
    return title


def compact_table(result) -> Table:
    """One line per batch size: K*, decided, runner-up with margin [interval], AL, ITL, goodput, speedup."""
    from rich import box

    conf = f"{result.confidence:.0%}"
    t = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    for col in ("BS", "K*", "decided", f"runner-up, margin [{conf}]", "AL", "ITL ms", "tok/s", "vs no-SD"):
        t.add_column(col, justify="right", no_wrap=True)
    for d in result.decisions:
        t.add_row(str(d.batch_size), str(d.k), _decided(d), _runner_up(d),
                  fmt_number(d.acceptance_length), fmt_number(d.itl_s * 1e3), fmt_number(d.goodput, 1),
                  fmt_number(d.speedup_vs_baseline) + "x")
    return t


def analysis_csv(result) -> str:
    """The per-BS result as CSV (list columns joined with ``;``)."""
    opt = result.optimal.copy()
    for col in opt.columns:
        if opt[col].map(lambda v: isinstance(v, (list, tuple))).any():
            opt[col] = opt[col].map(lambda v: ";".join(map(str, v)) if isinstance(v, (list, tuple)) else v)
    return opt.to_csv(index=False)


def render_analysis(result, console: Console, err_console: Console, wide: bool = False) -> None:
    """Optimal K per batch size, one line each; with ``wide``, every K's goodput vs the best."""
    conf = f"{result.confidence:.0%}"
    title = title_line(result)
    console.print("Optimal K per batch size" + (f": {title}" if title else ""), markup=False, highlight=False)
    console.print(compact_table(result) if not wide else _wide_table(result))
    if wide:
        console.print(_vs_best_table(result))
    if (truth := getattr(result, "truth", None)) is not None and not truth.empty:
        console.print(truth_table(truth))
        for line in truth_lines(truth):
            console.print(line, markup=False, highlight=False)
    _footer(result, console, err_console, conf)


def _wide_table(result) -> Table:
    conf = f"{result.confidence:.0%}"
    t = Table()
    for col in ("BS", "K*", "decided", "runner-up", f"margin [{conf}]", "AL", "ITL ms", "goodput tok/s",
                f"vs no-SD [{conf}]"):
        t.add_column(col, justify="right")
    ks = result.candidate_ks
    for k in ks:
        t.add_column(f"vs K={k}", justify="right")
    for d in result.decisions:
        t.add_row(str(d.batch_size), str(d.k), _decided(d), "-" if d.runner_up is None else str(d.runner_up),
                  _interval(d.margin, *d.interval), fmt_number(d.acceptance_length),
                  fmt_number(d.itl_s * 1e3), fmt_number(d.goodput, 1),
                  _interval(d.speedup_vs_baseline, d.speedup_low, d.speedup_high),
                  *[fmt_number(d.speedup_vs_k.get(k, math.nan)) + "x" for k in ks])
    return t


def _vs_best_table(result) -> Table:
    conf = f"{result.confidence:.0%}"
    ks = result.candidate_ks
    v = Table(title=f"Goodput vs the best K at each batch size, [{conf} interval]; * = chosen")
    v.add_column("BS", justify="right")
    for k in ks:
        v.add_column(f"K={k}", justify="right")
    chosen = dict(result.points)
    for b, group in result.cells.groupby("batch_size", sort=True):
        by_k = {int(r.num_spec_tokens): r for r in group.itertuples()}
        row = []
        for k in ks:
            c = by_k.get(k)
            row.append("" if c is None else _interval(c.ratio_to_best, c.ratio_low, c.ratio_high)
                       + ("*" if chosen.get(int(b)) == k else ""))
        v.add_row(str(int(b)), *row)
    return v


def _footer(result, console: Console, err_console: Console, conf: str) -> None:
    """Notes under the table: gaps, pooled runs, DSD vs fixed K, undecided sizes, shape."""
    from dsdprof.decide.analysis import fixed_k_summary

    cov = result.coverage
    if cov is not None and not cov.complete:
        err_console.print(f"warning: partial run: {cov.summary} (grid from the {cov.grid_from}); "
                          "`dsdprof export` refuses it unless --allow-partial", style="yellow",
                          markup=False, highlight=False)
    if result.provenance.get("pooled_runs"):
        pooled = {k: v for k, v in result.provenance.items()
                  if k.startswith("pooled_") and k != "pooled_runs"}
        console.print("pooled runs (--allow-mixed): " + result.provenance["pooled_runs"]
                      + "".join(f"; {k.removeprefix('pooled_')} = {v}" for k, v in pooled.items()),
                      markup=False, highlight=False)
    summary = fixed_k_summary(result)
    if not summary.empty:
        console.print("DSD vs always-K (geometric mean over batch sizes): " + ", ".join(
            f"K={int(r.k)} {r.geomean_speedup:.2f}x" for r in summary.itertuples()))
    opt = result.optimal
    from dsdprof.report.vanilla import vanilla_line  # where no speculation beat every K (vLLM's K=0 drafts)

    if (line := vanilla_line(opt, result.confidence)) is not None:
        console.print(line, style="red", markup=False, highlight=False)
    for warning in result.warnings:
        err_console.print(f"[yellow]{warning}[/]")
    unknown = {d.batch_size for d in result.decisions if not d.interval_known}
    open_bs = [b for b in result.undecided if b not in unknown]
    if open_bs:
        still = {d.batch_size: d.contenders for d in result.decisions}
        together = f" over all {result.family} batch sizes" if getattr(result, "family", 1) > 1 else ""
        console.print(f"not decided at {conf} confidence{together}: " + ", ".join(
            f"BS {b}"
            + (f" (K {','.join(map(str, still[b]))} still possible)" if len(still.get(b) or []) > 1 else "")
            for b in open_bs) + "; more repeats, or `dsdprof sweep --budget`, would separate them",
            markup=False, highlight=False)
    changed = [d for d in result.decisions if d.k != d.k_rule]
    if changed:
        console.print("kept non-increasing where undecided: " + ", ".join(
            f"BS {d.batch_size} K {d.k_rule} -> {d.k}" for d in changed))
    if result.acceptance == "chain":
        console.print("acceptance: AL of every K from the largest K's per-position acceptance (chain "
                      "drafter; measured AL agrees within its interval; at batch sizes where the largest K "
                      "has >= 2 repeats, its shares resampled over them)")
    console.print(f"{shape_line(result)}; tolerance {result.tolerance:.0%}, confidence {conf}")
    family = getattr(result, "family", 1)
    if family > 1 and result.intervals_known:
        console.print(f"decided: all {family} batch sizes together at {conf} (Bonferroni: each at "
                      f"{1 - (1 - result.confidence) / family:.1%}); intervals: {conf} each, ratios to the "
                      "best K of each bootstrap replicate", markup=False, highlight=False)
