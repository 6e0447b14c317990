"""Exact accounting under every scheduler vLLM may use, without a GPU: vLLM's real Scheduler and
AsyncScheduler driven in EngineCore's own call orders (step; step_with_batch_queue with a queue of
2, async and sync) by a fake model runner with a known acceptance (tests/vllm_fakes.py)."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm")

from dsdprof.measure.vllm.trace import read_trace, summarize  # noqa: E402
from dsdprof.plugins import vllm_profiling as vs  # noqa: E402
from tests.vllm_fakes import EOS, FakeRunner, drive, make_request, make_scheduler, vllm_config  # noqa: E402

TOKEN = "t" * 32
MODES = ("sync", "async", "sync_bq")


@pytest.fixture
def run_env(tmp_path, monkeypatch):
    monkeypatch.setenv("DSDPROF_RUN_TOKEN", TOKEN)
    monkeypatch.setenv("DSDPROF_TRACE_DIR", str(tmp_path))
    return tmp_path


def run_cell(tmp_path, mode, batch_size, k, accept, output_lens, waves, eos_at=None, spec=True, name="cell"):
    """Waves of ``batch_size`` requests through the tracing scheduler; (summary, received, trace steps,
    runner)."""
    cls = vs.TracingAsyncScheduler if mode == "async" else vs.TracingScheduler
    sched = make_scheduler(cls, vllm_config(5 if spec else 0, 8))
    runner = FakeRunner(accept, eos_at)
    received = {}
    for w in range(waves):
        for i in range(batch_size):
            extra = {"dsdprof_run": TOKEN, "dsdprof_wave_size": batch_size, "dsdprof_trace": name,
                     "dsdprof_wave": w}
            if spec:
                extra["dsdprof_num_spec_tokens"] = k
            rid = f"w{w}-r{i}"
            sched.add_request(make_request(rid, 24 + i,
                                           output_lens[(w * batch_size + i) % len(output_lens)], extra))
        received.update(drive(sched, runner, mode, spec))
    steps = read_trace(tmp_path / f"{name}.jsonl")
    return summarize(steps, batch_size, k if spec else 0, k), received, steps, runner


def delivered_per_request(steps):
    got: dict[str, int] = {}
    for s in steps:
        for r, d in s.delivered.items():
            got[r] = got.get(r, 0) + d
    return got


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch_size", [1, 4, 8])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_fixed_acceptance_is_exact_and_tokens_are_conserved(run_env, mode, batch_size, k):
    a = {1: 1, 3: 2, 5: 3}[k]  # accepted drafts per step
    t, received, steps, _ = run_cell(run_env, mode, batch_size, k, lambda r, s, d: a, [29, 31, 33], waves=2)
    assert t.acceptance_length == pytest.approx(a + 1, rel=1e-12)  # finishing steps unbiased
    assert t.acceptance_per_pos == pytest.approx(tuple(1.0 if i < a else 0.0 for i in range(k)))
    assert t.drafted_per_draft == k and t.steady_steps > 0
    assert delivered_per_request(steps) == {r: len(v) for r, v in received.items()}  # exact, per request
    assert t.all_delivered_tokens == sum(len(v) for v in received.values())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch_size", [4, 8])
def test_requests_with_different_acceptance(run_env, mode, batch_size):
    # request i accepts i % 4 of K=3 every step: a steady step holds all of them
    t, received, steps, _ = run_cell(run_env, mode, batch_size, 3,
                                     lambda r, s, d: int(r.rsplit("r", 1)[1]) % 4, [37], waves=2)
    truth = sum(i % 4 + 1 for i in range(batch_size)) / batch_size
    assert t.acceptance_length == pytest.approx(truth, rel=1e-12)
    assert delivered_per_request(steps) == {r: len(v) for r, v in received.items()}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", [2, 4])
def test_random_chain_acceptance_bs1_matches_the_runner(run_env, mode, k):
    rng = random.Random(7 + k)
    p = 0.7

    def chain(r, s, d):
        n = 0
        while n < d and rng.random() < p:
            n += 1
        return n

    t, received, steps, runner = run_cell(run_env, mode, 1, k, chain, [32, 29, 45], waves=12)
    # the truth: every sample the runner drew for a request that had not finished (vLLM kept it)
    live = _live_samples(runner, received)
    truth = sum(a + 1 for _, _, a in live) / len(live)
    assert t.acceptance_length == pytest.approx(truth, rel=0.005)
    assert delivered_per_request(steps) == {r: len(v) for r, v in received.items()}


def _live_samples(runner, received):
    """Runner samples vLLM used: a request's samples until its received tokens were all produced."""
    used, emitted = [], {}
    for rid, d, a in runner.samples:
        have = emitted.get(rid, 1)  # the prefill token
        if have < len(received[rid]):
            used.append((rid, d, a))
        emitted[rid] = have + a + 1
    return used


@pytest.mark.parametrize("mode", MODES)
def test_eos_stops_are_conserved_and_unbiased(run_env, mode):
    eos_at = {f"w{w}-r{i}": 9 + 5 * i + w for w in range(3) for i in range(4)}
    t, received, steps, _ = run_cell(run_env, mode, 4, 3, lambda r, s, d: 2, [64], waves=3, eos_at=eos_at)
    assert t.acceptance_length == pytest.approx(3.0, rel=1e-12)
    for rid, toks in received.items():
        assert toks[-1] == EOS and len(toks) == eos_at[rid] + 1
    assert delivered_per_request(steps) == {r: len(v) for r, v in received.items()}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch_size", [1, 8])
def test_vanilla_and_k0_are_one_token_per_step(run_env, mode, batch_size):
    t, received, steps, _ = run_cell(run_env, mode, batch_size, 0, lambda r, s, d: 0, [31],
                                     waves=2, spec=False)
    assert t.acceptance_length == 1.0 and t.num_drafts == 0
    t0, received0, steps0, _ = run_cell(run_env, mode, batch_size, 0, lambda r, s, d: 0, [31],
                                        waves=2, name="k0")
    assert t0.acceptance_length == 1.0 and t0.num_drafts == 0
    assert delivered_per_request(steps) == {r: len(v) for r, v in received.items()}
