"""Export a K table to TensorRT-LLM's batch-size keyed ``draft_len_schedule``.

TensorRT-LLM runs at batch size ``b`` the value of the **smallest key >= b** (``{4: 4, 8: 2, 32:
1}`` gives BS 1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0), and the smallest key's value must equal
``max_draft_len``. Each merged range ``[start, end, K]`` of the table becomes ``{end: K}``;
trailing K=0 ranges are dropped, and a last range with K > 0 is keyed at ``max(end,
LAST_RANGE_END)`` so that K carries forward as in :class:`dsdprof.serve.runtime.KSelector`. Where
the table records ``vanilla_faster`` the schedule keeps the table's K and the export warns
(:func:`dsdprof.export.table.vanilla_warning`). The rules, their sources in TensorRT-LLM and the
limits: docs/ktable.md ("TensorRT-LLM").
"""


from __future__ import annotations

from typing import Any, TypedDict, cast

from dsdprof.errors import InputError
from dsdprof.formats.ktable import LAST_RANGE_END
from dsdprof.formats.ktable_engines import check_trtllm_config
from dsdprof.formats.ktable_types import KTable, ServedTable

# vLLM / dsdprof method name -> TensorRT-LLM speculative config ``decoding_type``.
DECODING_TYPES = {"eagle3": "Eagle3", "eagle": "Eagle", "mtp": "MTP", "ngram": "NGram",
                  "draft_model": "DraftTarget"}
_DRAFT_MODEL_METHODS = ("eagle3", "eagle", "draft_model")


def draft_len_schedule(table: ServedTable) -> tuple[int, dict[int, int]]:
    """``(max_draft_len, {batch_size_threshold: draft_len})`` serving a table validated elsewhere
    (plain data: this calls nothing back; the export path validates the table last). InputError
    where TensorRT-LLM cannot serve it (K=0 everywhere, a K above batch size 1's)."""
    ranges = [(a, b, k) for a, b, k in table["ranges"]]
    cap = table.get("num_speculative_tokens")
    cap = max(k for _, _, k in ranges) if cap is None else cap
    merged: list[list[int]] = []
    for start, end, k in ranges:
        k = min(k, cap)
        if merged and merged[-1][2] == k:
            merged[-1][1] = end
        else:
            merged.append([start, end, k])
    trailing_zero = merged[-1][2] == 0
    while merged and merged[-1][2] == 0:
        merged.pop()
    if not merged:
        raise InputError("ranges", [list(r) for r in ranges],
                         "K=0 at every batch size: serve without a speculative config")
    first_k = merged[0][2]
    higher = next((r for r in merged if r[2] > first_k), None)
    if higher is not None:
        raise InputError("ranges", higher, f"K={higher[2]} above batch size 1's K={first_k}: TensorRT-LLM "
                                           "needs "
                         "the largest K at its smallest key (draft_len_schedule[smallest] == max_draft_len)")
    if not trailing_zero:  # the table's last K carries forward: keep it up to LAST_RANGE_END
        merged[-1][1] = max(merged[-1][1], LAST_RANGE_END)
    return first_k, {end: k for _, end, k in merged}


class TrtllmSpeculativeConfig(TypedDict, total=False):
    """TensorRT-LLM's ``speculative_config`` as dsdprof writes it."""

    decoding_type: str
    max_draft_len: int
    speculative_model: str
    draft_len_schedule: dict[str, int]


class TrtllmDocument(TypedDict):
    """``--extra_llm_api_options``: the speculative config."""

    speculative_config: TrtllmSpeculativeConfig


def trtllm_config_document(table: ServedTable) -> TrtllmDocument:
    """``{"speculative_config": {...}}`` for ``trtllm-serve --extra_llm_api_options`` (JSON is YAML)
    serving a table validated elsewhere, not checked yet (plain data: the export path checks it by
    :func:`~dsdprof.formats.ktable_engines.check_trtllm_config`, and validates the table, last).
    ``decoding_type`` and ``speculative_model`` come from the table's provenance when the method
    maps onto TensorRT-LLM's; otherwise add them yourself."""
    max_draft_len, schedule = draft_len_schedule(table)
    prov = table.get("provenance", {}) or {}
    method = str(prov.get("method") or "")
    cfg: TrtllmSpeculativeConfig = {}
    if method in DECODING_TYPES:
        cfg["decoding_type"] = DECODING_TYPES[method]
    cfg["max_draft_len"] = max_draft_len
    if method in _DRAFT_MODEL_METHODS and prov.get("draft_model"):
        cfg["speculative_model"] = cast(str, prov["draft_model"])
    cfg["draft_len_schedule"] = {str(k): v for k, v in schedule.items()}
    return {"speculative_config": cfg}


def read_trtllm_config(doc: dict[str, Any]) -> KTable | None:
    """dsdprof's own TensorRT-LLM ``speculative_config`` export (checked by its rules) read back as
    a v1 table of the same K per batch size (not validated yet); None when ``doc`` is no such export."""
    cfg = doc.get("speculative_config")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("draft_len_schedule"), dict):
        return None
    check_trtllm_config(doc)
    ranges, start = [], 1
    for key, k in sorted((int(a), int(b)) for a, b in cfg["draft_len_schedule"].items()):
        ranges.append([start, key, k])
        start = key + 1
    if start <= LAST_RANGE_END:  # above the largest key TensorRT-LLM runs K=0
        ranges.append([start, LAST_RANGE_END, 0])
    prov = {k: cfg[k] for k in ("decoding_type", "speculative_model") if cfg.get(k)}
    return cast(KTable, {"schema": "dsdprof.ktable/v1", "ranges": ranges, "provenance": prov})
