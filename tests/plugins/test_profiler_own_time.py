"""The profiler's own time is kept out of ITL (issue 30, part 5), shown on vLLM's real schedulers
with a fake clock: the model (the fake runner) takes exactly 10 ms per step, dsdprof's own code is
made to cost a known number of fake milliseconds per call, vLLM's own code costs none. Under the
synchronous scheduler every step's ``t_end`` difference must be the model's 10 ms, to the float;
under async scheduling ``t_end`` keeps the own time (it overlaps the GPU's step there) and ``t_own``
must account for it exactly. The wall-clock residue is measured by
``benchmarks/bench_scheduler_overhead.py`` (``in ITL``)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from dsdprof.measure.vllm.trace import read_trace  # noqa: E402
from dsdprof.plugins import vllm_profiling as vs  # noqa: E402
from tests.vllm_fakes import FakeRunner, drive, make_request, make_scheduler, vllm_config  # noqa: E402

TOKEN = "o" * 32
MODEL_S = 0.010
# dsdprof methods made slow (fake seconds per call); each runs in every traced step or request
SLOW = {"_dsdprof_k_source": 0.004, "_dsdprof_record_schedule": 0.002, "_dsdprof_before": 0.003,
        "_dsdprof_record_output": 0.005, "_dsdprof_forget": 0.0005}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.model_s = 0.0  # of which the model's

    def perf_counter(self) -> float:  # the profiling module's ``time``
        return self.now


@pytest.fixture
def clock(tmp_path, monkeypatch):
    monkeypatch.setenv("DSDPROF_RUN_TOKEN", TOKEN)
    monkeypatch.setenv("DSDPROF_TRACE_DIR", str(tmp_path))
    c = Clock()
    monkeypatch.setattr(vs, "time", c)
    for name, cost in SLOW.items():
        real = getattr(vs._DsdprofMixin, name)

        def slow(self, *args, _real=real, _cost=cost):
            c.now += _cost
            return _real(self, *args)

        monkeypatch.setattr(vs._DsdprofMixin, name, slow)
    real_parse = vs.parse_keys

    def slow_parse(*args):
        c.now += 0.001
        return real_parse(*args)

    monkeypatch.setattr(vs, "parse_keys", slow_parse)
    return c


class TimedRunner(FakeRunner):
    """The fake model runner, taking exactly ``MODEL_S`` of the fake clock per step."""

    def __init__(self, clock: Clock, accept) -> None:
        super().__init__(accept)
        self.fake = clock

    def execute(self, so):
        if so.total_num_scheduled_tokens > 0:  # an empty step runs no model
            self.fake.now += MODEL_S
            self.fake.model_s += MODEL_S
        return super().execute(so)


def run(tmp_path, clock, mode: str, batch_size: int = 4, k: int = 3):
    cls = vs.TracingAsyncScheduler if mode == "async" else vs.TracingScheduler
    sched = make_scheduler(cls, vllm_config(5, 8))
    for w in range(2):
        for i in range(batch_size):
            extra = {"dsdprof_run": TOKEN, "dsdprof_wave_size": batch_size, "dsdprof_trace": f"own-{mode}",
                     "dsdprof_wave": w, "dsdprof_num_spec_tokens": k}
            sched.add_request(make_request(f"w{w}-r{i}", 20, 40, extra, eos=False))
        drive(sched, TimedRunner(clock, lambda r, s, d: 1), mode, spec=True)
    steps = read_trace(tmp_path / f"own-{mode}.jsonl")
    own = [r["t_own"] for line in (tmp_path / f"own-{mode}.jsonl").read_text().splitlines()
           for r in json.loads(line)]
    pairs = [(a, b, oa, ob) for a, b, oa, ob in zip(steps, steps[1:], own, own[1:])
             if a.wave == b.wave and b.decoding == batch_size and b.prefill_tokens == 0]
    return pairs, sched


@pytest.mark.parametrize("mode", ["sync", "sync_bq"])
def test_sync_scheduler_step_times_exclude_its_own_work(tmp_path, clock, mode):
    pairs, sched = run(tmp_path, clock, mode)
    assert len(pairs) >= 10
    for a, b, oa, ob in pairs:
        assert ob - oa > 0.010  # dsdprof's own work in this step (the slow methods), recorded ...
        assert b.t_end - a.t_end == pytest.approx(MODEL_S, abs=1e-9)  # ... and out of the interval
    # every fake second is the model's or dsdprof's own (vLLM's code costs none): all of it accounted
    assert clock.now - 1000.0 == pytest.approx(clock.model_s + sched._dsdprof_own, abs=1e-9)


def test_async_scheduler_keeps_its_work_in_t_end_and_accounts_it_in_t_own(tmp_path, clock):
    pairs, _ = run(tmp_path, clock, "async")
    assert len(pairs) >= 10
    for a, b, oa, ob in pairs:
        if any(b.finished):  # the batch queue ran this step's model before the previous update
            continue
        wall = b.t_end - a.t_end
        assert wall > MODEL_S + 0.010  # not subtracted: the work overlaps the GPU's step there
        assert wall - (ob - oa) == pytest.approx(MODEL_S, abs=1e-9)  # the rest is exactly t_own's
