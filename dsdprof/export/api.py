"""``dsdprof export`` as one library call: a run (or a table) in, the document of one format out.

Formats (:data:`EXPORT_FORMATS`): ``table`` (the portable ``dsdprof.ktable/v2``), ``vllm``
(vLLM's ``--speculative-config`` with ``num_speculative_tokens_per_batch_size``), ``vllm-compilation``
(vLLM's ``--compilation-config``: the CUDA-graph settings the measurement ran under) and ``trtllm``
(TensorRT-LLM's ``speculative_config`` with ``draft_len_schedule``). Each document comes with the
validator :func:`dsdprof.io.atomic.write_json_atomic` runs on it before it replaces a file. The CLI
and the fleet export both call :func:`table_from_source` / :func:`export_document`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.errors import InputError
from dsdprof.formats.ktable import (
    TableError,
    context_buckets,
    context_slice,
    ranges_from_points,
    validate_table,
)
from dsdprof.formats.ktable_types import KTable
from dsdprof.formats.provenance import is_synthetic
from dsdprof.io.runs import Run

EXPORT_FORMATS = ("table", "vllm", "vllm-compilation", "trtllm")


@dataclass(frozen=True)
class ExportDocument:
    """A document to print or write, its validator, and what the user should know about it."""

    doc: dict[str, Any]
    check: Callable[[Any], Any]
    warnings: list[str] = field(default_factory=list)


def below_baseline_warning(optimal: Any) -> str | None:
    """Batch sizes where even the best speculative K is slower than the vanilla baseline."""
    below = optimal[optimal["speedup_vs_baseline"] < 1.0]
    if not len(below):
        return None
    sizes = ", ".join(str(int(b)) for b in below["batch_size"])
    return (f"at batch size {sizes} no K beats the no-speculation baseline (K=0 in DSD mode still runs the "
            "drafter, vLLM issue 49548); serving those sizes without a speculative config is faster")


def partial_run_error(coverage: Any, source: str | Path) -> InputError | None:
    """The refusal of a table over a grid with gaps (None when every grid cell has a number)."""
    if coverage is None or coverage.complete:
        return None
    field = "batch_sizes" if coverage.missing_batch_sizes else "cells"
    value = list(coverage.missing_batch_sizes) or [list(c) for c in coverage.missing_cells[:8]]
    return InputError(field, value, f"{source} is a partial run ({coverage.summary}); retry the "
                      "failed or missing cells with `dsdprof sweep SPEC --out RUN --resume`, or pass "
                      "--allow-partial to export a table "
                      "whose K there comes from the measured neighbours (recorded in the table)")


def synthetic_warning(provenance: dict[str, Any], synthetic: bool | None = None) -> str:
    """A run with synthetic acceptance ([engine] synthetic_acceptance_rates) says so ("" otherwise).
    ``synthetic``: whether it has (:attr:`dsdprof.io.checked.CheckedRun.synthetic`; else read from
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
    """The K table of a run (a :class:`dsdprof.io.runs.Run`, or the run directory / Parquet file
    to open; analysed here), or a table JSON as loaded. ``label``: the source the table's
    provenance names (default: the run's path). A run whose grid (from its manifest) has batch
    sizes or Ks with no ok cell is refused unless ``allow_partial``; then the table's provenance
    records the gaps (``partial``)."""
    table, warnings = _table(source, tolerance, allow_mixed, label, allow_partial)
    return validate_table(table), warnings


def _table(source: str | Path | Run, tolerance: float, allow_mixed: bool, label: str | None,
           allow_partial: bool) -> tuple[KTable, list[str]]:
    """:func:`table_from_source`, a run's table not validated yet. The path runs one way: the run
    opened and checked (``io``), analysed (``decide``), its K ranges (``formats``), then the
    document built here from plain data; the caller validates it last."""
    from dsdprof.decide.analysis import analyze_path
    from dsdprof.decide.context import analyze_contexts_path
    from dsdprof.export.context import end_at_last_measured
    from dsdprof.export.table import load_table, table_document
    from dsdprof.io.checked import check_run
    from dsdprof.io.runs import open_run

    if not isinstance(source, Run) and Path(source).suffix == ".json" and Path(source).is_file():
        return load_table(Path(source)), []
    run = open_run(source)
    source = run.path
    checked = check_run(run, "export", allow_mixed)  # every refusal and read before the analysis
    if checked.contexts is not None:  # a context sweep: a dsdprof.ktable/v3 table
        by_context = analyze_contexts_path(checked, tolerance=tolerance)
        assert by_context is not None  # the checked run has a context axis
        by_slice: dict[int, list[list[int]]] = {}
        for c in by_context.contexts:  # a loop, not a comprehension: formats only, right after decide
            by_slice[c] = ranges_from_points(by_context.slices[c].points)
        edges = context_buckets(by_context.contexts)
        return _context_table(by_context, by_slice, edges, run, label, allow_partial)
    result = analyze_path(checked, tolerance=tolerance)
    ranges = ranges_from_points(result.points)  # the table's K ranges (formats), before building it
    warnings = [w for w in [below_baseline_warning(result.optimal),
                            synthetic_warning(result.provenance, checked.synthetic)] if w]
    cov = checked.coverage
    assert cov is not None  # check_run computes it on the batch-size path of a command
    if not cov.complete:  # the refusal built only when raised: the path calls back nowhere
        if not allow_partial:
            err = partial_run_error(cov, source)
            assert err is not None
            raise err
        warnings.append(f"partial run: {cov.summary}; K there comes from the measured "
                        "neighbours (the table's provenance.partial says so)")
        result.provenance["partial"] = cov.summary
    rows = None if "acceptance_per_pos" in result.cells.columns else run.rows
    table = end_at_last_measured(table_document(result, ranges, source=label or str(source), rows=rows), cov)
    if not table.get("acceptance_per_pos"):
        warnings.append("the measurements have no per-position acceptance: the table serves statically but "
                        "AdaptiveKSelector cannot use it")
    return table, warnings


def partial_context_error(by_context: Any, source: str | Path) -> InputError | None:
    """The refusal of a context sweep whose slices have gaps (None when every context's grid has
    a number): one line naming each context and its batch sizes (or cells) with no ok row."""
    from dsdprof.export.context import gap_line

    gaps = by_context.gaps
    if not gaps:
        return None
    value = {c: list(cov.missing_batch_sizes) or [list(x) for x in cov.missing_cells[:8]]
             for c, cov in gaps.items()}
    first = next((cov.first_error for cov in gaps.values() if cov.first_error), "")
    what = "; ".join(f"context {c}: {gap_line(cov)}" for c, cov in gaps.items())
    what += f"; first error: {' '.join(first.split())[:120]}" if first else ""
    return InputError("contexts", value, f"{source} is a partial context sweep ({what}); retry the failed "
                      "or missing cells with `dsdprof sweep SPEC --out RUN --resume`, or pass "
                      "--allow-partial to "
                      "export the cells that ran (each slice ends at its last measured batch size; the table "
                      "records the gaps)")


def _context_table(by_context: Any, ranges: dict[int, list[list[int]]], edges: list[int], run: Run,
                   label: str | None, allow_partial: bool = False) -> tuple[KTable, list[str]]:
    """The v3 table of a context sweep, not validated yet (``ranges`` per slice and the buckets'
    ``edges``: :func:`dsdprof.export.context.context_document`)."""
    from dsdprof.export.context import context_document, gap_line

    source = run.path

    warnings = [f"context {c}: {w}" for c, a in sorted(by_context.slices.items())
                if (w := below_baseline_warning(a.optimal))]
    gaps = "; ".join(f"context {c}: {gap_line(cov)}" for c, cov in by_context.gaps.items())
    if by_context.gaps:
        if not allow_partial:
            err = partial_context_error(by_context, source)
            assert err is not None
            raise err
        warnings.append(f"partial context sweep: {gaps}; each slice ends at its last measured batch size "
                        "(contexts[i].partial and provenance.partial record the gaps)")
    warnings += [f"context {c}: no slice ({why})" for c, why in sorted(by_context.skipped.items())]
    table = context_document(by_context, ranges, edges, source=label or str(source), rows=run.rows)
    if gaps:
        table["provenance"] = dict(table.get("provenance") or {}, partial=gaps)
    return table, warnings


def format_table(table: KTable, fmt: str) -> ExportDocument:
    """``table`` in format ``fmt`` (InputError naming ``--format`` on an unknown one)."""
    from dsdprof.export.table import check_vllm_config, vanilla_warning, vllm_speculative_config
    from dsdprof.export.trtllm import check_trtllm_config, trtllm_speculative_config

    vanilla = [w for w in [vanilla_warning(table, {"trtllm": "TensorRT-LLM"}.get(fmt, "vLLM"))] if w]
    if fmt == "vllm":
        return ExportDocument(vllm_speculative_config(table), check_vllm_config, vanilla)
    if fmt == "vllm-compilation":  # the graphs the measurement captured, for the server of the "vllm" export
        from dsdprof.export.table import check_vllm_compilation_config, vllm_compilation_config

        return ExportDocument(vllm_compilation_config(table), check_vllm_compilation_config)
    if fmt == "trtllm":
        return ExportDocument(trtllm_speculative_config(table), check_trtllm_config, vanilla)
    if fmt == "table":
        return ExportDocument(cast(dict[str, Any], table), validate_table, vanilla)
    raise InputError("--format", fmt, f"must be one of {', '.join(EXPORT_FORMATS)}")


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
    if fmt not in EXPORT_FORMATS:
        raise InputError("--format", fmt, f"must be one of {', '.join(EXPORT_FORMATS)}")
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
        document = _engine_document(table, fmt, context, served, warnings)
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


def _engine_document(table: KTable, fmt: str, context: int | None, served: int | None,
                     warnings: list[str]) -> ExportDocument:
    """An engine's config (``fmt``: vllm, vllm-compilation, trtllm) serving ``table``'s slice at
    ``served`` (the whole table when None), from plain data: the caller validates the table last.
    TensorRT-LLM's config is checked against its rules here, after the document is made."""
    from dsdprof.export.context import context_notice, served_view
    from dsdprof.export.table import (
        check_vllm_compilation_config,
        check_vllm_config,
        vanilla_warning,
        vllm_compilation_config,
        vllm_config_document,
    )
    from dsdprof.export.trtllm import check_trtllm_config, trtllm_config_document

    if table.get("contexts"):
        warnings = warnings + [w for w in [context_notice(table, context)] if w]
    warnings = [w for w in warnings if "per-position" not in w]  # a note on the portable table only
    view = served_view(table, served)
    vanilla = [w for w in [vanilla_warning(view, {"trtllm": "TensorRT-LLM"}.get(fmt, "vLLM"))] if w]
    if fmt == "vllm":
        return ExportDocument(vllm_config_document(view), check_vllm_config, warnings + vanilla)
    if fmt == "vllm-compilation":  # the graphs the measurement captured, for the server of the "vllm" export
        return ExportDocument(vllm_compilation_config(view), check_vllm_compilation_config, warnings)
    document = ExportDocument(trtllm_config_document(view), check_trtllm_config, warnings + vanilla)
    check_trtllm_config(document.doc)
    return document


def _portable_document(source: str | Path | Run, table: KTable, warnings: list[str],
                       context: int | None) -> ExportDocument:
    """``--format table``: the table, validated last; with ``context``, its slice there (v2): the
    notice and the vanilla warning read from the slice as plain data first (a malformed table
    refused by the validation, not by them), then the table validated and sliced by formats last."""
    from dsdprof.export.context import check_context, context_notice, served_view
    from dsdprof.export.table import vanilla_warning

    if context is None:
        out = format_table(table, "table")
        document = ExportDocument(out.doc, out.check, warnings + out.warnings)
        validate_table(table)  # last: the path calls back nowhere after it
        return document
    if not table.get("contexts"):
        raise _no_context_axis(source, context)
    check_context(context)
    try:
        said = [context_notice(table, context), vanilla_warning(served_view(table, context))]
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        said = []  # a malformed table: validate_table below names what is wrong
    document = ExportDocument({}, validate_table, warnings + [w for w in said if w])
    validate_table(table)
    document.doc.update(context_slice(table, context))  # the slice, validated: formats last
    return document


def optional_vllm_config(table: KTable) -> dict[str, Any] | None:
    """vLLM's config serving ``table``; None when K = 0 everywhere (serve without speculation)."""
    try:
        return format_table(table, "vllm").doc
    except InputError:
        return None


def load_any_table(path: str | Path) -> tuple[KTable, str]:
    """(table, what it was) for ``dsdprof show``: a dsdprof K table, or dsdprof's own vLLM
    (``--speculative-config``) or TensorRT-LLM (``speculative_config``) export read back as a v1
    table of the same K per batch size. Anything else fails as :func:`load_table` does."""
    import json

    from dsdprof.export.table import load_table
    from dsdprof.formats.ktable import LAST_RANGE_END

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return load_table(p), ""
    if not isinstance(doc, dict) or "schema" in doc:
        return load_table(p), ""
    if "num_speculative_tokens_per_batch_size" in doc:
        ranges = [list(r) for r in doc["num_speculative_tokens_per_batch_size"]]
        prov = {k: doc[k] for k in ("method", "model") if doc.get(k)}
        table = {"schema": "dsdprof.ktable/v1", "ranges": ranges, "provenance": prov}
        if doc.get("num_speculative_tokens") is not None:
            table["num_speculative_tokens"] = doc["num_speculative_tokens"]
        return validate_table(table), "vLLM --speculative-config"
    cfg = doc.get("speculative_config")
    if isinstance(cfg, dict) and isinstance(cfg.get("draft_len_schedule"), dict):
        from dsdprof.export.trtllm import check_trtllm_config

        check_trtllm_config(doc)
        ranges, start = [], 1
        for key, k in sorted((int(a), int(b)) for a, b in cfg["draft_len_schedule"].items()):
            ranges.append([start, key, k])
            start = key + 1
        if start <= LAST_RANGE_END:  # above the largest key TensorRT-LLM runs K=0
            ranges.append([start, LAST_RANGE_END, 0])
        prov = {k: cfg[k] for k in ("decoding_type", "speculative_model") if cfg.get(k)}
        return validate_table({"schema": "dsdprof.ktable/v1", "ranges": ranges, "provenance": prov}), \
            "TensorRT-LLM speculative_config"
    return load_table(p), ""
