"""``dsdprof rollout``, ``dsdprof rollout-report`` and ``dsdprof replay`` (registered on the main
typer app by dsdprof.cli.app): the table in an RL rollout and in live serving, measured on vLLM
against vanilla and the best fixed K, and the makespan predicted without an engine.
docs/rollouts.md is the reference."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer
from rich import box
from rich.table import Table

from dsdprof.cli.common import Force, guarded, make_console
from dsdprof.errors import InputError
from dsdprof.report.text import fmt_number

if TYPE_CHECKING:
    from dsdprof.formats.ktable_types import KTable

console = make_console()


def _ci(r: float, lo: float, hi: float) -> str:
    if r is None or math.isnan(r):
        return "-"
    txt = f"{r:.3f}"
    return txt + (f" [{lo:.3f},{hi:.3f}]" if not math.isnan(lo) else "")


def _table(title: str, caption: str, columns: Sequence[str], tight: bool = False) -> Table:
    """A rollout or replay table: every column right-aligned and never wrapped (they overflow the
    terminal instead, so each table must fit 80 columns: ``tight`` puts two blanks between columns
    instead of three and none at the edges)."""
    t = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, caption=caption,
              collapse_padding=tight, show_edge=not tight)
    for col in columns:
        t.add_column(col, justify="right", no_wrap=True)
    return t


def render_rollout(df) -> list[Table]:
    """Rich tables of a run: rollout variants (makespan ratios with paired intervals) and serving."""
    from dsdprof.report.rollout import rollout_summary, serving_summary

    out = []
    r = rollout_summary(df)
    if len(r):
        # Two tables: the medians and the paired ratios in one were 91 columns wide.
        t = _table("rollout: medians over repeats", "tail: makespan after 90 % of the requests "
                   "finished; K: draft tokens per decoding request-step",
                   ("variant", "makespan s", "tok/s", "tail s", "K"))
        best = next((b for b in r["best_fixed"] if b), None)
        p = _table("rollout: makespan, paired by repeat",
                   "ratio to vanilla's and to the best fixed K's (same repeat), geometric mean, 95% t "
                   "interval over repeats; < 1 is faster",
                   ("variant", "vs vanilla", f"vs {best} (best)" if best else "vs best fixed"))
        for _, x in r.iterrows():
            t.add_row(x["variant"], fmt_number(x["makespan_s"], 2), fmt_number(x["tokens_per_s"], 1),
                      fmt_number(x["tail_s"], 2), fmt_number(x["mean_k"], 2))
            p.add_row(x["variant"], _ci(x["vs_vanilla"], x["vs_vanilla_lo"], x["vs_vanilla_hi"]),
                      _ci(x["vs_best"], x["vs_best_lo"], x["vs_best_hi"]))
        out += [t, p]
    s = serving_summary(df)
    if len(s):
        t = _table("serving: medians over repeats",
                   "ms; goodput req/s within the SLOs; lookup%: steps whose lookup batch size (prefill "
                   "chunks included) differs from the requests decoding; K%: the table's K differs",
                   ("rate", "variant", "TTFT50", "TPOT50", "TPOT90", "TPOT99", "ITL99", "good", "K",
                    "lookup%", "K%"), tight=True)
        for _, x in s.iterrows():
            t.add_row(
                f"{x['rate_per_s']:g}",
                x["variant"],
                *(
                    fmt_number(x[c] * 1e3, 0)
                    for c in ("ttft_p50_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "itl_p99_s")
                ),
                fmt_number(x["goodput_req_s"], 2),
                fmt_number(x["mean_k"], 2),
                fmt_number(x["lookup_differs"] * 100, 0),
                fmt_number(x["table_k_differs"] * 100, 0),
            )
        out.append(t)
        out.append(_render_serving_ratios(df))
    return out


def _render_serving_ratios(df) -> Table:
    from dsdprof.report.rollout import serving_ratios

    t = _table("serving: output tokens/s, paired by repeat",
               "ratio to vanilla's and to the best fixed K's at that rate, geometric mean, 95% t interval "
               "over repeats; > 1 is faster", ("rate", "variant", "vs vanilla", "vs best fixed", "best"))
    for _, x in serving_ratios(df).iterrows():
        t.add_row(f"{x['rate_per_s']:g}", x["variant"], _ci(x["vs_vanilla"], x["vs_vanilla_lo"],
                  x["vs_vanilla_hi"]), _ci(x["vs_best"], x["vs_best_lo"], x["vs_best_hi"]), x["best_fixed"])
    return t


def render_timeline(df, repeat: int = 0) -> Table:
    """The batch size over time against the K served: one rollout, per variant, the stretches of
    steps that scheduled one K (time, batch size first -> last, steps)."""
    from dsdprof.report.rollout import k_segments, k_timeline

    t = _table(f"rollout r{repeat}: batch size over time against the K served",
               "batch size = requests scheduled (vLLM's lookup); K = what the step scheduled for the next",
               ("variant", "seconds", "batch size", "steps", "K"))
    for v, steps in k_timeline(df, repeat=repeat).items():
        for i, seg in enumerate(k_segments(steps)):
            t.add_row(v if i == 0 else "", f"{seg['t_start']:.2f}-{seg['t_end']:.2f}",
                      f"{seg['bs_first']}->{seg['bs_last']}", str(seg["steps"]), str(seg["k"]))
    return t


def _run_table(run: Path, df, table_path: Path | None) -> KTable | None:
    """The table a run served: ``--table``, else the run directory's copy, else its rows' path."""
    import json

    from dsdprof.export.table import load_table

    if table_path is not None:
        return load_table(table_path)
    here = run if run.is_dir() else run.parent
    for cand in [here / "_adaptive_table.json", *(Path(str(x)) for x in df["table"].dropna().unique()[:1])]:
        if cand.is_file():
            try:
                doc = json.loads(cand.read_text())
            except (OSError, ValueError):
                continue
            return cast("KTable", doc) if isinstance(doc, dict) else None
    return None


def why_lines(df, table: KTable | None) -> list[str]:
    """The rollout's verdict lines: the run's repeat spread (which replay column to trust), the table
    and the plugin against the best fixed K (why, when beyond the interval), the plugin against the
    table in the same repeats (where its time goes)."""
    from dsdprof.report.rollout import QUIET_SPREAD, repeat_spread
    from dsdprof.report.rollout_why import plugin_cost, shortfall

    out = []
    sp = repeat_spread(df)
    if sp.dof:
        read = ("its fit point only if the other run's repeats also spread < 5 %; else its band"
                if sp.sd < QUIET_SPREAD else f"its band, not its point ({sp.sd * 100:.2f} %: not < 5 %)")
        out.append(f"repeats spread {_pct(sp.sd)} here (pooled log SD over variants); the paired ratios "
                   f"cancel it. A replay (dsdprof replay --fit) of or from this run: read {read}.")
    for v in ("dsd", "adaptive"):
        sh = shortfall(df, table, v)
        if sh is None:
            continue
        name = "the table (dsd)" if v == "dsd" else "the adaptive plugin"
        r = sh.ratio
        head = f"{name} / {sh.best_fixed}: {_ci(r.ratio, r.lo, r.hi)}"
        if not sh.loses:
            out.append(head + ": within its interval of the best fixed K.")
            continue
        reasons = sh.reasons()
        out.append(head + ": slower beyond its interval. Why:" + ("" if reasons else " none of the table's "
                   "day, prefill or K per batch size stands out; the engines' own cost differs"))
        out += [f"  - {x}" for x in reasons]
    pc = plugin_cost(df)
    if pc is not None:
        parts = []
        if pc.rollout is not None:
            r = pc.rollout
            parts.append(f"rollout makespan {_ci(r.ratio, r.lo, r.hi)} (< 1 faster); per repeat "
                         f"prefill {pc.prefill_s:+.2f} s, decode {pc.decode_s:+.2f} s, same-K step "
                         f"x{pc.step_ratio:.3f}, steps {pc.steps[0]:g} vs {pc.steps[1]:g}, "
                         f"{pc.other_k_steps:g} steps at a K not the table's")
        parts += [f"{rate:g} req/s tokens/s {_ci(r.ratio, r.lo, r.hi)}" for rate, r in pc.serving]
        out.append("adaptive / the table, same repeats: " + "; ".join(parts) + ".")
    return out


def _slo_s(name: str, ms: float | None) -> float:
    """An SLO option in seconds (None or 0: none); a negative or non-finite one is refused."""
    if ms is not None and not (math.isfinite(ms) and ms >= 0):
        raise InputError(name, ms, "must be >= 0 ms (0: no SLO)")
    return (ms or 0.0) / 1e3


def _rollout(
    table_path: Path = typer.Argument(
        ..., metavar="TABLE", help="K table (v2: its grid picks the best fixed K)."
    ),
    spec_path: Path = typer.Argument(
        ..., metavar="SPEC", help="Sweep spec: its engine and prompt workload."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Run directory (rollout.parquet, _logs, _traces)."),
    num_requests: int | None = typer.Option(
        None, "--num-requests", "-n", help="Rollout: requests submitted at once (default: a lengths "
        "file's count, else 16)."
    ),
    lengths: str = typer.Option(
        "lognormal:median=12,sigma=0.9",
        "--lengths",
        metavar="DIST|FILE",
        show_default=False,
        help="Output lengths: KIND:KEY=V,... with KIND lognormal (keys median, sigma), pareto "
        "(alpha, min) or fixed (len); or a .json/.jsonl file of lengths. Default: lognormal, "
        "median 12, sigma 0.9.",
    ),
    rates: list[str] | None = typer.Option(
        None, "--rate", help="Serving: Poisson rate (req/s); repeatable or a comma list (2,4,8)."
    ),
    serving_requests: int = typer.Option(24, "--serving-requests", help="Serving: requests per rate."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Repeats; the variants' order rotates."),
    fixed_k: list[int] | None = typer.Option(
        None,
        "--fixed-k",
        help="Fixed K to run (default: the best fixed K the replay predicts for these lengths).",
    ),
    adaptive: bool = typer.Option(True, "--adaptive/--no-adaptive", help="Also run the adaptive plugin."),
    seed: int = typer.Option(0, "--seed", help="Seed of lengths, arrivals and prompts."),
    slo_ttft_ms: float = typer.Option(0.0, "--slo-ttft-ms", help="Goodput SLO on TTFT (0: none)."),
    slo_tpot_ms: float = typer.Option(0.0, "--slo-tpot-ms", help="Goodput SLO on TPOT (0: none)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in OUT (same plan)."),
) -> None:
    """Run an RL rollout (N requests at once, heavy-tailed lengths) and, with --rate, a serving sweep
    on vLLM: vanilla, the best fixed K, the table on vLLM's schedule and the adaptive plugin."""
    from dsdprof.config.spec import load_spec
    from dsdprof.export.table import load_table
    from dsdprof.io.rollouts import read_rollout_rows
    from dsdprof.jobs.rollout import make_plan, parse_rates, run_rollout
    from dsdprof.measure.live_workload import parse_length_spec, read_lengths_file

    length_spec = parse_length_spec(lengths)
    rate_list = parse_rates(rates or [])
    if num_requests is None:
        num_requests = len(read_lengths_file(length_spec.path)) if length_spec.kind == "file" else 16
    table = load_table(table_path)
    spec = load_spec(spec_path)
    plan = make_plan(
        table,
        spec,
        length_spec,
        num_requests,
        repeats,
        rate_list,
        serving_requests,
        list(fixed_k) if fixed_k else None,
        adaptive,
        seed,
        _slo_s("--slo-ttft-ms", slo_ttft_ms),
        _slo_s("--slo-tpot-ms", slo_tpot_ms),
    )
    console.print(f"variants {', '.join(plan.variants)}; rollout lengths {sorted(plan.lengths)}")
    if length_spec.kind == "file":
        raw = read_lengths_file(length_spec.path)
        clipped = sum(1 for i, n in enumerate(plan.lengths) if n != raw[i % len(raw)])
        if clipped:
            console.print(f"[yellow]{clipped} of {len(plan.lengths)} lengths from {length_spec.path} "
                          "clipped to [2, max_model_len - input_len][/]")

    def on_row(row) -> None:
        if row["status"] == "ok":
            console.print(f"{row['row_id']}: makespan {row['makespan_s']:.2f} s, K {row['mean_k']:.2f}")
        else:
            console.print(f"[red]{row['row_id']} failed:[/] {row['error'][:300]}")

    run_rollout(table, spec, out, plan, str(table_path), {} if adaptive else None, resume, on_row)
    for t in render_rollout(read_rollout_rows(out)):
        console.print(t)


def _rollout_report(
    run: Path = typer.Argument(
        ..., metavar="RUN", help="A dsdprof rollout directory or its rollout.parquet."
    ),
    plots: Path | None = typer.Option(None, "--plots", help="Also write PNGs into this directory."),
    prefix: str = typer.Option("rollout", "--prefix", help="PNG file name prefix."),
    force: Force = False,
    slo_ttft_ms: float | None = typer.Option(None, "--slo-ttft-ms", help="Goodput at this TTFT SLO "
                                             "(recomputed from the rows; default: the run's)."),
    slo_tpot_ms: float | None = typer.Option(None, "--slo-tpot-ms", help="Goodput at this TPOT SLO."),
    table_path: Path | None = typer.Option(
        None, "--table", help="The table the run served (default: the run's copy, _adaptive_table.json, "
        "else the path in its rows): its date and grid say why it fell behind."),
) -> None:
    """Print a rollout run's tables; --plots draws the batch size over time against the K served."""
    from dsdprof.io.rollouts import read_rollout_rows

    df = read_rollout_rows(run)
    table = _run_table(run, df, table_path)
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        from dsdprof.report.rollout import with_slo

        df = with_slo(df, _slo_s("--slo-ttft-ms", slo_ttft_ms), _slo_s("--slo-tpot-ms", slo_tpot_ms))
    for t in render_rollout(df):
        console.print(t)
    if (df["kind"] == "rollout").any():
        console.print(render_timeline(df))
        for line in why_lines(df, table):
            console.print(line)
    if plots is not None:
        from dsdprof.report.plots import require_matplotlib
        from dsdprof.report.rollout_plots import plot_rollout_run

        require_matplotlib()
        for p in plot_rollout_run(df, plots, prefix, force):
            console.print(f"wrote {p}")


def _replay(
    source: Path = typer.Argument(
        ...,
        metavar="SOURCE",
        help="A rollout run (directory or rollout.parquet), a "
        "lengths file (.json/.jsonl), or a batch-size trace (.jsonl of "
        '{"batch_size": B} per step of a vanilla rollout).',
    ),
    table_path: Path = typer.Argument(..., metavar="TABLE", help="A v2 K table (its step-time grid)."),
    fit: Path | None = typer.Option(
        None, "--fit", help="Another measured rollout run: step and prefill seconds and acceptance per "
        "variant fitted on it replace the table's grid (its acceptance stays the shape)."
    ),
    prefill_s: float | None = typer.Option(
        None, "--prefill-s", help="Prefill seconds (files; default: --fit's, else one vanilla step at N)."
    ),
    scale: float = typer.Option(
        1.0, "--scale", help="Step-time factor for files (machine today / the table's)."
    ),
    runs: int = typer.Option(200, "--runs", min=1, help="Monte Carlo replays per prediction."),
    plot: Path | None = typer.Option(None, "--plot", help="A run: also draw predicted against measured "
                                     "makespan into this PNG."),
    force: Force = False,
) -> None:
    """Predict a rollout's makespan per variant from a table's step-time grid or, with --fit, from
    another measured run (no engine); on a measured run, check every prediction against it."""
    from dsdprof.export.table import load_table

    table = load_table(table_path)
    model = None
    fit_spread = None
    if fit is not None:
        from dsdprof.io.rollouts import read_rollout_rows
        from dsdprof.report.rollout import fit_step_model, repeat_spread

        fit_rows = read_rollout_rows(fit)
        model = fit_step_model(fit_rows, table)
        fit_spread = repeat_spread(fit_rows)
        console.print(f"fitted run's rollouts spread {_pct(fit_spread.sd)} from repeat to repeat "
                      "(pooled log SD): the band below holds it")
        console.print("fitted on " + str(fit) + ": prefill s " + ", ".join(
            f"{v} {x:.2f}" for v, x in sorted(model.prefill.items())) + "; rejection x " + ", ".join(
            f"{v} {x:.2f}" for v, x in sorted(model.reject.items())))
        if model.k_served.get("adaptive"):
            console.print("adaptive K served per batch size: " + _k_runs(model.k_served["adaptive"]))
    if source.is_dir() or source.suffix == ".parquet":
        _replay_run(source, table, runs, model, plot, force, fit_spread)
        return
    from dsdprof.decide.makespan import predict_all
    from dsdprof.measure.live_workload import read_trace_or_lengths

    lens = read_trace_or_lengths(str(source))
    t = Table(
        title=f"replay: {len(lens)} requests, lengths {min(lens)}..{max(lens)}",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
        caption="5-95%: the replays' spread (acceptance luck); adaptive: the table's schedule"
        if model is None else "step times, prefill, acceptance and the plugin's K fitted on --fit; "
        "band: the 90% band of one rollout on that machine (acceptance luck and twice the fitted "
        "run's repeat-to-repeat spread)",
    )
    from dsdprof.report.rollout import band, band_half

    half = band_half(fit_spread) if fit_spread is not None else math.nan
    for col in ("variant", "makespan s", "5-95%" if model is None else "band", "tail s", "steps", "K"):
        t.add_column(col, justify="right")
    for p in predict_all(table, lens, prefill_s, scale, runs, model=model):
        lo, hi = band(p.makespan_s, p.lo, p.hi, half)
        t.add_row(
            p.variant,
            fmt_number(p.makespan_s, 2),
            f"{fmt_number(lo, 2)}-{fmt_number(hi, 2)}",
            fmt_number(p.tail_s, 2),
            fmt_number(p.steps, 1),
            fmt_number(p.mean_k, 2),
        )
    console.print(t)


def _k_runs(k_of: Mapping[int, int]) -> str:
    """``{1: 4, 2: 4, 3: 2}`` as ``1-2: 4, 3: 2`` (runs of batch sizes served one K)."""
    runs: list[list[int]] = []
    for b in sorted(k_of):
        if runs and runs[-1][2] == k_of[b]:
            runs[-1][1] = b
        else:
            runs.append([b, b, k_of[b]])
    return ", ".join(f"{lo}{'' if lo == hi else f'-{hi}'}: {k}" for lo, hi, k in runs)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 100:.1f} %"


def _replay_run(source: Path, table: Mapping[str, Any], runs: int, model, plot: Path | None,
                force: bool, fit_spread=None) -> None:
    from dsdprof.io.rollouts import read_rollout_rows
    from dsdprof.report.rollout import band_pct, replay_check, replay_summary, trust_note

    chk = replay_check(read_rollout_rows(source), table, runs, model=model, fit_spread=fit_spread)
    kinds = ["raw", "cal"] + (["fit", "fitcal"] if model is not None else [])
    t = _table("replay vs measured makespan, per rollout",
               "err %: predicted / measured - 1. raw: the table's step times; cal.: scaled by the "
               "repeat's vanilla (" + ", ".join(f"r{r} {s:.3f}" for r, s in chk.scale.items()) + ")"
               + ("; fit: fitted on --fit; fitcal: fit's steps scaled by the repeat's vanilla decode, its "
                  f"prefill by the run's vanilla prefill (x{chk.prefill_scale:.3f})" if model else ""),
               ("rep", "variant", "measured s", *(f"{k} %" for k in kinds), "steps m/p"))
    for _, x in chk.rows.iterrows():
        t.add_row(
            str(x["repeat"]),
            x["variant"],
            fmt_number(x["measured_s"], 2),
            *(fmt_number(x[f"error_{k}"] * 100, 1) for k in kinds),
            f"{x['steps_measured']}/{fmt_number(x['steps_predicted'], 1)}",
        )
    console.print(t)
    s = _table("replay vs measured: mean over repeats",
               "err %: the mean prediction against the mean measured makespan; max: the largest single "
               "rollout's |err|" + f" ({kinds[-1]})" + (f"; band: the mean {chk.band_on}'s 90% band (both "
               f"runs' repeat-to-repeat spread, {band_pct(chk.band_half)}); in: it holds the measured mean"
               if model else ""),
               ("variant", "meas. s", *(f"{k} %" for k in kinds), "max %",
                *(["band s", "in"] if model else [])))
    s.show_edge = False  # nine columns with the band: 80 wide without the edge's two blanks
    for _, x in replay_summary(chk.rows, chk.band_half, chk.band_on).iterrows():
        s.add_row(x["variant"], fmt_number(x["measured_s"], 2),
                  *(fmt_number(x[f"{k}_err"] * 100, 1) for k in kinds),
                  fmt_number(x[f"{kinds[-1]}_max_err"] * 100, 1),
                  *([f"{fmt_number(x['band_lo_s'], 2)}-{fmt_number(x['band_hi_s'], 2)}",
                     "yes" if x["in_band"] is True else ("no" if x["in_band"] is False else "-")]
                    if model else []))
    console.print(s)
    console.print(trust_note(chk))
    if plot is not None:
        from dsdprof.report.plots import require_matplotlib
        from dsdprof.report.rollout_plots import plot_replay_check

        require_matplotlib()
        console.print(f"wrote {plot_replay_check(chk.rows, plot, force=force)}")


def register(app: typer.Typer) -> None:
    """Add ``rollout``, ``rollout-report`` and ``replay`` to ``app``."""
    app.command("rollout")(guarded(_rollout))
    app.command("rollout-report")(guarded(_rollout_report))
    app.command("replay")(guarded(_replay))
