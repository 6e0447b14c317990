"""``dsdprof report RUN``: what a results path holds, read through the public calls the other
commands make, laid out as one :class:`~dsdprof.report.html.model.Report`.

The kind of ``RUN`` decides the panels: a compare-drafts directory (``_drafts.json``), a rollout
run (``rollout.parquet``), a validate run, a context sweep or a sweep. Whatever cannot be read or
analysed becomes a line on the page naming what is missing, not an error: a partial run, broken
rows and a single batch size still give a page."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from dsdprof.config.defaults import DEFAULT_CONFIDENCE, DEFAULT_TOLERANCE
from dsdprof.config.run import ReadRun, Run, checked_run
from dsdprof.errors import InputError
from dsdprof.formats.jsontypes import ProvenanceView
from dsdprof.report.html.model import Answer, Panel, Report, provenance_items
from dsdprof.report.html.sweep import (
    answer_from_export,
    coverage_panel,
    records,
    rows_panel,
    sweep_panels,
)

if TYPE_CHECKING:
    import pandas as pd


def _title(prov: ProvenanceView) -> str:
    from dsdprof.report.plots import provenance_line

    return provenance_line(prov) or "dsdprof run"


def _rollout_rows(path: Path) -> tuple[pd.DataFrame | None, bytes | None]:
    """The rows of a rollout run (its file read once), None when ``path`` holds no rollout run; and
    the bytes of a file that holds none, for the run reader (so a Parquet file is read once)."""
    from dsdprof.io.rollouts import read_rollout_rows, rollout_path

    if path.is_dir():
        return (read_rollout_rows(path) if rollout_path(path).is_file() else None), None
    try:
        data = path.read_bytes()
    except OSError:
        return None, None  # the run reader says why
    try:
        return read_rollout_rows(path, data), None
    except InputError:
        return None, data


def build_report(path: str | Path, tolerance: float = DEFAULT_TOLERANCE, allow_mixed: bool = False) -> Report:
    """The report of ``path`` (InputError only when the path does not exist). ``tolerance`` and
    ``allow_mixed`` as ``analyze`` and ``export`` take them."""
    p = Path(path)
    if not p.exists():
        raise InputError("RUN", str(path), "no such file or directory")
    from dsdprof import __version__

    report = Report(title="dsdprof report", source=str(path), kind="sweep",
                    generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    dsdprof_version=__version__)
    from dsdprof.jobs.compare_drafts import PLAN_FILE

    if p.is_dir() and (p / PLAN_FILE).is_file():
        return _drafts(report, p)
    if p.is_file() and p.suffix == ".json":  # a table: its answer, but no rows to draw
        return _table_file(report, p, tolerance)
    rollout, data = _rollout_rows(p)
    if rollout is not None:
        return _rollout(report, rollout)
    from dsdprof.io.runs import read_run

    try:  # read once; as it is: nothing refused but unreadable files, so a mixed or validate run gets a page
        read = read_run(p, data)
    except InputError as err:
        report.kind = "unreadable"
        report.answer = Answer(missing=[f"the run could not be read: {err}"])
        return report
    run = checked_run(read)
    prov = dict(run.provenance)
    report.title = _title(prov)
    if run.kind == "validate":
        return _validate(report, run, prov)
    return _sweep(report, read, run, tolerance, allow_mixed)


def _sweep(report: Report, read: ReadRun, run: Run, tolerance: float, allow_mixed: bool) -> Report:
    report.answer = answer_from_export(read, tolerance, allow_mixed)
    if run.contexts is not None:
        return _contexts(report, read, run, tolerance, allow_mixed)
    from dsdprof.decide.analysis import analyze_path

    try:  # checked as `dsdprof analyze` checks it, with its refusals
        analysis = analyze_path(checked_run(read, "analyze", allow_mixed), tolerance=tolerance)
    except InputError as err:
        report.panels.append(Panel("analysis", "Analysis", missing=[f"analyze refuses these rows: {err}"]))
        report.panels.append(coverage_panel(run.coverage, run.rows))
        return report
    from dsdprof.report.html.sweep import sweep_headline

    report.answer.headline = sweep_headline(analysis.decisions, report.answer.ranges)
    ks = ", ".join(map(str, analysis.candidate_ks))
    report.subtitle = (f"{len(analysis.points)} batch size(s), K {ks}; "
                       f"tolerance {analysis.tolerance:g}, confidence {analysis.confidence:.0%}; "
                       f"curve {analysis.shape}")
    report.panels += sweep_panels(analysis, report.answer.ranges)
    if len(analysis.points) == 1:
        report.panels[0].missing.append("one batch size only: the table serves its K at every batch size; "
                                        "nothing says where K should change")
    report.panels.append(coverage_panel(analysis.coverage or run.coverage, run.rows))
    report.panels.append(rows_panel(records(analysis.cells), records(analysis.baseline)))
    return report


def _contexts(report: Report, read: ReadRun, run: Run, tolerance: float, allow_mixed: bool) -> Report:
    report.kind = "context sweep"
    from dsdprof.decide.context import analyze_contexts_path

    try:
        by_context = analyze_contexts_path(checked_run(read, "analyze", allow_mixed), tolerance=tolerance)
    except InputError as err:
        report.panels.append(Panel("contexts", "Context slices",
                                   missing=[f"analyze refuses these rows: {err}"]))
        return report
    from dsdprof.report.html.panels import context_panels

    if by_context is None or not by_context.slices:
        report.panels.append(Panel("contexts", "Context slices",
                                   missing=["no context slice could be analysed"]))
        return report
    report.subtitle = f"context sweep: contexts {', '.join(map(str, by_context.contexts))}"
    report.panels += context_panels(by_context)
    report.panels.append(coverage_panel(run.coverage, run.rows))
    return report


def _validate(report: Report, run: Run, prov: ProvenanceView) -> Report:
    from dsdprof.report.html.panels import validate_panels

    report.kind = "validate"
    report.answer = Answer(heading="The answer: the table served, against vanilla and the best fixed K",
                           provenance=provenance_items(prov),
                           missing=["a validate run serves a table and holds no K grid to export; the table "
                                    "it served is named in its provenance (what `dsdprof validate-report` "
                                    "prints, below)"])
    try:
        panels, report.answer.headline = validate_panels(run.rows, DEFAULT_CONFIDENCE)
        report.panels += panels
    except (InputError, KeyError, ValueError) as err:
        report.panels.append(Panel("validate", "Validate",
                                   missing=[f"the comparison could not be made: {err}"]))
    report.panels.append(coverage_panel(None, run.rows))
    return report


def _rollout(report: Report, df: pd.DataFrame) -> Report:  # df: the rollout run's rows
    from dsdprof.report.html.panels import rollout_headline, rollout_panels

    report.kind = "rollout"
    report.answer = Answer(heading="The answer: the table in a rollout, against vanilla and fixed K",
                           headline=rollout_headline(df),
                           missing=["a rollout run serves a table and holds no K grid to export (the tables "
                                    "below are `dsdprof rollout-report`'s)"])
    report.title = "rollout run"
    report.panels += rollout_panels(df)
    return report


def _table_file(report: Report, p: Path, tolerance: float) -> Report:
    report.kind = "table"
    report.answer = answer_from_export(p, tolerance, False)
    report.answer.missing.append("a table file holds no measurements: run `dsdprof report` on the run it "
                                 "was exported from for the panels")
    return report


def _drafts(report: Report, p: Path) -> Report:
    from dsdprof.report.drafts import load_comparison
    from dsdprof.report.html.panels import drafts_panels

    report.kind = "drafts"
    try:
        comp = load_comparison(p)
    except InputError as err:
        report.answer = Answer(missing=[str(err)])
        return report
    report.title = _title(comp.provenance)
    report.answer = Answer(provenance=provenance_items(comp.provenance),
                           missing=["a compare-drafts directory holds one grid per draft and category: "
                                    "`dsdprof export DIR --mix ... --draft NAME` writes a draft's table"])
    report.panels += drafts_panels(comp)
    return report
