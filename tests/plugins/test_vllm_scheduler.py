"""dsdprof's scheduler follows vLLM's resolved async_scheduling (class selection; the sync path runs
for real in test_vllm_integration.py — vLLM forces async scheduling off on CPU)."""

from types import SimpleNamespace as NS

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from dsdprof.plugins import vllm_profiling as vs  # noqa: E402
from dsdprof.plugins.names import SCHEDULER_QUALNAME  # noqa: E402


def test_class_follows_resolved_async_scheduling():
    assert vs.scheduler_class_for(NS(async_scheduling=True)) is vs.TracingAsyncScheduler
    assert issubclass(vs.TracingAsyncScheduler, AsyncScheduler)
    assert vs.scheduler_class_for(NS(async_scheduling=False)) is vs.TracingScheduler
    assert not issubclass(vs.TracingScheduler, AsyncScheduler) and issubclass(vs.TracingScheduler, Scheduler)
    # our methods come first in both MROs
    for cls in (vs.TracingScheduler, vs.TracingAsyncScheduler):
        assert cls.schedule.__qualname__.startswith("_DsdprofMixin")
        assert cls.update_from_output.__qualname__.startswith("_DsdprofMixin")
        assert cls.has_requests.__qualname__.startswith("_DsdprofMixin")


def test_factory_builds_by_the_config_it_is_given(monkeypatch):
    built = []
    monkeypatch.setattr(vs.TracingAsyncScheduler, "__init__", lambda self, *a, **k: built.append(type(self)))
    monkeypatch.setattr(vs.TracingScheduler, "__init__", lambda self, *a, **k: built.append(type(self)))
    vs.make_scheduler(vllm_config=NS(scheduler_config=NS(async_scheduling=True)))
    vs.make_scheduler(vllm_config=NS(scheduler_config=NS(async_scheduling=False)))
    assert built == [vs.TracingAsyncScheduler, vs.TracingScheduler]
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert resolve_obj_by_qualname(SCHEDULER_QUALNAME) is vs.make_scheduler
