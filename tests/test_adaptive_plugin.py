"""The adaptive vLLM scheduler's wiring, on fake scheduler outputs (no engine): settings, qualname,
per-position aggregation into AdaptiveKSelector.observe, the lookup swap, forced K.
tests/test_vllm_adaptive.py runs it in a real vLLM engine."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from dsdprof.engines.adaptive_settings import (
    ADAPTIVE_CONFIG_KEY, ADAPTIVE_SCHEDULER_QUALNAME, ADAPTIVE_TABLE_ENV, AdaptiveSettingError,
    adaptive_additional_config, resolve_settings,
)
from dsdprof.table import ranges_from_points

PROFILED_ACCEPTANCE = (0.3, 0.27, 0.243)  # q = 0.3, 0.9, 0.9: position 1 rarely accepted
ITL_FACTOR = {1: (1.0, 1.25, 1.55, 1.9), 2: (1.0, 1.25, 1.55, 1.9), 4: (1.0, 1.5, 2.2, 3.0)}


def shifted_table(base_itl_s: float = 0.04, provenance: dict | None = None) -> dict:
    """A v2 table profiled at low acceptance: K=1 at BS 1-2, K=0 from BS 3. At the toy pair's
    real acceptance (~0.85, 0.73, 0.62) the re-derived K is 3 at BS 1-2 and 1 at BS 4."""
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
    assert [k for _, k in points] == [1, 1, 0]
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
    sel = resolve_settings(adaptive_additional_config(str(path), {"margin": 0.05}), environ={}).selector(max_k=2)
    assert sel.margin == 0.05 and sel.max_k == 2


# ---------------------------------------------------------------- the scheduler (vLLM classes, no engine)

vllm = pytest.importorskip("vllm")
from vllm.utils.import_utils import resolve_obj_by_qualname  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup  # noqa: E402

from dsdprof.engines import vllm_adaptive as va  # noqa: E402
from dsdprof.engines import vllm_scheduler as vs  # noqa: E402
from dsdprof.engines.vllm_scheduler_names import K_EXTRA_ARG  # noqa: E402

MAX_BS = 8


def test_qualname_resolves_to_the_factory_which_follows_async_scheduling(monkeypatch):
    assert resolve_obj_by_qualname(ADAPTIVE_SCHEDULER_QUALNAME) is va.make_scheduler
    assert va.scheduler_class_for(NS(async_scheduling=True)) is va.AdaptiveAsyncScheduler
    assert va.scheduler_class_for(NS(async_scheduling=False)) is va.AdaptiveScheduler
    assert issubclass(va.AdaptiveAsyncScheduler, vs.TracingAsyncScheduler)
    assert issubclass(va.AdaptiveAsyncScheduler, AsyncScheduler)
    assert issubclass(va.AdaptiveScheduler, vs.TracingScheduler) and not issubclass(va.AdaptiveScheduler, AsyncScheduler)
    for cls in (va.AdaptiveScheduler, va.AdaptiveAsyncScheduler):
        assert cls.update_from_output.__qualname__.startswith("_AdaptiveMixin")
        assert cls.schedule.__qualname__.startswith("_DsdprofMixin")  # K forcing, gate and trace kept
        assert cls.has_requests.__qualname__.startswith("_DsdprofMixin")
    built = []
    monkeypatch.setattr(va.AdaptiveAsyncScheduler, "__init__", lambda self, *a, **k: built.append(type(self)))
    monkeypatch.setattr(va.AdaptiveScheduler, "__init__", lambda self, *a, **k: built.append(type(self)))
    va.make_scheduler(vllm_config=NS(scheduler_config=NS(async_scheduling=True)))
    va.make_scheduler(NS(scheduler_config=NS(async_scheduling=False)))
    assert built == [va.AdaptiveAsyncScheduler, va.AdaptiveScheduler]


def fake_scheduler(tmp_path, num_spec_tokens=3, options=None, cls=None, static_k=1):
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
    s._adaptive_setup(adaptive_additional_config(str(path), opts), environ={})
    return s


def step(drafted: dict[str, int], sampled: dict[str, int]):
    """(scheduler_output, model_runner_output) of one step: draft lengths and sampled-token counts."""
    ids = list(sampled)
    so = NS(scheduled_spec_decode_tokens={r: [-1] * d for r, d in drafted.items()})
    mro = NS(sampled_token_ids=[[7] * sampled[r] for r in ids], req_id_to_index={r: i for i, r in enumerate(ids)})
    return so, mro


def spy(sched):
    calls = []
    real = sched.dsdprof_selector.observe

    def observe(n, acc, drafted=None):
        calls.append((n, list(acc), None if drafted is None else list(drafted)))
        return real(n, acc, drafted)

    sched.dsdprof_selector = NS(observe=observe, version=sched.dsdprof_selector.version, real=sched.dsdprof_selector)
    return calls


def test_setup_serves_the_table_lookup_with_vllm_semantics(tmp_path):
    s = fake_scheduler(tmp_path)
    sel = s.dsdprof_selector
    assert sel.max_k == 3 and sel.ks == {1: 1, 2: 1, 4: 0}
    assert s.dynamic_sd_lookup == [0, 1, 1, 0, 0, 0, 0, 0, 0]
    assert s._dsdprof_table_lookup is s.dynamic_sd_lookup  # the tracing mixin's unforced schedule
    # the same dense list vLLM builds for these ranges and this num_speculative_tokens
    ranges = [list(r) for r in sel.ranges]
    assert s.dynamic_sd_lookup == build_dynamic_sd_schedule_lookup(ranges, MAX_BS, 3)
    capped = fake_scheduler(tmp_path, num_spec_tokens=2)
    assert capped.dsdprof_selector.max_k == 2
    with pytest.raises(AdaptiveSettingError, match="dynamic-SD"):
        s2 = va.AdaptiveScheduler.__new__(va.AdaptiveScheduler)
        s2.num_spec_tokens, s2.dynamic_sd_lookup = 3, None
        s2._adaptive_setup(adaptive_additional_config(str(tmp_path / "table.json")), environ={})


def test_observe_aggregates_requests_per_position(tmp_path):
    s = fake_scheduler(tmp_path, options={"rebuild_every": 1000})
    calls = spy(s)
    # 4 requests drafting 3: accepted 0, 1, 3, 2 (sampled = accepted + bonus)
    assert not s._adaptive_observe(*step({"a": 3, "b": 3, "c": 3, "d": 3}, {"a": 1, "b": 2, "c": 4, "d": 3}))
    assert calls[-1] == (4, [3, 2, 1], None)
    # mixed draft lengths (3 and 1): drafted per position goes along; a prefilling request
    # (no draft) and one missing from the output are skipped; sampled beyond the draft is capped
    s._adaptive_observe(*step({"a": 3, "b": 1, "z": 2}, {"a": 4, "b": 2, "p": 1}))
    assert calls[-1] == (2, [2, 1, 1], [2, 1, 1])
    # nothing sampled for a drafted request (dropped this step): not a draft
    s._adaptive_observe(*step({"a": 2, "b": 2}, {"a": 0, "b": 3}))
    assert calls[-1] == (1, [1, 1], None)
    n = len(calls)
    assert not s._adaptive_observe(*step({}, {"a": 1}))  # no drafts scheduled: no call
    assert not s._adaptive_observe(*step({"a": 1}, {}))
    assert len(calls) == n
    assert s._adaptive_acc == [0] * 4 and s._adaptive_drafted == [0] * 4  # scratch counts reset


def test_lookup_follows_live_acceptance_and_is_swapped_only_on_change(tmp_path):
    s = fake_scheduler(tmp_path)
    sel = s.dsdprof_selector
    start = s.dynamic_sd_lookup
    # acceptance as profiled (position 1 accepted 3 drafts in 10): nothing moves
    for _ in range(20):
        assert not s._adaptive_observe(*step({f"r{i}": 1 for i in range(10)},
                                             {f"r{i}": 2 if i < 3 else 1 for i in range(10)}))
    assert s.dynamic_sd_lookup is start and sel.version == 0
    # live acceptance far above the profile: 9 of 10 drafts accepted at position 1
    changed = [s._adaptive_observe(*step({f"r{i}": 1 for i in range(10)},
                                         {f"r{i}": 2 if i < 9 else 1 for i in range(10)})) for _ in range(30)]
    assert any(changed) and sel.version >= 1
    assert sel.ks[1] == 3 and sel.ks[2] == 3 and sel.ks[4] == 1
    assert s.dynamic_sd_lookup == sel.lookup_list(MAX_BS)
    assert s._dsdprof_table_lookup is s.dynamic_sd_lookup
    assert s.dynamic_sd_lookup[1] == 3 and s.dynamic_sd_lookup[MAX_BS] == 1
    # vLLM's semantics: index = number of scheduled requests, same list vLLM would build
    assert s.dynamic_sd_lookup == build_dynamic_sd_schedule_lookup([list(r) for r in sel.ranges], MAX_BS, 3)
    assert all(s.dynamic_sd_lookup[b] == sel.select(b) for b in range(1, MAX_BS + 1))


def test_forced_k_requests_keep_their_k_while_the_lookup_moves(tmp_path):
    s = fake_scheduler(tmp_path)
    forced = NS(sampling_params=NS(extra_args={K_EXTRA_ARG: 2}))
    s.running = [forced]
    s._dsdprof_apply_k()  # what schedule() does first
    assert s.dynamic_sd_lookup == [2] * (MAX_BS + 1)
    for _ in range(30):  # high acceptance while forced: the adaptive lookup moves underneath
        s._adaptive_observe(*step({f"r{i}": 2 for i in range(10)}, {f"r{i}": 3 for i in range(10)}))
    assert s.dsdprof_selector.version >= 1
    assert s.dynamic_sd_lookup == [2] * (MAX_BS + 1)  # this step stays forced
    s._dsdprof_apply_k()
    assert s.dynamic_sd_lookup == [2] * (MAX_BS + 1)  # and so does the next while the request runs
    s.running = []
    s._dsdprof_apply_k()
    assert s.dynamic_sd_lookup == s.dsdprof_selector.lookup_list(MAX_BS) and s.dynamic_sd_lookup[1] == 3


@pytest.mark.parametrize("cls", ["AdaptiveScheduler", "AdaptiveAsyncScheduler"])
def test_update_from_output_runs_vllm_then_observes(tmp_path, monkeypatch, cls):
    base = AsyncScheduler if cls == "AdaptiveAsyncScheduler" else Scheduler
    seen = []
    monkeypatch.setattr(base, "update_from_output", lambda self, so, mro: seen.append("vllm") or {"out": 1})
    s = fake_scheduler(tmp_path, cls=getattr(va, cls))
    calls = spy(s)
    so, mro = step({"a": 2}, {"a": 2})
    assert s.update_from_output(so, mro) == {"out": 1}
    assert seen == ["vllm"] and calls == [(1, [1, 0], None)]
