"""PNGs of a rollout run: the batch size over time against the K served (one rollout, every variant),
and serving latency / goodput against the request rate."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dsdprof.formats.rollouts import KIND_ROLLOUT
from dsdprof.io.atomic import check_output_path, write_bytes_atomic
from dsdprof.report.rollout import k_timeline, serving_summary

COLORS = {"vanilla": "#555555", "dsd": "#1f77b4", "adaptive": "#d62728"}
FIXED_COLORS = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2"]


def _color(v: str, fixed: list[str]) -> str:
    return COLORS.get(v) or FIXED_COLORS[fixed.index(v) % len(FIXED_COLORS)]


def _save(fig, path: Path, force: bool) -> Path:
    import io

    import matplotlib.pyplot as plt

    check_output_path(path, force)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, buf.getvalue())
    return path


def plot_batch_and_k(df: pd.DataFrame, path: Path, repeat: int = 0, force: bool = False) -> Path:
    """Top: requests scheduled per step (vLLM's lookup batch size) over time; bottom: the K each step
    scheduled; one line per variant, one rollout (``repeat``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = k_timeline(df, KIND_ROLLOUT, repeat)
    fixed = [v for v in lines if v.startswith("fixed-")]
    fig, (ax1, ax2) = plt.subplots(
        2, 1, figsize=(8, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    for v, s in lines.items():
        c = _color(v, fixed)
        ax1.step(s["t_s"], s["batch_size"], where="post", color=c, label=v, lw=1.4)
        ax2.step(s["t_s"], s["k"].clip(lower=0), where="post", color=c, label=v, lw=1.4)
    ax1.set_ylabel("batch size (requests scheduled)")
    ax1.set_yscale("log", base=2)
    ax1.legend(fontsize=8, ncol=len(lines))
    ax1.set_title(f"rollout, repeat {repeat}: batch size over time and the K served")
    ax2.set_ylabel("K scheduled")
    ax2.set_xlabel("seconds since the rollout started")
    fig.tight_layout()
    return _save(fig, path, force)


def plot_serving(df: pd.DataFrame, path: Path, force: bool = False) -> Path:
    """TPOT p50 / p99, TTFT p50 and goodput against the request rate, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = serving_summary(df)
    fixed = [v for v in s["variant"].unique() if v.startswith("fixed-")]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    for v, sub in s.groupby("variant"):
        c = _color(str(v), fixed)
        axes[0].plot(sub["rate_per_s"], sub["tpot_p50_s"] * 1e3, "o-", color=c, label=f"{v} p50")
        axes[0].plot(sub["rate_per_s"], sub["tpot_p99_s"] * 1e3, "x--", color=c, alpha=0.7)
        axes[1].plot(sub["rate_per_s"], sub["ttft_p50_s"] * 1e3, "o-", color=c, label=str(v))
        axes[2].plot(sub["rate_per_s"], sub["tokens_per_s"], "o-", color=c, label=str(v))
    axes[0].set_ylabel("TPOT ms (o p50, x p99)")
    axes[1].set_ylabel("TTFT p50 ms")
    axes[2].set_ylabel("output tokens/s")
    for ax in axes:
        ax.set_xlabel("request rate (req/s)")
    axes[1].legend(fontsize=8)
    fig.suptitle("serving: Poisson arrivals, medians over repeats")
    fig.tight_layout()
    return _save(fig, path, force)


def plot_rollout_run(
    df: pd.DataFrame, out_dir: Path, prefix: str = "rollout", force: bool = False
) -> list[Path]:
    """Every plot of a run into ``out_dir``: ``<prefix>-batch-k.png`` and, with serving rows,
    ``<prefix>-serving.png``."""
    written = []
    if not df[(df["kind"] == KIND_ROLLOUT) & (df["status"] == "ok")].empty:
        written.append(plot_batch_and_k(df, out_dir / f"{prefix}-batch-k.png", force=force))
    if not serving_summary(df).empty:
        written.append(plot_serving(df, out_dir / f"{prefix}-serving.png", force=force))
    return written


def plot_replay_check(rows: pd.DataFrame, path: Path, title: str = "", force: bool = False) -> Path:
    """Predicted against measured makespan, one point per measured rollout (a :class:`ReplayCheck`'s
    rows): filled, the fitted model (when present); hollow, the table's grid; the band is +-5 %."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fixed = sorted(v for v in rows["variant"].unique() if str(v).startswith("fixed-"))
    fig, ax = plt.subplots(figsize=(5.6, 5))
    lo = min(rows["measured_s"].min(), rows["predicted_raw_s"].min()) * 0.9
    hi = max(rows["measured_s"].max(), rows["predicted_raw_s"].max()) * 1.1
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.95, hi * 0.95], [lo * 1.05, hi * 1.05], color="grey", alpha=0.2,
                    label="+-5 %")
    has_fit = "predicted_fit_s" in rows and rows["predicted_fit_s"].notna().any()
    for v, sub in rows.groupby("variant", sort=False):
        c = _color(str(v), fixed)
        ax.scatter(sub["measured_s"], sub["predicted_raw_s"], facecolors="none", edgecolors=c, s=36,
                   label=f"{v} table" if not has_fit else None)
        if has_fit:
            ax.scatter(sub["measured_s"], sub["predicted_fit_s"], color=c, s=36, label=f"{v} fitted")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured makespan s")
    ax.set_ylabel("predicted makespan s (hollow: table's grid)")
    ax.set_title(title or "replay against the measured rollouts", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, force)
