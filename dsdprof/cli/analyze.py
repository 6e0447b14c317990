"""Rendering of ``dsdprof analyze`` (rich lives only in CLI modules)."""

from __future__ import annotations

import json
import math

from rich.console import Console
from rich.table import Table

from dsdprof.cli.common import fmt_number


def _interval(point: float, lo: float, hi: float) -> str:
    if math.isnan(lo) or math.isnan(hi):
        return f"{fmt_number(point)} [?]"
    return f"{fmt_number(point)} [{fmt_number(lo)}, {fmt_number(hi)}]"


def analysis_json(result) -> str:
    """The ``--json`` document: shape, decision settings, per-BS points and per-cell intervals."""
    cells = result.cells.drop(columns=[c for c in ("acceptance_per_pos",) if c in result.cells.columns])
    return json.dumps({
        "shape": result.shape, "monotonic": result.monotonic, "tolerance": result.tolerance,
        "confidence": result.confidence, "acceptance": result.acceptance,
        "intervals_known": result.intervals_known, "undecided": result.undecided,
        "optimal": json.loads(result.optimal.to_json(orient="records")),
        "cells": json.loads(cells.to_json(orient="records")),
    }, indent=2)


def shape_line(result) -> str:
    conf = f"{result.confidence:.0%}"
    if result.shape == "moe-like" and not result.intervals_known:
        return "K* vs BS is non-monotonic (MoE-like) in the point estimates; intervals unknown, so not shown beyond noise"
    return {
        "moe-like": f"K* vs BS is non-monotonic (MoE-like): K* rises with batch size beyond its {conf} intervals",
        "flat": "K* vs BS is flat (one K at every batch size; monotonic)",
    }.get(result.shape, "K* vs BS is monotonic non-increasing (dense-like)")


def render_analysis(result, console: Console, err_console: Console) -> None:
    """Optimal K per batch size with decisions and margins, then every K's goodput vs the best."""
    from dsdprof.decide.analysis import fixed_k_summary

    prov = result.provenance
    title = " / ".join(str(prov[k]) for k in ("model", "draft_model", "hardware") if prov.get(k))
    if prov.get("engine") == "sim":
        title += "  (sim: predicted)"
    conf = f"{result.confidence:.0%}"
    t = Table(title=f"Optimal K per batch size  {title}")
    for col in ("BS", "K*", "decided", "runner-up", f"margin [{conf}]", "AL", "ITL ms", "goodput tok/s", "vs no-SD"):
        t.add_column(col, justify="right")
    ks = result.candidate_ks
    for k in ks:
        t.add_column(f"vs K={k}", justify="right")
    for _, r in result.optimal.iterrows():
        decided = "yes" if r["decided"] else ("?" if not r["interval_known"] else "no")
        runner = "-" if r["runner_up"] is None or str(r["runner_up"]) == "<NA>" else str(int(r["runner_up"]))
        t.add_row(str(int(r["batch_size"])), str(int(r["k"])), decided, runner,
                  _interval(r["margin"], r["ci_low"], r["ci_high"]), fmt_number(r["acceptance_length"]),
                  fmt_number(r["itl_s"] * 1e3), fmt_number(r["goodput"], 1), fmt_number(r["speedup_vs_baseline"]) + "x",
                  *[fmt_number(r[f"speedup_vs_k{k}"]) + "x" for k in ks])
    console.print(t)

    v = Table(title=f"Goodput vs the best K at each batch size, [{conf} interval]; * = chosen")
    v.add_column("BS", justify="right")
    for k in ks:
        v.add_column(f"K={k}", justify="right")
    chosen = dict(zip(result.optimal["batch_size"].astype(int), result.optimal["k"].astype(int)))
    for b, group in result.cells.groupby("batch_size", sort=True):
        by_k = {int(r.num_spec_tokens): r for r in group.itertuples()}
        row = []
        for k in ks:
            c = by_k.get(k)
            row.append("" if c is None else _interval(c.ratio_to_best, c.ratio_low, c.ratio_high)
                       + ("*" if chosen.get(int(b)) == k else ""))
        v.add_row(str(int(b)), *row)
    console.print(v)

    summary = fixed_k_summary(result)
    if not summary.empty:
        console.print("DSD vs always-K (geometric mean over batch sizes): " + ", ".join(
            f"K={int(r.k)} {r.geomean_speedup:.2f}x" for r in summary.itertuples()))
    opt = result.optimal
    for warning in result.warnings:
        err_console.print(f"[yellow]{warning}[/]")
    open_bs = [b for b in result.undecided if b not in set(opt.loc[~opt["interval_known"], "batch_size"])]
    if open_bs:
        console.print(f"not decided at {conf} confidence: batch size {', '.join(map(str, open_bs))} "
                      "(more repeats, or `dsdprof sweep --budget`, would separate them)")
    changed = opt[opt["k"] != opt["k_rule"]]
    if len(changed):
        console.print("kept non-increasing where undecided: " + ", ".join(
            f"BS {int(r.batch_size)} K {int(r.k_rule)} -> {int(r.k)}" for r in changed.itertuples()))
    if result.acceptance == "chain":
        console.print("acceptance: AL of every K from the largest K's per-position acceptance (chain drafter; "
                      "measured AL agrees within its interval)")
    console.print(f"{shape_line(result)}; tolerance {result.tolerance:.0%}, confidence {conf}")
