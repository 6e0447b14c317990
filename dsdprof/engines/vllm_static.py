"""Public path of the static scheduler with metrics:
``scheduler_cls = "dsdprof.engines.vllm_static.make_scheduler"`` (docs/vllm-internals.md).

The code lives in :mod:`dsdprof.plugins.vllm_static`; only the documented name is re-exported."""

from dsdprof.plugins.vllm_static import make_scheduler

__all__ = ["make_scheduler"]
