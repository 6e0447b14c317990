"""The K table of a context sweep (``dsdprof.ktable/v3``): one v2 table per profiled context,
bucketed by context, and the slice an engine that keys K on batch size alone can serve.

Each slice is :func:`dsdprof.export.table.build_table` on that context's analysis (the same rule,
intervals and range semantics); the top level of the v3 document is the slice of the shortest
profiled context (``default_context``), so a reader that knows no context gets a complete v2-shaped
answer. ``num_speculative_tokens`` is the largest K of any slice (the cap must not cut a slice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from dsdprof.errors import InputError
from dsdprof.formats.ktable import SLICE_KEYS as _SLICE_KEYS
from dsdprof.formats.ktable_types import KTable, ServedTable
from dsdprof.formats.versions import TABLE_SCHEMA_V3

if TYPE_CHECKING:
    import pandas as pd

    from dsdprof.decide.context import ContextAnalysis

# a request context takes the slice of the nearest profiled one (log scale)
CONTEXT_INTERPOLATION = "nearest-log"


def context_document(result: ContextAnalysis, ranges: dict[int, list[list[int]]], edges: list[int],
                     source: str = "", rows: pd.DataFrame | None = None) -> KTable:
    """``dsdprof.ktable/v3`` from a :class:`dsdprof.decide.context.ContextAnalysis` (``rows``: the
    run's rows, for per-position acceptance when the analyses lack it), not validated yet, each
    slice's ``ranges`` and the buckets' ``edges`` (``formats.ktable.context_buckets``) given: the
    export path builds the document from plain data, calling nothing back, and validates it last."""
    from dsdprof.export.table import table_document

    contexts = result.contexts
    slices: list[dict[str, Any]] = []
    tables: dict[int, KTable] = {}
    for c, top in zip(contexts, edges):
        part = None
        if rows is not None and "context_len" in rows.columns:
            part = rows[rows["context_len"] == c]
        tables[c] = table_document(result.slices[c], ranges[c], source=source, rows=part)
        cov = getattr(result, "coverage", {}).get(c)
        end_at_last_measured(tables[c], cov)
        sl: dict[str, Any] = {"max_context": int(top), "context_len": int(c), "num_speculative_tokens":
              tables[c]["num_speculative_tokens"]}
        whole = cast(dict[str, Any], tables[c])
        sl.update({k: whole[k] for k in _SLICE_KEYS if whole.get(k) is not None})
        if cov is not None and not cov.complete:
            sl["partial"] = cov.gap_summary
        slices.append(sl)
    doc = dict(tables[result.default_context])
    doc.update(schema=TABLE_SCHEMA_V3, default_context=int(result.default_context),
               context_interpolation=CONTEXT_INTERPOLATION, contexts=slices,
               num_speculative_tokens=max(sl["num_speculative_tokens"] for sl in slices))
    if result.skipped:
        doc["contexts_skipped"] = {str(c): why for c, why in sorted(result.skipped.items())}
    return cast(KTable, doc)


def end_at_last_measured(table: KTable, cov: Any) -> KTable:
    """``table`` (a v2 table or slice, in place) with its last range ending at its last measured
    batch size when larger batch sizes of the grid produced no number (``cov``: the
    :class:`dsdprof.config.run.Coverage`): a K is never extended over batch sizes that failed. (A
    reader carries the last K forward past the end, as vLLM does; the table no longer claims it.)"""
    measured = [int(p["batch_size"]) for p in table.get("points") or []]
    if cov is None or not measured or not any(b > max(measured) for b in cov.missing_batch_sizes):
        return table
    last = max(measured)
    ranges = [list(r) for r in table["ranges"] if r[0] <= last]
    ranges[-1][1] = last
    table["ranges"] = ranges
    return table


def check_context(context: object) -> int:
    """``--context``: an integer >= 1 (InputError naming it otherwise)."""
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        raise InputError("--context", context, "must be an integer >= 1 (prompt tokens)")
    return context


def served_index(contexts: list[Any], context: int) -> int:
    """The index of the slice serving ``context`` in a v3 table's ``contexts``: the first whose
    ``max_context`` is >= ``context``, else the last (the choice of :func:`context_slice`;
    tests/export/test_walk.py checks they agree)."""
    return next((j for j, sl in enumerate(contexts) if context <= sl["max_context"]), len(contexts) - 1)


def served_view(table: KTable, context: int | None) -> ServedTable:
    """What an engine's config reads of ``table`` (ranges, cap, provenance, ``vanilla_faster``) at
    ``context``'s slice, as plain data: the keys :func:`context_slice` takes from that slice
    (``table`` itself when ``context`` is None). Not validated: the export path validates the
    table and the slice last; a cap that is not an integer is left to that validation (the
    slice's largest K stands in for it here)."""
    if context is None:
        return table
    chosen: Mapping[str, Any] = table["contexts"][served_index(table["contexts"], context)]
    cap = chosen.get("num_speculative_tokens")
    view = {k: v for k, v in table.items() if k == "provenance"}
    view.update({k: chosen[k] for k in _SLICE_KEYS if k in chosen})
    view["num_speculative_tokens"] = cap if type(cap) is int else max(r[2] for r in chosen["ranges"])
    return cast(ServedTable, view)  # the slice's own keys


def default_context(table: KTable) -> int:
    """The context a batch-size-only reader is served: ``default_context``, or where a v3 table
    leaves it out (it is optional), its first profiled slice's."""
    first = table["contexts"][0]
    return int(table.get("default_context", first.get("context_len", first["max_context"])))


def context_notice(table: KTable, context: int | None) -> str | None:
    """One line for stderr when a batch-size-only schedule is cut from a v3 table."""
    contexts = table.get("contexts")
    if not contexts:
        return None
    profiled = [sl.get("context_len", sl["max_context"]) for sl in contexts]
    if context is None:
        return (f"vLLM's schedule is keyed on batch size only: serving the slice of context "
                f"{default_context(table)} (the table's batch-size-only answer) of "
                f"contexts {profiled}; pass --context N to serve another")
    i = served_index(contexts, context)
    lo = contexts[i - 1]["max_context"] + 1 if i else 1
    hi = contexts[i]["max_context"]
    return (f"vLLM's schedule is keyed on batch size only: serving the slice profiled at context "
            f"{profiled[i]} (contexts {lo}..{hi}) for --context {context}; other contexts get the same K")
