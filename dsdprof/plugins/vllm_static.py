"""vLLM plugin: the table's static schedule, served by vLLM's own scheduler, with dsdprof's metrics.

``dsdprof serve TABLE`` (without ``--adaptive``) starts vLLM with ``scheduler_cls =
"dsdprof.engines.vllm_static.make_scheduler"``: vLLM's ``Scheduler`` (or ``AsyncScheduler``, by
the ``async_scheduling`` vLLM resolved) in dynamic-SD mode on the table's
``num_speculative_tokens_per_batch_size`` -- K is vLLM's own lookup, nothing of dsdprof decides it
-- as :class:`dsdprof.plugins.serving.ServingScheduler` with no K part and its metrics part
(:class:`~dsdprof.plugins.metrics.StepMetrics`): the K served per batch-size bucket, steps at K=0,
acceptance per position, ignored ``dsdprof_*`` request keys and the silent no-op alarm on vLLM's
``/metrics`` (docs/observability.md). Every dsdprof key of a request is ignored (and counted), even
in an engine a dsdprof run started. With metrics off (``DSDPROF_METRICS=0``) each of its methods
calls vLLM's straight away.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsdprof.plugins.serving import ServingAsyncScheduler, ServingScheduler
from dsdprof.plugins.vllm_profiling import build_for_config, class_for_config

if TYPE_CHECKING:
    from vllm.config import SchedulerConfig


class StaticScheduler(ServingScheduler):
    """vLLM's synchronous scheduler + dsdprof's metrics."""


class StaticAsyncScheduler(ServingAsyncScheduler):
    """vLLM's async scheduler + dsdprof's metrics."""


def scheduler_class_for(scheduler_config: SchedulerConfig) -> type:
    """The class :func:`make_scheduler` builds for vLLM's resolved scheduler config."""
    return class_for_config(scheduler_config, StaticScheduler, StaticAsyncScheduler)


def make_scheduler(*args: object, **kwargs: object) -> ServingScheduler:
    """``scheduler_cls`` for vLLM: the static scheduler with metrics, matching vLLM's async choice."""
    return build_for_config(StaticScheduler, StaticAsyncScheduler, args, kwargs)
