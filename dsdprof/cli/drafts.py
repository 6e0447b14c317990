"""``dsdprof compare-drafts`` (one sweep per draft and category) and ``dsdprof drafts-report`` (the
ranking, recommendation, memory, per-category acceptance and regret; a draft's table for a mix).
Registered on the main typer app by dsdprof.cli.app; the library does the work
(:mod:`dsdprof.jobs.compare_drafts`, :mod:`dsdprof.report.drafts`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dsdprof.cli.common import Force, guarded, make_console


def _compare_drafts(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="A sweep spec with a \\[\\[drafts]] list "
                                     "(and optionally \\[domains] categories)."),
    out: Path = typer.Option(..., "--out", "-o", help="Run directory: one sweep per draft and "
                                     "category, in OUT/<draft>/<category>/."),
    resume: bool = typer.Option(False, "--resume", help="Continue the runs already started in OUT."),
    only: str | None = typer.Option(None, "--only", metavar="DRAFT[/CATEGORY],...",
                                       help="Run only these drafts or draft/category runs."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and list the sweeps; run nothing."),
) -> None:
    """Compare drafts of one target: one sweep per (draft, category), the same grid and prompts."""
    from dsdprof.jobs.compare_drafts import plan_drafts, run_compare_drafts

    console = make_console()
    if dry_run:
        plan = plan_drafts(spec_path, out)
        for (draft, cat), spec in plan.specs.items():
            console.print(f"{draft}/{cat}: method {spec.engine.method}, design {spec.sweep.design}, "
                          f"dataset {spec.workload.dataset}")
        return
    wanted = [s.strip() for s in only.split(",") if s.strip()] if only else None
    results = run_compare_drafts(spec_path, out, resume=resume, only=wanted)
    for (draft, cat), summary in results.items():
        console.print(f"{draft}/{cat}: {summary.ok} ok, {summary.failed} failed, {summary.skipped} skipped")
    console.print(f"report: dsdprof drafts-report {out}")


def _drafts_report(
    out: Path = typer.Argument(..., metavar="OUT", help="A dsdprof compare-drafts directory."),
    mix: str | None = typer.Option(None, "--mix", metavar="CAT=W,...",
                                      help="Traffic mix (weights, any scale); default: the workload's "
                                           "prompts per category."),
    md: Path | None = typer.Option(None, "--md", help="Write the Markdown report here."),
    text_out: Path | None = typer.Option(None, "--text", help="Write the 80-column text report here."),
    plot: Path | None = typer.Option(None, "--plot", help="Write the speedup-vs-K PNG here."),
    ranking_plot: Path | None = typer.Option(None, "--ranking-plot",
                                             help="Write the ranking PNG here: speedup over vanilla per "
                                                  "batch size per draft at its mix K, with intervals."),
    title: str = typer.Option("", "--title", help="The report's heading."),
    as_json: bool = typer.Option(False, "--json", help="Print the ranking, each category's vanilla check "
                                 "and the recommendation as JSON instead of the text report."),
    draft: str | None = typer.Option(None, "--draft",
                                        help="With --table: the draft whose table to write."),
    table: Path | None = typer.Option(None, "--table",
                                         help="Write --draft's dsdprof.ktable/v2 for the mix."),
    force: Force = False,
) -> None:
    """Rank the drafts of a compare-drafts directory for a traffic mix; print the 80-column report
    (or write it, and the Markdown one)."""
    from dsdprof.errors import InputError
    from dsdprof.io.atomic import write_bytes_atomic, write_json_atomic
    from dsdprof.measure.categories import parse_mix
    from dsdprof.report.drafts import default_mix, drafts_figure, drafts_markdown, load_comparison, mix_ktable

    if table and not draft:  # refused before any report is written
        raise InputError("--table", str(table), "needs --draft NAME (the draft whose table to write)")
    outputs = {"--md": md, "--text": text_out, "--plot": plot, "--ranking-plot": ranking_plot,
               "--table": table}
    for opt, path in outputs.items():  # every output checked before any is written
        if path is not None and path.exists() and not force:
            raise InputError(opt, str(path), "exists; pass --force to replace it")
    comp = load_comparison(out)
    cats = list(comp.plan["categories"])
    weights = parse_mix(mix, cats) if mix else default_mix(comp)
    from dsdprof.report.drafts_text import drafts_text, ranking_figure

    text = drafts_text(comp, weights, title)
    if md:
        write_bytes_atomic(md, drafts_markdown(comp, weights, title).encode())
    if text_out:
        write_bytes_atomic(text_out, text.encode())
    if as_json:
        import json

        from dsdprof.report.drafts import drafts_json

        print(json.dumps(drafts_json(comp, weights), indent=1))
    elif not md and not text_out:
        print(text)
    figures = (("--plot", plot, lambda: drafts_figure(comp, weights)),
               ("--ranking-plot", ranking_plot, lambda: ranking_figure(comp, weights)))
    for opt, path, fig in figures:
        if path:
            from dsdprof.report.plots import render_png, write_png

            write_png(path, render_png(fig()), opt)
    if table and draft:
        write_json_atomic(table, mix_ktable(comp, draft, weights), force=force)


def export_mix(source: Path, mix: str | None, draft: str | None, fmt: str, context: int | None) -> Any:
    """``dsdprof export SOURCE --mix ... [--draft NAME]``: the draft's table for the mix in ``fmt``
    (an :class:`dsdprof.export.api.ExportDocument`)."""
    from dsdprof.errors import InputError
    from dsdprof.export.api import format_table
    from dsdprof.formats.ktable import validate_table
    from dsdprof.report.drafts import mix_export_table

    if mix is None and draft is None:
        raise InputError("SOURCE", str(source), "a compare-drafts directory: its tables are one draft's "
                         "for a traffic mix: add --mix CAT=W,... (and --draft NAME)")
    if mix is None:
        raise InputError("--draft", draft, "needs --mix (the traffic mix whose table to write)")
    if context is not None:
        raise InputError("--context", context, "not with --mix (a draft comparison has no context axis)")
    return format_table(validate_table(mix_export_table(source, mix, draft)), fmt)


def register(app: typer.Typer) -> None:
    """Add ``compare-drafts`` and ``drafts-report`` to ``app``."""
    app.command("compare-drafts")(guarded(_compare_drafts))
    app.command("drafts-report")(guarded(_drafts_report))
