"""CLI commands of this subpackage (registered on the main typer app by dsdprof.cli.app):
``dsdprof validate`` and ``dsdprof plot``. rich lives here only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dsdprof.cli.common import Force, Tolerance, fail, guarded, interrupted, make_console
from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.config.run import Run
from dsdprof.report.text import fmt_number

console = make_console()
err_console = make_console(stderr=True)


def render_comparison(comparison, title: str = "") -> list[Table]:
    """Rich tables of a :func:`dsdprof.report.compare.compare` result, each within 80 columns: the
    speeds (tokens/s per user of vanilla, each fixed K, the table's DSD and, with adaptive rows, the
    adaptive plugin), then the decision (the table's K, the best fixed K, regrets with intervals,
    speedup, noise).

    ``DSD K``: the table's K at that batch size; in parentheses the mean K vLLM actually drafted
    when it differs (requests of a wave finish at different steps, so a wave's tail runs at a
    smaller batch size and may get another K). With adaptive rows: the mean K the plugin drafted
    and its regret. Regrets carry their interval where the data allow."""
    from rich import box

    from dsdprof.config.defaults import DEFAULT_CONFIDENCE
    from dsdprof.report.compare import fixed_k_columns

    ks = fixed_k_columns(comparison)
    adaptive = "tops_adaptive" in comparison.columns
    speeds = Table(title=f"tokens/s per user (median over repeats)  {title}".strip(), box=box.SIMPLE_HEAD,
                   padding=(0, 1), pad_edge=False,
                   caption="DSD: the table on vLLM's schedule"
                   + ("; adaptive: the table served by dsdprof's adaptive plugin" if adaptive else ""))
    noise = comparison["noise"].max() if len(comparison) else 0.0
    caption = (f"regret = 1 - DSD / best fixed K, {DEFAULT_CONFIDENCE:.0%} interval in brackets (none with "
               "one sample); speedup = DSD / vanilla, * below vanilla beyond the noise floor "
               f"(±{noise * 100:.0f}%, --noise); DSD K (n): K vLLM drafted on average when it differs"
               + ("; adapt.: the adaptive plugin (K: mean drafted)" if adaptive else ""))
    decision = Table(title="DSD vs the best fixed K", box=box.SIMPLE_HEAD, caption=caption, padding=(0, 1),
                     pad_edge=False)
    for col in ["BS", "vanilla", *[f"K={k}" for k in ks], "DSD", *(["adaptive"] if adaptive else [])]:
        speeds.add_column(col, justify="right", no_wrap=True)
    for col in ["BS", "DSD K", "best", "regret %", "speedup",
                *(["adapt. K", "adapt. regret %"] if adaptive else [])]:
        decision.add_column(col, justify="right", no_wrap=True)
    for _, r in comparison.iterrows():
        k_obs = r.get("dsd_k_observed")
        k_txt = str(int(r["dsd_k"]))
        if k_obs is not None and not math.isnan(k_obs) and abs(k_obs - r["dsd_k"]) > 0.05:
            k_txt += f" ({k_obs:.1f})"
        sp_txt = f"{r['speedup_vs_vanilla']:.2f}x"
        if r["below_vanilla"]:
            sp_txt = f"[red]{sp_txt}*[/]"
        bs = str(int(r["batch_size"]))
        tops = [r["tops_vanilla"], *[r[f"tops_k{k}"] for k in ks], r["tops_dsd"],
                *([r["tops_adaptive"]] if adaptive else [])]
        speeds.add_row(bs, *[fmt_number(t, 1) for t in tops])
        cells = [bs, k_txt, str(int(r["best_fixed_k"])),
                 _regret(r["regret"], r.get("regret_lo"), r.get("regret_hi")),
                 sp_txt]
        if adaptive:
            cells += [fmt_number(r.get("adaptive_k_observed"), 2),
                      _regret(r["adaptive_regret"], r.get("adaptive_regret_lo"), r.get("adaptive_regret_hi"))]
        decision.add_row(*cells)
    return [speeds, decision]


def _regret(point: float, lo: float | None, hi: float | None) -> str:
    """In percent: ``+1.2`` or, with a known interval, ``+1.2 [-0.4,+2.9]`` (bounds of 10 or more
    without decimals: ``+10.8 [+3.9,+17]``, so two regrets fit 80 columns)."""
    if point is None or (isinstance(point, float) and math.isnan(point)):
        return "-"
    txt = f"{point * 100:+.1f}"
    if lo is not None and hi is not None and not (math.isnan(lo) or math.isnan(hi)):
        lo_t, hi_t = (f"{x * 100:+.0f}" if abs(x) >= 0.0995 else f"{x * 100:+.1f}" for x in (lo, hi))
        txt += f" [{lo_t},{hi_t}]"
    return txt


def _check_report_options(max_regret: float | None, fail_on_regret: float | None,
                          noise: float) -> float | None:
    """The regret limit as a fraction (None: no gate). ``--fail-on-regret PCT`` (deprecated: a
    percentage where every other option is a fraction) still works, with one warning line."""
    if max_regret is not None and fail_on_regret is not None:
        raise fail(f"--fail-on-regret={fail_on_regret!r}: give --max-regret (a fraction) or the deprecated "
                   "--fail-on-regret (a percentage), not both")
    if max_regret is not None and (math.isnan(max_regret) or not 0 <= max_regret < 1):
        raise fail(f"--max-regret={max_regret!r}: must be a fraction in [0, 1) (0.03 = 3%), like --tolerance")
    if fail_on_regret is not None and (math.isnan(fail_on_regret) or fail_on_regret < 0):
        raise fail(f"--fail-on-regret={fail_on_regret!r}: must be a percentage >= 0")
    if not (0 <= noise < 1):
        raise fail(f"--noise={noise!r}: must be in [0, 1)")
    if fail_on_regret is not None:
        err_console.print(f"warning: --fail-on-regret PCT is deprecated; use --max-regret "
                          f"{fail_on_regret / 100:g} "
                          "(a fraction, like --tolerance and --noise)", style="yellow", markup=False,
                          highlight=False, soft_wrap=True)
        return fail_on_regret / 100.0
    return max_regret


_MAX_REGRET_HELP = ("Exit 1 when DSD's regret vs the best fixed K exceeds this fraction (0.03 = 3%) at any "
                    "batch size. A fraction, like --tolerance and --noise.")
_FAIL_ON_REGRET_HELP = "Deprecated (a percentage): use --max-regret PCT/100."
Guidellm = Annotated[list[str] | None, typer.Option(
    "--guidellm", metavar="VARIANT=REPORT.json",
    help="A guidellm JSON report (concurrent profile) measured on the server of VARIANT (vanilla, fixed-K, "
         "dsd, adaptive); repeatable, one per repeat: shown beside the step trace, disagreements beyond the "
         "intervals flagged.")]


def report(run: Run, noise: float, max_regret: float | None, title: str,
           guidellm: list[str] | None = None) -> None:
    """Print the comparison of a validate run (and, with ``guidellm``, guidellm's reports beside its
    step-trace figures); ``typer.Exit(1)`` when regret exceeds the limit."""
    from dsdprof.report.compare import compare, regret_exceeds, verdict_lines

    rows = run.rows
    comparison = compare(rows, noise_floor=noise)
    for table in render_comparison(comparison, title):
        console.print(table)
    for said in verdict_lines(comparison, "; --max-regret gates the static table only"):
        console.print("[red]flag[/]" + said.removeprefix("flag") if said.startswith("flag ") else said)
    from dsdprof.config.defaults import DEFAULT_CONFIDENCE
    from dsdprof.report.vanilla import validate_vanilla, validate_vanilla_line

    if (line := validate_vanilla_line(validate_vanilla(rows, DEFAULT_CONFIDENCE),
                                      DEFAULT_CONFIDENCE)) is not None:
        console.print(line, style="red", markup=False, highlight=False)
    if guidellm:
        from dsdprof.report.guidellm_compare import client_beside_steps, client_lines, load_client

        for line in client_lines(client_beside_steps(rows, load_client(guidellm))):
            console.print(line, markup=False, highlight=False)
    if max_regret is not None:
        over = regret_exceeds(comparison, max_regret * 100.0)
        if over:
            console.print(f"[red]regret above {max_regret:.1%} (--max-regret {max_regret:g}) at BS {over}[/]")
            raise typer.Exit(1)


def _adaptive_options(adaptive: bool, adaptive_config: str | None) -> dict | None:
    """None (no adaptive variant) or the selector options given with ``--adaptive-config``."""
    if adaptive_config is None:
        return {} if adaptive else None
    try:
        options = json.loads(adaptive_config)
    except ValueError as err:
        raise fail(f"--adaptive-config={adaptive_config!r}: not JSON ({err})") from None
    if not isinstance(options, dict):
        raise fail(f"--adaptive-config={adaptive_config!r}: must be a JSON object of selector options")
    return options


def _title(prov: dict) -> str:
    return " / ".join(str(prov[k]) for k in ("model", "draft_model", "hardware") if prov.get(k))


def _validate(
    table_path: Path = typer.Argument(..., metavar="TABLE",
                                      help="K table (dsdprof.ktable/v1 or /v2 JSON) to serve."),
    spec_path: Path = typer.Argument(..., metavar="SPEC",
                                     help="Sweep spec whose engine, batch sizes and workload to run."),
    fixed_k: list[int] | None = typer.Option(None, "--fixed-k",
                                             help="Fixed K to compare against (repeatable; default 3)."),
    out: Path | None = typer.Option(None, "--out", "-o",
                                    help="Output directory for the Parquet rows; default: a new "
                                         "runs/validate-<time>."),
    max_regret: float | None = typer.Option(None, "--max-regret", metavar="FRACTION", help=_MAX_REGRET_HELP),
    fail_on_regret: float | None = typer.Option(None, "--fail-on-regret", metavar="PCT", hidden=True,
                                                help=_FAIL_ON_REGRET_HELP),
    noise: float = typer.Option(0.05, "--noise",
                                help="Relative noise floor for the below-vanilla flag (raised to the spread "
                                     "seen across repeats)."),
    repeats: int | None = typer.Option(None, "--repeats", min=1, help="Override the spec's sweep.repeats."),
    waves: int | None = typer.Option(None, "--waves", min=1, help="Override the spec's sweep.waves."),
    resume: bool = typer.Option(False, "--resume",
                                help="Continue the validate run in OUT (same table, spec and versions): skip "
                                     "finished cells, retry failed ones."),
    adaptive: bool = typer.Option(False, "--adaptive",
                                  help="Also serve the table (v2) through dsdprof's adaptive vLLM scheduler, "
                                       "which follows live acceptance (docs/adaptive.md)."),
    adaptive_config: str | None = typer.Option(None, "--adaptive-config", metavar="JSON",
                                               help='Adaptive selector options, e.g. \'{"half_life": 256, '
                                                    '"margin": 0.02}\' (implies --adaptive).'),
    design: str = typer.Option("paired", "--design",
                               help="paired: the variants' waves interleaved one by one, intervals paired by "
                                    "wave (drift cancels); steps: every variant but vanilla in one engine's "
                                    "waves, switched per step (finest pairing; --fixed-k up to the table's "
                                    "largest K); cells: each cell's waves back to back."),
    guidellm: Guidellm = None,
) -> None:
    """Serve TABLE on real vLLM next to vanilla and fixed K (and --adaptive); report tokens/s per user,
    regret, speedup."""
    from datetime import datetime

    from dsdprof.cli.progress import run_progress
    from dsdprof.config.spec import load_spec
    from dsdprof.export.table import load_table
    from dsdprof.jobs.validate import run_validation, table_warnings

    limit = _check_report_options(max_regret, fail_on_regret, noise)
    adaptive_options = _adaptive_options(adaptive, adaptive_config)
    table = load_table(table_path)
    spec = load_spec(spec_path)
    upd = {k: v for k, v in (("repeats", repeats), ("waves", waves)) if v is not None}
    if upd:
        spec = spec.model_copy(update={"sweep": spec.sweep.model_copy(update=upd)})
    if out is None:
        out = Path("runs") / f"validate-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    ks = list(fixed_k) if fixed_k else [3]
    early = table_warnings(table, spec)
    for w in early:
        err_console.print(f"[yellow]warning:[/] {w}")
    progress, on_progress = run_progress(err_console, "validate", [], [])
    try:
        with progress:
            summary = run_validation(table, spec, out, ks, table_path=str(table_path), resume=resume,
                                     on_progress=on_progress, adaptive=adaptive_options, design=design)
    except KeyboardInterrupt:
        again = ["dsdprof", "validate", str(table_path), str(spec_path), "--out", str(out)]
        again += [a for k in ks for a in ("--fixed-k", str(k))]
        again += [a for name, v in (("--repeats", repeats), ("--waves", waves)) if v is not None
                  for a in (name, str(v))]
        if adaptive_options is not None:
            again += ["--adaptive-config", json.dumps(adaptive_options)]
        again += ["--design", design]
        raise interrupted([*again, "--resume"]) from None
    for w in (w for w in summary.warnings if w not in early):
        err_console.print(f"[yellow]warning:[/] {w}")
    console.print(f"{summary.ok} ok, {summary.failed} failed, {summary.skipped} skipped -> {summary.out}")
    from dsdprof.io.runs import open_run

    report(open_run(out, "validate-report"), noise, limit, _title(table.get("provenance", {})), guidellm)

def _validate_report(
    results: Path = typer.Argument(..., metavar="RESULTS",
                                   help="Output of dsdprof validate (directory or Parquet file)."),
    max_regret: float | None = typer.Option(None, "--max-regret", metavar="FRACTION", help=_MAX_REGRET_HELP),
    fail_on_regret: float | None = typer.Option(None, "--fail-on-regret", metavar="PCT", hidden=True,
                                                help=_FAIL_ON_REGRET_HELP),
    noise: float = typer.Option(0.05, "--noise", help="Relative noise floor for the below-vanilla flag."),
    guidellm: Guidellm = None,
) -> None:
    """Print the vanilla / fixed K / DSD comparison of a finished validate run (no vLLM)."""
    from dsdprof.io.runs import open_run

    limit = _check_report_options(max_regret, fail_on_regret, noise)
    run = open_run(results, "validate-report")  # read once: rows and provenance
    report(run, noise, limit, _title(run.stored_provenance), guidellm)

def _plot(
    results: Path = typer.Argument(..., metavar="RESULTS",
                                   help="Sweep or validate output (directory or Parquet file)."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Directory for the PNG files."),
    tolerance: Tolerance = DEFAULT_TOLERANCE,
    force: Force = False,
) -> None:
    """Draw PNGs: optimal K vs BS, goodput heatmap, tokens/s per user (validate runs), acceptance per
    position."""
    from dsdprof.report.plots import plot_results, require_matplotlib

    require_matplotlib()
    written = plot_results(results, out_dir, tolerance=tolerance, force=force)
    for p in written:
        console.print(f"wrote {p}")


def register(app: typer.Typer) -> None:
    """Add ``validate``, ``validate-report`` and ``plot`` to ``app``."""
    app.command("validate")(guarded(_validate))
    app.command("validate-report")(guarded(_validate_report))
    app.command("plot")(guarded(_plot))
