"""Public path of the static scheduler with metrics:
``scheduler_cls = "dsdprof.engines.vllm_static.make_scheduler"``.

Re-exports :mod:`dsdprof.plugins.vllm_static`, where the code lives."""

from dsdprof.plugins.vllm_static import (  # noqa: F401 - re-exports
    StaticAsyncScheduler,
    StaticScheduler,
    make_scheduler,
    scheduler_class_for,
)
