"""A run's engines spawn side by side (EnginePool.prestart) and are waited for in order.

The process worker is replaced by a recorder with the same constructor and ``wait_started``: what is
checked is the pool's order of spawns and waits, which engine's failure is reported, and that an
engine spawned early but never asked for is killed when the pool closes."""

from __future__ import annotations

import pytest

from dsdprof.measure.vllm import pool as pool_mod


class Recorder:
    events: list[tuple[str, str]] = []
    fail: set[str] = set()

    def __init__(self, config, start_timeout_s, wait=True) -> None:
        self.key = config.llm_kwargs["key"]
        self.info = None
        Recorder.events.append(("spawn", self.key))
        if wait:
            self.wait_started()

    def wait_started(self):
        Recorder.events.append(("wait", self.key))
        if self.key in Recorder.fail:
            raise RuntimeError(f"{self.key} cannot load")
        self.info = {"key": self.key}
        return self

    @property
    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        Recorder.events.append(("stop", self.key))

    def kill(self) -> None:
        Recorder.events.append(("kill", self.key))


@pytest.fixture
def make_pool(monkeypatch):
    Recorder.events, Recorder.fail = [], set()
    monkeypatch.setattr(pool_mod, "EngineWorker", Recorder)
    monkeypatch.setattr(pool_mod, "PRESTART_ENGINES", True)
    return lambda: pool_mod.EnginePool(lambda key: {"key": key}, None, 60.0)


def test_engines_spawn_together_then_are_waited_for_in_order(make_pool):
    pool = make_pool()
    pool.prestart(["vanilla", "dsd"])
    assert Recorder.events == [("spawn", "vanilla"), ("spawn", "dsd")]  # nobody waited yet
    assert pool.get("vanilla").key == "vanilla" and pool.get("dsd").key == "dsd"
    assert Recorder.events[2:] == [("wait", "vanilla"), ("wait", "dsd")]
    pool.prestart(["dsd"])  # already running: not spawned twice
    assert pool.get("dsd").key == "dsd" and Recorder.events.count(("spawn", "dsd")) == 1
    pool.close()
    assert ("stop", "vanilla") in Recorder.events and ("stop", "dsd") in Recorder.events


def test_the_first_engines_failure_is_reported_and_the_other_is_killed_on_close(make_pool):
    Recorder.fail = {"vanilla", "dsd"}
    pool = make_pool()
    pool.prestart(["vanilla", "dsd"])
    with pytest.raises(pool_mod.EngineFailure, match="vanilla cannot load"):
        pool.get("vanilla")
    pool.close()  # the sweep stops at the baseline's failure: dsd was never waited for
    assert ("kill", "dsd") in Recorder.events and ("wait", "dsd") not in Recorder.events
    with pytest.raises(pool_mod.EngineFailure, match="vanilla"):  # remembered, not respawned
        pool.get("vanilla")


def test_off_starts_in_turn_and_a_test_worker_is_never_spawned_early(make_pool, monkeypatch):
    pool = make_pool()
    monkeypatch.setattr(pool_mod, "PRESTART_ENGINES", False)
    pool.prestart(["vanilla", "dsd"])
    assert Recorder.events == []
    monkeypatch.setattr(pool_mod, "PRESTART_ENGINES", True)
    other = pool_mod.EnginePool(lambda key: {"key": key}, None, 60.0, start_worker=lambda c, t: object())
    other.prestart(["vanilla"])
    assert Recorder.events == []
