"""Requests that arrive over time, inside one engine worker: a rollout (every request at t = 0)
or a serving run (Poisson arrivals), each request's tokens timed as they stream, every engine step
traced.

The worker drives ``vllm.LLM``'s engine itself (``llm_engine.add_request`` / ``step``), the way
an offline RL rollout or an online server does: a request is added when its arrival time has come
(between engine steps, as vLLM's engine core takes new requests between steps), and the client
time of each chunk of tokens is the return of the ``step`` that delivered it. Requests carry the
run's secret and one trace name, so dsdprof's profiling scheduler records every engine step
(:mod:`dsdprof.measure.vllm.trace`): the batch size vLLM looked K up with (every scheduled request,
prefill chunks included: ``len(num_scheduled_tokens)``), the requests decoding, the prefill tokens
and the K the step scheduled. A rollout's requests also carry the wave gate (``N``), so the first
step schedules all of them. No K is forced: each engine serves its own configuration (vanilla,
fixed K, the table on vLLM's schedule, the adaptive plugin).

The result is plain data (picklable, no vLLM types): :class:`ArrivalsResult`.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsdprof.formats.trace import TraceRecord


@dataclass(frozen=True)
class ArrivalsRequest:
    arrivals_s: tuple[float, ...]  # per request: seconds after the start at which it is submitted
    output_lens: tuple[int, ...]  # per request: tokens it generates (ignore_eos, min = max)
    gate: int = 0  # hold the first step until this many requests are queued (rollout: N; 0: none)
    trace_name: str = ""  # trace file name in the engine's trace directory ("" = temporary)
    temperature: float = 0.0
    seed: int = 0
    prompt_offset: int = 0  # request i takes prompt (i + prompt_offset) of the pool


@dataclass(frozen=True)
class StepRecord:
    """One engine step, from the trace (clock: the engine core's perf_counter, seconds)."""

    t_end: float
    lookup_batch_size: int  # requests scheduled: the index vLLM's dynamic-SD lookup used
    decoding: int  # of which decoding (no prefill tokens)
    prefill_tokens: int
    k_next: int  # K the step scheduled (drafts for the next step); -1 unknown
    drafted: float  # mean draft tokens verified per decoding request (0: none)
    generated: int  # tokens the target sampled over the decoding requests


@dataclass(frozen=True)
class ArrivalsResult:
    t0: float  # client perf_counter at the start (arrival 0)
    arrival_s: tuple[float, ...]  # per request, seconds after t0: when it was due
    chunk_t_s: tuple[tuple[float, ...], ...]  # per request: seconds after t0 of each chunk of tokens
    chunk_tokens: tuple[tuple[int, ...], ...]  # per request: output tokens so far after each chunk
    steps: tuple[StepRecord, ...] = field(default_factory=tuple)  # t_end shifted to seconds after t0
    wall_s: float = 0.0  # t0 to the last request's last token


def step_records(records: list[TraceRecord], t0: float,
                 subtracted: bool = True) -> tuple[StepRecord, ...]:
    """Trace records (:class:`dsdprof.formats.trace.TraceRecord`) as :class:`StepRecord`,
    times after ``t0``. ``t_end`` of the synchronous scheduler excludes dsdprof's cumulative own time;
    it is added back (``t_own``) so that the step clock matches the client's. The async scheduler's
    ``t_end`` is the clock itself (``subtracted=False``, :func:`own_subtracted`): adding its
    ``t_own`` would put every step later by all of dsdprof's work so far, idle builds included."""
    from dsdprof.formats.trace import Step

    out = []
    for d in records:
        s = Step.from_record(d)
        drafted = sum(s.drafted) / len(s.drafted) if s.drafted else 0.0
        out.append(
            StepRecord(
                (s.t_end + s.t_own if subtracted else s.t_end) - t0,
                s.scheduled + s.others,
                s.decoding,
                s.prefill_tokens,
                s.k_next,
                drafted,
                sum(s.generated),
            )
        )
    return tuple(out)


def own_subtracted(scheduler_config) -> bool:
    """Whether the traces of an engine with vLLM's resolved ``scheduler_config`` have ``t_end`` less
    dsdprof's own time: the tracing scheduler vLLM gets there (sync yes, async no) says."""
    from dsdprof.plugins.vllm_profiling import scheduler_class_for

    cls: Any = scheduler_class_for(scheduler_config)
    return bool(cls._dsdprof_subtract_own)


def read_records(path: str) -> list[TraceRecord]:
    """The raw step records of a trace file (missing file: none)."""
    import json

    if not os.path.isfile(path):
        return []
    with open(path) as fh:
        return [d for line in fh if line.strip() for d in json.loads(line)]


def _params(req: ArrivalsRequest, n: int, run_token: str, trace: str):
    from vllm import SamplingParams

    from dsdprof.plugins.names import GATE_ARG, RUN_ARG, TRACE_ARG, WAVE_ARG

    extra = {RUN_ARG: run_token, TRACE_ARG: trace, WAVE_ARG: 0}
    if req.gate:
        extra[GATE_ARG] = req.gate
    return SamplingParams(
        max_tokens=n,
        min_tokens=n,
        ignore_eos=True,
        temperature=req.temperature,
        seed=req.seed if req.temperature > 0 else None,
        extra_args=extra,
    )


def run_arrivals(
    llm, pool: list[list[int]], req: ArrivalsRequest, run_token: str = "", trace_dir: str = ""
) -> ArrivalsResult:
    """Submit every request at its arrival time, step the engine until all finished, and return the
    per-request chunk times and the engine's step trace (see the module docstring)."""
    run_token = run_token or os.environ.get("DSDPROF_RUN_TOKEN", "")
    trace_dir = trace_dir or os.environ.get("DSDPROF_TRACE_DIR", "")
    name = req.trace_name or f"tmp-{uuid.uuid4().hex}"
    path = os.path.join(trace_dir, name + ".jsonl")
    if os.path.exists(path):
        os.unlink(path)  # a retried run starts a fresh trace
    llm.reset_prefix_cache()
    engine = llm.llm_engine
    n = len(req.arrivals_s)
    order = sorted(range(n), key=lambda i: req.arrivals_s[i])
    ids = [f"dsdprof-{uuid.uuid4().hex[:8]}-{i}" for i in range(n)]
    index = {rid: i for i, rid in enumerate(ids)}
    times: list[list[float]] = [[] for _ in range(n)]
    counts: list[list[int]] = [[] for _ in range(n)]
    done = 0
    nxt = 0
    t0 = time.perf_counter()
    while done < n:
        now = time.perf_counter() - t0
        while nxt < n and req.arrivals_s[order[nxt]] <= now:
            i = order[nxt]
            prompt = {"prompt_token_ids": pool[(i + req.prompt_offset) % len(pool)]}
            engine.add_request(ids[i], prompt, _params(req, req.output_lens[i], run_token, name))
            nxt += 1
        if not engine.has_unfinished_requests():
            if nxt < n:  # idle until the next arrival
                time.sleep(max(0.0, req.arrivals_s[order[nxt]] - (time.perf_counter() - t0)))
            continue
        outputs = engine.step()
        t = time.perf_counter() - t0
        for out in outputs:
            j = index.get(out.request_id)
            if j is None:
                continue
            got = len(out.outputs[0].token_ids) if out.outputs else 0
            if got > (counts[j][-1] if counts[j] else 0):
                times[j].append(t)
                counts[j].append(got)
            if out.finished:
                done += 1
    wall = max((ts[-1] for ts in times if ts), default=0.0)
    steps: tuple[StepRecord, ...] = ()
    if trace_dir:
        subtracted = own_subtracted(engine.vllm_config.scheduler_config)
        steps = step_records(read_records(path), t0, subtracted)
    if not req.trace_name and os.path.exists(path):
        os.unlink(path)
    return ArrivalsResult(
        t0,
        tuple(float(req.arrivals_s[i]) for i in range(n)),
        tuple(tuple(ts) for ts in times),
        tuple(tuple(c) for c in counts),
        steps,
        wall,
    )
