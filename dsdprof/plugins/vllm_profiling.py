"""dsdprof's scheduler inside vLLM's engine core: follow a K, gate waves, trace every step.

vLLM is started with ``scheduler_cls = "dsdprof.engines.vllm_scheduler.make_scheduler"``, which
builds :class:`TracingAsyncScheduler` or :class:`TracingScheduler` by the ``async_scheduling`` vLLM
resolved (its GPU default for EAGLE/MTP/draft models; off on CPU): the scheduler it would have had.

**Trust.** The mixin acts only in an engine a dsdprof run started: the run's worker puts a secret
(``DSDPROF_RUN_TOKEN``) and a trace directory (``DSDPROF_TRACE_DIR``) in the environment of the
process that starts vLLM, which its engine core inherits; no client can set either. In any other
engine (``vllm serve`` with the adaptive plugin, say) every dsdprof key of a request is ignored
and never even read: the scheduler is vLLM's. In a run's engine, only requests whose
``extra_args[RUN_ARG]`` equals the secret are profiled, and their keys are parsed once, when the
request arrives; a value of the wrong type or out of range is ignored and counted
(``dsdprof_ignored``), never raised. For profiled requests:

* **K**: ``extra_args[K_EXTRA_ARG]`` (an int in 0..``num_spec_tokens``) replaces vLLM's
  dynamic-SD ``batch_size -> K`` lookup with that constant K, so one engine serves every K.
* **K sequence** (paired design): ``extra_args[K_SEQ_ARG]`` (a list of 1..``MAX_K_SEQ`` ints in
  0..``num_spec_tokens``) sets the K of the wave's i-th scheduled step to ``seq[i % len(seq)]``
  (the step counter is per traced wave); it takes precedence over a constant K. The K each step
  scheduled (vLLM's ``num_spec_tokens_to_schedule``: the drafts it proposes for the next step) is
  recorded in the trace as ``k_next``. Two values are **arms** rather than a K (validate's steps
  design: the variants that choose K themselves, switched step by step inside one engine):
  ``ARM_TABLE`` serves the schedule the engine started with (the table's K per batch size) and
  ``ARM_ENGINE`` leaves the step unforced (vLLM's lookup, or the adaptive plugin's current K). The
  arm of every step is recorded in the trace (``arm``) and exposed to a subclass as
  ``dsdprof_step_arms`` = (arm of the previous step, arm of this step) during ``update_from_output``,
  so the adaptive plugin learns only from its own steps.
* **Wave gate**: while nothing runs, a queue headed by a request carrying ``extra_args[GATE_ARG]
  = B`` (1..``max_num_seqs``) is not scheduled until B requests have arrived.
* **Step trace**: ``extra_args[TRACE_ARG]`` names the cell's trace file (a plain file name) inside
  the trace directory; one record per engine step (:class:`dsdprof.formats.trace.TraceRecord`) is
  buffered and appended as one JSON line when the engine has no request left.

**Own time out of ITL** (ITL = difference of consecutive ``t_end``): dsdprof's code is timed into
``t_own`` (cumulative, in every record). The synchronous scheduler runs schedule, model and update in
turn, so its ``t_end`` is ``perf_counter() - t_own``: only the mixin's frames and clock reads stay in
the interval (``benchmarks/bench_scheduler_overhead.py``: ``in ITL``). Under async scheduling the
scheduler runs while the GPU executes a step, so ``t_end`` keeps it (``t_own`` says how much).

**Accounting** holds under every call order vLLM uses (``EngineCore.step``, and
``step_with_batch_queue``: ``schedule`` of step n+1 before ``update_from_output`` of step n): what a
step scheduled is keyed by its ``SchedulerOutput``; a request's delivered tokens are its output's
growth across that step's update; drafted/accepted are counted as vLLM counts them, before it trims
the sampled tokens in place; outputs vLLM discards (request already finished) count as stale.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from dsdprof.formats.trace import TraceRecord, encode_flush, step_record
from dsdprof.plugins.names import ARM_ENGINE, ARM_TABLE
from dsdprof.plugins.profiling_keys import Profiled, _run_settings, parse_keys


class _DsdprofMixin:
    """See the module docstring."""

    if TYPE_CHECKING:  # vLLM's Scheduler (v1/core/sched/scheduler.py), which this mixin is combined with
        dynamic_sd_lookup: list[int] | None
        requests: Any  # dict[str, Request]
        running: list[Any]
        waiting: Any
        num_spec_tokens: int
        max_num_running_reqs: int

    _dsdprof_subtract_own = True  # t_end excludes dsdprof's own time (module docstring)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)  # vLLM's Scheduler.__init__
        self._dsdprof_init()

    def _dsdprof_init(self, environ=None) -> None:
        self._dsdprof_table_lookup = self.dynamic_sd_lookup
        lookup = self._dsdprof_table_lookup
        # ARM_TABLE: the schedule at start
        self._dsdprof_static = list(lookup) if lookup is not None else None
        self._dsdprof_arm: int | None = None  # the arm the step being scheduled runs (None: no arm)
        self._dsdprof_arms: dict[int, int] = {}  # id(SchedulerOutput) -> its arm, until its update
        self._dsdprof_last_arm: int | None = None
        self.dsdprof_step_arms: tuple[int | None, int | None] = (None, None)  # (previous step's, this step's)
        self._dsdprof_const: dict[int, list[int]] = {}
        self._dsdprof_steps: dict[int, tuple] = {}
        self._dsdprof_buffers: dict[str, list[TraceRecord]] = {}
        self._dsdprof_token, self._dsdprof_trace_dir = _run_settings(environ)
        self._dsdprof_reqs: dict[str, Profiled] = {}
        self._dsdprof_seq_step: dict[tuple[str, int], int] = {}  # (trace, wave) -> steps scheduled
        self._dsdprof_seq_key: tuple[str, int] | None = None
        # the _dsdprof_reqs _dsdprof_k_src was found for (None: stale)
        self._dsdprof_k_for: dict | None = None
        self._dsdprof_k_src: Profiled | int | None = None  # the first live K-sequence request, else max K
        self._dsdprof_own = getattr(self, "_dsdprof_own", 0.0)  # seconds of dsdprof's own work so far
        self.dsdprof_ignored = 0  # requests whose dsdprof keys were (partly) ignored

    # ------------------------------------------------------------------ requests
    def add_request(self, request) -> None:
        super().add_request(request)  # type: ignore[misc]  # vLLM's Scheduler method
        if not self._dsdprof_token:
            return
        t0 = time.perf_counter()
        params = request.sampling_params
        profile, bad = parse_keys(params.extra_args if params is not None else None, self._dsdprof_token,
                                  self._dsdprof_trace_dir, self.num_spec_tokens,
                                  self.max_num_running_reqs)
        self.dsdprof_ignored += bad
        if profile is not None:
            self._dsdprof_reqs[request.request_id] = profile
            self._dsdprof_k_for = None
        self._dsdprof_own += time.perf_counter() - t0

    def _dsdprof_forget(self, finished) -> None:  # vLLM's finished_req_ids: no longer profiled
        for req_id in finished:
            if self._dsdprof_reqs.pop(req_id, None) is not None:
                self._dsdprof_k_for = None

    def _dsdprof_live(self, req_id: str) -> bool:
        request = self.requests.get(req_id)
        return request is not None and not request.is_finished()

    # ------------------------------------------------------------------ K
    def _dsdprof_k_source(self) -> Profiled | int | None:
        """The first live request with a K sequence (paired design), else the live requests' max K."""
        requested = None
        for req_id, p in self._dsdprof_reqs.items():
            if p.k_seq and self._dsdprof_live(req_id):
                return p
            if p.k is not None and self._dsdprof_live(req_id):
                requested = p.k if requested is None else max(requested, p.k)
        return requested

    def _dsdprof_requested_k(self) -> int | None:
        reqs = self._dsdprof_reqs
        if reqs is not self._dsdprof_k_for:  # a request was added or finished since: look again
            self._dsdprof_k_src, self._dsdprof_k_for = self._dsdprof_k_source(), reqs
        p = self._dsdprof_k_src
        if not isinstance(p, Profiled):
            return p
        key = (p.trace, p.wave)
        self._dsdprof_seq_key = key  # advanced by schedule() only if the step runs anything
        self._dsdprof_arm = arm = p.k_seq[self._dsdprof_seq_step.get(key, 0) % len(p.k_seq)]
        return arm

    def _dsdprof_apply_k(self) -> None:
        t0 = time.perf_counter()
        k = self._dsdprof_requested_k() if self._dsdprof_reqs else None
        table = self._dsdprof_table_lookup
        if k is None or k == ARM_ENGINE or table is None:
            lookup = table
        elif k == ARM_TABLE:
            lookup = self._dsdprof_static
        else:
            lookup = self._dsdprof_const.get(k) or self._dsdprof_const.setdefault(k, [k] * len(table))
        self.dynamic_sd_lookup = lookup
        self._dsdprof_own += time.perf_counter() - t0

    # ------------------------------------------------------------------ gate
    def has_requests(self) -> bool:
        if self._dsdprof_reqs and not self.running:
            waiting = self.waiting
            for request in waiting:
                p = self._dsdprof_reqs.get(request.request_id)
                if p is not None and p.gate and len(waiting) < p.gate:
                    return False
                break
        return super().has_requests()  # type: ignore[misc]  # vLLM's Scheduler method

    # ------------------------------------------------------------------ trace
    def schedule(self, *args, **kwargs):
        t0 = time.perf_counter()
        self._dsdprof_seq_key = self._dsdprof_arm = None
        if self._dsdprof_reqs:  # finished since the last schedule (updates, aborts)
            self._dsdprof_forget(getattr(self, "finished_req_ids", ()))
        self._dsdprof_own += time.perf_counter() - t0
        self._dsdprof_apply_k()  # times its own work (a subclass's override is not dsdprof's profiling)
        out = super().schedule(*args, **kwargs)
        t1 = time.perf_counter()
        key = self._dsdprof_seq_key
        if key is not None and out.total_num_scheduled_tokens > 0:  # the wave's next step of its sequence
            self._dsdprof_seq_step[key] = self._dsdprof_seq_step.get(key, 0) + 1
            self._dsdprof_arms[id(out)] = self._dsdprof_arm
        if self._dsdprof_reqs:
            self._dsdprof_forget(getattr(out, "finished_req_ids", ()))  # finished inside schedule()
            self._dsdprof_record_schedule(out)
        self._dsdprof_own += time.perf_counter() - t1
        return out

    def _dsdprof_record_schedule(self, out) -> None:
        scheduled = out.num_scheduled_tokens
        if not scheduled:
            return
        new_ids = {r.req_id for r in out.scheduled_new_reqs}
        path, wave = "", 0
        reqs: list[tuple[str, bool]] = []  # (req_id, decoding)
        prefill_tokens = others = 0
        spec = out.scheduled_spec_decode_tokens
        for req_id, n in scheduled.items():
            request = self.requests.get(req_id)
            if request is None:
                continue
            drafted = len(spec.get(req_id, ()))
            computed_before = request.num_computed_tokens - n
            decoding = (req_id not in new_ids and n == 1 + drafted
                        and computed_before >= request.num_prompt_tokens)
            if not decoding:
                prefill_tokens += n
            p = self._dsdprof_reqs.get(req_id)
            if p is None or not p.trace:
                others += 1
                continue
            if not path:
                path, wave = p.trace, p.wave
            elif p.trace != path or p.wave != wave:
                others += 1
                continue
            reqs.append((req_id, decoding))
        if path:
            self._dsdprof_steps[id(out)] = (path, wave, reqs, prefill_tokens, others,
                                            int(getattr(out, "num_spec_tokens_to_schedule", -1)),
                                            self._dsdprof_arms.get(id(out)))

    def update_from_output(self, scheduler_output, model_runner_output):
        t0 = time.perf_counter()
        info = self._dsdprof_steps.pop(id(scheduler_output), None) if self._dsdprof_steps else None
        if self._dsdprof_arms or self._dsdprof_last_arm is not None:
            arm = self._dsdprof_arms.pop(id(scheduler_output), None)
            self.dsdprof_step_arms = (self._dsdprof_last_arm, arm)
            self._dsdprof_last_arm = arm
        elif self.dsdprof_step_arms[0] is not None or self.dsdprof_step_arms[1] is not None:
            self.dsdprof_step_arms = (None, None)
        before = (self._dsdprof_before(info, scheduler_output, model_runner_output) if info is not None
                  else None)
        self._dsdprof_own += time.perf_counter() - t0
        result = super().update_from_output(scheduler_output, model_runner_output)
        t2 = time.perf_counter()
        own = self._dsdprof_own
        if info is not None:
            self._dsdprof_record_output(info, before, t2 - own if self._dsdprof_subtract_own else t2, own)
        if not self.running and len(self.waiting) == 0 and (
                self._dsdprof_reqs or self._dsdprof_buffers or self._dsdprof_seq_step):
            self._dsdprof_reqs = {r: p for r, p in self._dsdprof_reqs.items() if self._dsdprof_live(r)}
            self._dsdprof_seq_step = {}
            self._dsdprof_last_arm = None
            if self._dsdprof_buffers:
                self._dsdprof_flush()
        info = before = None  # freed here, inside the timed stretch, not on return
        self._dsdprof_own += time.perf_counter() - t2
        return result

    def _dsdprof_before(self, info, so, mro) -> list[tuple]:
        """Per traced request, before vLLM processes the output (and trims it in place):
        (id, request, decoding, stale, output tokens so far, drafted, accepted, sampled)."""
        sampled = mro.sampled_token_ids
        index = mro.req_id_to_index
        spec = so.scheduled_spec_decode_tokens
        invalid = so.num_invalid_spec_tokens or {}
        per_step = getattr(self, "num_sampled_tokens_per_step", 1)
        rows = []
        for req_id, decoding in info[2]:
            request = self.requests.get(req_id)
            stale = request is None or request.is_finished() or bool(
                getattr(request, "num_stale_output_tokens", 0)
                and getattr(request, "drop_stale_output", False))
            i = index.get(req_id)
            g = len(sampled[i]) if (sampled and i is not None) else 0
            d = len(spec.get(req_id, ()))
            a = max(g - per_step, 0) if d and (g or per_step == 0) else 0
            d = d - invalid.get(req_id, 0) if d else 0
            done = 0 if stale else request.num_output_tokens
            rows.append((req_id, request, decoding, stale, done, d, a, g))
        return rows

    def _dsdprof_record_output(self, info, before, t_end: float, t_own: float) -> None:
        path, wave, reqs, prefill_tokens, others, k_next, arm = info
        ids, drafted, accepted, generated, finished, delivered = [], [], [], [], [], {}
        stale_n = 0
        for req_id, request, decoding, stale, n_before, d, a, g in before:
            if stale:
                stale_n += 1
                continue
            delivered[req_id] = request.num_output_tokens - n_before
            if decoding:
                ids.append(req_id)
                drafted.append(d)
                accepted.append(a)
                generated.append(g)
                finished.append(request.is_finished())
        if not delivered:  # every output of the step was stale (async: the wave already finished)
            return
        self._dsdprof_buffers.setdefault(path, []).append(step_record(
            wave=wave, t_end=t_end, t_own=t_own, scheduled=len(reqs), decoding=len(ids),
            prefill_tokens=prefill_tokens, others=others, stale=stale_n, ids=ids, drafted=drafted,
            accepted=accepted, generated=generated, delivered=delivered, finished=finished, k_next=k_next,
            arm=arm))

    def _dsdprof_flush(self) -> None:
        trace_dir = self._dsdprof_trace_dir
        for path, records in self._dsdprof_buffers.items():
            if not trace_dir or os.path.dirname(path) != trace_dir:
                continue  # never outside the run's trace directory
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(path, flags, 0o644)
                with os.fdopen(fd, "a") as fh:
                    fh.write(encode_flush(records))
            except OSError:
                self.dsdprof_ignored += 1  # a trace that cannot be written fails its cell, not the engine
        self._dsdprof_buffers = {}


class TracingScheduler(_DsdprofMixin, Scheduler):
    """vLLM's synchronous scheduler with dsdprof's K, wave gate and step trace."""


class TracingAsyncScheduler(_DsdprofMixin, AsyncScheduler):
    """vLLM's async scheduler (its default on GPU where supported) with the same additions."""

    _dsdprof_subtract_own = False  # its work overlaps the GPU's step (module docstring)


def class_for_config(scheduler_config, sync_cls: type, async_cls: type) -> type:
    """``async_cls`` when vLLM resolved ``async_scheduling`` on for this engine, else ``sync_cls``."""
    return async_cls if getattr(scheduler_config, "async_scheduling", False) else sync_cls


def build_for_config(sync_cls: type, async_cls: type, args: tuple, kwargs: dict):
    """Instantiate the class matching the ``vllm_config`` vLLM passes to ``scheduler_cls``."""
    vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
    return class_for_config(vllm_config.scheduler_config, sync_cls, async_cls)(*args, **kwargs)


def scheduler_class_for(scheduler_config) -> type:
    """The class :func:`make_scheduler` builds for vLLM's resolved scheduler config."""
    return class_for_config(scheduler_config, TracingScheduler, TracingAsyncScheduler)


def make_scheduler(*args, **kwargs):
    """``scheduler_cls`` for vLLM: build the tracing scheduler matching vLLM's own choice."""
    return build_for_config(TracingScheduler, TracingAsyncScheduler, args, kwargs)
