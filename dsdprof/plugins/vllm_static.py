"""vLLM plugin: the table's static schedule, served by vLLM's own scheduler, with dsdprof's metrics.

``dsdprof serve TABLE`` (without ``--adaptive``) starts vLLM with ``scheduler_cls =
"dsdprof.engines.vllm_static.make_scheduler"``: vLLM's ``Scheduler`` (or ``AsyncScheduler``, by
the ``async_scheduling`` vLLM resolved) in dynamic-SD mode on the table's
``num_speculative_tokens_per_batch_size`` -- K is vLLM's own lookup, nothing of dsdprof decides it
-- plus :class:`~dsdprof.plugins.metrics.MetricsMixin`: the K served per batch-size bucket, steps
at K=0, acceptance per position, ignored ``dsdprof_*`` request keys and the silent no-op alarm on
vLLM's ``/metrics`` (docs/observability.md). With metrics off (``DSDPROF_METRICS=0``) it is vLLM's
scheduler with vLLM's methods bound on the instance.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from dsdprof.plugins.metrics import MetricsMixin
from dsdprof.plugins.vllm_profiling import build_for_config, class_for_config


class StaticScheduler(MetricsMixin, Scheduler):
    """vLLM's synchronous scheduler + dsdprof's metrics."""


class StaticAsyncScheduler(MetricsMixin, AsyncScheduler):
    """vLLM's async scheduler + dsdprof's metrics."""


def scheduler_class_for(scheduler_config) -> type:
    """The class :func:`make_scheduler` builds for vLLM's resolved scheduler config."""
    return class_for_config(scheduler_config, StaticScheduler, StaticAsyncScheduler)


def make_scheduler(*args, **kwargs):
    """``scheduler_cls`` for vLLM: the static scheduler with metrics, matching vLLM's async choice."""
    return build_for_config(StaticScheduler, StaticAsyncScheduler, args, kwargs)
