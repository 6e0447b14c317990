"""Public path of the adaptive serving plugin:
``scheduler_cls = "dsdprof.engines.vllm_adaptive.make_scheduler"`` (docs/vllm-internals.md).

The code lives in :mod:`dsdprof.plugins.vllm_adaptive`; only the documented name is re-exported."""

from dsdprof.plugins.vllm_adaptive import make_scheduler

__all__ = ["make_scheduler"]
