"""The adaptive vLLM scheduler's wiring, on fake scheduler outputs (no engine): settings, qualname,
per-position aggregation into AdaptiveKSelector.observe, the lookup swap, forced K.
tests/engines/test_vllm_adaptive.py runs it in a real vLLM engine."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace as NS

import pytest

from dsdprof.formats.ktable import ranges_from_points
from dsdprof.serve.settings import (
    ADAPTIVE_CONFIG_KEY,
    ADAPTIVE_SCHEDULER_QUALNAME,
    ADAPTIVE_TABLE_ENV,
    AdaptiveSettingError,
    adaptive_additional_config,
    resolve_settings,
)

PROFILED_ACCEPTANCE = (0.99, 0.98, 0.97, 0.96)  # as if the draft were the target
ITL_FACTOR = {1: (1.0, 1.1, 1.55, 2.0, 2.6), 2: (1.0, 1.1, 1.55, 2.0, 2.6), 4: (1.0, 1.35, 1.9, 2.6, 3.4)}


def shifted_table(base_itl_s: float = 0.04, provenance: dict | None = None) -> dict:
    """A v2 table profiled at near-perfect acceptance: K=3 at BS 1-2, K=2 from BS 3 (K=4 measured,
    never chosen). At the toy pair's real acceptance (~0.85, 0.73, 0.6) the re-derived K at BS 1-2
    is 1; at a chain acceptance of 0.6 it is 1 everywhere."""
    p0 = PROFILED_ACCEPTANCE
    cells, points = [], []
    for b, factors in ITL_FACTOR.items():
        g = {}
        for k, f in enumerate(factors):
            al = 1.0 + sum(p0[:k])
            itl = base_itl_s * b ** 0.5 * f
            g[k] = al / itl
            cells.append({"batch_size": b, "k": k, "itl_s": itl, "acceptance_length": al, "goodput": al / itl,
                          "acceptance_per_pos": list(p0[:k])})
        best = max(g.values())
        points.append((b, min(k for k, v in g.items() if v >= best * 0.98)))
    assert [k for _, k in points] == [3, 3, 2]
    return {"schema": "dsdprof.ktable/v2", "num_speculative_tokens": 3, "tolerance": 0.02,
            "ranges": ranges_from_points(points), "points": [{"batch_size": b, "k": k} for b, k in points],
            "cells": cells, "acceptance_per_pos": list(p0), "provenance": provenance or {}}


# ---------------------------------------------------------------- settings (no vLLM needed)

def test_settings_from_additional_config_then_environment(tmp_path):
    cfg = adaptive_additional_config("/t.json", {"half_life": 64, "allowed_ks": (1, 3)})
    assert cfg == {ADAPTIVE_CONFIG_KEY: {"table": "/t.json", "half_life": 64, "allowed_ks": [1, 3]}}
    json.dumps(cfg)  # vLLM hashes additional_config as JSON
    s = resolve_settings(cfg, environ={ADAPTIVE_TABLE_ENV: "/other.json"})
    assert s.table_path == "/t.json" and dict(s.options) == {"half_life": 64, "allowed_ks": [1, 3]}
    s = resolve_settings({}, environ={ADAPTIVE_TABLE_ENV: "/other.json"})
    assert (s.table_path, s.options, s.source) == ("/other.json", (), ADAPTIVE_TABLE_ENV)
    with pytest.raises(AdaptiveSettingError, match=ADAPTIVE_TABLE_ENV):
        resolve_settings({}, environ={})
    with pytest.raises(AdaptiveSettingError, match=r"dsdprof_adaptive\.halflife=3: unknown option"):
        resolve_settings({ADAPTIVE_CONFIG_KEY: {"table": "/t.json", "halflife": 3}}, environ={})
    with pytest.raises(AdaptiveSettingError, match=r"dsdprof_adaptive\.table=None"):
        resolve_settings({ADAPTIVE_CONFIG_KEY: {"margin": 0.1}}, environ={})
    with pytest.raises(AdaptiveSettingError, match="must be an object"):
        resolve_settings({ADAPTIVE_CONFIG_KEY: "/t.json"}, environ={})
    with pytest.raises(AdaptiveSettingError, match="allowed_ks=3"):
        adaptive_additional_config("/t.json", {"allowed_ks": 3})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(shifted_table()))
    settings = resolve_settings(adaptive_additional_config(str(path), {"margin": 0.05, "probe_every": 7}),
                                environ={})
    assert settings.probe_every == 7 and dict(settings.options) == {"margin": 0.05}
    assert resolve_settings(adaptive_additional_config(str(path)), environ={}).probe_every == 1024
    sel = settings.selector(max_k=2)
    assert sel.margin == 0.05 and sel.max_k == 2
    for bad in (-1, 1.5, True):
        with pytest.raises(AdaptiveSettingError, match="probe_every"):
            adaptive_additional_config(str(path), {"probe_every": bad})


# ---------------------------------------------------------------- the scheduler (vLLM classes, no engine)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed")
if HAS_VLLM:
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    from dsdprof.plugins import vllm_adaptive as va
    from dsdprof.plugins import vllm_profiling as vs
    from dsdprof.plugins.serving import ServingScheduler, serving_class

MAX_BS = 8


@needs_vllm
def test_qualname_resolves_to_the_factory_which_follows_async_scheduling(monkeypatch):
    assert resolve_obj_by_qualname(ADAPTIVE_SCHEDULER_QUALNAME) is va.make_scheduler
    assert va.scheduler_class_for(NS(async_scheduling=True)) is va.AdaptiveAsyncScheduler
    assert va.scheduler_class_for(NS(async_scheduling=False)) is va.AdaptiveScheduler
    assert issubclass(va.AdaptiveAsyncScheduler, vs.TracingAsyncScheduler)
    assert issubclass(va.AdaptiveAsyncScheduler, AsyncScheduler)
    assert issubclass(va.AdaptiveScheduler,
                      vs.TracingScheduler) and not issubclass(va.AdaptiveScheduler, AsyncScheduler)
    for cls in (va.AdaptiveScheduler, va.AdaptiveAsyncScheduler):
        # every vLLM method dsdprof's serving engines override: in one class, which calls its parts
        for name in ("has_requests", "add_request", "schedule", "update_from_output",
                     "update_draft_token_ids", "update_draft_token_ids_in_output"):
            assert getattr(cls, name).__qualname__ == f"ServingScheduler.{name}"
        assert "make_spec_decoding_stats" not in vars(ServingScheduler)  # vLLM's, unless the K part counts
        assert cls.k_part is va.AdaptiveK
    built = []
    monkeypatch.setattr(va.AdaptiveAsyncScheduler, "__init__", lambda self, *a, **k: built.append(type(self)))
    monkeypatch.setattr(va.AdaptiveScheduler, "__init__", lambda self, *a, **k: built.append(type(self)))
    va.make_scheduler(vllm_config=NS(scheduler_config=NS(async_scheduling=True)))
    va.make_scheduler(NS(scheduler_config=NS(async_scheduling=False)))
    assert built == [va.AdaptiveAsyncScheduler, va.AdaptiveScheduler]


def serving_setup(s, additional_config):
    """The tracer's state and the serving scheduler's parts (metrics off) on a scheduler built
    without vLLM's __init__ (its state set by the caller)."""
    s._dsdprof_init(environ={})
    s._serving_setup(additional_config, environ={"DSDPROF_METRICS": "0"})
    return s


def fake_scheduler(tmp_path, num_spec_tokens=4, options=None, cls=None, static_k=3):
    """The scheduler's own state, as vLLM's __init__ leaves it in dynamic-SD mode, then our setup."""
    path = tmp_path / "table.json"
    path.write_text(json.dumps(shifted_table()))
    cls = cls or va.AdaptiveScheduler
    s = cls.__new__(cls)
    s.num_spec_tokens = num_spec_tokens
    s.dynamic_sd_lookup = [0] + [static_k] * MAX_BS  # vLLM's lookup of the configured schedule
    s.running, s.waiting, s.requests = [], [], {}
    opts = {"prior_weight": 4, "half_life": 64, "rebuild_every": 1}
    opts.update(options or {})
    return serving_setup(s, adaptive_additional_config(str(path), opts))


def step(drafted: dict[str, int], sampled: dict[str, int], num_spec_tokens: int = 4):
    """vLLM's SpecDecodingStats of one step, built by vLLM's rules from draft lengths and
    sampled-token counts (a request without a draft or without a sample is not a draft)."""
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    stats = SpecDecodingStats.new(num_spec_tokens)
    for r, d in drafted.items():
        g = sampled.get(r, 0)
        if d and g:
            stats.observe_draft(num_draft_tokens=d, num_accepted_tokens=max(g - 1, 0))
    return stats


def spy(sched):
    calls = []
    real = sched.dsdprof_k.selector.observe

    def observe(n, acc, drafted=None, batch_size=None):
        calls.append((n, list(acc), None if drafted is None else list(drafted)))
        return real(n, acc, drafted, batch_size=batch_size)

    sel = sched.dsdprof_k.selector
    sched.dsdprof_k.selector = NS(observe=observe, version=sel.version, real=sel,
                                observe_step=sel.observe_step, explore=sel.explore)
    return calls


def force(sched, k):
    """A request of a dsdprof run (secret checked at arrival) that forces K."""
    sched._dsdprof_reqs = {"forced": vs.Profiled(k, 0, "", 0)}
    sched.requests = {"forced": NS(is_finished=lambda: False)}


@needs_vllm
def test_setup_serves_the_table_lookup_with_vllm_semantics(tmp_path):
    s = fake_scheduler(tmp_path)
    sel = s.dsdprof_k.selector
    assert sel.max_k == 4 and sel.ks == {1: 3, 2: 3, 4: 2}
    assert s.dynamic_sd_lookup == [0, 3, 3, 2, 2, 2, 2, 2, 2]
    assert s._dsdprof_table_lookup is s.dynamic_sd_lookup  # the tracing mixin's unforced schedule
    # the same dense list vLLM builds for these ranges and this num_speculative_tokens
    ranges = [list(r) for r in sel.ranges]
    assert s.dynamic_sd_lookup == build_dynamic_sd_schedule_lookup(ranges, MAX_BS, 4)
    capped = fake_scheduler(tmp_path, num_spec_tokens=2)
    assert capped.dsdprof_k.selector.max_k == 2 and max(capped.dynamic_sd_lookup) == 2
    with pytest.raises(AdaptiveSettingError, match="dynamic-SD"):
        s2 = va.AdaptiveScheduler.__new__(va.AdaptiveScheduler)
        s2.num_spec_tokens, s2.dynamic_sd_lookup = 3, None
        serving_setup(s2, adaptive_additional_config(str(tmp_path / "table.json")))


@needs_vllm
def test_observe_aggregates_requests_per_position(tmp_path):
    s = fake_scheduler(tmp_path, options={"rebuild_every": 1000})
    calls = spy(s)
    # 4 requests drafting 3: accepted 0, 1, 3, 2 (sampled = accepted + bonus)
    assert not s.dsdprof_k.observe(step({"a": 3, "b": 3, "c": 3, "d": 3}, {"a": 1, "b": 2, "c": 4, "d": 3}))
    assert calls[-1] == (4, [3, 2, 1], None)
    # mixed draft lengths (3 and 1): drafted per position goes along; a prefilling request
    # (no draft) and one missing from the output are skipped
    s.dsdprof_k.observe(step({"a": 3, "b": 1, "z": 2}, {"a": 4, "b": 2, "p": 1}))
    assert calls[-1] == (2, [2, 1, 1], [2, 1, 1])
    # nothing sampled for a drafted request (dropped this step): not a draft
    s.dsdprof_k.observe(step({"a": 2, "b": 2}, {"a": 0, "b": 3}))
    assert calls[-1] == (1, [1, 1], None)
    n = len(calls)
    assert not s.dsdprof_k.observe(step({}, {"a": 1}))  # no drafts scheduled: no call
    assert not s.dsdprof_k.observe(step({"a": 1}, {}))
    assert len(calls) == n


@needs_vllm
def test_without_stats_logging_the_histogram_rebuilds_vllms_own_stats(tmp_path):
    # An engine that logs no stats: the plugin's make_spec_decoding_stats (dsdprof.plugins.spec_count;
    # its appended indices folded after vLLM's loop) counts what vLLM's observe_draft would have,
    # invalid drafts excluded; requests without a draft do not count.
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    s = va.AdaptiveScheduler.__new__(va.AdaptiveScheduler)
    s.log_stats = False
    s.num_spec_tokens, s.dynamic_sd_lookup = 4, [0] + [3] * MAX_BS
    s.running, s.waiting, s.requests = [], [], {}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(shifted_table()))
    serving_setup(s, adaptive_additional_config(str(path)))
    calls = [("a", 3, 0, None), ("b", 3, 3, None), ("c", 1, 1, None), ("d", 0, 0, None),
             ("e", 4, 2, {"e": 2}),
             ("f", 2, 1, {"x": 1}), ("g", 4, 4, None), ("h", 9, 0, None)]  # h: beyond K, never raised
    want = SpecDecodingStats.new(4)
    assert s.make_spec_decoding_stats is s.dsdprof_k.count.counter
    for r, d, a, invalid in calls:
        assert s.make_spec_decoding_stats(None, num_draft_tokens=d, num_accepted_tokens=a,
                                          num_invalid_spec_tokens=invalid, request_id=r) is None
        if d and d < 9:
            want.observe_draft(num_draft_tokens=d - (invalid or {}).get(r, 0), num_accepted_tokens=a)
    assert s.dsdprof_k.count.stats(0, len(s.dsdprof_k.keys)) == want


def _plugin_config(tmp_path, options):
    """A vLLM config (K <= 4, MAX_BS running) serving ``shifted_table()`` through the plugin."""
    import copy

    from tests.vllm_fakes import vllm_config

    path = tmp_path / "table.json"
    path.write_text(json.dumps(shifted_table()))
    config = copy.copy(vllm_config(4, MAX_BS, max_model_len=512))
    config.additional_config = adaptive_additional_config(str(path), options)
    return config


def _hashed_chain(req_id, n, d, accepts):
    """Drafts accepted of ``d`` at request step ``n``: a chain, position ``a`` accepted while
    ``accepts(a, h)`` for a hash ``h`` of (request, step), so every run sees the same acceptance."""
    import zlib

    h, a = zlib.crc32(f"{req_id}:{n}".encode()), 0
    while a < d and accepts(a, h):
        a += 1
    return a


@needs_vllm
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_with_or_without_stats_logging_the_selector_sees_the_same_steps(tmp_path, mode):
    # vLLM's real (Async)Scheduler driven by a fake runner: the selector is fed the same counts
    # step by step whether vLLM builds its SpecDecodingStats (log_stats) or the plugin counts them.
    from tests.vllm_fakes import FakeRunner, drive, make_request, make_scheduler

    config = _plugin_config(tmp_path, {"rebuild_every": 4})

    def accept(req_id, n, d):  # chain acceptance ~0.7 per position, the same in both runs
        return _hashed_chain(req_id, n, d, lambda a, h: (h >> (4 * a)) & 15 < 11)

    seen = {}
    for log_stats in (True, False):
        s = make_scheduler(va.AdaptiveAsyncScheduler if mode == "async" else va.AdaptiveScheduler,
                           config, log_stats)
        calls = spy(s)
        for i in range(MAX_BS + 3):
            s.add_request(make_request(f"r{i}", 20 + i, 25 + 7 * i))
        drive(s, FakeRunner(accept, {"r2": 9}), mode, True)
        seen[log_stats] = calls
    assert seen[True] == seen[False]
    assert sum(c[0] for c in seen[True]) > 100


@needs_vllm
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_queued_steps_serve_the_k_that_feeding_every_step_would(tmp_path, mode, monkeypatch):
    # The plugin feeds the selector every rebuild_every drafted steps; fed at every step instead
    # (_adaptive_every = 1), every step must be scheduled at the same K, swaps included. Both runs
    # must see the same step times: the plugin's clock ticks 50 ms per step (the wall clock would
    # give each run its own times, and the selector learns step times too).
    import itertools

    from tests.vllm_fakes import FakeRunner, drive, make_request, make_scheduler

    config = _plugin_config(tmp_path, {"rebuild_every": 5, "prior_weight": 4, "half_life": 64})

    def accept(req_id, n, d):  # all accepted for 6 steps, then a chain acceptance of ~0.5
        return _hashed_chain(req_id, n, d, lambda a, h: n < 6 or (h >> (4 * a)) & 15 < 8)

    served = {}
    for every in (None, 1):
        ticks = itertools.count()
        monkeypatch.setattr(va, "_clock", lambda ticks=ticks: 0.05 * next(ticks))
        s = make_scheduler(va.AdaptiveAsyncScheduler if mode == "async" else va.AdaptiveScheduler, config)
        if every:
            s.dsdprof_k.every = every
        ks, schedule = [], s.schedule

        def spy_schedule(*a, schedule=schedule, ks=ks):
            out = schedule(*a)
            ks.append(out.num_spec_tokens_to_schedule)
            return out

        s.schedule = spy_schedule
        for i in range(MAX_BS):
            s.add_request(make_request(f"r{i}", 20 + i, 60 + 9 * i))
        drive(s, FakeRunner(accept), mode, True)
        served[every] = (ks, s.dsdprof_k.selector.version)
    assert served[None] == served[1]
    assert served[1][1] >= 1 and len(set(served[1][0])) > 1  # the lookup did move


@needs_vllm
def test_without_a_run_secret_vllms_own_methods_are_called_directly(tmp_path, monkeypatch):
    # The tracer cannot act without a run's secret: each serving method calls vLLM's own directly
    # (bound once at start, in private attributes); nothing is rebound on the instance.
    import copy

    from dsdprof.plugins.vllm_static import StaticScheduler
    from tests.vllm_fakes import make_scheduler, vllm_config

    path = tmp_path / "table.json"
    path.write_text(json.dumps(shifted_table()))
    config = copy.copy(vllm_config(4, MAX_BS, max_model_len=512))
    config.additional_config = adaptive_additional_config(str(path))
    vllm_methods = {"has_requests", "add_request", "schedule", "update_from_output", "update_draft_token_ids",
                    "update_draft_token_ids_in_output", "make_spec_decoding_stats"}
    s = make_scheduler(va.AdaptiveScheduler, config, log_stats=False)
    assert not vllm_methods & set(vars(s))
    for bound, vllm_method in ((s._has, Scheduler.has_requests), (s._add, Scheduler.add_request),
                               (s._schedule, Scheduler.schedule), (s._update, Scheduler.update_from_output)):
        assert bound.__func__ is vllm_method
    assert s.make_spec_decoding_stats is s.dsdprof_k.count.counter  # log_stats off: the K part counts
    assert type(s).__mro__[1] is va.AdaptiveScheduler and type(s).__name__ == "AdaptiveScheduler"
    # untraced, metrics on: has_requests has no part acting in it, so it is vLLM's own function;
    # the rest are the serving scheduler's (metrics / K part act in them)
    assert type(s).has_requests is Scheduler.has_requests
    for name in vllm_methods - {"has_requests", "make_spec_decoding_stats"}:
        assert getattr(type(s), name).__qualname__ == f"ServingScheduler.{name}", name
    monkeypatch.setenv("DSDPROF_METRICS", "0")  # metrics off: vLLM's own drafts and add_request too
    off = make_scheduler(va.AdaptiveScheduler, config, log_stats=False)
    assert off.dsdprof_metrics is None and type(off) is not type(s)
    for name in ("has_requests", "add_request", "update_draft_token_ids", "update_draft_token_ids_in_output"):
        assert getattr(type(off), name) is getattr(Scheduler, name), name
    for name in ("schedule", "update_from_output"):  # the K part acts in them
        assert getattr(type(off), name).__qualname__ == f"ServingScheduler.{name}", name
    static_off = make_scheduler(StaticScheduler, config)  # no part at all: vLLM's own every method
    assert all(getattr(type(static_off), n) is getattr(Scheduler, n) for n in vllm_methods)
    assert isinstance(static_off, StaticScheduler)
    s._serving_setup(config.additional_config)  # set up again: the variant of its own base class
    assert type(s).__mro__[1] is va.AdaptiveScheduler
    monkeypatch.delenv("DSDPROF_METRICS")
    counting = serving_class(va.AdaptiveScheduler, counting=True)  # the counter alone: has_requests ours
    assert counting.has_requests.__qualname__ == "ServingScheduler.has_requests"
    assert make_scheduler(va.AdaptiveScheduler, config).make_spec_decoding_stats.__func__ is (
        Scheduler.make_spec_decoding_stats)
    monkeypatch.setenv("DSDPROF_RUN_TOKEN", "t" * 32)
    run = make_scheduler(va.AdaptiveScheduler, config)
    assert not vllm_methods & set(vars(run))
    assert run._update.__func__ is vs._DsdprofMixin.update_from_output
    assert run._schedule.__func__ is vs._DsdprofMixin.schedule
    assert run._has.__func__ is vs._DsdprofMixin.has_requests
    static = make_scheduler(StaticScheduler, config)  # the static schedule never traces, secret or not
    assert static._update.__func__ is Scheduler.update_from_output and not static._dsdprof_token


@needs_vllm
def test_lookup_follows_live_acceptance_and_is_swapped_only_on_change(tmp_path):
    s = fake_scheduler(tmp_path)
    sel = s.dsdprof_k.selector
    start = s.dynamic_sd_lookup
    ids = [f"r{i}" for i in range(100)]
    # acceptance as profiled (of 100 drafts of 3: positions 1-3 accepted 99, 98, 97): nothing moves
    profiled = {r: 4 if i < 97 else 4 - (i - 96) for i, r in enumerate(ids)}
    for _ in range(20):
        assert not s.dsdprof_k.observe(step({r: 3 for r in ids}, profiled))
    assert s.dynamic_sd_lookup is start and sel.version == 0
    # live acceptance far below the profile: a chain at 0.6 (accepted 0, 1, 2, 3 in 40/24/14/22 of 100)
    low = {r: 1 + (0 if i < 40 else 1 if i < 64 else 2 if i < 78 else 3) for i, r in enumerate(ids)}
    changed = [s.dsdprof_k.observe(step({r: 3 for r in ids}, low)) for _ in range(30)]
    assert any(changed) and sel.version >= 1
    assert sel.ks == {1: 1, 2: 1, 4: 1}
    assert s.dynamic_sd_lookup == sel.lookup_list(MAX_BS)
    assert s._dsdprof_table_lookup is s.dynamic_sd_lookup
    assert s.dynamic_sd_lookup == [0] + [1] * MAX_BS
    # vLLM's semantics: index = number of scheduled requests, same list vLLM would build
    assert s.dynamic_sd_lookup == build_dynamic_sd_schedule_lookup([list(r) for r in sel.ranges], MAX_BS, 4)
    assert all(s.dynamic_sd_lookup[b] == sel.select(b) for b in range(1, MAX_BS + 1))


@needs_vllm
def test_forced_k_requests_keep_their_k_while_the_lookup_moves(tmp_path):
    s = fake_scheduler(tmp_path)
    force(s, 2)
    s._dsdprof_apply_k()  # what schedule() does first
    assert s.dynamic_sd_lookup == [2] * (MAX_BS + 1)
    for _ in range(30):  # nothing accepted while forced: the adaptive lookup moves underneath
        s.dsdprof_k.observe(step({f"r{i}": 2 for i in range(10)}, {f"r{i}": 1 for i in range(10)}))
    assert s.dsdprof_k.selector.version >= 1
    assert s.dynamic_sd_lookup == [2] * (MAX_BS + 1)  # this step stays forced
    s._dsdprof_apply_k()
    assert s.dynamic_sd_lookup == [2] * (MAX_BS + 1)  # and so does the next while the request runs
    s._dsdprof_reqs = {}
    s._dsdprof_apply_k()
    assert s.dynamic_sd_lookup == s.dsdprof_k.selector.lookup_list(MAX_BS) and s.dynamic_sd_lookup[1] < 3


@needs_vllm
def test_a_k0_everywhere_engine_probes_k1_to_keep_learning(tmp_path):
    s = fake_scheduler(tmp_path, options={"probe_every": 3})
    for _ in range(30):  # nothing accepted: K=0 wherever the table was measured
        s.dsdprof_k.observe(step({f"r{i}": 3 for i in range(10)}, {f"r{i}": 1 for i in range(10)}))
    table_lookup = s._dsdprof_table_lookup
    assert table_lookup == [0] * (MAX_BS + 1)
    for _ in range(3):
        s._dsdprof_apply_k()
        assert s.dynamic_sd_lookup is table_lookup
        s.dsdprof_k.observe(step({}, {"r0": 1}))  # steps without a draft
    s._dsdprof_apply_k()
    assert s.dynamic_sd_lookup == [1] * (MAX_BS + 1)  # one probe step at K=1
    s._dsdprof_apply_k()
    assert s.dynamic_sd_lookup is table_lookup  # then back to the table
    # the probe's draft (scheduled the step after) is observed and resets the count
    s.dsdprof_k.observe(step({"r0": 1}, {"r0": 2}))
    assert s.dsdprof_k.idle == 0
    # a forced K is never replaced by a probe; probe_every = 0 never probes
    s.dsdprof_k.idle = 99
    force(s, 0)
    s._dsdprof_apply_k()
    assert s.dynamic_sd_lookup == [0] * (MAX_BS + 1) and s.dynamic_sd_lookup is not table_lookup
    never = fake_scheduler(tmp_path, options={"probe_every": 0})
    never.dsdprof_k.idle = 10**6
    never._dsdprof_apply_k()
    assert never.dynamic_sd_lookup is never._dsdprof_table_lookup


@needs_vllm
@pytest.mark.parametrize("cls", ["AdaptiveScheduler", "AdaptiveAsyncScheduler"])
def test_update_from_output_runs_vllm_then_observes(tmp_path, monkeypatch, cls):
    base = AsyncScheduler if cls == "AdaptiveAsyncScheduler" else Scheduler
    seen = []
    result = {0: NS(scheduler_stats=NS(spec_decoding_stats=step({"a": 2}, {"a": 2})))}
    monkeypatch.setattr(base, "update_from_output", lambda self, so, mro: seen.append("vllm") or result)
    s = fake_scheduler(tmp_path, cls=getattr(va, cls))
    calls = spy(s)
    so = NS(num_scheduled_tokens={"a": 3}, total_num_scheduled_tokens=3, num_spec_tokens_to_schedule=2)
    assert s.update_from_output(so, NS()) is result
    assert seen == ["vllm"] and calls == [(1, [1, 0], None)]


# ---------------------------------------------------------- validate --adaptive (fake engines) and its report

def _spec(tmp_path, batch_sizes=(1, 2), repeats=1):
    from dsdprof.config.spec import parse_spec

    for name in ("tgt", "drf"):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text("{}")
    return parse_spec({"engine": {"name": "vllm", "model": str(tmp_path / "tgt"),
                                  "draft_model": str(tmp_path / "drf"),
                                  "method": "draft_model", "extra": {"additional_config": {"other": 1}}},
                       "sweep": {"batch_sizes": list(batch_sizes), "num_spec_tokens": [0, 3], "waves": 3,
                                 "output_len": 8, "repeats": repeats}})


TOPS = {"vanilla": 10.0, "fixed-1": 13.0, "fixed-2": 14.0, "fixed-3": 13.0, "dsd": 13.0, "adaptive": 14.0}


class FakeWorker:
    """Stands in for the vLLM child process: records its kwargs, and for the adaptive engine
    resolves the plugin's setting from them exactly as the scheduler does in the engine core."""

    started: list = []

    def __init__(self, config, timeout_s):
        from dsdprof.serve.settings import ADAPTIVE_SCHEDULER_QUALNAME

        kw = config.llm_kwargs
        spec_cfg = kw.get("speculative_config")
        if spec_cfg is None:
            self.key = "vanilla"
        elif kw["scheduler_cls"] == ADAPTIVE_SCHEDULER_QUALNAME:
            self.key = "adaptive"
            self.selector = resolve_settings(kw["additional_config"], environ={}).selector(
                max_k=spec_cfg["num_speculative_tokens"])
        elif "num_speculative_tokens_per_batch_size" in spec_cfg:
            self.key = "dsd"
        else:
            self.key = f"fixed-{spec_cfg['num_speculative_tokens']}"
        self.kwargs, self.requests, self.alive = kw, [], True
        self.info = {"engine_version": "fake", "hardware": "test"}
        FakeWorker.started.append(self)

    def run(self, req, timeout_s):
        from dsdprof.measure.engine import CellMeasurement

        self.requests.append(req)
        k = {"vanilla": 0, "dsd": 1, "adaptive": 2}.get(self.key)
        k = int(self.key.split("-")[1]) if k is None else k
        tops = TOPS[self.key] / req.batch_size ** 0.5
        al = [1.0 + 0.6 * k * f for f in (1.0, 0.98, 1.02)]
        itl = [a / (tops * f) for a, f in zip(al, (1.01, 0.99, 1.0))]
        a, t = sum(al) / 3, sum(itl) / 3
        return CellMeasurement(
            acceptance_length=a, acceptance_per_pos=(), num_drafts=30 if k else 0, num_draft_tokens=30 * k,
            num_accepted_tokens=int(30 * (a - 1)), itl_s=t, itl_p50_s=t, itl_p90_s=t, itl_p99_s=t,
            tpot_s=t / a, tpot_p50_s=t / a, tpot_p90_s=t / a, tpot_p99_s=t / a, tokens_per_s_per_user=a / t,
            tokens_per_s_total=req.batch_size * a / t, num_requests=3 * req.batch_size, num_output_tokens=24,
            wall_s=1.0, drafted_per_draft=float(k), steady_steps=6, sample_acceptance_length=tuple(al),
            sample_itl_s=tuple(itl))

    def stop(self):
        self.alive = False

    def kill(self):
        self.alive = False


def test_plan_interleaves_the_adaptive_variant():
    from dsdprof.jobs.validate import plan_validation, worker_key

    cells = plan_validation([2, 1], [1, 3], [[1, 1, 1], [2, 1 << 20, 0]], repeats=2, adaptive_k=3)
    assert len(cells) == 2 * 2 * 5
    first = cells[:5]
    assert {(c.mode, c.num_spec_tokens) for c in first} == {
        ("vanilla", 0), ("fixed", 1), ("fixed", 3), ("dsd", 1), ("adaptive", 3)}
    assert {c.batch_size for c in first} == {1}
    assert [c.mode for c in cells[5:10]] != [c.mode for c in first]  # order rotates
    assert worker_key([c for c in first if c.mode == "adaptive"][0]) == "adaptive"
    assert len(plan_validation([1], [1], [[1, 1 << 20, 1]], 1)) == 3  # without it, as before


def test_validate_adaptive_serves_the_plugin_and_reports_both_regrets(tmp_path):
    import pandas as pd
    from typer.testing import CliRunner

    from dsdprof.cli.app import app
    from dsdprof.jobs.validate import ADAPTIVE_TABLE_FILE, run_validation
    from dsdprof.report.compare import compare

    FakeWorker.started = []
    spec = _spec(tmp_path)
    table = shifted_table(provenance={"model": str(tmp_path / "tgt")})
    out = tmp_path / "val"
    summary = run_validation(table, spec, out, [1, 2, 3], table_path="t.json", start_worker=FakeWorker,
                             adaptive={"half_life": 64})
    assert (summary.ok, summary.failed) == (2 * 6, 0)
    engines = {w.key: w for w in FakeWorker.started}
    assert set(engines) == {"vanilla", "fixed-1", "fixed-2", "fixed-3", "dsd", "adaptive"}
    ad = engines["adaptive"]
    cfg = ad.kwargs["speculative_config"]
    assert cfg["num_speculative_tokens"] == 4  # the table's largest measured K, above its served max (3)
    assert cfg["num_speculative_tokens_per_batch_size"] == table["ranges"]
    assert cfg["model"] == str(tmp_path / "drf") and cfg["method"] == "draft_model"
    assert ad.kwargs["additional_config"]["other"] == 1  # the spec's own additional_config is kept
    served_table = ad.kwargs["additional_config"]["dsdprof_adaptive"]["table"]
    assert served_table == str((out / ADAPTIVE_TABLE_FILE).resolve())
    assert json.loads((out / ADAPTIVE_TABLE_FILE).read_text()) == table
    assert ad.selector.half_life == 64 and ad.selector.ks == {1: 3, 2: 3, 4: 2}
    assert engines["dsd"].kwargs["scheduler_cls"] != ad.kwargs["scheduler_cls"]
    assert all(r.num_spec_tokens is None and r.verify_k == -1 and r.positions == 0 for r in ad.requests)

    df = pd.read_parquet(out)
    assert sorted(df.loc[df["mode"] == "adaptive", "cell_id"]) == ["adaptive-bs1-k4-r0", "adaptive-bs2-k4-r0"]
    c = compare(df).set_index("batch_size")
    assert c["best_fixed_k"].tolist() == [2, 2]
    assert c["regret"].tolist() == pytest.approx([1 - 13 / 14] * 2, abs=0.02)
    assert c["adaptive_regret"].tolist() == pytest.approx([0.0, 0.0], abs=0.02)
    assert c["adaptive_k_observed"].tolist() == [2.0, 2.0]
    for name in ("regret", "adaptive_regret"):  # 3 waves each: intervals known and around the point
        assert (c[f"{name}_lo"] < c[name] + 0.005).all() and (c[name] - 0.005 < c[f"{name}_hi"]).all()
        assert ((c[f"{name}_hi"] - c[f"{name}_lo"]) < 0.2).all()
    r = CliRunner().invoke(app, ["validate-report", str(out)], terminal_width=80)
    assert r.exit_code == 0, r.output
    assert "adapt. regret" in r.output and "adaptive: max regret" in r.output
    assert "+7.1 [" in r.output  # the static table's regret (in percent) with its interval
    assert max(len(line) for line in r.output.splitlines()) <= 80, r.output  # the tables fit 80 columns


def test_validate_adaptive_bad_input_is_one_line_and_writes_nothing(tmp_path):
    from typer.testing import CliRunner

    from dsdprof.cli.app import app
    from dsdprof.errors import InputError
    from dsdprof.jobs.validate import run_validation

    spec = _spec(tmp_path)
    v1 = {k: v for k, v in shifted_table().items() if k not in ("cells", "acceptance_per_pos")}
    v1["schema"] = "dsdprof.ktable/v1"
    with pytest.raises(InputError, match="table.cells"):
        run_validation(v1, spec, tmp_path / "a", [1], start_worker=FakeWorker, adaptive={})
    with pytest.raises(InputError, match=r"--adaptive-config.*halflife"):
        run_validation(shifted_table(), spec, tmp_path / "b", [1], start_worker=FakeWorker,
                       adaptive={"halflife": 1})
    with pytest.raises(InputError, match=r"--adaptive-config.*margin"):
        run_validation(shifted_table(), spec, tmp_path / "c", [1], start_worker=FakeWorker,
                       adaptive={"margin": 2})
    assert not any((tmp_path / d).exists() for d in "abc")
    (tmp_path / "t.json").write_text(json.dumps(shifted_table()))
    (tmp_path / "s.toml").write_text("[engine]\nmodel = 'x'\n")
    r = CliRunner().invoke(app, ["validate", str(tmp_path / "t.json"), str(tmp_path / "s.toml"),
                                 "--adaptive-config", "[1]", "--out", str(tmp_path / "d")])
    assert r.exit_code == 2 and "--adaptive-config='[1]': must be a JSON object" in r.output
    assert not (tmp_path / "d").exists()
