"""An idle engine is paused while another engine of the pool measures (EnginePool.exclusive): a
real process group is stopped and resumed, every span of a paired unit runs with the other engine
paused, and nothing stays paused after an error. No vLLM here."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from dsdprof.measure.engine import MODE_DSD, MODE_VANILLA


def _spin(counter) -> None:
    os.setpgrp()  # as worker_main does: the worker leads its own process group
    while True:  # no lock: a process stopped while holding one would block the test's reads
        counter.value += 1


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.slow  # a spawned process and sleeps
def test_pause_stops_the_worker_process_group_and_resume_continues_it():
    from dsdprof.measure.vllm.pool import EngineWorker

    ctx = mp.get_context("spawn")
    counter = ctx.RawValue("q", 0)
    proc = ctx.Process(target=_spin, args=(counter,), daemon=True)
    proc.start()
    w = EngineWorker.__new__(EngineWorker)  # the handle without a vLLM engine behind it
    w.proc = proc
    try:
        deadline = time.time() + 30
        while counter.value == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert os.getpgid(proc.pid) == proc.pid
        w.pause()
        time.sleep(0.2)
        assert _state(proc.pid) == "T"
        frozen = counter.value
        time.sleep(0.3)
        assert counter.value == frozen  # no progress while paused
        w.resume()
        time.sleep(0.3)
        assert _state(proc.pid) != "T" and counter.value > frozen
    finally:
        os.killpg(proc.pid, 9)
        proc.join(10)
    w.pause()  # a dead worker: no error
    w.resume()


class Recording:
    """A pool worker that records pause/resume into a shared log."""

    def __init__(self, key: str, log: list) -> None:
        self.key, self.log, self.alive, self.paused = key, log, True, False
        self.info: dict = {}

    def pause(self) -> None:
        self.paused = True
        self.log.append(("pause", self.key))

    def resume(self) -> None:
        self.paused = False
        self.log.append(("resume", self.key))

    def stop(self) -> None:
        self.alive = False


def _pool(log: list):
    from dsdprof.measure.vllm.pool import EnginePool

    return EnginePool(lambda key: {"key": key}, None, 1.0,
                      start_worker=lambda c, t: Recording(c.llm_kwargs["key"], log))


def test_exclusive_pauses_the_other_engines_and_always_resumes_them():
    log: list = []
    pool = _pool(log)
    # off unless DSDPROF_PAUSE_IDLE_ENGINES=1 (a kill -9 would leave it stopped)
    assert pool.pause_idle is False
    pool.pause_idle = True
    for key in ("vanilla", "dsd", "fixed-2"):
        pool.get(key)
    with pool.exclusive("dsd") as w:
        assert w.key == "dsd" and not w.paused
        assert {k for k, w in pool._workers.items() if w.paused} == {"vanilla", "fixed-2"}
    assert not any(w.paused for w in pool._workers.values())
    with pytest.raises(RuntimeError):
        with pool.exclusive("vanilla"):
            raise RuntimeError("cell failed")
    assert not any(w.paused for w in pool._workers.values())  # resumed on error too
    log.clear()
    pool.pause_idle = False
    with pool.exclusive("dsd"):
        pass
    assert log == []


def test_every_span_of_a_paired_unit_runs_with_the_idle_engine_paused(tmp_path):
    from dsdprof.measure.runner import run_sweep
    from tests.measure.test_paired_vanilla import FakeWorker, Machine, make_engine

    machine = Machine()
    spec, eng = make_engine(tmp_path, machine)
    seen: list[tuple[str, bool]] = []
    workers: dict[str, Pausable] = {}

    class Pausable(FakeWorker):
        paused = False

        def __init__(self, *a) -> None:
            super().__init__(*a)
            workers[self.key] = self

        def pause(self) -> None:
            self.paused = True

        def resume(self) -> None:
            self.paused = False

        def run(self, req, timeout_s):
            others = [w for k, w in workers.items() if k != self.key]
            seen.append((self.key, bool(others) and all(w.paused for w in others)))
            return super().run(req, timeout_s)

    eng.pool._start = lambda c, t: Pausable(c, t, machine, 1)
    eng.pool.pause_idle = True
    summary = run_sweep(spec, tmp_path / "out", engine=eng)
    assert summary.failed == 0
    assert {k for k, _ in seen} == {MODE_DSD, MODE_VANILLA} and len(seen) == 2 * 4
    assert all(paused for _, paused in seen), seen  # vanilla starts first: every span had the other paused
    assert not any(w.paused for w in workers.values())
