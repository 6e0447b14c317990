"""vLLM schedulers that follow a K carried by the requests (imported inside vLLM's engine core).

vLLM's dynamic-SD mode keeps a dense ``batch_size -> K`` lookup (``dynamic_sd_lookup``) built from
``num_speculative_tokens_per_batch_size``. These subclasses replace that lookup for a step with a
constant K when the scheduled requests carry ``extra_args[K_EXTRA_ARG]`` in their
``SamplingParams``; requests without it get the configured schedule, unchanged. So one engine
started with ``num_speculative_tokens = max K`` serves every K of a sweep, wave by wave.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from dsdprof.engines.vllm_scheduler_names import K_EXTRA_ARG


class _FollowRequestK:
    """Mixin: pick this step's K from the running/waiting requests' ``extra_args``."""

    _dsdprof_table_lookup: list[int] | None
    _dsdprof_const: dict[int, list[int]]

    def _dsdprof_requested_k(self) -> int | None:
        requested = None
        for queue in (self.running, self.waiting):  # type: ignore[attr-defined]
            for request in queue:
                params = request.sampling_params
                extra = params.extra_args if params is not None else None
                if extra and K_EXTRA_ARG in extra:
                    k = int(extra[K_EXTRA_ARG])
                    requested = k if requested is None else max(requested, k)
        return requested

    def schedule(self, *args, **kwargs):  # type: ignore[override]
        if not hasattr(self, "_dsdprof_const"):
            self._dsdprof_table_lookup = self.dynamic_sd_lookup  # type: ignore[attr-defined]
            self._dsdprof_const = {}
        k = self._dsdprof_requested_k()
        if k is None or self._dsdprof_table_lookup is None:
            self.dynamic_sd_lookup = self._dsdprof_table_lookup  # type: ignore[attr-defined]
        else:
            k = max(0, min(k, self.num_spec_tokens))  # type: ignore[attr-defined]
            lookup = self._dsdprof_const.get(k)
            if lookup is None:
                lookup = [k] * len(self._dsdprof_table_lookup)
                self._dsdprof_const[k] = lookup
            self.dynamic_sd_lookup = lookup  # type: ignore[attr-defined]
        return super().schedule(*args, **kwargs)  # type: ignore[misc]


class KFollowingScheduler(_FollowRequestK, Scheduler):
    """Synchronous scheduler following the requests' K."""


class KFollowingAsyncScheduler(_FollowRequestK, AsyncScheduler):
    """Async scheduler (vLLM's default where supported) following the requests' K."""

