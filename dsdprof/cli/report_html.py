"""``dsdprof report RUN -o report.html`` (registered on the main typer app by dsdprof.cli.app): one
self-contained HTML page per run (docs/report.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from dsdprof.cli.common import AllowMixed, Force, Tolerance, fail, guarded, make_console
from dsdprof.config.defaults import DEFAULT_TOLERANCE

console = make_console()


def _report(
    run: Path = typer.Argument(..., metavar="RUN",
                               help="A sweep or validate run (directory or Parquet file), a context sweep, a "
                                    "rollout run or a compare-drafts directory."),
    output: Path = typer.Option(..., "--output", "-o", help="The HTML file to write."),
    tolerance: Tolerance = DEFAULT_TOLERANCE,
    force: Force = False,
    allow_mixed: AllowMixed = False,
) -> None:
    """Write one self-contained HTML page of a run (no network needed).

    The page opens with the table as export serves it, with provenance and warnings, then K*
    against batch size, speedup over vanilla, the goodput heatmap, step time, acceptance,
    coverage gaps and failed cells."""
    from dsdprof.io.atomic import check_output_path, write_bytes_atomic
    from dsdprof.report.html.build import build_report
    from dsdprof.report.html.render import render_html

    if not 0 <= tolerance < 1:  # bad input is one line before any work, as analyze and export say it
        raise fail(f"--tolerance={tolerance!r}: must be in [0, 1)")
    check_output_path(output, force, field="--output")
    if not output.resolve().parent.is_dir():
        raise fail(f"--output={str(output)!r}: no directory {str(output.resolve().parent)!r} to write it in")
    page = render_html(build_report(run, tolerance=tolerance, allow_mixed=allow_mixed))
    write_bytes_atomic(output, page.encode("utf-8"))
    console.print(f"wrote {output}", markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``report`` to ``app``."""
    app.command("report")(guarded(_report))
