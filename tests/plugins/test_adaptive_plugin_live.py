"""The adaptive vLLM scheduler feeds step times and serves exploration probes (fake outputs, no engine)."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace as NS

import pytest

from dsdprof.serve.adaptive import PROBE_STEPS
from dsdprof.serve.settings import adaptive_additional_config
from tests.plugins.test_adaptive_plugin import serving_setup
from tests.support.simulate import synthetic_table

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
MAX_BS = 8
STEP_S = {b: {k: 0.030 + 0.003 * k + 0.001 * b * k for k in range(5)} for b in (1, 2, 4, 8)}


def scheduler(tmp_path, options=None):
    from dsdprof.plugins import vllm_adaptive as va

    path = tmp_path / "table.json"
    path.write_text(json.dumps(synthetic_table(STEP_S, (0.8,) * 4)))
    s = va.AdaptiveScheduler.__new__(va.AdaptiveScheduler)
    s.num_spec_tokens = 4
    s.dynamic_sd_lookup = [0] + [4] * MAX_BS
    s.running, s.waiting, s.requests = [], [], {}
    return serving_setup(s, adaptive_additional_config(str(path), options or {}))


def output(n: int, k: int, prefill: int = 0):
    """A scheduler output of n decoding requests verifying and drafting k, plus prefill tokens."""
    ids = [f"r{i}" for i in range(n)]
    return NS(num_scheduled_tokens={r: 1 + k for r in ids}, total_num_scheduled_tokens=n * (1 + k) + prefill,
              num_spec_tokens_to_schedule=k, scheduled_spec_decode_tokens={})


def test_pure_steps_carry_their_duration_and_others_none(tmp_path, monkeypatch):
    from dsdprof.plugins import vllm_adaptive as va

    s = scheduler(tmp_path)
    clock = iter([10.0, 10.2, 10.5, 11.0, 11.4, 20.0, 20.1])
    monkeypatch.setattr(va, "_clock", lambda: next(clock))
    got = [s.dsdprof_k.step_time(output(4, 2)),  # the first step: no interval yet
           s.dsdprof_k.step_time(output(4, 2)),  # pure: 0.2 s at (4, 2)
           s.dsdprof_k.step_time(output(4, 2, prefill=37)),  # a prefill rides along: no time
           s.dsdprof_k.step_time(output(3, 1)),  # pure: 0.5 s at (3, 1)
           s.dsdprof_k.step_time(output(0, 0)),  # nothing scheduled: the next interval is not a step
           s.dsdprof_k.step_time(output(2, 3)),
           s.dsdprof_k.step_time(output(2, 3))]  # pure: 0.1 s at (2, 3)
    assert got == [(4, 2, None), (4, 2, pytest.approx(0.2)), (4, 2, None), (3, 1, pytest.approx(0.5)),
                   (0, None, None), (2, 3, None), (2, 3, pytest.approx(0.1))]


def engine_step(s, out):
    """``update_from_output`` of a step whose outputs carry no stats (vLLM's part stubbed)."""
    s._update = lambda so, mro: {}
    return s.update_from_output(out, None)


def test_step_times_are_queued_and_fed_in_order_every_rebuild_every_steps(tmp_path, monkeypatch):
    from dsdprof.plugins import vllm_adaptive as va

    s = scheduler(tmp_path, {"explore_every": 0})
    sel = s.dsdprof_k.selector
    calls = []
    real = sel.observe_step
    monkeypatch.setattr(type(sel), "observe_step", lambda self, *a: calls.append(a) or real(*a))
    t = [0.0]

    def tick():
        t[0] += 0.05
        return t[0]

    monkeypatch.setattr(va, "_clock", tick)
    every = sel.rebuild_every
    engine_step(s, output(4, 2))  # no interval yet: nothing queued
    for i in range(every - 1):
        engine_step(s, output(4, 2) if i % 2 else output(2, 0))
    assert calls == [] and len(s.dsdprof_k.queue) == every - 1  # nothing fed yet: an append per step
    engine_step(s, output(4, 2, prefill=3))  # no time, no drafts: not queued
    engine_step(s, output(1, 1))  # pure on its own (one request, K=1): timed; the queue is full: fed
    assert len(calls) == every and s.dsdprof_k.queue == []
    assert [c[:2] for c in calls] == [(2, 0) if i % 2 == 0 else (4, 2) for i in range(every - 1)] + [(1, 1)]
    assert all(c[2] == pytest.approx(0.05) for c in calls) and sel.rejected == 0


def test_live_step_times_reach_the_estimate(tmp_path, monkeypatch):
    from dsdprof.plugins import vllm_adaptive as va

    s = scheduler(tmp_path, {"explore_every": 0})
    t = [0.0]

    def tick():
        t[0] += 0.09  # 3x the table's step time
        return t[0]

    monkeypatch.setattr(va, "_clock", tick)
    for _ in range(300):
        engine_step(s, output(4, s.dynamic_sd_lookup[4]))
    s.dsdprof_k.selector.rebuild()
    k = s.dsdprof_k.selector.ks[4]
    assert s.dsdprof_k.selector.step_time(4, k) == pytest.approx(0.09, rel=0.02)


def test_exploration_probes_unforced_steps_only(tmp_path):
    from dsdprof.plugins.names import K_EXTRA_ARG

    s = scheduler(tmp_path)
    table = s._dsdprof_table_lookup
    served = []
    for _ in range(512):
        s._dsdprof_apply_k()
        served.append(s.dynamic_sd_lookup)
    probes = [lk for lk in served if lk is not table]
    assert len(probes) == 2 * PROBE_STEPS and all(len(p) == MAX_BS + 1 for p in probes)
    assert all(p[b] != table[b] for p in probes for b in range(1, MAX_BS + 1))  # a neighbouring K everywhere
    assert all(abs(p[b] - table[b]) == 1 for p in probes for b in range(1, MAX_BS + 1))
    s.running = [NS(sampling_params=NS(extra_args={K_EXTRA_ARG: 2}))]  # a client's K: ignored
    for _ in range(512):
        s._dsdprof_apply_k()
        assert s.dynamic_sd_lookup != [2] * (MAX_BS + 1)
    never = scheduler(tmp_path, {"explore_every": 0})
    for _ in range(600):
        never._dsdprof_apply_k()
        assert never.dynamic_sd_lookup is never._dsdprof_table_lookup


def test_a_k_change_from_step_times_alone_is_served_at_the_feed(tmp_path, monkeypatch):
    """A step without drafts (K=0 served) never reaches the acceptance path; when its step time
    moves K, the new lookup is served once the queue is fed."""
    s = scheduler(tmp_path)
    sel = s.dsdprof_k.selector
    before = list(s.dynamic_sd_lookup)

    def observe_step(self, n, k, seconds):  # as if this step's time tipped a rebuild
        self._k = {b: 0 for b in self._k}
        self._swap()
        return True

    monkeypatch.setattr(type(sel), "observe_step", observe_step)
    s.dsdprof_k.queue.append((None, 4, 0, 0.03, 0))
    assert s.dsdprof_k.feed() is True
    assert s.dsdprof_k.version == 1 and s.dynamic_sd_lookup == [0] * (MAX_BS + 1) != before
    assert s._dsdprof_table_lookup is s.dynamic_sd_lookup


def _serve_steps(s, monkeypatch, steps, slow, seed=0):
    """``steps`` engine steps at BS 4, each the K the plugin serves (probes included), timed by a
    clock that runs the table's step time of that K times ``slow(i, k)``, with vLLM's
    ``SpecDecodingStats`` of 4 drafts accepted as profiled (chain 0.8); the served Ks."""
    import random

    from dsdprof.plugins import vllm_adaptive as va

    rng, t, served = random.Random(seed), [0.0], []
    monkeypatch.setattr(va, "_clock", lambda: t[0])
    for i in range(steps):
        s._dsdprof_apply_k()
        k = s.dynamic_sd_lookup[4]
        t[0] += STEP_S[4][k] * slow(i, k)
        accepted, alive = [], 4
        for _ in range(k):
            alive = sum(rng.random() < 0.8 for _ in range(alive))
            accepted.append(alive)
        stats = NS(num_drafts=4, num_draft_tokens_per_pos=[4] * k, num_accepted_tokens_per_pos=accepted)
        s._update = lambda so, mro, st=stats: {0: NS(scheduler_stats=NS(spec_decoding_stats=st))}
        s.update_from_output(output(4, k), None)
        served.append(s._dsdprof_table_lookup[4])
    return served


def test_a_slowdown_common_to_every_k_moves_no_k_but_a_k_specific_one_does(tmp_path, monkeypatch):
    """Issue 31 through the plugin's own step clock: every K 1.5x slower for 1000 of 2500 steps
    (probes to the neighbouring Ks included) changes no K at BS 4, where K=3 (the table's) leads
    K=4 by under 1 %; the same 1.5x on K=3 alone moves it."""
    s = scheduler(tmp_path)
    kt = s.dsdprof_k.selector.ks[4]
    served = _serve_steps(s, monkeypatch, 2500, lambda i, k: 1.5 if 700 <= i < 1700 else 1.0)
    assert set(served) == {kt}, sorted(set(served))
    s = scheduler(tmp_path)
    served = _serve_steps(s, monkeypatch, 2500, lambda i, k: 1.5 if k == kt and i >= 700 else 1.0)
    assert served[-1] != kt, sorted(set(served))
