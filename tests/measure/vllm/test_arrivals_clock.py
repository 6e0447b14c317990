"""The arrivals worker's step clock (``dsdprof.measure.vllm.arrivals.step_records``) is the engine
core's clock at the end of each step's ``update_from_output`` (where ``t_end`` is read), for the
synchronous scheduler (``t_end`` less dsdprof's own time: ``t_own`` added back) and the async one
(``t_end`` not corrected: adding its ``t_own`` put every step later by all of dsdprof's own work
so far, the idle builds' included). On vLLM's real schedulers with the fake clock of
``test_profiler_own_time`` (vLLM's code costs nothing, dsdprof's per-request methods fake time)."""

from __future__ import annotations

import types

import pytest

pytest.importorskip("vllm")

from dsdprof.measure.vllm.arrivals import own_subtracted, read_records, step_records  # noqa: E402
from tests.plugins.test_profiler_own_time import (  # noqa: E402,F401  (fixtures)
    TimedRunner,
    add_wave,
    clock,
    run_env,
    scheduler,
)
from tests.vllm_fakes import drive  # noqa: E402


def vllm_update(sched):
    """The first class after dsdprof's mixins in ``sched``'s MRO that defines ``update_from_output``."""
    for cls in type(sched).__mro__:
        if cls.__module__.startswith("vllm.") and "update_from_output" in cls.__dict__:
            return cls
    raise AssertionError("no vLLM update_from_output")


@pytest.mark.parametrize("mode", ["sync", "async", "sync_bq"])
def test_step_clock_is_the_engine_clock_at_each_update(run_env, clock, monkeypatch, mode):  # noqa: F811
    sched = scheduler(mode, defer=True)
    ends: list[float] = []
    base = vllm_update(sched)
    real = base.update_from_output

    def timed(self, so, mro):
        out = real(self, so, mro)
        ends.append(clock.now)  # vLLM's code costs no fake time: this is the t_end read right after
        return out

    monkeypatch.setattr(base, "update_from_output", timed)
    for w in range(3):
        add_wave(sched, w, 4, f"clock-{mode}", lambda w, i: 12 + 3 * i, eos=True)
        drive(sched, TimedRunner(clock, lambda r, s, d: d // 2), mode, spec=True)
    config = types.SimpleNamespace(async_scheduling=mode == "async")
    subtracted = own_subtracted(config)
    assert subtracted is (mode != "async")
    records = read_records(str(run_env / f"clock-{mode}.jsonl"))
    assert len(records) > 20
    steps = step_records(records, 1000.0, subtracted)
    for s in steps:
        assert min(abs(1000.0 + s.t_end - e) for e in ends) < 1e-9, s
    assert [s.t_end for s in steps] == sorted(s.t_end for s in steps)
    # the other reading is off once dsdprof has done any work (here: every idle build after wave 0)
    wrong = step_records(records, 1000.0, not subtracted)
    assert any(min(abs(1000.0 + s.t_end - e) for e in ends) > 1e-4 for s in wrong)
