"""Public path of the profiling scheduler:
``scheduler_cls = "dsdprof.engines.vllm_scheduler.make_scheduler"``.

Re-exports :mod:`dsdprof.plugins.vllm_profiling`, where the code lives."""

from dsdprof.plugins.vllm_profiling import (  # noqa: F401 - re-exports
    TracingAsyncScheduler,
    TracingScheduler,
    make_scheduler,
    scheduler_class_for,
)
