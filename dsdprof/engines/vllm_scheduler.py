"""Public path of the profiling scheduler: ``scheduler_cls = "dsdprof.engines.vllm_scheduler.make_scheduler"``.

Re-exports :mod:`dsdprof.measure.vllm.scheduler`, where the code lives."""

from dsdprof.measure.vllm.scheduler import (  # noqa: F401 - re-exports
    TracingAsyncScheduler, TracingScheduler, make_scheduler, scheduler_class_for,
)
