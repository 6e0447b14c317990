"""The draft comparison at 80 columns and as a ranking plot (``dsdprof drafts-report``).

:func:`drafts_text`: the recommendation, the ranking per batch size (each draft at its own best K
for the mix, speedup over vanilla with its interval), draft memory, each draft's table for the mix
and, per category, its own best K with the acceptance length and the draft tokens it proposed per
request-step (its effective K: below K for a drafter that proposes 0..K, n-gram), and each
sweep's own vanilla side by side. Plain text,
no line over 80 columns. :func:`ranking_figure`: speedup over vanilla against batch size, a
point per draft at its mix K with the interval, labelled with that K; a batch size left without a
verdict (the drafts' vanillas disagree) is shaded, its points hollow, and labelled so.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from dsdprof.decide.domains import mix_table
from dsdprof.decide.drafts import VANILLA_TOLERANCE, comparison_memory, rank_drafts, recommend, unsettled
from dsdprof.report.text import fmt_finite, fmt_interval

WIDTH = 80


def _wrap(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def _mix_line(weights: dict[str, float]) -> str:
    total = sum(weights.values())
    return ", ".join(f"{c} {100 * w / total:.0f} %" for c, w in weights.items())


def _memory(comp: Any) -> list[str]:
    bmax, kmax, memory = comparison_memory(comp.spec, comp.plan["drafts"])
    out = [f"  {'draft':<16} {'method':<12} {'weights MiB':>11} {'KV KiB/tok':>10} "
           f"{f'KV MiB BS{bmax} K{kmax}':>16}"]
    for d, m in memory:
        weights = fmt_finite(m["weights_bytes"] / 2**20, 1)
        per_token = fmt_finite(m["kv_bytes_per_token"] / 2**10, 1)
        out.append(f"  {d['name'][:16]:<16} {d['method'][:12]:<12} {weights:>11} "
                   f"{per_token:>10} {fmt_finite(m['kv_bytes'] / 2**20, 1):>16}")
    return out


def _per_category(comp: Any) -> list[str]:
    out = [f"  {'draft':<14} {'category':<9} {'BS':>3} {'K*':>2} {'speedup [interval]':<20} "
           f"{'AL':>5} {'drafted':>7}"]
    for name, grid in comp.grids.items():
        for c in sorted(grid["category"].unique()):
            g = grid[grid["category"] == c]
            for _, r in mix_table(g, {c: 1.0}).iterrows():
                row = g[(g["batch_size"] == r["batch_size"]) & (g["num_spec_tokens"] == r["k"])].iloc[0]
                drafted = row["drafted_per_step"] if "drafted_per_step" in row else math.nan
                out.append(f"  {name[:14]:<14} {c[:9]:<9} {int(r['batch_size']):>3} {int(r['k']):>2} "
                           f"{fmt_interval(r):<20} {fmt_finite(row['acceptance_length']):>5} "
                           f"{fmt_finite(drafted):>7}")
    return out


def _vanillas(comp: Any) -> list[str]:
    sizes = sorted({int(b) for g in comp.grids.values() for b in g["batch_size"]})
    out = [f"  {'sweep':<24}" + "".join(f"{f'BS {b}':>9}" for b in sizes)]
    for name, grid in comp.grids.items():
        for c in sorted(grid["category"].unique()):
            vals = []
            for b in sizes:
                v = grid[(grid["category"] == c) & (grid["batch_size"] == b)]["vanilla_goodput"]
                vals.append(fmt_finite(v.iloc[0] * b, 1) if len(v) else "?")
            out.append(f"  {f'{name}/{c}'[:24]:<24}" + "".join(f"{x:>9}" for x in vals))
    return out


def drafts_text(comp: Any, weights: dict[str, float], title: str = "") -> str:
    """The report at 80 columns (module docstring)."""
    ranking = rank_drafts(comp.grids, weights)
    rec = recommend(ranking)
    eng = comp.spec.get("engine", {})
    designs = {d["name"]: d.get("design", "") for d in comp.plan["drafts"]}
    out = [title or "Draft comparison", ""]
    out += _wrap(f"Target {eng.get('model', '?')}; drafts: " + ", ".join(
        f"{d['name']} ({d['method']}" + (f", {designs[d['name']]} design" if designs[d["name"]] else "")
        + ")" for d in comp.plan["drafts"]) + "; categories (prompts): "
        + ", ".join(f"{c} ({n})" for c, n in comp.plan["categories"].items())
        + f"; mix: {_mix_line(weights)}.")
    out += [""] + _wrap(f"Recommendation: {rec['text']}.") + ["",
            "Ranking per batch size (each draft at its best K for the mix; speedup over",
            "its own sweep's vanilla, with its interval):", "",
            f"  {'BS':>4} {'rank':>4}  {'draft':<16} {'K':>2}  {'speedup [interval]':<20} verdict"]
    for _, r in ranking.iterrows():
        out.append(f"  {int(r['batch_size']):>4} {int(r['rank']):>4}  {str(r['draft'])[:16]:<16} "
                   f"{int(r['k']):>2}  {fmt_interval(r):<20} {r['verdict']}")
    bad = unsettled(ranking)
    if bad:
        out += [""] + _wrap("Vanillas disagree (checked per category, before the mix; a mix takes "
                            "its worst category): " + "; ".join(
                                f"BS {b}: {c} {100 * s:.0f} % apart" for b, (s, c) in bad.items())
                            + f" (over {VANILLA_TOLERANCE:.0%}): no verdict there, re-measure.")
    out += ["", "Draft memory (weights + draft KV; the target's KV is the same for all):", "",
            *_memory(comp), "", "Each draft's table for the mix:", ""]
    for name, grid in comp.grids.items():
        t = mix_table(grid, weights)
        out += _wrap(f"{name}: " + ", ".join(f"BS {int(b)} -> K {int(k)}"
                                             for b, k in zip(t["batch_size"], t["k"])), "  ")
    out += ["", "By category: own best K*, its speedup, AL, and draft tokens proposed per",
            "request-step at K* (below K*: steps that drafted fewer, e.g. no n-gram match):", "",
            *_per_category(comp), "",
            "Vanilla tokens/s (whole batch), each sweep's own: they should agree across",
            f"drafts (more than {VANILLA_TOLERANCE:.0%} apart: that batch size is unsettled).", "",
            *_vanillas(comp), ""]
    return "\n".join(out)


def ranking_figure(comp: Any, weights: dict[str, float]):  # -> matplotlib Figure
    """Speedup over vanilla per batch size, a point per draft at its mix K with its interval."""
    import numpy as np
    from matplotlib.figure import Figure

    ranking = rank_drafts(comp.grids, weights)
    bad = unsettled(ranking)
    sizes = sorted({int(b) for b in ranking["batch_size"]})
    drafts = list(comp.grids)
    fig = Figure(figsize=(max(4.0, 1.6 * len(sizes) + 2), 3.4), dpi=110)
    ax = fig.subplots()
    width = 0.6 / max(1, len(drafts))
    for i, name in enumerate(drafts):
        r = ranking[ranking["draft"] == name].sort_values("batch_size")
        x = np.array([sizes.index(int(b)) for b in r["batch_size"]]) + (i - (len(drafts) - 1) / 2) * width
        s = r["speedup"].to_numpy(float)
        err = np.vstack([s - r["speedup_low"].to_numpy(float), r["speedup_high"].to_numpy(float) - s])
        ax.errorbar(x, s, yerr=np.nan_to_num(err), fmt="o", color=f"C{i}", capsize=3, label=name)
        off = np.array([int(b) in bad for b in r["batch_size"]], dtype=bool)
        if off.any():  # unsettled: hollow, as the text gives no verdict there
            ax.plot(x[off], s[off], "o", color="white", markeredgecolor=f"C{i}", markersize=6, zorder=3)
        for xi, si, k in zip(x, s, r["k"]):
            ax.annotate(f"K{int(k)}", (xi, si), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    for b, (spread, cat) in bad.items():  # the batch sizes the text leaves without a verdict
        j = sizes.index(b)
        ax.axvspan(j - 0.45, j + 0.45, color="0.85", zorder=0)
        ax.annotate(f"vanillas disagree\n({cat} {100 * spread:.0f} %)", (j, 1),
                    xycoords=("data", "axes fraction"), xytext=(0, -3), textcoords="offset points",
                    ha="center", va="top", fontsize=7)
    ax.set_xticks(range(len(sizes)), [str(b) for b in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over vanilla (mix K)")
    ax.set_title(f"mix: {_mix_line(weights)}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
