"""The K table in an engine's own form, as ``dsdprof export`` writes it and ``dsdprof show`` reads
it back: TensorRT-LLM's ``speculative_config`` with ``draft_len_schedule`` (the rules of its
validator in ``tensorrt_llm/llmapi/llm_args.py``; the mapping from a table is
:mod:`dsdprof.export.trtllm`'s). Stdlib only.
"""

from __future__ import annotations

from typing import Any

from dsdprof.formats.ktable import MAX_BATCH_SIZE, MAX_K, TableError, validate_num_speculative_tokens


def check_trtllm_schedule(schedule: Any, max_draft_len: Any) -> dict[int, int]:
    """TensorRT-LLM's validator for ``draft_len_schedule`` (keys may be JSON strings of ints)."""
    if not isinstance(schedule, dict) or not schedule:
        raise TableError(f"draft_len_schedule={schedule!r}: must be a non-empty object")
    out: dict[int, int] = {}
    for key, value in schedule.items():
        try:
            bs = int(key)
        except (TypeError, ValueError):
            raise TableError(f"draft_len_schedule.{key}={value!r}: key must be an integer batch "
                             "size") from None
        if not 1 <= bs <= MAX_BATCH_SIZE:
            raise TableError(f"draft_len_schedule.{key}={value!r}: batch size threshold must be >= 1")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_K:
            raise TableError(f"draft_len_schedule.{key}={value!r}: draft length must be an integer in "
                             f"0..{MAX_K}")
        out[bs] = value
    mdl = validate_num_speculative_tokens(max_draft_len, "max_draft_len")
    smallest = min(out)
    if out[smallest] != mdl:
        raise TableError(f"draft_len_schedule.{smallest}={out[smallest]}: the smallest key's draft length "
                         f"must equal max_draft_len={mdl}")
    over = [bs for bs, v in out.items() if v > mdl]
    if over:
        raise TableError(f"draft_len_schedule.{over[0]}={out[over[0]]}: exceeds max_draft_len={mdl}")
    return dict(sorted(out.items()))


def check_trtllm_config(doc: Any) -> None:
    """Validator for a written TensorRT-LLM export (the schedule rules above)."""
    cfg = doc.get("speculative_config") if isinstance(doc, dict) else None
    if not isinstance(cfg, dict):
        raise TableError(f"speculative_config={cfg!r}: must be an object")
    check_trtllm_schedule(cfg.get("draft_len_schedule"), cfg.get("max_draft_len"))
