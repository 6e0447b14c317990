"""dsdprof.plugins.spec_count on vLLM's real Scheduler and AsyncScheduler with the fake runner: with
log_stats off the adaptive plugin's bulk count of each step equals the per-request count in vLLM's
loop and vLLM's own SpecDecodingStats (log_stats on), step by step, with the events that make vLLM
skip a request in flight: aborts while a step runs, requests finished (async: their next step's
output), preemptions for want of KV blocks (async: stale outputs vLLM keeps) and a reset that
preempts every running request (stale outputs vLLM drops)."""

from __future__ import annotations

import copy
import itertools
import json

import pytest

pytest.importorskip("vllm")

from dsdprof.plugins import vllm_adaptive as va  # noqa: E402
from dsdprof.plugins.spec_count import SpecCount  # noqa: E402
from dsdprof.serve.settings import adaptive_additional_config  # noqa: E402
from tests.plugins.test_adaptive_plugin import MAX_BS, _hashed_chain, shifted_table  # noqa: E402
from tests.vllm_fakes import FakeRunner, drive, make_request, make_scheduler, vllm_config  # noqa: E402


def accept(req_id, n, d):  # chain acceptance ~0.7 per position
    return _hashed_chain(req_id, n, d, lambda a, h: (h >> (4 * a)) & 15 < 11)


class Events(FakeRunner):
    """Right after running step ``i`` (the step's output not yet processed): ``abort[i]`` of its
    drafted requests aborted (vLLM's ``finish_requests``, as on a client's abort), and at the steps
    in ``reset`` every running request preempted with its in-flight output dropped
    (``reset_prefix_cache(reset_running_requests=True)``). ``ragged``: the drafter proposes 0 to K
    drafts, by request and step (as n-gram drafters do; sync scheduling hands them back)."""

    def __init__(self, sched, abort: dict[int, int], reset: tuple[int, ...] = (),
                 ragged: bool = False) -> None:
        super().__init__(accept, {"r2": 9, "r5": 14, "r9": 30})
        self.sched, self.abort, self.reset, self.ragged, self.step = sched, abort, reset, ragged, 0
        self.aborted = self.resets = 0

    def take_draft_token_ids(self, so):
        drafts = super().take_draft_token_ids(so)
        if self.ragged and drafts is not None:
            for i, (req_id, ids) in enumerate(zip(drafts.req_ids, drafts.draft_token_ids)):
                del ids[_hashed_chain(req_id, self.step + i, len(ids), lambda a, h: (h >> (3 * a)) & 7 < 6):]
        return drafts

    def execute(self, so):
        from vllm.v1.request import RequestStatus

        out = super().execute(so)
        self.step += 1
        drafted = [r for r in so.scheduled_spec_decode_tokens if r in self.sched.requests]
        for req_id in drafted[1:1 + self.abort.get(self.step, 0)]:  # the step's first request stays
            self.aborted += 1
            self.sched.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)
        if self.step in self.reset and self.sched.running:
            self.resets += 1
            self.sched.reset_prefix_cache(reset_running_requests=True)
        return out


def _config(tmp_path, blocks: int):
    path = tmp_path / "table.json"
    path.write_text(json.dumps(shifted_table()))
    config = copy.copy(vllm_config(4, MAX_BS, max_model_len=512, num_blocks=blocks))
    config.additional_config = adaptive_additional_config(str(path), {"rebuild_every": 4})
    return config


def _run(sched, mode: str, reset: tuple[int, ...], ragged: bool) -> tuple[list, Events, dict]:
    """Run the plugin; every queued step as ``(requests, K, drafts, drafted, accepted, drafted per
    position, accepted per position)``, in order (step times come from a ticking clock)."""
    seen: list = []
    feed = sched._adaptive_feed
    events = {"preempted": 0, "dropped": 0}
    preempt = sched._preempt_request

    def record():
        seen.extend(sched._adaptive_queue)
        return feed()

    def spy_preempt(request, *args, **kwargs):
        preempt(request, *args, **kwargs)
        events["preempted"] += 1
        events["dropped"] += request.drop_stale_output and request.num_stale_output_tokens > 0

    sched._adaptive_feed, sched._preempt_request = record, spy_preempt
    for i in range(MAX_BS + 5):
        sched.add_request(make_request(f"r{i}", 20 + i, 25 + 7 * i))
    runner = Events(sched, {6: 2, 11: 1, 19: 2, 23: 1}, reset, ragged)
    drive(sched, runner, mode, True)
    seen.extend(sched._adaptive_queue)
    out = []
    for stats, n, k, _, _ in seen:
        if type(stats) is list:
            stats = sched._adaptive_hist_stats(stats)
        out.append((n, k) + ((stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
                              list(stats.num_draft_tokens_per_pos), list(stats.num_accepted_tokens_per_pos))
                             if stats is not None else ()))
    return out, runner, events


def _three(tmp_path, monkeypatch, mode: str, blocks: int, reset: tuple[int, ...], without: tuple = (),
           ragged: bool = False):
    """vLLM's SpecDecodingStats (log_stats on), the bulk count and the per-request count, run alike."""
    cls = va.AdaptiveAsyncScheduler if mode == "async" else va.AdaptiveScheduler
    runs, scheds = {}, {}
    for name, log_stats in (("vllm", True), ("bulk", False), ("per_request", False)):
        ticks = itertools.count()  # the same step times in every run (the selector learns them too)
        monkeypatch.setattr(va, "_clock", lambda ticks=ticks: 0.05 * next(ticks))
        s = scheds[name] = make_scheduler(cls, _config(tmp_path, blocks), log_stats)
        if name == "per_request":
            s._adaptive_count.unhook()  # every drafted step counted in vLLM's loop
        elif name == "bulk":
            for hook in without:  # a mutation: these events not recorded
                del s.__dict__[hook]
        runs[name] = _run(s, mode, reset, ragged)
    return runs, scheds


@pytest.mark.parametrize("mode,blocks,reset,ragged", [
    ("sync", 4096, (), False), ("async", 4096, (), False), ("sync_bq", 4096, (), False),
    ("sync", 16, (), False), ("async", 16, (), False),  # KV blocks short: preemptions
    ("async", 4096, (9, 17, 28), False), ("sync_bq", 4096, (9, 17), False),  # a reset: outputs dropped
    ("sync", 4096, (), True), ("sync_bq", 16, (), True)])  # drafts of 0 to K tokens
def test_bulk_count_equals_per_request_and_vllms_stats_step_by_step(tmp_path, monkeypatch, mode, blocks,
                                                                      reset, ragged):
    runs, scheds = _three(tmp_path, monkeypatch, mode, blocks, reset, ragged=ragged)
    bulk = scheds["bulk"]._adaptive_count
    assert scheds["vllm"]._adaptive_hist is None  # vLLM's own SpecDecodingStats
    assert bulk.bulk and bulk.per_request_steps == 0  # every drafted step counted in bulk
    assert not bulk.touched  # nothing left tracked once every step is counted
    assert scheds["per_request"]._adaptive_count.per_request_steps > 50
    steps, runner, events = runs["bulk"]
    assert runner.aborted >= 4
    assert steps == runs["per_request"][0] == runs["vllm"][0]
    drafted = [r for r in steps if len(r) > 2 and r[2]]
    assert len(drafted) > 50 and len({r[4] / r[3] for r in drafted}) > 5  # acceptance varies
    if mode != "sync":  # requests skipped by vLLM's loop were taken back (async, batch queue: in flight)
        assert bulk.taken_back >= 4
    if blocks < 100:
        assert events["preempted"] >= 3
    if reset:
        assert runner.resets == len(reset) and events["dropped"] >= 8
    if ragged:  # steps that mixed draft lengths (vLLM's drafted per position then differs by position)
        assert sum(len(set(r[5])) > 1 for r in drafted) > 10


@pytest.mark.parametrize("mode,reset,without", [
    ("sync", (), ("_free_blocks",)), ("async", (), ("_free_blocks",)),
    ("async", (9, 17, 28), ("_preempt_request",))])
def test_without_an_event_hook_the_bulk_count_differs(tmp_path, monkeypatch, mode, reset, without):
    """The check above can fail: counting in bulk without the event that makes vLLM skip a request
    (freed: aborted or finished; preempted with its output dropped) counts those requests too."""
    runs, scheds = _three(tmp_path, monkeypatch, mode, 4096, reset, without)
    assert runs["per_request"][0] == runs["vllm"][0] != runs["bulk"][0]


def test_a_step_only_vllms_loop_can_judge_is_counted_there(tmp_path):
    """Grammar-invalidated drafts, or a request with drafts but no output row: the bulk count
    declines the step (nothing counted), vLLM's loop counts it per request, and vLLM's own
    make_spec_decoding_stats is back afterwards."""
    s = make_scheduler(va.AdaptiveScheduler, _config(tmp_path, 4096), False)
    count = s._adaptive_count
    for i in range(3):
        s.add_request(make_request(f"r{i}", 20, 60))
    runner = FakeRunner(accept)
    declined = 0
    for step in range(14):
        so = s.schedule(False)
        mro = runner.execute(so)
        if step in (8, 10) and so.scheduled_spec_decode_tokens:
            hist = list(count.hist)
            if step == 8:
                so.num_invalid_spec_tokens = {"r1": 1}
            else:
                mro.sampled_token_ids[mro.req_id_to_index["r1"]] = []  # no token: vLLM does not count it
            assert not count.count(so, mro) and count.hist == hist  # declined, nothing counted
            declined += 1
        s.update_from_output(so, mro)
        assert count.per_request_steps == declined
        assert "make_spec_decoding_stats" not in vars(s)  # vLLM's own method back
        drafts = runner.take_draft_token_ids(so)
        if drafts is not None:
            s.update_draft_token_ids(drafts)
    assert declined == 2


def test_a_kv_connector_or_another_vllm_counts_per_request(tmp_path):
    """Where vLLM may hold finished requests or fail KV loads (a KV or EC connector), or its loop
    does not use the names the skip rules are read from, every step is counted per request."""
    s = make_scheduler(va.AdaptiveScheduler, _config(tmp_path, 4096), False)
    assert s._adaptive_count.bulk
    for attr in ("connector", "ec_connector"):
        other = copy.copy(s)
        setattr(other, attr, object())
        assert not SpecCount(other, [0] * 10).bulk
    other = copy.copy(s)
    other.num_sampled_tokens_per_step = 0
    assert not SpecCount(other, [0] * 10).bulk
