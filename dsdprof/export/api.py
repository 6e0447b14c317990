"""``dsdprof export`` as one library call: a run (or a table) in, the document of one format out.

Formats (:data:`EXPORT_FORMATS`): ``table`` (the portable ``dsdprof.ktable/v2``), ``vllm``
(vLLM's ``--speculative-config`` with ``num_speculative_tokens_per_batch_size``) and ``trtllm``
(TensorRT-LLM's ``speculative_config`` with ``draft_len_schedule``). Each document comes with the
validator :func:`dsdprof.io.atomic.write_json_atomic` runs on it before it replaces a file. The CLI
and the fleet export both call :func:`table_from_source` / :func:`export_document`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.errors import InputError
from dsdprof.formats.ktable import validate_table

EXPORT_FORMATS = ("table", "vllm", "trtllm")


@dataclass(frozen=True)
class ExportDocument:
    """A document to print or write, its validator, and what the user should know about it."""

    doc: dict[str, Any]
    check: Callable[[Any], Any]
    warnings: list[str] = field(default_factory=list)


def below_baseline_warning(optimal: Any) -> Optional[str]:
    """Batch sizes where even the best speculative K is slower than the vanilla baseline."""
    below = optimal[optimal["speedup_vs_baseline"] < 1.0]
    if not len(below):
        return None
    sizes = ", ".join(str(int(b)) for b in below["batch_size"])
    return (f"at batch size {sizes} no K beats the no-speculation baseline (K=0 in DSD mode still runs the "
            "drafter, vLLM issue 49548); serving those sizes without a speculative config is faster")


def table_from_source(source: str | Path, tolerance: float = DEFAULT_TOLERANCE, allow_mixed: bool = False,
                      label: Optional[str] = None) -> tuple[dict[str, Any], list[str]]:
    """The K table of a run directory / Parquet file (analysed here), or a table JSON as loaded.
    ``label``: the source the table's provenance names (default: ``source``)."""
    from dsdprof.export.table import build_table, load_table

    source = Path(source)
    if source.suffix == ".json" and source.is_file():
        return load_table(source), []
    from dsdprof.decide.analysis import analyze_path
    from dsdprof.io.readers import read_measurements

    from dsdprof.decide.context import analyze_contexts_path

    by_context = analyze_contexts_path(source, tolerance=tolerance, allow_mixed=allow_mixed)
    if by_context is not None:  # a context sweep: a dsdprof.ktable/v3 table
        return _context_table(by_context, source, label, allow_mixed)
    result = analyze_path(source, tolerance=tolerance, allow_mixed=allow_mixed)
    warnings = [w for w in [below_baseline_warning(result.optimal)] if w]
    rows = None if "acceptance_per_pos" in result.cells.columns else read_measurements(source, allow_mixed=allow_mixed)
    table = build_table(result, source=label or str(source), rows=rows)
    if not table.get("acceptance_per_pos"):
        warnings.append("the measurements have no per-position acceptance: the table serves statically but "
                        "AdaptiveKSelector cannot use it")
    return table, warnings


def _context_table(by_context: Any, source: Path, label: Optional[str],
                   allow_mixed: bool) -> tuple[dict[str, Any], list[str]]:
    from dsdprof.export.context import build_context_table
    from dsdprof.io.readers import read_measurements

    warnings = [f"context {c}: {w}" for c, a in sorted(by_context.slices.items())
                if (w := below_baseline_warning(a.optimal))]
    warnings += [f"context {c}: no slice ({why})" for c, why in sorted(by_context.skipped.items())]
    rows = read_measurements(source, allow_mixed=allow_mixed)
    return build_context_table(by_context, source=label or str(source), rows=rows), warnings


def format_table(table: dict[str, Any], fmt: str) -> ExportDocument:
    """``table`` in format ``fmt`` (InputError naming ``--format`` on an unknown one)."""
    from dsdprof.export.table import check_vllm_config, vllm_speculative_config
    from dsdprof.export.trtllm import check_trtllm_config, trtllm_speculative_config

    if fmt == "vllm":
        return ExportDocument(vllm_speculative_config(table), check_vllm_config)
    if fmt == "trtllm":
        return ExportDocument(trtllm_speculative_config(table), check_trtllm_config)
    if fmt == "table":
        return ExportDocument(table, validate_table)
    raise InputError("--format", fmt, f"must be one of {', '.join(EXPORT_FORMATS)}")


def export_document(source: str | Path, fmt: str = "table", tolerance: float = DEFAULT_TOLERANCE,
                    allow_mixed: bool = False, context: Optional[int] = None) -> ExportDocument:
    """What ``dsdprof export SOURCE --format FMT [--context N]`` prints or writes.

    A table with a context axis (v3) exported to an engine keyed on batch size only (vllm,
    trtllm) serves one slice: ``context``'s, else the batch-size-only answer; a notice says which.
    ``--format table --context N`` writes that slice as a v2 table."""
    from dsdprof.export.context import context_notice, slice_for_context

    if fmt not in EXPORT_FORMATS:
        raise InputError("--format", fmt, f"must be one of {', '.join(EXPORT_FORMATS)}")
    table, warnings = table_from_source(source, tolerance, allow_mixed)
    if table.get("contexts") and (fmt != "table" or context is not None):
        warnings = warnings + [context_notice(table, context)]
        table = slice_for_context(table, context if context is not None else int(table["default_context"]))
    elif context is not None:
        raise InputError("--context", context, f"{source} has no context axis (a sweep without [sweep] context_lens)")
    if fmt != "table":  # the per-position note concerns the portable table only
        warnings = [w for w in warnings if "per-position" not in w]
    out = format_table(table, fmt)
    return ExportDocument(out.doc, out.check, warnings)


def optional_vllm_config(table: dict[str, Any]) -> Optional[dict[str, Any]]:
    """vLLM's config serving ``table``; None when K = 0 everywhere (serve without speculation)."""
    try:
        return format_table(table, "vllm").doc
    except InputError:
        return None
