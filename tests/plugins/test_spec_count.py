"""dsdprof.plugins.spec_count on vLLM's real Scheduler and AsyncScheduler with the fake runner: with
log_stats off the adaptive plugin's count of each step (one index appended per request vLLM's loop
counts, turned into histograms when fed) equals the same rules applied in Python and vLLM's own
SpecDecodingStats (log_stats on), step by step, with the events that make vLLM skip a request in
flight: aborts while a step runs, requests finished (async: their next step's output), preemptions
for want of KV blocks (async: stale outputs vLLM keeps) and a reset that preempts every running
request (stale outputs vLLM drops); and with drafts of 0 to K tokens."""

from __future__ import annotations

import copy
import itertools
import json

import pytest

pytest.importorskip("vllm")

from dsdprof.plugins import vllm_adaptive as va  # noqa: E402
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
    feed = sched.dsdprof_k.feed
    events = {"preempted": 0, "dropped": 0}
    preempt = sched._preempt_request

    def record():  # the steps' stats before the feed counts and clears their keys
        seen.extend(_stats(sched, sched.dsdprof_k.queue))
        return feed()

    def spy_preempt(request, *args, **kwargs):
        preempt(request, *args, **kwargs)
        events["preempted"] += 1
        events["dropped"] += request.drop_stale_output and request.num_stale_output_tokens > 0

    sched.dsdprof_k.feed, sched._preempt_request = record, spy_preempt
    for i in range(MAX_BS + 5):
        sched.add_request(make_request(f"r{i}", 20 + i, 25 + 7 * i))
    runner = Events(sched, {6: 2, 11: 1, 19: 2, 23: 1}, reset, ragged)
    drive(sched, runner, mode, True)
    seen.extend(_stats(sched, sched.dsdprof_k.queue))
    out = []
    for stats, n, k in seen:
        out.append((n, k) + ((stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
                              list(stats.num_draft_tokens_per_pos), list(stats.num_accepted_tokens_per_pos))
                             if stats is not None else ()))
    return out, runner, events


def _stats(sched, queue) -> list:
    """``(stats, requests, K)`` of queued steps; a step's slice of the keys (log_stats off) counted."""
    return [(sched.dsdprof_k.count.stats(*stats) if type(stats) is tuple else stats, n, k)
            for stats, n, k, _, _ in queue]


def _three(tmp_path, monkeypatch, mode: str, blocks: int, reset: tuple[int, ...], ragged: bool = False,
           mutate=None):
    """vLLM's SpecDecodingStats (log_stats on), the plugin's count (``bulk``; ``mutate`` may change
    its index table first) and the per-request count into the histograms, run alike."""
    cls = va.AdaptiveAsyncScheduler if mode == "async" else va.AdaptiveScheduler
    runs, scheds = {}, {}
    for name, log_stats in (("vllm", True), ("bulk", False), ("per_request", False)):
        ticks = itertools.count()  # the same step times in every run (the selector learns them too)
        monkeypatch.setattr(va, "_clock", lambda ticks=ticks: 0.05 * next(ticks))
        s = scheds[name] = make_scheduler(cls, _config(tmp_path, blocks), log_stats)
        if name == "per_request":  # every request straight into the histograms
            s.make_spec_decoding_stats = s.dsdprof_k.count.per_request
        elif name == "bulk" and mutate is not None:
            mutate(s.dsdprof_k.count)
        runs[name] = _run(s, mode, reset, ragged)
    return runs, scheds


@pytest.mark.parametrize("mode,blocks,reset,ragged", [
    ("sync", 4096, (), False), ("async", 4096, (), False), ("sync_bq", 4096, (), False),
    ("sync", 16, (), False), ("async", 16, (), False),  # KV blocks short: preemptions
    ("async", 4096, (9, 17, 28), False), ("sync_bq", 4096, (9, 17), False),  # a reset: outputs dropped
    ("sync", 4096, (), True), ("sync_bq", 16, (), True)])  # drafts of 0 to K tokens
def test_the_count_equals_per_request_and_vllms_stats_step_by_step(tmp_path, monkeypatch, mode, blocks,
                                                                      reset, ragged):
    runs, scheds = _three(tmp_path, monkeypatch, mode, blocks, reset, ragged=ragged)
    assert scheds["vllm"].dsdprof_k.keys is None  # vLLM's own SpecDecodingStats
    assert scheds["bulk"].make_spec_decoding_stats is scheds["bulk"].dsdprof_k.count.counter
    steps, runner, events = runs["bulk"]
    assert runner.aborted >= 4
    assert steps == runs["per_request"][0] == runs["vllm"][0]
    drafted = [r for r in steps if len(r) > 2 and r[2]]
    assert len(drafted) > 50 and len({r[4] / r[3] for r in drafted}) > 5  # acceptance varies
    if blocks < 100:
        assert events["preempted"] >= 3
    if reset:
        assert runner.resets == len(reset) and events["dropped"] >= 8
    if ragged:  # steps that mixed draft lengths (vLLM's drafted per position then differs by position)
        assert sum(len(set(r[5])) > 1 for r in drafted) > 10


@pytest.mark.parametrize("shift", [1, -1])
def test_the_comparison_fails_on_a_count_off_by_one(tmp_path, monkeypatch, shift):
    """The check above can fail: an index table that shifts every accepted count by one (where the
    shifted pair still exists) gives other per-step counts than vLLM's."""
    def mutate(count):
        w = count.width
        count.key[1:] = [[d * w + min(max(a + shift, 0), d) for a in range(w)] for d in range(1, w)]

    runs, _ = _three(tmp_path, monkeypatch, "sync", 4096, (), mutate=mutate)
    assert runs["per_request"][0] == runs["vllm"][0] != runs["bulk"][0]


def test_grammar_invalidated_and_out_of_range_drafts_count_by_vllms_rules(tmp_path):
    """A call with invalidated drafts takes the rules in Python (drafted minus the invalid ones; a
    draft left with none still counts), the others the index table: together vLLM's rules; no
    draft, or beyond K, not counted and never raised."""
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    s = make_scheduler(va.AdaptiveScheduler, _config(tmp_path, 4096), False)
    count = s.dsdprof_k.count
    calls = [("a", 3, 1, {"a": 2}), ("b", 4, 4, {"a": 2}), ("c", 2, 0, None), ("d", 4, 2, {"d": 4}),
             ("e", 5, 0, None), ("f", 0, 0, {"f": 1}), ("g", 1, 5, None)]  # e, g: beyond K=4; f: no draft
    want = SpecDecodingStats.new(4)
    for r, d, a, invalid in calls:
        assert count.counter(None, d, a, invalid, r) is None
        if d and d - (invalid or {}).get(r, 0) <= 4 and a <= 4:
            want.observe_draft(d - (invalid or {}).get(r, 0), a)
    assert count.stats(0, len(count.keys)) == want
