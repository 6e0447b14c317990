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
``t_own`` (cumulative, in every record); per step it keeps references (the step's SchedulerOutput,
finished requests) and builds the per-request records when the engine is idle, outside every timed
step (``_dsdprof_defer = False``, or a preemption, a resumable stop or a failed KV load until idle:
inside each step). The sync scheduler's ``t_end`` is ``perf_counter() - t_own``; the async one's
is not corrected (:meth:`_dsdprof_uncut` puts back what vLLM cut at a stop). The accounting holds
under every call order vLLM uses (``EngineCore.step``, ``step_with_batch_queue``). Why, and what it
costs: docs/measurement.md ("The step trace and steady-state steps") and docs/vllm-internals.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from dsdprof.formats.trace import TraceRecord
from dsdprof.plugins.names import ARM_ENGINE, ARM_TABLE
from dsdprof.plugins.profiling_keys import Profiled, _run_settings, parse_keys
from dsdprof.plugins.profiling_records import _StepRecords

_NO_ARMS: tuple[None, None] = (None, None)
MAX_PENDING = 4096  # steps kept for the idle build; past it they are built at once (a wave is shorter)
# Late counts (_dsdprof_uncut) need vLLM 0.32's placeholders: a stop's are cut by what it delivered. 0.33
# subtracts every sampled token, trimmed ones too, so the cut is lost: copy the counts before the update.
LATE_COUNTS = vllm.__version__.startswith("0.32.")


class _DsdprofMixin(_StepRecords):
    """See the module docstring."""

    if TYPE_CHECKING:  # vLLM's Scheduler (v1/core/sched/scheduler.py), which this mixin is combined with
        dynamic_sd_lookup: list[int] | None
        requests: Any  # dict[str, Request]
        running: list[Any]
        waiting: Any
        num_spec_tokens: int
        max_num_running_reqs: int

    _dsdprof_subtract_own = True  # t_end excludes dsdprof's own time (module docstring)
    _dsdprof_defer = False  # build each step's record in it (sync; TracingAsyncScheduler: when idle)

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
        self.dsdprof_step_arms: tuple[int | None, int | None] = _NO_ARMS  # (previous step's, this step's)
        self._dsdprof_const: dict[int, list[int]] = {}
        self._dsdprof_steps: dict[int, Any] = {}  # id(SchedulerOutput) -> a step's info, or it (kept)
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
        self._dsdprof_pending: list[tuple] = []  # steps kept for the idle build, in order
        self._dsdprof_seen: dict[str, Any] = {}  # req_id -> Request: every request added, until idle
        self._dsdprof_profiles: dict[str, Profiled] = {}  # req_id -> keys, not forgotten until idle
        self._dsdprof_fin: dict[str, int] = {}  # req_id -> when first seen finished (2u - 1: before update u)
        self._dsdprof_u = 0  # update_from_output calls so far
        self._dsdprof_exact = False  # stale outputs vLLM may drop: build every step in it, until idle
        self._dsdprof_late = LATE_COUNTS and self._dsdprof_defer and isinstance(self, AsyncScheduler)
        self._dsdprof_cut: dict[str, int] = {}  # req_id -> output placeholders at its stop, this update
        # no subclass's _dsdprof_apply_k: the K is set inside schedule()'s first timed stretch
        self._dsdprof_k_inline = type(self)._dsdprof_apply_k is _DsdprofMixin._dsdprof_apply_k
        self._dsdprof_k_fixed: tuple | None = None  # (table, lookup) while _dsdprof_k_for holds, no K seq
        self._dsdprof_index: Any = None  # the first kept step's req_id_to_index (_dsdprof_fresh)
        self._dsdprof_index_fresh = False  # the runner builds req_id_to_index anew every step: not copied

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
        req_id = request.request_id
        self._dsdprof_seen[req_id] = request
        self._dsdprof_fin.pop(req_id, None)
        if profile is not None:
            self._dsdprof_reqs[req_id] = self._dsdprof_profiles[req_id] = profile
            self._dsdprof_k_for = None
        self._dsdprof_own += time.perf_counter() - t0

    def _dsdprof_forget(self, finished) -> None:  # vLLM's finished_req_ids: no longer profiled
        for req_id in finished:
            if self._dsdprof_reqs.pop(req_id, None) is not None:
                self._dsdprof_k_for = None

    def _dsdprof_saw(self, finished, when: int) -> list[str]:
        """Note when each of vLLM's ``finished_req_ids`` was first seen finished, on a half-step clock
        (``2u - 1``: before update ``u``; ``2u``: right after it): a kept step's stale outputs. The
        ids seen finished for the first time."""
        fin, first = self._dsdprof_fin, []
        for req_id in finished:
            if req_id not in fin:
                fin[req_id] = when
                first.append(req_id)
        return first

    def _preempt_request(self, request, *args, **kwargs):  # vLLM's; its in-flight output may be dropped
        self._dsdprof_exact = True
        return super()._preempt_request(request, *args, **kwargs)

    def _handle_stopped_request(self, request):  # vLLM's; a resumable stop drops in-flight output
        if self._dsdprof_late:  # after vLLM cut the step's sampled tokens at the stop: see _dsdprof_uncut
            self._dsdprof_cut[request.request_id] = request.num_output_placeholders
        if getattr(request, "resumable", False):
            self._dsdprof_exact = True
        return super()._handle_stopped_request(request)

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

    def _dsdprof_apply_k(self) -> None:
        """Set the K lookup this step is scheduled with (timed)."""
        t0 = time.perf_counter()
        self._dsdprof_set_k()
        self._dsdprof_own += time.perf_counter() - t0

    def _dsdprof_set_k(self) -> None:
        reqs, k, fixed = self._dsdprof_reqs, None, bool(self._dsdprof_reqs)
        if reqs:
            if reqs is not self._dsdprof_k_for:  # a request was added or finished since: look again
                self._dsdprof_k_src, self._dsdprof_k_for = self._dsdprof_k_source(), reqs
            p = self._dsdprof_k_src
            if isinstance(p, Profiled):
                key = (p.trace, p.wave)
                self._dsdprof_seq_key = key  # advanced by schedule() only if the step runs anything
                self._dsdprof_arm = k = p.k_seq[self._dsdprof_seq_step.get(key, 0) % len(p.k_seq)]
                fixed = False
            else:
                k = p
        table = self._dsdprof_table_lookup
        if k is None or k == ARM_ENGINE or table is None:
            lookup = table
        elif k == ARM_TABLE:
            lookup = self._dsdprof_static
        else:
            lookup = self._dsdprof_const.get(k) or self._dsdprof_const.setdefault(k, [k] * len(table))
        self.dynamic_sd_lookup = lookup
        self._dsdprof_k_fixed = (table, lookup) if fixed else None  # the same until a request comes or goes

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
        finished = getattr(self, "finished_req_ids", ())  # since the last schedule (updates, aborts)
        if finished and self._dsdprof_seen:
            self._dsdprof_saw(finished, 2 * self._dsdprof_u + 1)
            if self._dsdprof_reqs:
                self._dsdprof_forget(finished)
        if self._dsdprof_k_inline:
            fixed = self._dsdprof_k_fixed
            if (fixed is not None and self._dsdprof_k_for is self._dsdprof_reqs
                    and fixed[0] is self._dsdprof_table_lookup):
                self.dynamic_sd_lookup = fixed[1]
            else:
                self._dsdprof_set_k()
            self._dsdprof_own += time.perf_counter() - t0
        else:
            self._dsdprof_own += time.perf_counter() - t0
            self._dsdprof_apply_k()  # times its own work (a subclass's override is not dsdprof's profiling)
        out = super().schedule(*args, **kwargs)
        t1 = time.perf_counter()
        key = self._dsdprof_seq_key
        if key is not None and out.total_num_scheduled_tokens > 0:  # the wave's next step of its sequence
            self._dsdprof_seq_step[key] = self._dsdprof_seq_step.get(key, 0) + 1
            self._dsdprof_arms[id(out)] = self._dsdprof_arm
        if self._dsdprof_reqs:
            finished = getattr(out, "finished_req_ids", ())  # and those finished inside schedule()
            if finished:
                self._dsdprof_saw(finished, 2 * self._dsdprof_u + 1)
                self._dsdprof_forget(finished)
            if not self._dsdprof_defer or self._dsdprof_exact:
                self._dsdprof_record_schedule(out)
            elif out.num_scheduled_tokens:  # the SchedulerOutput itself, read when idle (_dsdprof_build)
                self._dsdprof_steps[id(out)] = out
        self._dsdprof_own += time.perf_counter() - t1
        return out

    def _dsdprof_record_schedule(self, out) -> None:
        info = self._dsdprof_step_info(
            out.num_scheduled_tokens, {r.req_id for r in out.scheduled_new_reqs},
            out.scheduled_spec_decode_tokens, self.requests, self._dsdprof_reqs, None,
            int(getattr(out, "num_spec_tokens_to_schedule", -1)), self._dsdprof_arms.get(id(out)))
        if info is not None:
            self._dsdprof_steps[id(out)] = info

    def update_from_output(self, scheduler_output, model_runner_output):
        t0 = time.perf_counter()
        self._dsdprof_u = u = self._dsdprof_u + 1
        finished = getattr(self, "finished_req_ids", ())
        if finished and self._dsdprof_seen:
            self._dsdprof_saw(finished, 2 * u - 1)
        mro = model_runner_output
        info = self._dsdprof_steps.pop(id(scheduler_output), None) if self._dsdprof_steps else None
        arm = None
        if self._dsdprof_arms or self._dsdprof_last_arm is not None:
            arm = self._dsdprof_arms.pop(id(scheduler_output), None)
            self.dsdprof_step_arms = (self._dsdprof_last_arm, arm)
            self._dsdprof_last_arm = arm
        elif self.dsdprof_step_arms is not _NO_ARMS:
            self.dsdprof_step_arms = _NO_ARMS
        kept = before = late = None
        if info is None:
            pass
        elif info is scheduler_output and not self._dsdprof_exact and (  # kept (schedule)
                getattr(mro, "kv_connector_output", None) is None or not self._dsdprof_kv_failed(mro)):
            if self._dsdprof_late:  # read after vLLM's update, each cut put back (_dsdprof_uncut)
                late = info
            else:  # its counts now: vLLM trims a stopped request's in place
                sampled, index = mro.sampled_token_ids, mro.req_id_to_index
                if not self._dsdprof_index_fresh:  # by reference once the runner builds one per step
                    index = self._dsdprof_fresh(index)
                kept = (info, arm, u, index, list(map(len, sampled)) if sampled else None,
                        info.num_invalid_spec_tokens)
        else:
            info, before = self._dsdprof_exact_before(info, scheduler_output, mro, arm)
        self._dsdprof_own += time.perf_counter() - t0
        result = super().update_from_output(scheduler_output, mro)
        t2 = time.perf_counter()
        own = self._dsdprof_own
        t_end = t2 - own if self._dsdprof_subtract_own else t2
        finished = getattr(self, "finished_req_ids", ())
        stopped = self._dsdprof_saw(finished, 2 * u) if finished and self._dsdprof_seen else None
        if late is not None:  # async, kept: the counts now (warm from vLLM's loop), a stop's cut put back
            sampled, index = mro.sampled_token_ids, mro.req_id_to_index
            if not self._dsdprof_index_fresh:
                index = self._dsdprof_fresh(index)
            lens = [*map(len, sampled)] if sampled else None
            trimmed = self._dsdprof_uncut(lens, index) if self._dsdprof_cut else None
            self._dsdprof_pending.append((late, arm, u, index, lens, late.num_invalid_spec_tokens,
                                          trimmed, t_end, own))
        elif kept is not None:  # what vLLM left of a stopped request's sampled tokens: delivered
            index, sampled = kept[3], mro.sampled_token_ids
            trimmed = {r: len(sampled[index[r]]) for r in stopped if r in index} if stopped else None
            self._dsdprof_pending.append((*kept, trimmed, t_end, own))
        elif before is not None:
            self._dsdprof_record_output(info, before, t_end, own)
        if self._dsdprof_cut:  # a stop outside a late-read step: nothing to put back
            self._dsdprof_cut = {}
        if not self.running and len(self.waiting) == 0 and (
                self._dsdprof_reqs or self._dsdprof_buffers or self._dsdprof_seq_step or self._dsdprof_pending
                or self._dsdprof_seen):
            self._dsdprof_idle(u)
        elif len(self._dsdprof_pending) >= MAX_PENDING:
            self._dsdprof_build()
        info = before = kept = late = None  # freed here, inside the timed stretch, not on return
        self._dsdprof_own += time.perf_counter() - t2
        return result

    def _dsdprof_exact_before(self, info, so, mro, arm):
        if info is so:  # a kept step: its schedule-time facts from its SchedulerOutput
            info = self._dsdprof_kept_info(so, arm)
        if self._dsdprof_pending:
            self._dsdprof_build()  # records stay in step order
        return info, (self._dsdprof_before(info, so, mro) if info is not None else None)

    def _dsdprof_idle(self, u: int) -> None:
        """The engine has no request left: build and write the traces, forget the finished."""
        if self._dsdprof_pending:
            self._dsdprof_build()
        self._dsdprof_reqs = {r: p for r, p in self._dsdprof_reqs.items() if self._dsdprof_live(r)}
        self._dsdprof_seq_step = {}
        self._dsdprof_last_arm = None
        self._dsdprof_exact = False
        if self._dsdprof_buffers:
            self._dsdprof_flush()
        horizon = 2 * u - 64  # a step still in flight was scheduled a few updates ago at most
        fin = self._dsdprof_fin = {r: f for r, f in self._dsdprof_fin.items() if f >= horizon}
        keep = self.requests
        self._dsdprof_seen = {r: q for r, q in self._dsdprof_seen.items() if r in fin or r in keep}
        self._dsdprof_profiles = {r: p for r, p in self._dsdprof_profiles.items() if r in fin or r in keep}


class TracingScheduler(_DsdprofMixin, Scheduler):
    """vLLM's synchronous scheduler with dsdprof's K, wave gate and step trace."""


class TracingAsyncScheduler(_DsdprofMixin, AsyncScheduler):
    """vLLM's async scheduler (its default on GPU where supported) with the same additions."""

    _dsdprof_subtract_own = False  # its work overlaps the GPU's step (module docstring)
    _dsdprof_defer = True  # so little of it is in the step: per-request bookkeeping built when idle


def scheduler_pair(sync_cls: type, async_cls: type) -> tuple[Callable[..., type], Callable[..., object]]:
    """A plugin module's ``(scheduler_class_for, make_scheduler)`` for its pair of schedulers:
    the class matching the ``async_scheduling`` vLLM resolved for this engine (``async_cls`` when
    on), and the ``scheduler_cls`` vLLM calls, building that class from the ``vllm_config`` it passes."""

    def scheduler_class_for(scheduler_config) -> type:
        return async_cls if getattr(scheduler_config, "async_scheduling", False) else sync_cls

    def make_scheduler(*args, **kwargs):
        vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        return scheduler_class_for(vllm_config.scheduler_config)(*args, **kwargs)

    return scheduler_class_for, make_scheduler


# the tracing scheduler matching vLLM's own choice (dsdprof.engines.vllm_scheduler.make_scheduler)
scheduler_class_for, make_scheduler = scheduler_pair(TracingScheduler, TracingAsyncScheduler)
