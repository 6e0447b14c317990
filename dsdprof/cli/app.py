"""``dsdprof`` command line: parse, call, render. rich lives only in CLI modules."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from dsdprof import __version__
from dsdprof.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    AllowMixed,
    Force,
    Terminated,
    Tolerance,
    fail,
    guarded,
    handle_sigterm,
    interrupted,
    make_console,
    plain_flags_in_help,
)
from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.report.text import fmt_number

plain_flags_in_help()

app = typer.Typer(
    name="dsdprof",
    help="Measure speculative decoding on your model, draft and GPU; pick the goodput-optimal "
         "number of draft tokens K per batch size; export it to vLLM or a runtime selector.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
console = make_console()
err_console = make_console(stderr=True)


def _version(value: bool) -> None:
    if value:
        print(f"dsdprof {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """dsdprof: hardware-aware dynamic speculative decoding profiler."""


# ----------------------------------------------------------------------------- sweep

@app.command()
@guarded
def sweep(
    spec_path: Path = typer.Argument(..., metavar="SPEC",
                                     help="Sweep spec (TOML): \\[engine], \\[sweep], \\[workload]."),
    out: Path = typer.Option(..., "--out", "-o",
                             help="Run directory for the Parquet part files: new or empty, or an earlier run "
                                  "with --resume. Locked while the sweep runs."),
    resume: bool = typer.Option(False, "--resume",
                                help="Continue the run in OUT (same spec, overrides and versions): skip "
                                     "finished cells, retry failed ones."),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="Stream vLLM's own output to the console, not to the log "
                                      "files OUT/_logs/engine-*.log."),
    budget: str | None = typer.Option(None, "--budget",
                                      help="Engine seconds (3600, 90m, 2h) or measured waves (400w): after "
                                           "one pass over the grid, run further repeats only of the Ks that "
                                           "can still win at batch sizes whose K is not yet decided."),
    model: str | None = typer.Option(None, "--model",
                                     help="Override the spec's engine.model (recorded in OUT/_sweep.json)."),
    draft_model: str | None = typer.Option(None, "--draft-model",
                                           help="Override the spec's engine.draft_model."),
    batch_sizes: str | None = typer.Option(None, "--batch-sizes", metavar="1,8,64",
                                           help="Override the spec's sweep.batch_sizes."),
    num_spec_tokens: str | None = typer.Option(None, "--num-spec-tokens", metavar="0,2,4",
                                               help="Override the spec's sweep.num_spec_tokens (vLLM's "
                                                    "num_speculative_tokens), the Ks to measure."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Print the grid, the number of cells and an estimated duration; start "
                                      "no engine, write nothing."),
) -> None:
    """Run the BS x K grid on the spec's engine and record AL and ITL per cell to Parquet.

    Exit codes: 0 done, 1 every cell failed (the first error is printed), 2 bad input (including a
    model that cannot be resolved or loaded), 130 interrupted."""
    from dsdprof.cli.progress import run_progress
    from dsdprof.config.spec import load_spec, with_overrides
    from dsdprof.measure.runner import run_sweep

    overrides = {"--model": model, "--draft-model": draft_model, "--batch-sizes": batch_sizes,
                 "--num-spec-tokens": num_spec_tokens}
    spec = with_overrides(load_spec(spec_path), overrides)
    if budget is not None:
        from dsdprof.jobs.budget import run_budgeted_sweep
        from dsdprof.jobs.budget_plan import parse_budget

        parsed_budget = parse_budget(budget)  # bad --budget fails here, before any output
    notices: list[str] = []
    if spec.engine.name == "sim":
        from dsdprof.measure.sim.config import model_notices, resolve

        setup = resolve(spec)  # bad [sim] input or model config.json fails here, before any output
        # Notices wait until the run directory is ours: a refused --out stays a one-line error.
        notices = [*model_notices(spec), "engine 'sim': rows are analytic predictions, not measurements"
                   + setup.assumption_note()]
    if dry_run:
        if spec.engine.name != "sim":
            from dsdprof.config.spec import check_workload_for_engine

            check_workload_for_engine(spec)  # dataset and lengths, as the engine checks them
        return _print_plan(spec)
    first_error: list[str] = []
    progress, on_progress = run_progress(err_console, "sweep", notices, first_error)
    try:
        with progress:
            if budget is None:
                summary = run_sweep(spec, out, resume=resume, on_progress=on_progress,
                                    stream_engine_log=verbose)
            else:
                summary = budgeted = run_budgeted_sweep(spec, out, parsed_budget, resume=resume,
                                                        on_progress=on_progress, stream_engine_log=verbose)
    except KeyboardInterrupt:
        again = [a for flag, v in overrides.items() if v is not None for a in (flag, v)]
        again += ["--budget", budget] if budget is not None else []
        raise interrupted(["dsdprof", "sweep", str(spec_path), "--out", str(out), *again,
                           "--resume"]) from None
    console.print(f"{summary.ok} ok, {summary.failed} failed, {summary.skipped} skipped "
                  f"(speculation mode {summary.speculation_mode}) -> {summary.out}")
    if budget is not None:
        console.print(budgeted.report(), markup=False, highlight=False)
    if summary.failed and not summary.ok and not summary.skipped:
        print(f"error: every cell failed; first error: {first_error[0][:500] if first_error else 'unknown'}",
              file=sys.stderr)
        raise typer.Exit(1)


def _listed(values, most: int = 16) -> str:
    """``1, 2, 4`` -- or, for a long list, its ends and its length (a dry run stays a few lines)."""
    if len(values) <= most:
        return ", ".join(map(str, values))
    head, tail = ", ".join(map(str, values[:6])), ", ".join(map(str, values[-3:]))
    return f"{head}, ..., {tail} ({len(values)} values)"


def _print_plan(spec) -> None:
    from dsdprof.cli.progress import duration
    from dsdprof.measure.runner import plan_sweep

    p = plan_sweep(spec)
    console.print(f"engine {p.engine}: {spec.engine.model}"
                  + (f" + {spec.engine.draft_model}" if spec.engine.draft_model else "")
                  + f" ({spec.engine.method})", markup=False, highlight=False)
    console.print(f"batch sizes {_listed(p.batch_sizes)}; K {_listed(p.ks)}; "
                  f"{p.repeats} repeat(s)", markup=False, highlight=False)
    console.print(f"{p.cells:,} cells (vanilla included), at most {p.decode_steps:,} decode steps",
                  markup=False, highlight=False)
    console.print(f"estimated duration {duration(p.est_seconds)} ({p.assumption})", markup=False,
                  highlight=False)


# ----------------------------------------------------------------------------- analyze

def _warn_below_baseline(optimal) -> None:
    from dsdprof.export.api import below_baseline_warning

    if (w := below_baseline_warning(optimal)) is not None:
        err_console.print(f"warning: {w}", style="yellow", markup=False, highlight=False, soft_wrap=True)



@app.command()
@guarded
def analyze(
    measurements: Path = typer.Argument(..., help="Sweep directory or Parquet file."),
    tolerance: Tolerance = DEFAULT_TOLERANCE,
    json_out: bool = typer.Option(False, "--json", help="Print the per-BS result as JSON instead of tables."),
    csv_out: bool = typer.Option(False, "--csv", help="Print the per-BS result as CSV instead of tables."),
    wide: bool = typer.Option(False, "--wide",
                              help="Also show every K: speedup of K* vs each K, and each K's goodput vs the "
                                   "best with intervals."),
    allow_mixed: AllowMixed = False,
    confidence: float = typer.Option(0.9, "--confidence",
                                     help="Confidence of the bootstrap intervals the decisions use (central "
                                          "interval)."),
    acceptance: str = typer.Option("auto", "--acceptance",
                                   help="auto | measured | chain: AL per K as measured, or from the largest "
                                        "K's per-position acceptance (chain drafters)."),
) -> None:
    """Find the goodput-optimal K (goodput = AL / ITL) per batch size, with intervals and decisions.

    One line per batch size: K*, whether the data decided it, the runner-up K and how much better
    K* is (goodput ratio - 1, with its interval), AL, ITL, goodput (tokens/s per user) and the
    speedup vs no speculation. Grid cells with no number (failed or not yet run) are named."""
    from dsdprof.cli.analyze import analysis_csv, analysis_json, render_analysis
    from dsdprof.decide.analysis import analyze_path
    from dsdprof.decide.context import analyze_contexts_path
    from dsdprof.io.runs import open_run

    if json_out and csv_out:
        raise fail("--csv: give --json or --csv, not both")
    options: dict[str, Any] = dict(tolerance=tolerance, confidence=confidence, acceptance=acceptance)
    run = open_run(measurements, "analyze", allow_mixed)  # every file read once, checked once
    by_context = analyze_contexts_path(run, **options)
    if by_context is not None:  # a context sweep: the same analysis per context
        if json_out:
            print(json.dumps({str(c): json.loads(analysis_json(a)) for c, a in by_context.slices.items()},
                             indent=2))
            return
        for c, a in by_context.slices.items():
            console.rule(f"context {c}")
            render_analysis(a, console, err_console)
        return
    result = analyze_path(run, **options)
    if json_out or csv_out:
        from dsdprof.cli.sim import sim_band_record

        doc = analysis_json(result, **sim_band_record(run, tolerance))  # a sim run: its "prediction_band"
        sys.stdout.write((doc + "\n") if json_out else analysis_csv(result))
        sys.stdout.flush()
        return
    render_analysis(result, console, err_console, wide=wide)
    _warn_below_baseline(result.optimal)
    from dsdprof.cli.sim import print_sim_band

    print_sim_band(run, tolerance, console)  # a sim run: its band, K* within it, what was assumed


# ----------------------------------------------------------------------------- export / show

@app.command()
@guarded
def export(
    source: Path = typer.Argument(..., metavar="SOURCE",
                                  help="Sweep directory / Parquet file, an existing table JSON (v1 or "
                                       "v2), or a compare-drafts directory or one draft's OUT/<draft> in "
                                       "it (with --mix)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write here (default: stdout)."),
    fmt: str = typer.Option("table", "--format", "-f",
                            help="table (dsdprof.ktable/v2), vllm (--speculative-config JSON), "
                                 "vllm-compilation (--compilation-config JSON: the measured CUDA-graph "
                                 "settings) or trtllm (speculative_config with draft_len_schedule)."),
    tolerance: Tolerance = DEFAULT_TOLERANCE,
    force: Force = False,
    allow_mixed: AllowMixed = False,
    allow_partial: bool = typer.Option(False, "--allow-partial",
                                       help="Export a run whose grid has batch sizes or Ks with no ok cell "
                                            "(failed or not yet run), a context sweep's failed slices "
                                            "included. Without it such a run is refused, naming them; with "
                                            "it the table's provenance.partial records the gaps, a range "
                                            "ends at the last measured batch size when larger ones failed, "
                                            "and a gap inside the grid takes the measured neighbours' K."),
    context: int | None = typer.Option(None, "--context",
                                       help="Context sweeps (dsdprof.ktable/v3): the context (prompt tokens) "
                                            "whose slice a batch-size-only schedule serves; default: the "
                                            "table's batch-size-only answer."),
    mix: str | None = typer.Option(None, "--mix", metavar="CAT=W,...",
                                   help="A compare-drafts directory (or one draft's OUT/<draft>): the table "
                                        "for this traffic mix, e.g. code=0.7,text=0.3 (weights of any "
                                        "scale; per batch size the K of the highest mixed speedup; "
                                        "docs/drafts.md)."),
    draft: str | None = typer.Option(None, "--draft", help="With --mix: the draft whose table to write."),
) -> None:
    """Write the portable K table, or an engine's native config serving it (vLLM, TensorRT-LLM)."""
    from dsdprof.export.api import export_document, export_format
    from dsdprof.io.atomic import check_output_path, write_json_atomic

    export_format(fmt)  # an unknown --format refused first, by the registry
    if output is not None:
        check_output_path(output, force, field="--output")
    from dsdprof.report.drafts import is_comparison

    if mix is not None or draft is not None or is_comparison(source):  # a compare-drafts draft, for a mix
        from dsdprof.cli.drafts import export_mix

        exported = export_mix(source, mix, draft, fmt, context)
    else:
        exported = export_document(source, fmt, tolerance, allow_mixed, allow_partial, context=context)
    for w in exported.warnings:
        err_console.print(f"warning: {w}", style="yellow", markup=False, highlight=False, soft_wrap=True)
    if output is None:
        sys.stdout.write(json.dumps(exported.doc, indent=2) + "\n")
        sys.stdout.flush()  # a closed pipe fails here, inside guarded: a quiet exit 0
    else:
        write_json_atomic(output, exported.doc, force=force, check=exported.check)
        console.print(f"wrote {output}")


_SHOW_MAX_RANGES = 200


def _show_contexts(doc: Mapping[str, Any]) -> None:
    """A v3 table: one table per context slice, the contexts it serves in its title."""
    cap, lo = doc.get("num_speculative_tokens"), 1
    for sl in doc["contexts"]:
        last = sl is doc["contexts"][-1]
        span = f"{lo}+" if last else f"{lo}..{sl['max_context']}"
        t = Table(title=f"context {span} (profiled at {sl.get('context_len', '?')})")
        for col in ("batch sizes", "K", "profiled BS: K (vs baseline)"):
            t.add_column(col, justify="right")
        pts = {p["batch_size"]: p for p in sl.get("points", [])}
        for i, (start, end, k) in enumerate(sl["ranges"][:_SHOW_MAX_RANGES]):
            bs = "+" if i == len(sl["ranges"]) - 1 else ("" if start == end else f"-{end}")
            inside = [f"{b}: {p['k']} ({fmt_number(p.get('speedup_vs_baseline') or math.nan)}x)"
                      for b, p in sorted(pts.items()) if start <= b <= end]
            t.add_row(f"{start}{bs}", str(min(k, cap)) if cap is not None else str(k), ", ".join(inside))
        console.print(t)
        lo = sl["max_context"] + 1


@app.command()
@guarded
def show(table_path: Path = typer.Argument(
        ..., metavar="TABLE", help="A dsdprof.ktable/v1 or /v2 JSON file, dsdprof's vLLM or TensorRT-LLM "
                                   "export, or a fleet's tables/index.json.")) -> None:
    """Show a K table: ranges, profiled points, measured cells and provenance."""
    from dsdprof.export.api import load_any_table
    from dsdprof.fleet.export import find_index

    if (index := find_index(table_path)) is not None:  # a fleet's index: list its tables
        from dsdprof.cli.fleet import print_index

        return print_index(index)
    doc, kind = load_any_table(table_path)
    prov = doc.get("provenance", {})
    ranges = doc["ranges"]
    cap = doc.get("num_speculative_tokens")
    console.print(f"{table_path}  ({kind or doc['schema']})", markup=False, highlight=False, soft_wrap=True)
    if doc.get("contexts"):
        _show_contexts(doc)
    t = Table(title="no context known" if doc.get("contexts") else None)
    for col in ("batch sizes", "K"):
        t.add_column(col, justify="right")
    for i, (start, end, k) in enumerate(ranges[:_SHOW_MAX_RANGES]):
        last = i == len(ranges) - 1  # K carries forward past the last range
        span = f"{start}+" if last else (f"{start}" if start == end else f"{start}-{end}")
        t.add_row(span, f"{cap} (table {k}, capped)" if cap is not None and k > cap else str(k))
    if len(ranges) > _SHOW_MAX_RANGES:
        t.add_row(f"... {len(ranges) - _SHOW_MAX_RANGES} more ranges", "")
    console.print(t)
    if doc.get("vanilla_faster"):  # where no speculation measured faster than every K
        from dsdprof.export.table import vanilla_warning

        console.print(vanilla_warning(doc), style="red", markup=False, highlight=False)
    if doc.get("points"):
        p = Table(title="profiled points")
        for col in ("BS", "K", "AL", "ITL ms", "goodput tok/s", "vs baseline"):
            p.add_column(col, justify="right")
        for pt in doc["points"]:
            p.add_row(str(pt["batch_size"]), str(pt["k"]), fmt_number(pt.get("acceptance_length")),
                      fmt_number((pt.get("itl_s") or math.nan) * 1e3), fmt_number(pt.get("goodput"), 1),
                      fmt_number(pt.get("speedup_vs_baseline") if pt.get("speedup_vs_baseline") is not None
                                 else math.nan) + "x")
        console.print(p)
    if doc.get("cells"):
        sizes = sorted({c["batch_size"] for c in doc["cells"]})
        ks = sorted({c["k"] for c in doc["cells"]})
        per_pos = doc.get("acceptance_per_pos")
        console.print(f"measured cells: {len(doc['cells'])} (batch sizes {sizes[0]}..{sizes[-1]}, "
                      f"K {ks[0]}..{ks[-1]}); "
                      + (f"profiled acceptance per position: {', '.join(f'{x:.2f}' for x in per_pos)}"
                         if per_pos else "no per-position acceptance (not usable adaptively)"))
    if prov:
        console.print(", ".join(f"{k}={v}" for k, v in prov.items() if v not in ("", None)))


def _register_subcommands() -> None:
    from dsdprof.cli import drafts as drafts_cli
    from dsdprof.cli import fleet as fleet_cli
    from dsdprof.cli import report as report_cli
    from dsdprof.cli import report_html as report_html_cli
    from dsdprof.cli import rollout as rollout_cli
    from dsdprof.cli import serve as serve_cli
    from dsdprof.cli import sim as sim_cli
    from dsdprof.cli import toy as toy_cli
    from dsdprof.cli import watch as watch_cli

    toy_cli.register(app)  # first: `dsdprof --help` lists it right after app's own commands, as before
    sim_cli.register(app)
    serve_cli.register(app)
    watch_cli.register(app)
    report_cli.register(app)
    report_html_cli.register(app)
    fleet_cli.register(app)
    rollout_cli.register(app)
    drafts_cli.register(app)


_register_subcommands()


def main() -> None:
    """Console-script entry point. SIGTERM unwinds like Ctrl-C (rows flushed, lock released), exit 143."""
    handle_sigterm()
    try:
        app()
    except Terminated:
        print("terminated", file=sys.stderr)
        sys.exit(EXIT_TERMINATED)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
