"""PNG figures for sweeps and validate runs (matplotlib, object API: no pyplot, no global backend).

Each ``*_figure`` function takes DataFrames (or an :class:`~dsdprof.decide.analysis.Analysis`) and
returns a ``matplotlib.figure.Figure``; :func:`plot_results` reads a run and writes the PNGs.
matplotlib is imported inside the functions, so importing this module is cheap."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dsdprof.config.defaults import DEFAULT_CONFIDENCE, DEFAULT_TOLERANCE
from dsdprof.config.run import RUN_KIND_VALIDATE, Run
from dsdprof.errors import InputError
from dsdprof.formats.jsontypes import ProvenanceView
from dsdprof.io.atomic import write_bytes_atomic
from dsdprof.io.runs import open_run
from dsdprof.report.context_plots import DPI, _box

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# tokens_per_s_per_user: vLLM's name (output tokens/s per user); *_by_context: report.context_plots
PNG_NAMES = {"optimal_k": "optimal_k.png", "goodput_heatmap": "goodput_heatmap.png",
             "tops_per_user": "tokens_per_s_per_user.png", "acceptance": "acceptance_per_position.png",
             "context_heatmaps": "goodput_heatmap_by_context.png",
             "context_optimal_k": "optimal_k_by_context.png"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def require_matplotlib() -> None:
    """Raise a one-line :class:`InputError` when matplotlib (the ``plot`` extra) is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError("matplotlib", "not installed",
                         "plots need it: pip install 'dsdprof[plot]'") from None


def _short(name: Any) -> str:
    """Last two components of a path-like model name (``/tmp/toys/dense/target`` -> ``dense/target``)."""
    s = str(name or "")
    parts = [p for p in s.replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:]) if s.startswith(("/", ".", "~")) and len(parts) > 2 else s


def provenance_line(prov: ProvenanceView) -> str:
    """``model + draft (method) | hardware | engine`` for figure titles."""
    parts = []
    model = _short(prov.get("model"))
    if model:
        draft = _short(prov.get("draft_model"))
        method = prov.get("method")
        parts.append(model + (f" + {draft}" if draft else "") + (f" ({method})" if method else ""))
    if prov.get("hardware"):
        parts.append(str(prov["hardware"]))
    eng = prov.get("engine")
    if eng:
        ver = str(prov.get("engine_version") or "")
        parts.append("sim (predicted)" if eng == "sim" else f"{eng} {ver}".strip())
    return "  |  ".join(parts)


def _figure(width: float = 7.5, height: float = 4.6, rows: int = 1, height_ratios=None):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    if rows == 1:
        return fig, fig.add_subplot(1, 1, 1)
    axes = fig.subplots(rows, 1, sharex=True, gridspec_kw={"height_ratios": height_ratios or [1] * rows})
    return fig, axes


def _titles(fig, title: str, prov: ProvenanceView) -> None:
    import textwrap

    width = max(40, int(fig.get_figwidth() * 12.5))  # characters that fit at this font size
    lines = textwrap.wrap(title, width)
    for part in provenance_line(prov).split("  |  ") if prov else []:
        if lines[len(textwrap.wrap(title, width)):] and len(lines[-1]) + len(part) + 5 <= width:
            lines[-1] += "  |  " + part
        else:
            lines.append(part)
    fig.suptitle("\n".join(lines), fontsize=10)


def _log2_bs_axis(ax, batch_sizes) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    bs = sorted(int(b) for b in batch_sizes)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(bs))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(b) for b in bs])
    if len(bs) > 1:
        ax.set_xlim(bs[0] / 1.35, bs[-1] * 1.35)
    else:
        ax.set_xlim(bs[0] / 2, bs[0] * 2)
    ax.set_xlabel("batch size (concurrent requests, log2 scale)")


def optimal_k_figure(analysis, table_ranges: list[list[int]] | None = None):
    """Goodput-optimal K per profiled batch size, the served table's K between them, speedups."""
    from dsdprof.formats.ktable import k_for_batch_size, ranges_from_points

    opt = analysis.optimal
    bs = opt["batch_size"].astype(int).tolist()
    ks = opt["k"].astype(int).tolist()
    ranges = table_ranges or ranges_from_points(list(zip(bs, ks)))
    fig, ax = _figure()
    grid = np.unique(np.round(np.geomspace(bs[0], bs[-1], 400)).astype(int)) if len(bs) > 1 else np.array(bs)
    ax.step(grid, [k_for_batch_size(ranges, int(b)) for b in grid], where="post", color="tab:blue",
            alpha=0.35, lw=2, label="table: K served between profiled sizes")
    decided = [bool(d) for d in opt["decided"]] if "decided" in opt.columns else [True] * len(bs)
    dec_bs = [b for b, d in zip(bs, decided) if d]
    ax.plot(dec_bs, [k for k, d in zip(ks, decided) if d], "o", color="tab:blue", ms=8,
            label="goodput-optimal K (profiled, decided)")
    _mark_undecided(ax, opt, bs, ks, decided, getattr(analysis, "confidence", 0.9))
    _mark_vanilla(ax, opt, bs, ks, getattr(analysis, "confidence", 0.9))
    for b, k, sp in zip(bs, ks, opt["speedup_vs_baseline"]):
        if sp is not None and not math.isnan(sp):
            ax.annotate(f"{sp:.2f}x", (b, k), textcoords="offset points", xytext=(0, 9), ha="center",
                        fontsize=8, color="0.25")
    kmax = max(analysis.candidate_ks + ks)
    ax.set_ylim(-0.5, kmax + 0.9)
    ax.set_yticks(range(0, kmax + 1))
    ax.set_ylabel("draft tokens per step K")
    _log2_bs_axis(ax, bs)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", fontsize=8, title="labels: speedup vs no speculation", title_fontsize=8)
    _titles(fig, f"Optimal K vs batch size ({analysis.shape}, tolerance {analysis.tolerance:.0%})",
            analysis.provenance)
    return fig


def _mark_undecided(ax, opt, bs, ks, decided, confidence: float) -> None:
    """Hollow markers at undecided batch sizes, with a bar over the Ks the data still allow."""
    und = [i for i, d in enumerate(decided) if not d]
    if not und:
        return
    ax.plot([bs[i] for i in und], [ks[i] for i in und], "o", mfc="white", mec="tab:red", mew=2, ms=8,
            label=f"undecided at {confidence:.0%} (bar: Ks still possible)")
    if "contenders" not in opt.columns:
        return
    for i in und:
        still = [int(k) for k in (opt["contenders"].iloc[i] or [])] + [ks[i]]
        lo, hi = min(still), max(still)
        if hi > lo:
            ax.vlines(bs[i], lo, hi, color="tab:red", lw=2, alpha=0.6)


def _mark_vanilla(ax, opt, bs, ks, confidence: float) -> None:
    """A red band at batch sizes where vanilla (no speculative config) beat every K beyond its
    interval (vLLM's K=0 still runs the drafter), labelled with the gap and its interval."""
    from dsdprof.export.table import gap_text
    if "vanilla_faster" not in opt.columns:
        return
    hits = [i for i, f in enumerate(opt["vanilla_faster"]) if bool(f)]
    for n, i in enumerate(hits):
        ax.axvspan(bs[i] / 1.3, bs[i] * 1.3, color="tab:red", alpha=0.12, lw=0,
                   label=f"vanilla faster than every K ({confidence:.0%} interval)" if n == 0 else None)
        r = opt.iloc[i]
        ax.annotate("vanilla\n" + gap_text(r["vanilla_gain"], r["vanilla_gain_low"], r["vanilla_gain_high"]),
                    (bs[i], ks[i]), textcoords="offset points", xytext=(0, -24), fontsize=7,
                    ha="right" if i == len(bs) - 1 and len(bs) > 1 else "center",
                    color="tab:red")


def goodput_heatmap_figure(analysis):
    """Goodput (AL / ITL, tokens/s per user) over BS x K; color relative to the best at each BS.

    When the sweep has a separate vanilla baseline (mode column), it is drawn as its own bottom
    row, so a K=0 candidate that pays drafter overhead stands out against it.
    """
    cells = analysis.cells
    bs = sorted(int(b) for b in cells["batch_size"].unique())
    ks = analysis.candidate_ks
    grid = cells.pivot_table(index="num_spec_tokens", columns="batch_size", values="goodput")
    grid = grid.reindex(index=ks, columns=bs)
    labels = [str(k) for k in ks]
    base = analysis.baseline.set_index("batch_size")["goodput"].reindex(bs)
    k0 = grid.loc[0] if 0 in grid.index else None
    if base.notna().any() and (k0 is None or not np.allclose(base.fillna(-1), k0.fillna(-1))):
        grid = pd.concat([pd.DataFrame([base.to_numpy()], index=["vanilla"], columns=bs), grid])
        labels = ["vanilla"] + labels
    rel = grid / grid.max(axis=0)
    nrows = len(labels)
    fig, ax = _figure(width=max(6.5, 1.5 + 0.95 * len(bs)), height=max(3.8, 1.8 + 0.5 * nrows))
    im = ax.imshow(rel.to_numpy(dtype=float), origin="lower", aspect="auto", cmap="viridis",
                   vmin=max(0.0, float(np.nanmin(rel.to_numpy(dtype=float))) - 0.02), vmax=1.0)
    opt_k = dict(zip(analysis.optimal["batch_size"].astype(int), analysis.optimal["k"].astype(int)))
    opt = analysis.optimal
    faster = (set(opt.loc[opt["vanilla_faster"].astype(bool), "batch_size"].astype(int))
              if "vanilla_faster" in opt else set())
    for j, b in enumerate(bs):
        for i, label in enumerate(labels):
            v, r = grid.iat[i, j], rel.iat[i, j]
            if np.isnan(v):
                continue
            chosen = label == str(opt_k.get(b))
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=8,
                    color="black" if r > 0.75 else "white", fontweight="bold" if chosen else "normal")
            if chosen:
                ax.add_patch(_box(j, i))
            if label == "vanilla" and b in faster:  # vanilla beat every K beyond its interval
                ax.add_patch(_box(j, i, "tab:red", "--"))
    ax.set_xticks(range(len(bs)), [str(b) for b in bs])
    ax.set_yticks(range(nrows), labels)
    if labels[0] == "vanilla":
        ax.axhline(0.5, color="white", lw=2)
    ax.set_xlabel("batch size (profiled, log2-spaced)")
    ax.set_ylabel("draft tokens per step K")
    cb = fig.colorbar(im, ax=ax, shrink=0.9)
    cb.set_label("goodput / best at this batch size")
    title = "Goodput = AL / ITL in tokens/s per user (red box = chosen K"
    title += "; dashed: vanilla beats every K)" if faster else ")"
    _titles(fig, title, analysis.provenance)
    return fig


def tops_figure(comparison: pd.DataFrame, provenance: ProvenanceView | None = None,
                vanilla_gaps: pd.DataFrame | None = None):
    """Tokens/s per user vs BS for vanilla, each fixed K and DSD; below, DSD's ratios.
    ``vanilla_gaps`` (:func:`dsdprof.report.vanilla.validate_vanilla`): batch sizes where vanilla
    beat every variant beyond its interval, starred and labelled with the gap."""
    from dsdprof.report.compare import fixed_k_columns

    c = comparison.sort_values("batch_size")
    bs = c["batch_size"].astype(int).tolist()
    fig, (ax, ax2) = _figure(width=7.5, height=6.2, rows=2, height_ratios=[2.2, 1])
    ax.plot(bs, c["tops_vanilla"], "s--", color="0.45", label="vanilla (no speculation)")
    colors = ["tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    for n, k in enumerate(fixed_k_columns(c)):
        ax.plot(bs, c[f"tops_k{k}"], "^-", color=colors[n % len(colors)], alpha=0.85, label=f"fixed K={k}")
    ax.plot(bs, c["tops_dsd"], "o-", color="tab:blue", lw=2.4, ms=7, label="DSD (table)", zorder=5)
    _star_vanilla(ax, c, vanilla_gaps)
    ax.set_ylabel("output tokens/s per user")
    tops = [col for col in c.columns if col.startswith("tops_")]
    ax.set_ylim(0, float(np.nanmax(c[tops].to_numpy())) * 1.15)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax2.axhline(1.0, color="0.3", lw=1)
    noise = c["noise"].to_numpy()
    ax2.fill_between(bs, 1 - noise, 1 + noise, color="0.85", label="noise band")
    ax2.plot(bs, c["speedup_vs_vanilla"], "o-", color="tab:blue", label="DSD / vanilla")
    ax2.plot(bs, 1.0 - c["regret"], "d:", color="tab:red", label="DSD / best fixed K")
    flagged = c[c["below_vanilla"]]
    if not flagged.empty:
        ax2.plot(flagged["batch_size"], flagged["speedup_vs_vanilla"], "x", color="red", ms=11, mew=2.5,
                 label="below vanilla")
    ax2.set_ylabel("ratio")
    ax2.margins(y=0.18)
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=7.5, loc="best", ncol=2)
    _log2_bs_axis(ax2, bs)
    ax2.set_xticklabels([f"{b}\nK={int(k)}" for b, k in zip(bs, c["dsd_k"])])
    ax2.set_xlabel("batch size (concurrent requests, log2 scale) / K the table serves there")
    _titles(fig, "Served: tokens/s per user, vanilla vs fixed K vs DSD", provenance or {})
    return fig


def _star_vanilla(ax, c: pd.DataFrame, gaps: pd.DataFrame | None) -> None:
    from dsdprof.export.table import gap_text
    if gaps is None or not len(gaps):
        return
    tops = dict(zip(c["batch_size"].astype(int), c["tops_vanilla"]))
    pts = [(int(b), tops[int(b)]) for b in gaps["batch_size"] if int(b) in tops]
    ax.plot([b for b, _ in pts], [t for _, t in pts], "*", color="tab:red", ms=13, zorder=6,
            label="vanilla beats every variant")
    for (b, t), (_, g) in zip(pts, gaps.iterrows()):
        ax.annotate(gap_text(g["gain"], g["gain_low"], g["gain_high"]), (b, t), textcoords="offset points",
                    xytext=(0, 9), ha="center", fontsize=7, color="tab:red")


def acceptance_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per batch size, the median per-position acceptance of its largest-K speculative rows
    (:func:`dsdprof.export.table.per_cell_acceptance` at that K).

    Columns: ``batch_size``, ``k``, ``position`` (1-based), ``acceptance``.
    """
    from dsdprof.export.table import per_cell_acceptance

    columns = ["batch_size", "k", "position", "acceptance"]
    if "acceptance_per_pos" not in df.columns:
        return pd.DataFrame(columns=columns)
    d = df[df["num_spec_tokens"] > 0]
    if "mode" in d.columns:
        d = d[d["mode"] != "vanilla"]
    per_cell = per_cell_acceptance(d)
    rows = [{"batch_size": int(b), "k": int(k), "position": i + 1, "acceptance": float(v)}
            for b, k in d.groupby("batch_size")["num_spec_tokens"].max().items()
            for i, v in enumerate(per_cell.get((int(b), int(k)), []))]
    return pd.DataFrame(rows, columns=columns)


def acceptance_figure(df: pd.DataFrame, provenance: ProvenanceView | None = None):
    """Acceptance rate per draft position (accepted at position i / drafts), one line per BS."""
    from matplotlib import colormaps

    acc = acceptance_table(df)
    if acc.empty:
        raise InputError("acceptance_per_pos", None, "no speculative rows with per-position acceptance")
    fig, ax = _figure(width=7.4, height=4.4)
    bss = sorted(acc["batch_size"].unique())
    curves = {b: acc[acc["batch_size"] == b] for b in bss}
    first = curves[bss[0]]["acceptance"].to_numpy()
    same = all(len(c) == len(first) and np.allclose(c["acceptance"].to_numpy(), first, atol=1e-6)
               for c in curves.values())
    if same and len(bss) > 1:  # e.g. predictions: one curve for every batch size
        g = curves[bss[0]]
        ax.plot(g["position"], g["acceptance"], "o-", color="tab:blue",
                label=f"every batch size ({bss[0]}..{bss[-1]})")
    else:
        cmap = colormaps["viridis"]
        for n, b in enumerate(bss):
            g = curves[b]
            color = cmap(0.1 + 0.8 * n / max(1, len(bss) - 1))
            ax.plot(g["position"], g["acceptance"], "o-", color=color,
                    label=f"BS {b} (K={int(g['k'].iloc[0])})")
    kmax = int(acc["position"].max())
    ax.set_xticks(range(1, kmax + 1))
    ax.set_xlim(0.7, kmax + 0.3)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("acceptance rate (accepted at i / drafts)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    _titles(fig, "Acceptance per draft position (median over repeats)", provenance or {})
    return fig


def plot_results(results: str | Path | Run, out_dir: str | Path, tolerance: float = DEFAULT_TOLERANCE,
                 force: bool = False) -> list[Path]:
    """Write every figure that ``results`` supports into ``out_dir``; return the paths."""
    from dsdprof.config.run import validate_measurements
    from dsdprof.decide.analysis import analyze

    require_matplotlib()
    run = results if isinstance(results, Run) else open_run(results, "plot")
    df, prov = run.rows, run.stored_provenance
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("--out", str(out), "exists and is not a directory")
    figures: dict[str, Figure] = {}
    if run.kind == RUN_KIND_VALIDATE:
        from dsdprof.report.compare import compare
        from dsdprof.report.vanilla import validate_vanilla

        figures["tops_per_user"] = tops_figure(compare(df), prov, validate_vanilla(df, DEFAULT_CONFIDENCE))
    elif run.contexts is not None:  # a context sweep: a grid of heatmaps, K* per context
        from dsdprof.report.context_plots import context_figures

        figures.update(context_figures(df, prov, tolerance))
    else:
        analysis = analyze(df, tolerance=tolerance, provenance=prov)
        figures["optimal_k"] = optimal_k_figure(analysis)
        figures["goodput_heatmap"] = goodput_heatmap_figure(analysis)
    ok = validate_measurements(df)
    if not acceptance_table(ok).empty:
        figures["acceptance"] = acceptance_figure(ok, prov)
    paths = [out / PNG_NAMES[name] for name in figures]
    clash = [str(p) for p in paths if p.exists()]
    if clash and not force:
        raise InputError("--out", clash[0], "exists; pass --force to replace it")
    rendered = {name: render_png(fig) for name, fig in figures.items()}  # all of them before any write
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError("--out", str(out), f"cannot be created ({err.strerror or err})") from None
    for name, data in rendered.items():
        write_png(out / PNG_NAMES[name], data)
    return paths


def render_png(fig) -> bytes:
    """The figure as PNG bytes, checked to be a non-trivial PNG."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = buf.getvalue()
    if not data.startswith(PNG_SIGNATURE) or len(data) < 1000:
        raise RuntimeError(f"matplotlib produced no valid PNG ({len(data)} bytes)")
    return data


def write_png(path: Path, data: bytes, field: str = "--out") -> None:
    """Atomic write of a checked PNG; an unwritable destination is one line naming ``field``."""
    try:
        write_bytes_atomic(path, data)
    except OSError as err:
        raise InputError(field, str(path), f"cannot be written ({err.strerror or err})") from None
