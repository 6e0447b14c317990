"""Panels of the other run kinds, from the data their own commands read: a validate run
(``validate-report``: :func:`dsdprof.report.compare.compare`), a rollout run (``rollout-report``:
:mod:`dsdprof.report.rollout`), a compare-drafts directory (``drafts-report``:
:mod:`dsdprof.report.drafts`) and a context sweep (``analyze``'s analysis per context slice)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from dsdprof.report.html.model import Cell, Panel, TableData, finite, interval, num
from dsdprof.report.html.svg import Mark, Series, xy_chart
from dsdprof.report.html.sweep import heatmap_panel, records

if TYPE_CHECKING:
    import pandas as pd

    from dsdprof.decide.context import ContextAnalysis


def _ci(r: Any, col: str) -> str:
    return f"{num(r.get(col))} {interval(r.get(col + '_lo'), r.get(col + '_hi'))}"


def validate_panels(rows: pd.DataFrame, confidence: float) -> tuple[list[Panel], list[str]]:
    """``validate-report``'s comparison: tokens/s per user of vanilla, each fixed K, the table's DSD
    (and the adaptive plugin), then regret against the best fixed K and speedup over vanilla; and
    its verdict lines (:func:`dsdprof.report.compare.verdict_lines`)."""
    from dsdprof.report.compare import compare, fixed_k_columns, verdict_lines
    from dsdprof.report.vanilla import validate_vanilla, validate_vanilla_line

    comp = compare(rows)
    ks = fixed_k_columns(comp)
    adaptive = "tops_adaptive" in comp.columns
    recs = comp.to_dict(orient="records")
    bss = [int(r["batch_size"]) for r in recs]
    p = Panel("validate", "Validate: the table served against vanilla and fixed K",
              "Tokens/s per user (median over repeats) of each variant served on vLLM; DSD is the table on "
              "vLLM's schedule.")
    variants = [("vanilla", "tops_vanilla"), *[(f"K={k}", f"tops_k{k}") for k in ks], ("DSD", "tops_dsd")]
    if adaptive:
        variants.append(("adaptive", "tops_adaptive"))
    series = []
    for name, col in variants:
        s = Series(name)
        for i, r in enumerate(recs):
            if finite(r.get(col)):
                s.marks.append(Mark(i, float(r[col]), f"BS {r['batch_size']}, {name}: {num(r[col])} tok/s "
                                    f"per user over {r.get('repeats', '?')} repeat(s)"))
        series.append(s)
    p.charts.append(xy_chart(series, [str(b) for b in bss], x_title="batch size",
                             y_title="tokens/s per user", y_min=0, chart_id="chart-validate"))
    speeds = [[Cell(str(r["batch_size"])), *[Cell(num(r.get(c)), title=f"{n}: {num(r.get(c))} tok/s per user")
                                             for n, c in variants]] for r in recs]
    p.tables.append(TableData("tokens/s per user (median over repeats)", ["BS", *[n for n, _ in variants]],
                              speeds, "validate-speeds"))
    dec = []
    for r in recs:
        k_txt = str(int(r["dsd_k"]))
        if finite(r.get("dsd_k_observed")) and abs(float(r["dsd_k_observed"]) - float(r["dsd_k"])) > 0.05:
            k_txt += f" ({float(r['dsd_k_observed']):.1f})"
        regret_ci = interval(100 * float(r.get("regret_lo", math.nan)),
                             100 * float(r.get("regret_hi", math.nan)))
        dec.append([Cell(str(r["batch_size"])), Cell(k_txt), Cell(str(int(r["best_fixed_k"]))),
                    Cell(f"{100 * float(r['regret']):+.1f} %",
                         title=f"regret 1 - DSD / best fixed K, {confidence:.0%} interval {regret_ci} %"),
                    Cell(regret_ci),
                    Cell(f"{num(r['speedup_vs_vanilla'])}x" + (" *" if r.get("below_vanilla") else ""),
                         cls="warn" if r.get("below_vanilla") else ""),
                    Cell(str(r.get("repeats", "-")))])
    p.tables.append(TableData("DSD against the best fixed K (regret in %, * below vanilla beyond the noise)",
                              ["BS", "DSD K", "best fixed K", "regret", "interval", "speedup", "repeats"],
                              dec, "validate-decision"))
    headline = verdict_lines(comp)
    line = validate_vanilla_line(validate_vanilla(rows, confidence), confidence)
    if line:
        p.notes.append(line)
        headline.append(line)
    return [p], headline


def rollout_headline(df: Any) -> list[str]:
    """Each variant's rollout makespan against vanilla's and the best fixed K's (paired by repeat)."""
    from dsdprof.report.rollout import rollout_summary

    return [f"{x['variant']}: makespan {num(x['makespan_s'])} s, {_ci(x, 'vs_vanilla')} of vanilla's, "
            f"{_ci(x, 'vs_best')} of the best fixed K's"
            for x in rollout_summary(df).to_dict(orient="records") if x["variant"] != "vanilla"]


def rollout_panels(df: Any) -> list[Panel]:
    """``rollout-report``'s tables: rollout makespans and serving percentiles per variant."""
    from dsdprof.report.rollout import rollout_summary, serving_ratios, serving_summary

    out = []
    r = rollout_summary(df)
    if len(r):
        p = Panel("rollout", "Rollout: makespan per variant",
                  "Median over repeats; ratios are makespan / vanilla's or / the best fixed K's (same "
                  "repeat), geometric mean with a 95 % t interval; below 1 is faster.")
        recs = r.to_dict(orient="records")
        s = Series("makespan", line=False)
        for i, x in enumerate(recs):
            s.marks.append(Mark(i, float(x["makespan_s"]), f"{x['variant']}: makespan {num(x['makespan_s'])} "
                                f"s, vs vanilla {_ci(x, 'vs_vanilla')}", label=num(x["makespan_s"])))
        p.charts.append(xy_chart([s], [str(x["variant"]) for x in recs], x_title="variant",
                                 y_title="makespan, s", y_min=0, chart_id="chart-rollout"))
        rows = [[Cell(str(x["variant"])), Cell(num(x["makespan_s"])), Cell(num(x["tokens_per_s"])),
                 Cell(num(x["tail_s"])), Cell(num(x["mean_k"])), Cell(_ci(x, "vs_vanilla")),
                 Cell(_ci(x, "vs_best"))] for x in recs]
        cols = ["variant", "makespan s", "tok/s", "tail s", "K", "vs vanilla", "vs best fixed"]
        p.tables.append(TableData("rollout: medians over repeats", cols, rows, "rollout-table"))
        out.append(p)
    s_ = serving_summary(df)
    if len(s_):
        p = Panel("serving", "Serving: latency and goodput per variant and rate",
                  "Medians over repeats, in ms; goodput: requests/s within the SLOs.")
        recs = s_.to_dict(orient="records")
        rates = sorted({float(x["rate_per_s"]) for x in recs})
        series = []
        for v in dict.fromkeys(str(x["variant"]) for x in recs):
            se = Series(v)
            for x in recs:
                if str(x["variant"]) == v and finite(x.get("tokens_per_s")):
                    se.marks.append(Mark(rates.index(float(x["rate_per_s"])), float(x["tokens_per_s"]),
                                         f"{v} at {x['rate_per_s']:g} req/s: {num(x['tokens_per_s'])} tok/s, "
                                         f"TPOT p50 {num(1e3 * x['tpot_p50_s'])} ms"))
            series.append(se)
        p.charts.append(xy_chart(series, [f"{r:g}" for r in rates], x_title="request rate, req/s",
                                 y_title="output tokens/s", y_min=0, chart_id="chart-serving"))
        p.tables.append(TableData("serving: medians over repeats",
                                  ["rate", "variant", "TTFT50", "TPOT50", "TPOT99", "ITL99", "good req/s",
                                   "K"],
                                  [[Cell(f"{x['rate_per_s']:g}"), Cell(str(x["variant"])),
                                    *[Cell(num(1e3 * float(x[c]))) for c in ("ttft_p50_s", "tpot_p50_s",
                                                                             "tpot_p99_s", "itl_p99_s")],
                                    Cell(num(x["goodput_req_s"])), Cell(num(x["mean_k"]))] for x in recs],
                                  "serving-table"))
        ratios = serving_ratios(df).to_dict(orient="records")
        p.tables.append(TableData("output tokens/s paired by repeat (> 1 is faster)",
                                  ["rate", "variant", "vs vanilla", "vs best fixed", "best fixed"],
                                  [[Cell(f"{x['rate_per_s']:g}"), Cell(str(x["variant"])),
                                    Cell(_ci(x, "vs_vanilla")), Cell(_ci(x, "vs_best")),
                                    Cell(str(x["best_fixed"]))] for x in ratios],
                                  "serving-ratios"))
        out.append(p)
    if not out:
        out.append(Panel("rollout", "Rollout",
                         missing=["the rollout file has no ok rollout or serving rows"]))
    return out


def drafts_panels(comp: Any) -> list[Panel]:
    """``drafts-report``'s ranking for the workload's own mix, as its 80-column text."""
    from dsdprof.decide.drafts import rank_drafts, unsettled
    from dsdprof.report.drafts import default_mix
    from dsdprof.report.drafts_text import drafts_text

    weights = default_mix(comp)
    p = Panel("drafts", "Drafts: ranking per batch size for the workload's mix",
              "What `dsdprof drafts-report` prints for the workload's own mix of prompt categories.")
    sizes = sorted({int(b) for g in comp.grids.values() for b in g["batch_size"]})
    bad = unsettled(rank_drafts(comp.grids, weights))  # no verdict there: hollow marks, as the text says
    series = []
    for name, grid in comp.grids.items():  # per (draft, category): the best K's speedup at each batch size
        for cat in sorted(grid["category"].unique()):
            s = Series(f"{name} / {cat}")
            for i, b in enumerate(sizes):
                g = grid[(grid["batch_size"] == b) & (grid["category"] == cat)]
                g = g[g["speedup"].map(finite)]
                if len(g):
                    r = g.loc[g["speedup"].astype(float).idxmax()]
                    s.marks.append(Mark(i, float(r["speedup"]), f"{name} on {cat}, BS {b}: best K="
                                        f"{int(r['num_spec_tokens'])}, speedup {num(r['speedup'])}x "
                                        f"{interval(r['speedup_low'], r['speedup_high'])}, AL "
                                        f"{num(r['acceptance_length'])}"
                                        + ("; vanillas disagree: not settled" if b in bad else ""),
                                        float(r["speedup_low"]), float(r["speedup_high"]),
                                        filled=b not in bad))
            series.append(s)
    if series:
        p.charts.append(xy_chart(series, [str(b) for b in sizes], x_title="batch size",
                                 y_title="best speedup over vanilla", ref_y=1.0, ref_label="vanilla",
                                 chart_id="chart-drafts"))
    if bad:
        p.notes.append("Hollow: vanillas disagree, no verdict (" + "; ".join(
            f"BS {b}: {c} {100 * s:.0f} % apart" for b, (s, c) in bad.items()) + ").")
    p.notes.append("pre:" + drafts_text(comp, weights))
    missing = [d["name"] for d in comp.plan.get("drafts", []) if d["name"] not in comp.grids]
    if missing:
        p.missing.append(f"no finished run yet for draft {', '.join(missing)}")
    return [p]


def context_panels(by_context: ContextAnalysis) -> list[Panel]:
    """A context sweep: K* against batch size per context, and a goodput heatmap per context."""
    p = Panel("contexts", "K* against batch size, per context",
              "One line per context (prompt tokens) the sweep measured; hollow: not decided.")
    opts = {c: a.decisions for c, a in by_context.slices.items()}
    bss = sorted({r.batch_size for o in opts.values() for r in o})
    series = []
    for c, o in opts.items():
        s = Series(f"ctx {c}")
        for r in o:
            s.marks.append(Mark(bss.index(r.batch_size), float(r.k),
                                f"context {c}, BS {r.batch_size}: K*={r.k} "
                                f"({'decided' if r.decided else 'not decided'})", filled=r.decided))
        series.append(s)
    p.charts.append(xy_chart(series, [str(b) for b in bss], x_title="batch size", y_title="K*", y_min=-0.3,
                             integer_y=True, chart_id="chart-contexts"))
    for c, why in sorted(getattr(by_context, "skipped", {}).items()):
        p.missing.append(f"context {c}: no slice ({why})")
    for c, cov in sorted(getattr(by_context, "gaps", {}).items()):
        p.missing.append(f"context {c}: {cov.gap_summary}")
    out = [p]
    for c, a in by_context.slices.items():
        h = heatmap_panel(records(a.cells), records(a.baseline), opts[c])
        h.id, h.title = f"heatmap-ctx{c}", f"Goodput at context {c}: batch size x K, with vanilla"
        for t in h.tables:
            t.id = f"heatmap-ctx{c}"
            for row in t.rows:
                for cell in row:
                    cell.href = ""  # no row table per context: the title carries the numbers
        out.append(h)
    return out
