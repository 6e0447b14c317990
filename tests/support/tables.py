"""Conveniences over the export path that only tests use (moved out of the package): each is a
composition of the package's own functions, validated first as the CLI's path validates last."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsdprof.errors import InputError
from dsdprof.export.context import check_context, context_document
from dsdprof.export.trtllm import TrtllmDocument, draft_len_schedule, trtllm_config_document
from dsdprof.formats.ktable import context_buckets, context_slice, ranges_from_points, validate_table
from dsdprof.formats.ktable_engines import check_trtllm_config
from dsdprof.formats.ktable_types import KTable


def build_context_table(result: Any, source: str = "", rows: Any = None) -> KTable:
    """``dsdprof.ktable/v3`` from a :class:`dsdprof.decide.context.ContextAnalysis` (``rows``: the
    run's rows, for per-position acceptance when the analyses lack it), validated."""
    ranges = {c: ranges_from_points(result.slices[c].points) for c in result.contexts}
    return validate_table(context_document(result, ranges, context_buckets(result.contexts), source, rows))


def slice_for_context(table: KTable, context: int) -> KTable:
    """The slice of a v3 ``table`` serving ``context`` as a v2-shaped table (:func:`context_slice`)."""
    check_context(context)
    if not table.get("contexts"):
        raise InputError("--context", context, f"the table ({table.get('schema')}) has no context axis")
    return context_slice(table, context)


def trtllm_draft_len_schedule(table: Mapping[str, Any]) -> tuple[int, dict[int, int]]:
    """``(max_draft_len, {batch_size_threshold: draft_len})`` serving a table, validated first."""
    validate_table(table)
    return draft_len_schedule(table)


def trtllm_speculative_config(table: Mapping[str, Any]) -> TrtllmDocument:
    """``{"speculative_config": {...}}`` for ``trtllm-serve``: the table validated first, the config
    checked by TensorRT-LLM's rules last."""
    validate_table(table)
    doc = trtllm_config_document(table)
    check_trtllm_config(doc)
    return doc
