"""Public path of the adaptive serving plugin:
``scheduler_cls = "dsdprof.engines.vllm_adaptive.make_scheduler"``.

Re-exports :mod:`dsdprof.plugins.vllm_adaptive`, where the code lives."""

from dsdprof.plugins.vllm_adaptive import *  # noqa: F401,F403 - re-exports
from dsdprof.plugins.vllm_adaptive import make_scheduler  # noqa: F401
