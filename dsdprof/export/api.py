"""``dsdprof export`` as one library call: a run (or a table) in, the document of one format out.

Formats, resolved from one registry (:data:`FORMATS`: name, writer, validator, reader, and one
refusal of an unknown name in :func:`export_format`): ``table`` (the portable
``dsdprof.ktable/v2``), ``vllm`` (vLLM's ``--speculative-config`` with
``num_speculative_tokens_per_batch_size``), ``vllm-compilation`` (vLLM's ``--compilation-config``:
the CUDA-graph settings the measurement ran under) and ``trtllm`` (TensorRT-LLM's
``speculative_config`` with ``draft_len_schedule``). Each document comes with the validator
:func:`dsdprof.io.atomic.write_json_atomic` runs on it before it replaces a file; ``dsdprof show``
reads the engines' documents back with the format's reader. The CLI
and the fleet export both call :func:`table_from_source` / :func:`export_document`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.config.run import Run
from dsdprof.errors import InputError
from dsdprof.export.table import (
    VllmSpeculativeConfig,
    check_vllm_compilation_config,
    check_vllm_config,
    read_vllm_config,
    vanilla_warning,
    vllm_compilation_config,
    vllm_config_document,
    vllm_speculative_config,
)
from dsdprof.export.trtllm import read_trtllm_config, trtllm_config_document
from dsdprof.formats.jsontypes import ProvenanceView
from dsdprof.formats.ktable import (
    TableError,
    context_buckets,
    context_slice,
    ranges_from_points,
    validate_table,
)
from dsdprof.formats.ktable_engines import check_trtllm_config
from dsdprof.formats.ktable_types import KTable, ServedTable
from dsdprof.formats.provenance import is_synthetic

if TYPE_CHECKING:
    import pandas as pd

    from dsdprof.config.run import Coverage
    from dsdprof.decide.context import ContextAnalysis


def _portable(table: ServedTable) -> KTable:
    return cast(KTable, table)


@dataclass(frozen=True)
class ExportFormat:
    """One ``--format``: ``write`` builds its document from a table validated elsewhere (plain
    data), ``check`` validates a document before it replaces a file, ``read`` reads dsdprof's own
    document back as a v1 table (None: not this format's; ``label`` names it in ``dsdprof show``).
    ``engine``: the server named in the vanilla warning ("" for none: the document does not
    speculate); ``check_written``: the document is checked right after it is built."""

    name: str
    write: Callable[[ServedTable], Mapping[str, object]]  # a KTable or an engine's config
    check: Callable[[Any], Any]
    engine: str = "vLLM"
    check_written: bool = False
    read: Callable[[dict[str, Any]], KTable | None] | None = None
    label: str = ""


FORMATS: dict[str, ExportFormat] = {f.name: f for f in (
    ExportFormat("table", _portable, validate_table),
    ExportFormat("vllm", vllm_config_document, check_vllm_config, read=read_vllm_config,
                 label="vLLM --speculative-config"),
    # the graphs the measurement captured, for the server of the "vllm" export
    ExportFormat("vllm-compilation", vllm_compilation_config, check_vllm_compilation_config, engine=""),
    ExportFormat("trtllm", trtllm_config_document, check_trtllm_config, engine="TensorRT-LLM",
                 check_written=True, read=read_trtllm_config, label="TensorRT-LLM speculative_config"),
)}


def export_format(name: str) -> ExportFormat:
    """The format called ``name``; the one refusal of an unknown ``--format``."""
    try:
        return FORMATS[name]
    except KeyError:
        raise InputError("--format", name, f"must be one of {', '.join(FORMATS)}") from None


@dataclass(frozen=True)
class ExportDocument:
    """A document to print or write, its validator, and what the user should know about it."""

    doc: Mapping[str, object]  # the format's: KTable, VllmSpeculativeConfig, TrtllmDocument, vLLM's JSON
    check: Callable[[Any], Any]
    warnings: list[str] = field(default_factory=list)


def below_baseline_warning(optimal: pd.DataFrame) -> str | None:
    """Batch sizes where even the best speculative K is slower than the vanilla baseline."""
    below = optimal[optimal["speedup_vs_baseline"] < 1.0]
    if not len(below):
        return None
    sizes = ", ".join(str(int(b)) for b in below["batch_size"])
    return (f"at batch size {sizes} no K beats the no-speculation baseline (K=0 in DSD mode still runs the "
            "drafter, vLLM issue 49548); serving those sizes without a speculative config is faster")


def partial_run_error(coverage: Coverage | None, source: str | Path) -> InputError | None:
    """The refusal of a table over a grid with gaps (None when every grid cell has a number)."""
    if coverage is None or coverage.complete:
        return None
    field = "batch_sizes" if coverage.missing_batch_sizes else "cells"
    value: list[int] | list[list[int]] = (list(coverage.missing_batch_sizes)
                                          or [list(c) for c in coverage.missing_cells[:8]])
    return InputError(field, value, f"{source} is a partial run ({coverage.summary}); retry the "
                      "failed or missing cells with `dsdprof sweep SPEC --out RUN --resume`, or pass "
                      "--allow-partial to export a table "
                      "whose K there comes from the measured neighbours (recorded in the table)")


def synthetic_warning(provenance: ProvenanceView, synthetic: bool | None = None) -> str:
    """A run with synthetic acceptance ([engine] synthetic_acceptance_rates) says so ("" otherwise).
    ``synthetic``: whether it has (:attr:`dsdprof.config.run.Run.synthetic`; else read from
    ``provenance``)."""
    if synthetic is None:
        synthetic = is_synthetic(provenance)
    if not synthetic:
        return ""
    note = str(provenance.get("extra_acceptance", "")).removeprefix("synthetic: ")
    return (f"synthetic acceptance ({note}): the table's K follows the configured rates, not a draft model "
            "(the table's provenance.extra_acceptance says so)")


def table_from_source(source: str | Path | Run, tolerance: float = DEFAULT_TOLERANCE,
                      allow_mixed: bool = False, label: str | None = None,
                      allow_partial: bool = False) -> tuple[KTable, list[str]]:
    """The K table of a run (a :class:`dsdprof.config.run.Run` opened for ``export``, or the run
    directory / Parquet file to open; analysed here), or a table JSON as loaded. ``label``: the
    source the table's provenance names (default: the run's path). A run whose grid (from its
    manifest) has batch sizes or Ks with no ok cell is refused unless ``allow_partial``; then the
    table's provenance records the gaps (``partial``)."""
    table, warnings = _table(source, tolerance, allow_mixed, label, allow_partial)
    return validate_table(table), warnings


def _table(source: str | Path | Run, tolerance: float, allow_mixed: bool, label: str | None,
           allow_partial: bool) -> tuple[KTable, list[str]]:
    """:func:`table_from_source`, a run's table not validated yet. The path runs one way: the run
    read (``io``) and checked (``config.run``), analysed (``decide``), its K ranges (``formats``),
    then the document built here from plain data; the caller validates it last."""
    from dsdprof.decide.analysis import analyze_path
    from dsdprof.decide.context import analyze_contexts_path
    from dsdprof.export.context import end_at_last_measured
    from dsdprof.export.table import load_table, table_document
    from dsdprof.io.runs import open_run

    if not isinstance(source, Run) and Path(source).suffix == ".json" and Path(source).is_file():
        return load_table(Path(source)), []
    # every refusal and read before the analysis (a Run given is one opened for "export" already)
    run = source if isinstance(source, Run) else open_run(source, "export", allow_mixed)
    source = run.path
    if run.contexts is not None:  # a context sweep: a dsdprof.ktable/v3 table
        by_context = analyze_contexts_path(run, tolerance=tolerance)
        assert by_context is not None  # the checked run has a context axis
        by_slice: dict[int, list[list[int]]] = {}
        for c in by_context.contexts:  # a loop, not a comprehension: formats only, right after decide
            by_slice[c] = ranges_from_points(by_context.slices[c].points)
        edges = context_buckets(by_context.contexts)
        return _context_table(by_context, by_slice, edges, run, label, allow_partial)
    result = analyze_path(run, tolerance=tolerance)
    ranges = ranges_from_points(result.points)  # the table's K ranges (formats), before building it
    warnings = [w for w in [below_baseline_warning(result.optimal),
                            synthetic_warning(result.provenance, run.synthetic),
                            str(result.provenance.get("extra_prediction_note") or "")] if w]  # sim: band
    cov = run.coverage
    assert cov is not None  # open_run computes it without a context axis
    if not cov.complete:  # the refusal built only when raised: the path calls back nowhere
        _refuse_unless(allow_partial, lambda: partial_run_error(cov, source))
        warnings.append(f"partial run: {cov.summary}; K there comes from the measured "
                        "neighbours (the table's provenance.partial says so)")
        result.provenance["partial"] = cov.summary
    rows = None if "acceptance_per_pos" in result.cells.columns else run.rows
    table = end_at_last_measured(table_document(result, ranges, source=label or str(source), rows=rows), cov)
    if not table.get("acceptance_per_pos"):
        warnings.append("the measurements have no per-position acceptance: the table serves statically but "
                        "AdaptiveKSelector cannot use it")
    return table, warnings


def _refuse_unless(allowed: bool, refusal: Callable[[], InputError | None]) -> None:
    """Raise the refusal (built only then) unless the gap is ``allowed`` (``--allow-partial``)."""
    if not allowed:
        err = refusal()
        assert err is not None
        raise err


def partial_context_error(by_context: ContextAnalysis, source: str | Path) -> InputError | None:
    """The refusal of a context sweep whose slices have gaps (None when every context's grid has
    a number): one line naming each context and its batch sizes (or cells) with no ok row."""
    gaps = by_context.gaps
    if not gaps:
        return None
    value: dict[int, list[int] | list[list[int]]] = {
        c: list(cov.missing_batch_sizes) or [list(x) for x in cov.missing_cells[:8]]
        for c, cov in gaps.items()}
    first = next((cov.first_error for cov in gaps.values() if cov.first_error), "")
    what = "; ".join(f"context {c}: {cov.gap_summary}" for c, cov in gaps.items())
    what += f"; first error: {' '.join(first.split())[:120]}" if first else ""
    return InputError("contexts", value, f"{source} is a partial context sweep ({what}); retry the failed "
                      "or missing cells with `dsdprof sweep SPEC --out RUN --resume`, or pass "
                      "--allow-partial to "
                      "export the cells that ran (each slice ends at its last measured batch size; the table "
                      "records the gaps)")


def _context_table(by_context: ContextAnalysis, ranges: dict[int, list[list[int]]], edges: list[int],
                   run: Run, label: str | None, allow_partial: bool = False) -> tuple[KTable, list[str]]:
    """The v3 table of a context sweep, not validated yet (``ranges`` per slice and the buckets'
    ``edges``: :func:`dsdprof.export.context.context_document`)."""
    from dsdprof.export.context import context_document

    source = run.path

    warnings = [f"context {c}: {w}" for c, a in sorted(by_context.slices.items())
                if (w := below_baseline_warning(a.optimal))]
    gaps = "; ".join(f"context {c}: {cov.gap_summary}" for c, cov in by_context.gaps.items())
    if by_context.gaps:
        _refuse_unless(allow_partial, lambda: partial_context_error(by_context, source))
        warnings.append(f"partial context sweep: {gaps}; each slice ends at its last measured batch size "
                        "(contexts[i].partial and provenance.partial record the gaps)")
    warnings += [f"context {c}: no slice ({why})" for c, why in sorted(by_context.skipped.items())]
    table = context_document(by_context, ranges, edges, source=label or str(source), rows=run.rows)
    if gaps:
        table["provenance"] = dict(table.get("provenance") or {}, partial=gaps)
    return table, warnings


def export_document(source: str | Path | Run, fmt: str = "table", tolerance: float = DEFAULT_TOLERANCE,
                    allow_mixed: bool = False, allow_partial: bool = False,
                    context: int | None = None) -> ExportDocument:
    """What ``dsdprof export SOURCE --format FMT [--context N]`` prints or writes.

    A table with a context axis (v3) exported to an engine keyed on batch size only (vllm,
    trtllm) serves one slice: ``context``'s, else the batch-size-only answer; a notice says which.
    ``--format table --context N`` writes that slice as a v2 table.

    The path runs one way: the table built from the run (or loaded), the engine's config cut from
    it as plain data, then the table (and the served slice) validated last. A refusal met while
    cutting (a bad ``--context``, K = 0 everywhere, a schedule the engine rejects) is raised after
    that validation, so an invalid table is refused first, as it always was."""
    export_format(fmt)
    from dsdprof.export.context import check_context, default_context

    table, warnings = _table(source, tolerance, allow_mixed, None, allow_partial)
    if fmt == "table":
        return _portable_document(source, table, warnings, context)
    served: int | None = None
    refusal: InputError | TableError | None = None
    document = None
    try:
        if table.get("contexts"):
            served = check_context(context if context is not None else default_context(table))
        elif context is not None:
            raise _no_context_axis(source, context)
        document = format_table(table, fmt, context, served, warnings)
    except (InputError, TableError) as err:
        refusal = err
    validate_table(table)  # last: the path calls back nowhere after it
    if served is not None:
        context_slice(table, served)  # the served slice, validated as a table of its own
    if refusal is not None:
        raise refusal
    assert document is not None
    return document


def _no_context_axis(source: str | Path | Run, context: int) -> InputError:
    where = source.path if isinstance(source, Run) else source
    return InputError("--context", context, f"{where} has no context axis (a sweep without [sweep] "
                      "context_lens)")


def format_table(table: KTable, fmt: str, context: int | None = None, served: int | None = None,
                 warnings: Sequence[str] = ()) -> ExportDocument:
    """``table`` in format ``fmt`` (InputError naming ``--format`` on an unknown one), serving its
    slice at ``served`` (the whole table when None), from plain data: the caller validates the table
    (last, on the export path). A format that checks what it wrote (TensorRT-LLM's rules) does so
    here, after the document is made. ``warnings``: the export's so far."""
    from dsdprof.export.context import context_notice, served_view

    f = export_format(fmt)
    if table.get("contexts"):
        warnings = [*warnings, *[w for w in [context_notice(table, context)] if w]]
    warnings = [w for w in warnings if "per-position" not in w]  # a note on the portable table only
    view = served_view(table, served)
    vanilla = [w for w in [vanilla_warning(view, f.engine or "vLLM")] if w]
    document = ExportDocument(f.write(view), f.check, warnings + (vanilla if f.engine else []))
    if f.check_written:
        f.check(document.doc)
    return document


def _portable_document(source: str | Path | Run, table: KTable, warnings: list[str],
                       context: int | None) -> ExportDocument:
    """``--format table``: the table, validated last; with ``context``, its slice there (v2): the
    notice and the vanilla warning read from the slice as plain data first (a malformed table
    refused by the validation, not by them), then the table validated and sliced by formats last."""
    from dsdprof.export.context import check_context, context_notice, served_view

    if context is None:
        vanilla = [w for w in [vanilla_warning(table)] if w]
        document = ExportDocument(table, validate_table, warnings + vanilla)
        validate_table(table)  # last: the path calls back nowhere after it
        return document
    if not table.get("contexts"):
        raise _no_context_axis(source, context)
    check_context(context)
    try:
        said = [context_notice(table, context), vanilla_warning(served_view(table, context))]
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        said = []  # a malformed table: validate_table below names what is wrong
    sliced: dict[str, object] = {}
    document = ExportDocument(sliced, validate_table, warnings + [w for w in said if w])
    validate_table(table)
    sliced.update(context_slice(table, context))  # the slice, validated: formats last
    return document


def optional_vllm_config(table: KTable) -> VllmSpeculativeConfig | None:
    """vLLM's config serving ``table``; None when K = 0 everywhere (serve without speculation)."""
    try:
        return vllm_speculative_config(table)
    except InputError:
        return None


def load_any_table(path: str | Path) -> tuple[KTable, str]:
    """(table, what it was) for ``dsdprof show``: a dsdprof K table, or an engine's document
    dsdprof exported, read back by its format's reader as a v1 table of the same K per batch size
    (the format's ``label`` says which). Anything else fails as :func:`load_table` does."""
    import json

    from dsdprof.export.table import load_table

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return load_table(p), ""
    if not isinstance(doc, dict) or "schema" in doc:
        return load_table(p), ""
    for f in FORMATS.values():
        table = f.read(doc) if f.read is not None else None
        if table is not None:
            return validate_table(table), f.label
    return load_table(p), ""
