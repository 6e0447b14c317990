"""What vLLM engines need from the machine before they start: their share of its memory when
several are alive at once, and the models on local disk (dsdprof runs offline)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

from dsdprof.errors import InputError

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default, shared out between concurrent engines
GIB = 1 << 30
CPU_KV_MAX_GIB = 4  # per engine, when dsdprof sizes a CPU engine's KV cache itself


# vllm.LLM(**kwargs) (and its speculative / compilation configs): vLLM's own names, with
# ``[engine] extra``'s passed through (vLLM is untyped here); a value dsdprof reads back is narrowed there.
LLMKwargs = dict[str, object]


class MemoryKwargs(TypedDict, total=False):
    """The vllm.LLM kwargs that share a machine's memory between engines."""

    gpu_memory_utilization: float
    kv_cache_memory_bytes: int


def memory_plan(extra: dict[str, Any], concurrent_engines: int, on_gpu: bool,
                available_bytes: int | None = None) -> tuple[MemoryKwargs, str]:
    """(kwargs to add, provenance note): how concurrent engines share one machine.

    vLLM checks at start that ``gpu_memory_utilization`` of the device's memory is free, so engines
    alive at once each get an equal share of the total. On its CPU backend the same check runs on
    the NUMA node's memory unless the KV cache is sized explicitly, and the KV cache then takes the
    whole share: two engines at 0.45 each leave a second engine short by the first one's weights and
    runtime. So on CPU, unless ``VLLM_CPU_KVCACHE_SPACE`` or ``[engine] extra``'s
    ``kv_cache_memory_bytes`` sizes it, each engine gets an explicit KV cache (which also skips that
    check): 40 % of the memory available now split between the engines, in whole GiB, between
    1 and ``CPU_KV_MAX_GIB``."""
    total = float(extra.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
    share = round(total / max(1, concurrent_engines), 4)
    kwargs: MemoryKwargs = {"gpu_memory_utilization": share}
    note = f"{concurrent_engines} engines alive at once, gpu_memory_utilization {share} each (of {total})"
    if on_gpu:
        return kwargs, f"gpu: {note}"
    space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    if space:
        kv = f"KV cache VLLM_CPU_KVCACHE_SPACE={space} GiB per engine"
    elif "kv_cache_memory_bytes" in extra:
        kv = f"KV cache kv_cache_memory_bytes={extra['kv_cache_memory_bytes']} per engine"
    else:
        gib = cpu_kv_cache_gib(concurrent_engines, available_bytes)
        kwargs["kv_cache_memory_bytes"] = gib * GIB
        kv = (f"KV cache {gib} GiB per engine (VLLM_CPU_KVCACHE_SPACE unset: 40 % of the memory "
              f"available at start over {concurrent_engines} engines, 1..{CPU_KV_MAX_GIB} GiB)")
    return kwargs, f"cpu: {note}; {kv}"


def cpu_kv_cache_gib(concurrent_engines: int, available_bytes: int | None = None) -> int:
    """Whole GiB of KV cache per CPU engine when nothing sizes it: 40 % of the available memory over
    the engines alive at once, at least 1, at most ``CPU_KV_MAX_GIB``."""
    if available_bytes is None:
        import psutil

        available_bytes = int(psutil.virtual_memory().available)
    gib = int(0.4 * available_bytes / max(1, concurrent_engines) // GIB)
    return max(1, min(CPU_KV_MAX_GIB, gib))


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
