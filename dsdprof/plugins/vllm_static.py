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

from dsdprof.plugins.serving import ServingAsyncScheduler, ServingScheduler
from dsdprof.plugins.vllm_profiling import scheduler_pair


class StaticScheduler(ServingScheduler):
    """vLLM's synchronous scheduler + dsdprof's metrics."""


class StaticAsyncScheduler(ServingAsyncScheduler):
    """vLLM's async scheduler + dsdprof's metrics."""


# the static scheduler with metrics matching vLLM's async choice (engines.vllm_static.make_scheduler)
scheduler_class_for, make_scheduler = scheduler_pair(StaticScheduler, StaticAsyncScheduler)
