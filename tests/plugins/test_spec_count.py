"""dsdprof.plugins.spec_count on vLLM's real Scheduler and AsyncScheduler with the fake runner: with
log_stats off the adaptive plugin's bulk count of each step equals the per-request count in vLLM's
loop (the old way) and vLLM's own SpecDecodingStats (log_stats on), step by step, including steps
whose requests were aborted while the step ran and (async) outputs of requests already finished."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from dsdprof.plugins import vllm_adaptive as va  # noqa: E402
from tests.plugins.test_adaptive_plugin import MAX_BS, _hashed_chain, _plugin_config  # noqa: E402
from tests.vllm_fakes import FakeRunner, drive, make_request, make_scheduler  # noqa: E402


def accept(req_id, n, d):  # chain acceptance ~0.7 per position
    return _hashed_chain(req_id, n, d, lambda a, h: (h >> (4 * a)) & 15 < 11)


class Aborting(FakeRunner):
    """Aborts some of a step's drafted requests (vLLM's ``finish_requests``, as the engine does on
    a client's abort) right after running the step that scheduled them: their output reaches
    ``update_from_output`` for a request vLLM no longer holds."""

    def __init__(self, sched, at: dict[int, int]) -> None:
        super().__init__(accept, {"r2": 9, "r5": 14})
        self.sched, self.at, self.step, self.aborted_in_flight = sched, at, 0, 0

    def execute(self, so):
        from vllm.v1.request import RequestStatus

        out = super().execute(so)
        self.step += 1
        drafted = [r for r in so.scheduled_spec_decode_tokens if r in self.sched.requests]
        for req_id in drafted[1:1 + self.at.get(self.step, 0)]:  # the step's first request stays
            self.aborted_in_flight += 1
            self.sched.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)
        return out


def _steps(sched, mode: str):
    """Run the plugin; every queued step as ``(requests, K, drafts, drafted, accepted, drafted per
    position, accepted per position)``, in order (step times vary with the wall clock: left out)."""
    seen: list = []
    feed = sched._adaptive_feed

    def record():
        seen.extend(sched._adaptive_queue)
        return feed()

    sched._adaptive_feed = record
    for i in range(MAX_BS + 5):
        sched.add_request(make_request(f"r{i}", 20 + i, 25 + 7 * i))
    runner = Aborting(sched, {6: 2, 11: 1, 19: 2, 23: 1})
    drive(sched, runner, mode, True)
    seen.extend(sched._adaptive_queue)
    assert runner.aborted_in_flight >= 4
    out = []
    for stats, n, k, _, _ in seen:
        if type(stats) is list:
            stats = sched._adaptive_hist_stats(stats)
        out.append((n, k) + ((stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
                              list(stats.num_draft_tokens_per_pos), list(stats.num_accepted_tokens_per_pos))
                             if stats is not None else ()))
    return out


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_bulk_count_equals_per_request_and_vllms_stats_step_by_step(tmp_path, mode, monkeypatch):
    import itertools

    config = _plugin_config(tmp_path, {"rebuild_every": 4})
    cls = va.AdaptiveAsyncScheduler if mode == "async" else va.AdaptiveScheduler
    runs, scheds = {}, {}
    for name, log_stats in (("vllm", True), ("bulk", False), ("per_request", False)):
        ticks = itertools.count()  # the same step times in every run (the selector learns them too)
        monkeypatch.setattr(va, "_clock", lambda ticks=ticks: 0.05 * next(ticks))
        s = scheds[name] = make_scheduler(cls, config, log_stats)
        if name == "per_request":
            s._adaptive_bulk.bulk = False  # every drafted step counted in vLLM's loop, the old way
        runs[name] = _steps(s, mode)
    assert scheds["vllm"]._adaptive_hist is None  # vLLM's own SpecDecodingStats
    assert scheds["bulk"]._adaptive_bulk.per_request_steps == 0  # every step counted in bulk
    assert scheds["bulk"]._adaptive_bulk.taken_back >= 4  # aborted in flight (async: finished too)
    assert scheds["per_request"]._adaptive_bulk.per_request_steps > 50
    assert runs["bulk"] == runs["per_request"] == runs["vllm"]
    drafted = [r for r in runs["bulk"] if len(r) > 2 and r[2]]
    assert len(drafted) > 50 and len({r[4] / r[3] for r in drafted}) > 5  # acceptance varies


def test_a_step_only_vllms_loop_can_judge_is_counted_there(tmp_path, monkeypatch):
    """A stale output (a preempted request's) or a request finished but still held: the bulk count
    declines the step, and vLLM's loop counts it per request."""
    config = _plugin_config(tmp_path, {"rebuild_every": 4})
    s = make_scheduler(va.AdaptiveScheduler, config, False)
    bulk = s._adaptive_bulk
    for i in range(3):
        s.add_request(make_request(f"r{i}", 20, 60))
    runner = FakeRunner(accept)
    for step in range(12):
        so = s.schedule(False)
        mro = runner.execute(so)
        if step == 8:  # as _preempt_request leaves a request whose output is in flight (not dropped)
            s.requests["r1"].num_stale_output_tokens = so.num_scheduled_tokens["r1"]
            hist = list(bulk.hist)
            assert not bulk.count(so, mro) and bulk.hist == hist  # declined, nothing counted
        s.update_from_output(so, mro)
        assert bulk.per_request_steps == (step >= 8)  # that step counted in vLLM's loop
        if step == 8:
            assert s.requests["r1"].num_stale_output_tokens == 0  # vLLM drained it
            assert "make_spec_decoding_stats" not in vars(s)  # vLLM's own method back
        drafts = runner.take_draft_token_ids(so)
        if drafts is not None:
            s.update_draft_token_ids(drafts)
