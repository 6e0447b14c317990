"""Figures of a context sweep (``[sweep] context_lens``): the second axis.

* :func:`context_heatmaps_figure`: a grid of goodput heatmaps (batch size x K), one per context,
  each colored relative to the best K at its batch size, the chosen K boxed in red; a batch size
  with no cell at a context (the KV cache cannot hold it) is marked "KV full".
* :func:`context_k_figure`: K* against batch size, one line per context.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from dsdprof.formats.jsontypes import ProvenanceView

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from dsdprof.decide.context import ContextAnalysis

DPI = 130  # every figure of dsdprof.report (report.plots imports it from here)


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _title(fig, title: str, prov: ProvenanceView) -> None:
    parts = [str(prov.get("model") or ""), str(prov.get("hardware") or ""),
             "sim (predicted)" if prov.get("engine") == "sim" else str(prov.get("engine") or "")]
    sub = "  |  ".join(p for p in parts if p)
    fig.suptitle(title + (f"\n{sub}" if sub else ""), fontsize=10)


def _box(j: int, i: int, color: str = "red", style: str = "-"):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False, edgecolor=color, lw=2, linestyle=style)


def _ctx_label(c: int) -> str:
    if c >= 1000 and c % 1000 == 0:
        return f"{c // 1000}k"
    return f"{c // 1024}k" if c >= 1024 and c % 1024 == 0 else str(c)


def _heatmap(ax, analysis: Any, bs: list[int], ks: list[int]):
    cells = analysis.cells
    grid = cells.pivot_table(index="num_spec_tokens", columns="batch_size", values="goodput")
    grid = grid.reindex(index=ks, columns=bs)
    rel = (grid / grid.max(axis=0)).to_numpy(dtype=float)
    im = ax.imshow(rel, origin="lower", aspect="auto", cmap="viridis", vmin=0.5, vmax=1.0)
    opt_k = dict(zip(analysis.optimal["batch_size"].astype(int), analysis.optimal["k"].astype(int)))
    for j, b in enumerate(bs):
        if b not in opt_k:
            ax.text(j, (len(ks) - 1) / 2, "KV\nfull", ha="center", va="center", fontsize=7, color="0.4")
            continue
        i = ks.index(opt_k[b]) if opt_k[b] in ks else None
        if i is not None:
            ax.add_patch(_box(j, i))
            ax.text(j, i, str(opt_k[b]), ha="center", va="center", fontsize=7, color="white",
                    fontweight="bold")
    ax.set_xticks(range(len(bs)), [str(b) for b in bs], fontsize=7)
    ax.set_yticks(range(len(ks)), [str(k) for k in ks], fontsize=7)
    return im


def context_heatmaps_figure(result: ContextAnalysis, provenance: ProvenanceView | None = None):
    """One goodput heatmap per context (a :class:`dsdprof.decide.context.ContextAnalysis`)."""
    contexts = result.contexts
    bs = sorted({int(b) for a in result.slices.values() for b in a.cells["batch_size"].unique()})
    ks = sorted({int(k) for a in result.slices.values() for k in a.candidate_ks})
    ncol = min(3, len(contexts))
    nrow = math.ceil(len(contexts) / ncol)
    fig = _figure(width=3.4 * ncol + 1.2, height=2.9 * nrow + 1.0)
    axes = fig.subplots(nrow, ncol, squeeze=False)
    im = None
    for n, c in enumerate(contexts):
        ax = axes[n // ncol][n % ncol]
        im = _heatmap(ax, result.slices[c], bs, ks)
        ax.set_title(f"context {_ctx_label(c)}", fontsize=9)
        if n % ncol == 0:
            ax.set_ylabel("K", fontsize=8)
        if n // ncol == nrow - 1:
            ax.set_xlabel("batch size", fontsize=8)
    for n in range(len(contexts), nrow * ncol):
        axes[n // ncol][n % ncol].axis("off")
    if im is not None:
        cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.85)
        cb.set_label("goodput / best K at this batch size", fontsize=8)
    _title(fig, "Goodput by batch size x K, per context (box = chosen K)", provenance or {})
    return fig


def context_k_figure(result: ContextAnalysis, provenance: ProvenanceView | None = None):
    """K* against batch size, one line per context."""
    fig = _figure(7.5, 4.6)
    ax = fig.add_subplot(1, 1, 1)
    all_bs: list[int] = []
    for c in result.contexts:
        opt = result.slices[c].optimal
        bs, ks = opt["batch_size"].astype(int).tolist(), opt["k"].astype(int).tolist()
        all_bs += bs
        ax.plot(bs, ks, "o-", label=f"context {_ctx_label(c)}", drawstyle="steps-post", alpha=0.85)
    ticks = sorted(set(all_bs))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.minorticks_off()
    ax.set_xlabel("batch size (log2 scale)")
    kmax = max(int(k) for a in result.slices.values() for k in a.optimal["k"])
    ax.set_yticks(np.arange(0, kmax + 1, max(1, (kmax + 1) // 10)))
    ax.set_ylabel("goodput-optimal K")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _title(fig, "Optimal K vs batch size, per context", provenance or {})
    return fig


def context_figures(df: pd.DataFrame, provenance: ProvenanceView, tolerance: float) -> dict[str, Figure]:
    """Both figures of a context sweep's rows (name -> figure)."""
    from dsdprof.decide.context import analyze_contexts

    result = analyze_contexts(df, tolerance=tolerance, provenance=provenance)
    return {"context_heatmaps": context_heatmaps_figure(result, provenance),
            "context_optimal_k": context_k_figure(result, provenance)}
