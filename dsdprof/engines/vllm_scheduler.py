"""Public path of the profiling scheduler:
``scheduler_cls = "dsdprof.engines.vllm_scheduler.make_scheduler"`` (docs/vllm-internals.md).

The code lives in :mod:`dsdprof.plugins.vllm_profiling`; only the documented name is re-exported."""

from dsdprof.plugins.vllm_profiling import make_scheduler

__all__ = ["make_scheduler"]
