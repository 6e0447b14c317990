"""dsdprof's scheduler inside vLLM's engine core: follow a K, gate waves, trace every step.

vLLM is started with ``scheduler_cls = "dsdprof.engines.vllm_scheduler.make_scheduler"``: a
factory that builds :class:`TracingAsyncScheduler` or :class:`TracingScheduler` by the
``async_scheduling`` value vLLM itself resolved for this engine (vLLM's default on GPU for
EAGLE/MTP/draft-model methods; always off on CPU), so the engine keeps the scheduler it would
have had. The mixin adds three things, all driven by the requests' ``SamplingParams.extra_args``
(requests without them are scheduled exactly as vLLM would):

* **K**: ``extra_args[K_EXTRA_ARG]`` replaces vLLM's dynamic-SD ``batch_size -> K`` lookup with
  that constant K (capped at ``num_speculative_tokens``), so one engine serves every K of a sweep.
* **Wave gate**: while nothing runs, a queue of requests carrying ``extra_args[GATE_ARG] = B``
  is not scheduled until B of them have arrived (``has_requests`` answers no, and the engine core
  waits for input): the wave starts as one batch of exactly B, whatever the transport's timing.
* **Step trace**: for requests carrying ``extra_args[TRACE_ARG]`` (a file path), one record per
  engine step (:class:`dsdprof.measure.vllm.trace.Step`) is buffered and appended to that file as one
  JSON line when the engine has no request left, i.e. before the wave's last output leaves the
  engine core.
"""

from __future__ import annotations

import json
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from dsdprof.plugins.names import GATE_ARG, TRACE_ARG, WAVE_ARG
from dsdprof.plugins.names import K_EXTRA_ARG


def _extra(request) -> dict[str, Any]:
    params = request.sampling_params
    extra = params.extra_args if params is not None else None
    return extra or {}


class _DsdprofMixin:
    """See the module docstring. Attributes are created lazily: vLLM owns ``__init__``."""

    def _dsdprof_init(self) -> None:
        self._dsdprof_table_lookup = self.dynamic_sd_lookup  # type: ignore[attr-defined]
        self._dsdprof_const: dict[int, list[int]] = {}
        self._dsdprof_steps: dict[int, tuple[str, int, list[tuple[str, int, bool, int]], int, int]] = {}
        self._dsdprof_buffers: dict[str, list[dict[str, Any]]] = {}

    # ------------------------------------------------------------------ K
    def _dsdprof_requested_k(self) -> int | None:
        requested = None
        for queue in (self.running, self.waiting):  # type: ignore[attr-defined]
            for request in queue:
                extra = _extra(request)
                if K_EXTRA_ARG in extra:
                    k = int(extra[K_EXTRA_ARG])
                    requested = k if requested is None else max(requested, k)
        return requested

    def _dsdprof_apply_k(self) -> None:
        k = self._dsdprof_requested_k()
        if k is None or self._dsdprof_table_lookup is None:
            self.dynamic_sd_lookup = self._dsdprof_table_lookup  # type: ignore[attr-defined]
            return
        k = max(0, min(k, self.num_spec_tokens))  # type: ignore[attr-defined]
        lookup = self._dsdprof_const.get(k)
        if lookup is None:
            lookup = [k] * len(self._dsdprof_table_lookup)
            self._dsdprof_const[k] = lookup
        self.dynamic_sd_lookup = lookup  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ gate
    def has_requests(self) -> bool:  # type: ignore[override]
        waiting = self.waiting  # type: ignore[attr-defined]
        if not self.running and len(waiting) > 0:  # type: ignore[attr-defined]
            for request in waiting:
                need = int(_extra(request).get(GATE_ARG, 0) or 0)
                if need and len(waiting) < need:
                    return False
                break
        return super().has_requests()  # type: ignore[misc]

    # ------------------------------------------------------------------ trace
    def schedule(self, *args, **kwargs):  # type: ignore[override]
        if not hasattr(self, "_dsdprof_const"):
            self._dsdprof_init()
        self._dsdprof_apply_k()
        out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        self._dsdprof_record_schedule(out)
        return out

    def _dsdprof_record_schedule(self, out) -> None:
        scheduled = out.num_scheduled_tokens
        if not scheduled:
            return
        new_ids = {r.req_id for r in out.scheduled_new_reqs}
        path, wave = "", 0
        reqs: list[tuple[str, int, bool, int]] = []  # (req_id, drafted, decoding, output tokens before)
        prefill_tokens = others = 0
        for req_id, n in scheduled.items():
            request = self.requests.get(req_id)  # type: ignore[attr-defined]
            if request is None:
                continue
            drafted = len(out.scheduled_spec_decode_tokens.get(req_id, ()))
            computed_before = request.num_computed_tokens - n
            decoding = (req_id not in new_ids and n == 1 + drafted
                        and computed_before >= request.num_prompt_tokens)
            if not decoding:
                prefill_tokens += n
            extra = _extra(request)
            trace = extra.get(TRACE_ARG)
            if not trace:
                others += 1
                continue
            if not path:
                path, wave = str(trace), int(extra.get(WAVE_ARG, 0))
            elif str(trace) != path or int(extra.get(WAVE_ARG, 0)) != wave:
                others += 1
                continue
            reqs.append((req_id, drafted, decoding, request.num_output_tokens))
        if path:
            self._dsdprof_steps[id(out)] = (path, wave, reqs, prefill_tokens, others)

    def update_from_output(self, scheduler_output, model_runner_output):  # type: ignore[override]
        if not hasattr(self, "_dsdprof_const"):
            self._dsdprof_init()
        info = self._dsdprof_steps.pop(id(scheduler_output), None)
        requests = {}
        if info is not None:
            requests = {rid: self.requests.get(rid) for rid, *_ in info[2]}  # type: ignore[attr-defined]
        result = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        if info is not None:
            self._dsdprof_record_output(info, requests, model_runner_output)
        if not self.running and len(self.waiting) == 0 and self._dsdprof_buffers:  # type: ignore[attr-defined]
            self._dsdprof_flush()
        return result

    def _dsdprof_record_output(self, info, requests, model_runner_output) -> None:
        path, wave, reqs, prefill_tokens, others = info
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        drafted, generated, delivered, finished = [], [], {}, []
        decoding = 0
        for req_id, n_draft, is_decoding, before in reqs:
            if not is_decoding:
                continue
            decoding += 1
            i = index.get(req_id)
            drafted.append(n_draft)
            generated.append(len(sampled[i]) if (sampled and i is not None) else 0)
            request = requests.get(req_id)
            delivered[req_id] = (request.num_output_tokens - before) if request is not None else 0
            finished.append(bool(request is None or request.is_finished()))
        self._dsdprof_buffers.setdefault(path, []).append({
            "wave": wave, "t_end": time.perf_counter(), "scheduled": len(reqs), "decoding": decoding,
            "prefill_tokens": prefill_tokens, "others": others, "drafted": drafted,
            "generated": generated, "delivered": delivered, "finished": finished,
        })

    def _dsdprof_flush(self) -> None:
        for path, records in self._dsdprof_buffers.items():
            with open(path, "a") as fh:
                fh.write(json.dumps(records) + "\n")
        self._dsdprof_buffers = {}


class TracingScheduler(_DsdprofMixin, Scheduler):
    """vLLM's synchronous scheduler with dsdprof's K, wave gate and step trace."""


class TracingAsyncScheduler(_DsdprofMixin, AsyncScheduler):
    """vLLM's async scheduler (its default on GPU where supported) with the same additions."""


def class_for_config(scheduler_config, sync_cls: type, async_cls: type) -> type:
    """``async_cls`` when vLLM resolved ``async_scheduling`` on for this engine, else ``sync_cls``."""
    return async_cls if getattr(scheduler_config, "async_scheduling", False) else sync_cls


def build_for_config(sync_cls: type, async_cls: type, args: tuple, kwargs: dict):
    """Instantiate the class matching the ``vllm_config`` vLLM passes to ``scheduler_cls``."""
    vllm_config = kwargs.get("vllm_config") if "vllm_config" in kwargs else args[0]
    return class_for_config(vllm_config.scheduler_config, sync_cls, async_cls)(*args, **kwargs)


def scheduler_class_for(scheduler_config) -> type:
    """The class :func:`make_scheduler` builds for vLLM's resolved scheduler config."""
    return class_for_config(scheduler_config, TracingScheduler, TracingAsyncScheduler)


def make_scheduler(*args, **kwargs):
    """``scheduler_cls`` for vLLM: build the tracing scheduler matching vLLM's own choice."""
    return build_for_config(TracingScheduler, TracingAsyncScheduler, args, kwargs)
