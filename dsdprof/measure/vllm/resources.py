"""What vLLM engines need from the machine before they start: their share of its memory when
several are alive at once, and the models on local disk (dsdprof runs offline)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default, shared out between concurrent engines


def memory_plan(extra: dict[str, Any], concurrent_engines: int, on_gpu: bool) -> tuple[dict[str, Any], str]:
    """(kwargs to add, provenance note): how concurrent engines share one machine.

    vLLM checks at start that ``gpu_memory_utilization`` of the device's memory is free (on its CPU
    backend, of the NUMA node's memory, though the KV cache there is sized by
    ``VLLM_CPU_KVCACHE_SPACE``), so engines alive at once each get an equal share of the total."""
    total = float(extra.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
    share = round(total / max(1, concurrent_engines), 4)
    note = f"{concurrent_engines} engines alive at once, gpu_memory_utilization {share} each (of {total})"
    if not on_gpu:
        space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        kv = (f"KV cache VLLM_CPU_KVCACHE_SPACE={space} GiB per engine" if space else
              "VLLM_CPU_KVCACHE_SPACE unset: each engine's KV cache takes its memory share")
        note = f"cpu: {note}; {kv}"
    else:
        note = f"gpu: {note}"
    return {"gpu_memory_utilization": share}, note


def resolve_model_offline(field: str, name: str) -> None:
    """A model must be a local directory or already in the Hugging Face cache: fail before any cell."""
    p = Path(name).expanduser()
    if p.exists():
        if p.is_dir() and not (p / "config.json").is_file():
            raise InputError(field, name, "directory has no config.json")
        return
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise InputError(field, name, "no such directory")
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return
    if not isinstance(try_to_load_from_cache(name, "config.json"), str):
        raise InputError(field, name, "not a local directory and not in the Hugging Face cache "
                                      f"(download it first: huggingface-cli download {name})")
