"""An engine that fails to start is reported in one line with vLLM's own root cause (no vLLM needed)."""

from dsdprof.measure.vllm.pool import root_cause

_WORKER = "(VllmWorker-0 pid=32184) ERROR 11-29 16:40:30 [multiproc_executor.py:953] "
LOG = "\n".join([
    "INFO 11-29 16:40:20 [model.py:100] Resolved architecture: Qwen3MoeForCausalLM",
    _WORKER + "Traceback (most recent call last):",
    _WORKER + "    raise ValueError(",
    _WORKER + "ValueError: Available memory on node 0 (15.52/18.21 GiB) on startup is less than desired CPU "
    "memory utilization (0.92, 16.76 GiB).",
    "Exception: WorkerProc initialization failed due to an exception in a background process. See stack "
    "trace for root cause.",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
]) + "\n"


def test_root_cause_comes_from_the_engine_log(tmp_path):
    log = tmp_path / "engine-vanilla.log"
    log.write_text(LOG)
    err = RuntimeError("RuntimeError: Engine core initialization failed. See root cause above. Failed "
                       "core proc(s): {}")
    msg = root_cause(err, str(log))
    assert msg.startswith("ValueError: Available memory on node 0") and "\n" not in msg


def test_specific_errors_and_missing_logs_pass_through(tmp_path):
    assert root_cause(RuntimeError("OSError: no config.json"),
                      str(tmp_path / "x.log")) == "OSError: no config.json"
    generic = RuntimeError("Engine core initialization failed. See root cause above.")
    assert root_cause(generic, str(tmp_path / "missing.log")) == str(generic)
    assert len(root_cause(RuntimeError("x" * 5000))) <= 400


def test_concurrent_engines_split_memory_on_gpu_and_cpu():
    from dsdprof.measure.vllm.resources import memory_plan

    kw, note = memory_plan({}, 2, on_gpu=True)
    assert kw == {"gpu_memory_utilization": 0.45} and note.startswith("gpu: 2 engines")
    kw, note = memory_plan({"gpu_memory_utilization": 0.8}, 4, on_gpu=False)
    assert kw == {"gpu_memory_utilization": 0.2} and note.startswith("cpu: 4 engines")


def test_cpu_engines_get_an_explicit_kv_cache_when_nothing_sizes_it(monkeypatch):
    """Without VLLM_CPU_KVCACHE_SPACE vLLM's CPU backend gives each engine's KV cache its whole
    memory share, so a second engine found 10.55 GiB free against the 10.59 it asked for: dsdprof
    sizes the KV cache itself (which also skips vLLM's start check), unless the user did."""
    from dsdprof.measure.vllm.resources import GIB, cpu_kv_cache_gib, memory_plan

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    kw, note = memory_plan({}, 2, on_gpu=False, available_bytes=23 * GIB)
    assert kw == {"gpu_memory_utilization": 0.45, "kv_cache_memory_bytes": 4 * GIB}, kw
    assert "KV cache 4 GiB per engine" in note
    assert cpu_kv_cache_gib(2, 12 * GIB) == 2 and cpu_kv_cache_gib(5, 2 * GIB) == 1
    kw, _ = memory_plan({"kv_cache_memory_bytes": 123}, 2, on_gpu=False, available_bytes=23 * GIB)
    assert "kv_cache_memory_bytes" not in kw  # the user's own, from [engine] extra, stays
    kw, _ = memory_plan({}, 2, on_gpu=True, available_bytes=23 * GIB)
    assert "kv_cache_memory_bytes" not in kw
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    kw, note = memory_plan({}, 2, on_gpu=False, available_bytes=23 * GIB)
    assert "kv_cache_memory_bytes" not in kw and "VLLM_CPU_KVCACHE_SPACE=1" in note
