"""A pool's engines shut down side by side: vLLM's shutdown takes seconds per engine (its grace
period, then a kill), so :meth:`EnginePool.close` asks every engine to stop before it waits for any."""

from __future__ import annotations

from types import SimpleNamespace

from dsdprof.measure.vllm import pool as pool_mod


class Recorder:
    def __init__(self, key: str, events: list[tuple[str, str]]) -> None:
        self.key, self.events, self.info = key, events, {}

    @property
    def alive(self) -> bool:
        return True

    def request_stop(self) -> None:
        self.events.append(("request_stop", self.key))

    def stop(self) -> None:
        self.events.append(("stop", self.key))


def test_close_asks_every_engine_to_stop_before_waiting_for_one():
    events: list[tuple[str, str]] = []
    def start(config, timeout):
        return Recorder(config.llm_kwargs["key"], events)

    pool = pool_mod.EnginePool(lambda key: {"key": key}, None, 60.0, start_worker=start)
    pool.get("vanilla")
    pool.get("dsd")
    pool.close()
    assert events == [("request_stop", "vanilla"), ("request_stop", "dsd"),
                      ("stop", "vanilla"), ("stop", "dsd")]
    assert pool.keys() == []


def test_a_worker_sends_stop_once_and_waits_only_in_stop():
    w = object.__new__(pool_mod.EngineWorker)  # a process handle without a process
    sent: list[tuple[str]] = []
    joined: list[float] = []
    w.conn = SimpleNamespace(send=sent.append, close=lambda: None)
    w.proc = SimpleNamespace(pid=None, is_alive=lambda: True, join=joined.append)
    w._stop_sent = False
    w.request_stop()
    assert sent == [("stop",)] and joined == []
    w.stop()
    assert sent == [("stop",)] and joined[0] == 60  # not sent twice; the graceful wait, then the kill's


def test_fixed_mode_spawns_vanilla_and_its_first_k_engine_together(monkeypatch):
    """Fixed mode (one engine per K) spawns the baseline and the engine of the first K the cells run
    side by side, as DSD mode does its two engines; nothing else starts early."""
    from dsdprof.config.spec import parse_spec
    from dsdprof.measure.engine import plan_cells
    from dsdprof.measure.vllm import engine as engine_mod

    ks = [0, 3, 1]
    spec = parse_spec({"engine": {"model": "m", "draft_model": "d", "dsd_mode": "fixed"},
                       "sweep": {"batch_sizes": [1, 2], "num_spec_tokens": ks}})
    eng = engine_mod.VllmEngine(spec, start_worker=lambda config, timeout: object())
    spawned: list[str] = []
    monkeypatch.setattr(engine_mod, "_cuda_available", lambda: False)
    monkeypatch.setattr(eng, "check_models", lambda: None)
    monkeypatch.setattr(eng.pool, "prestart", spawned.extend)
    monkeypatch.setattr(eng.pool, "get", lambda key: object())
    assert eng.speculation_mode == "fixed"
    first = next(c for c in plan_cells([1, 2], spec.sweep.num_spec_tokens, 1, "fixed") if c.mode == "fixed")
    assert spawned == ["vanilla", f"fixed-{first.num_spec_tokens}"]
