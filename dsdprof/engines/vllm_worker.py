"""A child process hosting one ``vllm.LLM`` and running cells on request.

Each engine lives in its own process (and process group) so that (a) vLLM's Prometheus registry,
from which the spec-decode counters and the ITL histogram are read, belongs to exactly one engine;
(b) a hung cell can be timed out by killing the group, engine core included; (c) an engine that
dies takes down only its worker, which is restarted for the next cell.
"""

from __future__ import annotations

import os
import platform
import time
import traceback
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerConfig:
    llm_kwargs: dict[str, Any]
    workload: Any  # dsdprof.spec.WorkloadSpec (picklable pydantic model)


@dataclass(frozen=True)
class CellRequest:
    batch_size: int
    num_spec_tokens: int | None  # None: let the engine's configured schedule decide
    positions: int  # draft positions to report acceptance for
    waves: int
    warmup: int
    output_len: int
    temperature: float
    seed: int


def detect_hardware() -> str:
    """GPU name when CUDA is visible, else the CPU model."""
    try:
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            name = torch.cuda.get_device_name(0)
            return f"{n}x {name}" if n > 1 else name
    except Exception:  # noqa: BLE001 - no torch / no driver: fall back to CPU
        pass
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return f"CPU: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def run_cell(llm, pool: list[list[int]], req: CellRequest):
    """Warm-up waves (unmeasured), then ``req.waves`` waves of exactly ``batch_size`` requests."""
    from vllm import SamplingParams

    from dsdprof.engines.vllm_metrics import RequestTiming, build_measurement, snapshot_from_metrics
    from dsdprof.engines.vllm_scheduler_names import K_EXTRA_ARG
    from dsdprof.workload import wave_prompts

    extra = {K_EXTRA_ARG: req.num_spec_tokens} if req.num_spec_tokens is not None else None
    params = SamplingParams(
        max_tokens=req.output_len, min_tokens=req.output_len, ignore_eos=True,
        temperature=req.temperature, seed=req.seed if req.temperature > 0 else None, extra_args=extra)

    def wave(w: int):
        prompts = [{"prompt_token_ids": p} for p in wave_prompts(pool, req.batch_size, w)]
        return llm.generate(prompts, params, use_tqdm=False)

    for w in range(req.warmup):
        wave(req.waves + w)  # warm-up uses prompts outside the measured ones
    before = snapshot_from_metrics(llm.get_metrics())
    timings: list[RequestTiming] = []
    t0 = time.perf_counter()
    for w in range(req.waves):
        for out in wave(w):
            m = out.metrics
            timings.append(RequestTiming(float(m.first_token_ts), float(m.last_token_ts),
                                         int(m.num_generation_tokens)))
    wall = time.perf_counter() - t0
    after = snapshot_from_metrics(llm.get_metrics())
    return build_measurement(before, after, timings, req.positions, wall)


def _die_with_parent() -> None:
    """Kill this worker's process group (engine core included) if the sweep process dies."""
    import signal
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="dsdprof-parent-watch", daemon=True).start()


def worker_main(conn, config: WorkerConfig) -> None:
    """Process entry point: start the LLM, report ``ready``, then serve ``cell`` requests."""
    try:
        os.setpgrp()  # own process group: the parent kills the group (engine core too) on timeout
    except OSError:
        pass
    _die_with_parent()
    try:
        import vllm
        from vllm import LLM

        from dsdprof.workload import build_prompt_pool

        llm = LLM(**config.llm_kwargs)
        pool = build_prompt_pool(config.workload, llm.get_tokenizer())
        sched = llm.llm_engine.vllm_config.scheduler_config
        conn.send(("ready", {"engine_version": vllm.__version__, "hardware": detect_hardware(),
                             "async_scheduling": bool(sched.async_scheduling),
                             "max_num_seqs": int(sched.max_num_seqs)}))
    except BaseException as err:  # noqa: BLE001 - report any start failure to the parent
        conn.send(("error", f"{type(err).__name__}: {err}".strip()[:2000], traceback.format_exc()[-4000:]))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if msg[0] == "stop":
            break
        try:
            conn.send(("ok", run_cell(llm, pool, msg[1])))
        except BaseException as err:  # noqa: BLE001 - a failed cell is reported, the worker lives on
            conn.send(("error", f"{type(err).__name__}: {err}".strip()[:2000], traceback.format_exc()[-4000:]))
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001
        pass
