"""The draft comparison report of a ``dsdprof compare-drafts`` directory (Markdown, a PNG, tables).

:func:`load_comparison` reads ``OUT/_drafts.json`` and every ``OUT/<draft>/<category>/`` run into
category grids (:mod:`dsdprof.decide.domains`); :func:`drafts_markdown` ranks the drafts for a mix
(:mod:`dsdprof.decide.drafts`) and lays out the ranking, the recommendation, memory, each draft's
table for the mix, AL per position and regret per category, and the vanillas side by side;
:func:`mix_ktable` is a draft's ``dsdprof.ktable/v2`` for the mix; :func:`drafts_figure` plots
speedup over vanilla against K per batch size, one line per (draft, category).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from dsdprof.decide.decision import BatchDecision
from dsdprof.decide.domains import category_grid, category_regret, mix_table, mixed_grid, per_position
from dsdprof.decide.drafts import (
    VANILLA_TOLERANCE,
    comparison_memory,
    rank_drafts,
    recommend,
    unsettled,
    vanilla_spreads,
)
from dsdprof.errors import InputError
from dsdprof.report.text import fmt_finite, fmt_interval


@dataclass(frozen=True)
class Comparison:
    out: Path
    plan: dict[str, Any]
    grids: dict[str, pd.DataFrame]  # draft -> category grid
    provenance: dict[str, Any]
    spec: dict[str, Any]  # the first run's sweep spec (target, grid, workload)


def load_comparison(out: str | Path) -> Comparison:
    """Every finished (draft, category) run of a compare-drafts directory."""
    from dsdprof.io.runs import open_run
    from dsdprof.jobs.compare_drafts import PLAN_FILE

    root = Path(out)
    if not (root / PLAN_FILE).is_file():
        raise InputError("directory", str(root), f"no {PLAN_FILE}: not a dsdprof compare-drafts directory")
    plan = json.loads((root / PLAN_FILE).read_text())
    grids: dict[str, pd.DataFrame] = {}
    prov: dict[str, Any] = {}
    spec: dict[str, Any] = {}
    for d in plan["drafts"]:
        runs = {c: open_run(root / d["name"] / c) for c in plan["categories"]  # started runs with rows only
                if any((root / d["name"] / c).glob("*.parquet"))}
        if runs:
            grids[d["name"]] = category_grid(runs)
            if not prov:
                first = next(iter(runs.values()))
                prov = first.provenance
                spec = first.manifests[0].spec_dump if first.manifests else {}
    if not grids:
        raise InputError("directory", str(root), "no draft has a finished run yet")
    return Comparison(root, plan, grids, prov, spec)


def default_mix(comp: Comparison) -> dict[str, float]:
    """The workload's own mix: each category weighted by its prompts in the workload file."""
    counts = {c: float(n) for c, n in comp.plan["categories"].items()}
    return counts if sum(counts.values()) > 0 else {c: 1.0 for c in counts}


def _memory_rows(comp: Comparison) -> list[str]:
    bmax, kmax, memory = comparison_memory(comp.spec, comp.plan["drafts"])
    lines = [f"| draft | method | weights MiB | KV KiB/token | KV MiB at BS {bmax}, K {kmax} |",
             "|---|---|---:|---:|---:|"]
    for d, m in memory:
        mib = [fmt_finite(m["weights_bytes"] / 2**20, 1), fmt_finite(m["kv_bytes_per_token"] / 2**10, 1),
               fmt_finite(m["kv_bytes"] / 2**20, 1)]
        lines.append(f"| {d['name']} | {d['method']} | {' | '.join(mib)} |")
    return lines


def _per_category_rows(comp: Comparison) -> list[str]:
    lines = ["| draft | category | BS | own K* | speedup [interval] | AL at K* | drafted per step at K* | "
             "acceptance per position (largest K) |", "|---|---|---:|---:|---|---:|---:|---|"]
    for name, grid in comp.grids.items():
        pp = per_position(grid).set_index(["category", "batch_size"])
        for c in sorted(grid["category"].unique()):
            g = grid[grid["category"] == c]
            best = mix_table(g, {c: 1.0})
            for _, r in best.iterrows():
                al = g[(g["batch_size"] == r["batch_size"]) & (g["num_spec_tokens"] == r["k"])]
                pos = pp.loc[(c, int(r["batch_size"])), "acceptance_per_pos"]
                pos_s = " ".join(fmt_finite(p) for p in pos) if pos is not None else "?"
                drafted = al["drafted_per_step"].iloc[0] if "drafted_per_step" in al else math.nan
                al_s = fmt_finite(al["acceptance_length"].iloc[0])
                lines.append(f"| {name} | {c} | {int(r['batch_size'])} | {int(r['k'])} | {fmt_interval(r)} | "
                             f"{al_s} | {fmt_finite(drafted)} | {pos_s} |")
    return lines


def _regret_rows(comp: Comparison, weights: dict[str, float]) -> list[str]:
    lines = ["| draft | category | BS | mix K | own K | speedup at mix K | own best | regret |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, grid in comp.grids.items():
        table = {int(b): int(k) for b, k in zip(*(mix_table(grid, weights)[c] for c in ("batch_size", "k")))}
        for _, r in category_regret(grid, table).iterrows():
            lines.append(f"| {name} | {r['category']} | {r['batch_size']} | {r['table_k']} | {r['own_k']} | "
                         f"{fmt_finite(r['speedup_at_table_k'])} | {fmt_finite(r['own_speedup'])} | "
                         f"{fmt_finite(100 * r['regret'], 1)} % |")
    return lines


def _vanilla_rows(comp: Comparison) -> list[str]:
    lines = ["| BS | " + " | ".join(f"{n}/{c}" for n, g in comp.grids.items()
                                    for c in sorted(g["category"].unique())) + " |"]
    lines.append("|---:|" + "---:|" * (lines[0].count("|") - 2))
    sizes = sorted({int(b) for g in comp.grids.values() for b in g["batch_size"]})
    for b in sizes:
        vals = []
        for g in comp.grids.values():
            for c in sorted(g["category"].unique()):
                v = g[(g["category"] == c) & (g["batch_size"] == b)]["vanilla_goodput"]
                vals.append(fmt_finite(v.iloc[0] * b, 1) if len(v) else "?")
        lines.append(f"| {b} | " + " | ".join(vals) + " |")
    return lines


def drafts_markdown(comp: Comparison, weights: dict[str, float], title: str = "") -> str:
    """The report (module docstring); ``weights`` the traffic mix (any scale)."""
    ranking = rank_drafts(comp.grids, weights)
    rec = recommend(ranking)
    total = sum(weights.values())
    mix = ", ".join(f"{c} {100 * w / total:.0f} %" for c, w in weights.items())
    eng = comp.spec.get("engine", {})
    out = [f"# {title or 'Draft comparison'}", "",
           f"Target `{eng.get('model', '?')}`; drafts: "
           + ", ".join(f"`{d['name']}` ({d['method']})" for d in comp.plan["drafts"])
           + "; categories (prompts): "
           + ", ".join(f"{c} ({n})" for c, n in comp.plan["categories"].items()) + f"; mix: {mix}.",
           "", f"**Recommendation:** {rec['text']}.", "",
           "## Ranking per batch size (each draft at its best K for the mix)", "",
           "Speedup = goodput over the vanilla that ran beside it, with its interval; *wins*: above "
           "every other draft's interval; *tied*: intervals overlap the leader's point; *vanillas "
           "disagree*: the drafts' own vanillas (one configuration) are more than "
           f"{VANILLA_TOLERANCE:.0%} apart there, machine drift the intervals do not hold: re-measure.", "",
           "| BS | rank | draft | K | speedup [interval] | verdict |", "|---:|---:|---|---:|---|---|"]
    for _, r in ranking.iterrows():
        out.append(f"| {r['batch_size']} | {r['rank']} | {r['draft']} | {r['k']} | {fmt_interval(r)} | "
                   f"{r['verdict']} |")
    bad = unsettled(ranking)
    if bad:
        out += ["", "Vanillas disagree (checked per category, before the mix; a mix takes its worst "
                "category): " + "; ".join(f"BS {b}: {c} {100 * s:.0f} % apart" for b, (s, c) in bad.items())
                + "."]
    out += ["", "## Draft memory (weights + draft KV; the target's KV is the same for all)", "",
            *_memory_rows(comp), "", "## Each draft's table for the mix", ""]
    for name, grid in comp.grids.items():
        t = mix_table(grid, weights)
        out.append(f"- **{name}**: " + ", ".join(f"BS {int(b)} -> K {int(k)}"
                                                  for b, k in zip(t["batch_size"], t["k"])))
    out += ["", "## By category: own best K, AL, acceptance per position", "", *_per_category_rows(comp),
            "", "## Regret per category of the mix table", "",
            "The share of a category's best speedup that the mix's K gives up at that batch size.", "",
            *_regret_rows(comp, weights), "", "## Vanilla side by side (tokens/s, whole batch)", "",
            "Each sweep's own vanilla (same target, same category prompts): they should agree across drafts "
            f"(more than {VANILLA_TOLERANCE:.0%} apart leaves a batch size unsettled).",
            "", *_vanilla_rows(comp), ""]
    return "\n".join(out)


class DraftsJSON(TypedDict):
    """``drafts-report --json``: the mix, the ranking rows (``rank_drafts``'s columns), each
    category's vanilla check before the mix, the unsettled batch sizes and the recommendation."""

    mix: dict[str, float]
    ranking: list[dict[str, object]]
    vanilla_by_category: list[dict[str, object]]
    unsettled: list[dict[str, object]]
    recommendation: dict[str, object]


def _plain(v: object) -> object:
    """A JSON value: numpy scalars as Python numbers, NaN as null."""
    if isinstance(v, np.generic):
        v = v.item()
    return None if isinstance(v, float) and not math.isfinite(v) else v


def drafts_json(comp: Comparison, weights: dict[str, float]) -> DraftsJSON:
    """The ranking as data (:class:`DraftsJSON`): what the text and Markdown reports render."""
    ranking = rank_drafts(comp.grids, weights)
    total = sum(weights.values())
    rows = [{k: _plain(v) for k, v in r.items()} for r in ranking.to_dict("records")]
    spreads = [{k: _plain(v) for k, v in r.items()}
               for r in vanilla_spreads(comp.grids, weights).to_dict("records")]
    bad: list[dict[str, object]] = [{"batch_size": b, "category": c, "vanilla_spread": s}
                                    for b, (s, c) in unsettled(ranking).items()]
    return {"mix": {c: w / total for c, w in weights.items()}, "ranking": rows,
            "vanilla_by_category": spreads, "unsettled": bad,
            "recommendation": {k: _plain(v) for k, v in recommend(ranking).items()}}


def mix_ktable(comp: Comparison, draft: str, weights: dict[str, float]) -> dict[str, Any]:
    """``draft``'s ``dsdprof.ktable/v2`` for the mix: per batch size the K of the highest mixed
    speedup; cells are the mixed cells (AL and ITL weighted by the mix)."""
    from dsdprof.export.table import build_table

    if draft not in comp.grids:
        raise InputError("--draft", draft, f"no finished run (drafts: {', '.join(comp.grids)})")
    grid = comp.grids[draft]
    mixed = mixed_grid(grid, weights)
    best = mix_table(grid, weights)
    cells = mixed.rename(columns={})[["batch_size", "num_spec_tokens", "acceptance_length", "itl_s"]].copy()
    cells["goodput"] = cells["acceptance_length"] / cells["itl_s"]
    opt = best.merge(cells, left_on=["batch_size", "k"], right_on=["batch_size", "num_spec_tokens"])
    opt = opt.rename(columns={"speedup": "speedup_vs_baseline"}).drop(columns=["num_spec_tokens"])
    total = sum(weights.values())
    prov = dict(comp.provenance)
    prov.update(draft=draft, mix=",".join(f"{c}={w / total:.4g}" for c, w in weights.items()))
    # the K of the highest mixed speedup per batch size: a K* with its speedup, no decision rule's
    answers = [BatchDecision(int(r["batch_size"]), int(r["k"]), float(r["goodput"]),
                             float(r["acceptance_length"]), float(r["itl_s"]), math.nan,
                             float(r["speedup_vs_baseline"])) for r in opt.to_dict("records")]
    analysis = SimpleNamespace(decisions=answers, points=[(d.batch_size, d.k) for d in answers], cells=cells,
                               provenance=prov, tolerance=0.0,
                               shape="dense-like" if list(opt["k"]) == sorted(opt["k"], reverse=True)
                               else "moe-like")
    return dict(build_table(analysis, source=str(comp.out / draft), decided=False))


def drafts_figure(comp: Comparison, weights: dict[str, float] | None = None):  # -> matplotlib Figure
    """Speedup over vanilla against K, one panel per batch size, a line per (draft, category); a
    batch size the ranking for ``weights`` (default: the workload's mix) leaves unsettled says so
    in its panel's title."""
    from matplotlib.figure import Figure

    bad = unsettled(rank_drafts(comp.grids, weights or default_mix(comp)))
    sizes = sorted({int(b) for g in comp.grids.values() for b in g["batch_size"]})
    fig = Figure(figsize=(3.2 * len(sizes), 3.2), dpi=110)
    axes = fig.subplots(1, len(sizes), squeeze=False)[0]
    styles = ["-", "--", ":", "-."]
    for ax, b in zip(axes, sizes):
        for i, (name, grid) in enumerate(comp.grids.items()):
            for j, c in enumerate(sorted(grid["category"].unique())):
                g = grid[(grid["batch_size"] == b) & (grid["category"] == c)].sort_values("num_spec_tokens")
                k = g["num_spec_tokens"].to_numpy()
                s = g["speedup"].to_numpy(float)
                err = np.vstack([s - g["speedup_low"].to_numpy(float), g["speedup_high"].to_numpy(float) - s])
                ax.errorbar(k, s, yerr=np.nan_to_num(err), linestyle=styles[j % len(styles)], marker="o",
                            color=f"C{i}", capsize=2, label=f"{name} / {c}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        if b in bad:
            spread, cat = bad[b]
            ax.set_title(f"BS {b}: vanillas disagree\n({cat} {100 * spread:.0f} %, no verdict)", fontsize=8,
                         color="firebrick")
        else:
            ax.set_title(f"BS {b}")
        ax.set_xlabel("K")
    axes[0].set_ylabel("speedup over vanilla")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def is_comparison(source: str | Path) -> bool:
    """A compare-drafts directory, or one draft's directory in it (what ``export --mix`` reads)."""
    from dsdprof.jobs.compare_drafts import PLAN_FILE

    src = Path(source)
    return (src / PLAN_FILE).is_file() or (src.parent / PLAN_FILE).is_file()


def mix_export_table(source: str | Path, mix: str, draft: str | None = None) -> dict[str, Any]:
    """``dsdprof export SOURCE --mix CAT=W,... [--draft NAME]``: the ``dsdprof.ktable/v2`` of one
    draft for a traffic mix. ``SOURCE``: a compare-drafts directory (``--draft`` names the draft
    unless one draft has runs) or one draft's directory in it (``OUT/<draft>``)."""
    from dsdprof.jobs.compare_drafts import PLAN_FILE
    from dsdprof.measure.categories import parse_mix

    src = Path(source)
    if (src / PLAN_FILE).is_file():
        comp = load_comparison(src)
        if draft is None:
            if len(comp.grids) != 1:
                raise InputError("--mix", mix, f"{src} compares {', '.join(comp.grids)}: name the draft "
                                 "with --draft NAME")
            draft = next(iter(comp.grids))
    elif (src.parent / PLAN_FILE).is_file():
        comp = load_comparison(src.parent)
        if draft is not None and draft != src.name:
            raise InputError("--draft", draft, f"{src} is draft {src.name!r}'s directory")
        draft = src.name
    else:
        raise InputError("--mix", mix, f"{src} is not a dsdprof compare-drafts directory (no {PLAN_FILE} "
                         "in it or its parent): a mix weighs the runs of one draft by category")
    weights = parse_mix(mix, list(comp.plan["categories"]))
    if draft not in comp.grids:
        raise InputError("--draft", draft, f"no finished run (drafts: {', '.join(comp.grids)})")
    if mixed_grid(comp.grids[draft], weights).empty:
        raise InputError("--mix", mix, f"draft {draft!r} has no (batch size, K) measured in every "
                         "category of positive weight")
    return mix_ktable(comp, draft, weights)
