"""dsdprof's metrics (dsdprof.plugins.metrics) on vLLM's real schedulers driven by a fake runner:
the counters agree with the runner's own record of what it drafted and accepted, the silent no-op
alarm fires when the drafter ignores K (and only then), hostile request keys are counted and change
nothing, metrics off leaves vLLM's methods called straight away, and the dashboard names only
metrics that exist."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from dsdprof.plugins import metrics as pm  # noqa: E402
from dsdprof.plugins import vllm_adaptive as va  # noqa: E402
from dsdprof.plugins import vllm_static as vs  # noqa: E402
from dsdprof.plugins.names import K_EXTRA_ARG, K_SEQ_ARG, RUN_ARG  # noqa: E402
from dsdprof.serve.settings import adaptive_additional_config  # noqa: E402
from tests.plugins.test_adaptive_plugin import MAX_BS, _hashed_chain, shifted_table  # noqa: E402
from tests.vllm_fakes import FakeRunner, drive, make_request, make_scheduler, vllm_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def value(s, name: str, **labels) -> float:
    m = s.dsdprof_metrics
    return m.registry.get_sample_value(name,
                                       {"model_name": m.labels[0], "engine": m.labels[1], **labels}) or 0.0


def accept(req_id, n, d):  # chain acceptance ~0.7 per position
    return _hashed_chain(req_id, n, d, lambda a, h: (h >> (4 * a)) & 15 < 11)


class Counting(FakeRunner):
    """Counts the steps that scheduled at least one request."""

    steps_run = 0

    def execute(self, so):
        self.steps_run += bool(so.num_scheduled_tokens)
        return super().execute(so)


def _adaptive(tmp_path, log_stats=True):
    path = tmp_path / "table.json"
    path.write_text(json.dumps(shifted_table()))
    config = copy.copy(vllm_config(4, MAX_BS, max_model_len=512))
    config.additional_config = adaptive_additional_config(str(path), {"rebuild_every": 4})
    return make_scheduler(va.AdaptiveScheduler, config, log_stats)


def _static(k_served: int | None = None):
    config = copy.copy(vllm_config(4, MAX_BS, max_model_len=512))
    config.additional_config = {}
    s = make_scheduler(vs.StaticScheduler, config)
    if k_served is not None:
        s.dynamic_sd_lookup = [0] + [k_served] * MAX_BS
    return s


def _load(s, n: int = MAX_BS + 3, extra=None):
    for i in range(n):
        s.add_request(make_request(f"r{i}", 20 + i, 25 + 7 * i, extra))


@pytest.mark.parametrize("kind", ["adaptive", "static"])
def test_counters_agree_with_what_the_runner_drafted_and_accepted(tmp_path, kind):
    s = _adaptive(tmp_path) if kind == "adaptive" else _static()
    _load(s)
    runner = Counting(accept, {"r2": 9})
    drive(s, runner, "sync", True)
    drafted = [(d, a) for _, d, a in runner.samples if d]
    assert value(s, "dsdprof:spec_decode_num_drafts_total") == len(drafted) > 50
    assert value(s, "dsdprof:spec_decode_num_draft_tokens_total") == sum(d for d, _ in drafted)
    assert value(s, "dsdprof:spec_decode_num_accepted_tokens_total") == sum(a for _, a in drafted)
    for pos in range(4):
        assert value(s, "dsdprof:spec_decode_num_draft_tokens_per_pos_total", position=str(pos)) == \
            sum(d > pos for d, _ in drafted)
        assert value(s, "dsdprof:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == \
            sum(a > pos for _, a in drafted)
    steps = sum(value(s, "dsdprof:steps_total", batch_size_bucket=pm.bucket_label(lo, hi),
                      num_speculative_tokens=str(k))
                for lo, hi in pm.buckets(MAX_BS) for k in range(5))
    assert steps == runner.steps_run > 40  # every step that scheduled a request, once
    assert value(s, "dsdprof:silent_noop_steps_total") == 0  # the fake drafter drafts the K scheduled
    assert value(s, "dsdprof:info", mode=kind,
                 table=str(tmp_path / "table.json") if kind == "adaptive" else "") == 1
    if kind == "adaptive":
        sizes = s.dsdprof_k.selector._sizes
        for b in sizes:
            lo, est, hi = (value(s, "dsdprof:acceptance_length_ratio", batch_size=str(b), bound=x)
                           for x in ("lower", "estimate", "upper"))
            assert 0 < lo <= est <= hi, (b, lo, est, hi)
            lo, est, hi = (value(s, "dsdprof:step_time_ratio", batch_size=str(b), bound=x)
                           for x in ("lower", "estimate", "upper"))
            assert 0 < lo <= est <= hi, (b, lo, est, hi)


def test_steps_count_each_bucket_and_k_including_k0():
    s = _static(k_served=0)
    _load(s, 3)
    drive(s, FakeRunner(accept), "sync", True)
    k0 = value(s, "dsdprof:steps_total", batch_size_bucket="3-4", num_speculative_tokens="0")
    assert k0 > 10 and value(s, "dsdprof:spec_decode_num_drafts_total") == 0
    assert value(s, "dsdprof:num_speculative_tokens", batch_size_bucket="3-4") == 0


class IgnoresK(FakeRunner):
    """A drafter that never got K (vLLM issue 51510): it drafts the engine's maximum every step."""

    def execute(self, so):
        so_k = so.num_spec_tokens_to_schedule
        so.num_spec_tokens_to_schedule = 4
        try:
            return super().execute(so)
        finally:
            so.num_spec_tokens_to_schedule = so_k

    def take_draft_token_ids(self, so):
        drafts = super().take_draft_token_ids(so)
        self.handed = getattr(self, "handed", 0) + (drafts is not None)
        return drafts


def test_the_silent_noop_alarm_fires_when_the_drafter_ignores_k_and_only_then():
    honest, broken = _static(k_served=2), _static(k_served=2)
    ignores = IgnoresK(accept)
    for s, runner in ((honest, FakeRunner(accept)), (broken, ignores)):
        _load(s, 4)
        drive(s, runner, "sync", True)
    assert value(honest, "dsdprof:silent_noop_steps_total") == 0
    assert value(broken, "dsdprof:silent_noop_steps_total") == ignores.handed > 10  # every step that drafted
    full = _static(k_served=4)  # the drafter's K is the scheduled one: nothing to see
    _load(full, 4)
    drive(full, IgnoresK(accept), "sync", True)
    assert value(full, "dsdprof:silent_noop_steps_total") == 0


class OwnDrafts(FakeRunner):
    """A runner whose drafter never got K: it drafts ``drafts`` tokens for every request every
    step, whatever the step scheduled. Sync: the drafts go back to the scheduler, which schedules
    them all. Async (``own=True``): they stay in the worker, which verifies them at the request's
    next step whatever the scheduler's placeholders say (vLLM's issue 51510, seen from the
    scheduler). Records the truth: the steps in which a request got more tokens than the drafts
    scheduled for it + 1 (any request; the first or last one)."""

    def __init__(self, accept, drafts: int, own: bool) -> None:
        super().__init__(accept)
        self.drafts, self.own = drafts, own
        self.mine: set[str] = set()  # requests drafted for at the previous step
        self.over_any = self.over_ends = 0

    def execute(self, so):
        k, spec = so.num_spec_tokens_to_schedule, so.scheduled_spec_decode_tokens
        so.num_spec_tokens_to_schedule = self.drafts
        if self.own:
            so.scheduled_spec_decode_tokens = {r: [7] * self.drafts for r in so.num_scheduled_tokens
                                               if r in self.mine and self.prompt_left.get(r, 0) <= 0}
        try:
            out = super().execute(so)
        finally:
            so.num_spec_tokens_to_schedule, so.scheduled_spec_decode_tokens = k, spec
        over = [len(t) > len(spec.get(r, ())) + 1 for r, t in zip(out.req_ids, out.sampled_token_ids)]
        self.over_any += any(over)
        self.over_ends += bool(over) and (over[0] or over[-1])
        self.mine = {r for r, t in zip(out.req_ids, out.sampled_token_ids) if t}
        return out


def _varying(mode: str, log_stats: bool, kind: str, tmp_path):
    """vLLM's scheduler (sync or async) with the metrics: ``static`` serving a K that changes with
    the batch (4 at 1-2, 2 at 3-4, 1 from 5), so consecutive steps schedule different K as requests
    finish; or the adaptive plugin on its table."""
    if kind == "adaptive":
        path = tmp_path / "table.json"
        path.write_text(json.dumps(shifted_table()))
        config = copy.copy(vllm_config(4, MAX_BS, max_model_len=512))
        config.additional_config = adaptive_additional_config(str(path), {"rebuild_every": 4})
        cls = va.AdaptiveAsyncScheduler if mode == "async" else va.AdaptiveScheduler
        return make_scheduler(cls, config, log_stats)
    config = copy.copy(vllm_config(4, MAX_BS, max_model_len=512))
    config.additional_config = {}
    s = make_scheduler(vs.StaticAsyncScheduler if mode == "async" else vs.StaticScheduler, config, log_stats)
    s.dynamic_sd_lookup = [0, 4, 4, 2, 2] + [1] * (MAX_BS - 4)
    return s


@pytest.mark.parametrize("mode,log_stats,kind", [
    ("sync", True, "static"), ("sync", False, "static"), ("async", True, "static"),
    ("async", False, "static"), ("sync", True, "adaptive"), ("async", True, "adaptive"),
    ("async", False, "adaptive")])
def test_the_silent_noop_alarm_under_sync_and_async_scheduling(tmp_path, mode, log_stats, kind):
    """An honest runner (drafts the K each step scheduled) raises no alarm while K changes from
    step to step; a runner whose drafter ignores K raises it: under sync at every step whose drafts
    came back longer than that step's K, under async at every step whose tokens show drafts
    verified beyond those scheduled (every such step with vLLM's SpecDecodingStats; with
    log_stats off, those where the step's first or last request shows it)."""
    honest = _varying(mode, log_stats, kind, tmp_path)
    _load(honest)
    drive(honest, FakeRunner(accept), mode, True)
    if kind == "static":  # K moved between steps
        assert {k for lo, hi in pm.buckets(MAX_BS) for k in range(5) if value(
            honest, "dsdprof:steps_total", batch_size_bucket=pm.bucket_label(lo, hi),
            num_speculative_tokens=str(k))} == {1, 2, 4}
    assert value(honest, "dsdprof:silent_noop_steps_total") == 0

    broken = _varying(mode, log_stats, kind, tmp_path)
    _load(broken)
    ignores = OwnDrafts(accept, 4, own=mode == "async")
    drive(broken, ignores, mode, True)
    alarms = value(broken, "dsdprof:silent_noop_steps_total")
    if mode == "sync":  # drafts of 4 for K < 4: every step that drafted at K < 4, seen at the hand-back
        assert alarms == sum(value(broken, "dsdprof:steps_total", batch_size_bucket=pm.bucket_label(lo, hi),
                                   num_speculative_tokens=str(k))
                             for lo, hi in pm.buckets(MAX_BS) for k in range(4)) > 10
        assert ignores.over_any == 0  # vLLM scheduled every draft it got: none verified beyond
    else:
        assert alarms == (ignores.over_any if log_stats else ignores.over_ends) > 5


def test_drafts_handed_back_under_async_with_structured_outputs_are_checked_too(monkeypatch):
    """Async + structured outputs: vLLM hands the drafts of the step just processed to
    ``update_draft_token_ids_in_output``; checked against that step's K before vLLM trims them,
    then vLLM's own method runs (it writes the step's num_invalid_spec_tokens)."""
    from vllm.v1.outputs import DraftTokenIds

    config = copy.copy(vllm_config(4, MAX_BS, max_model_len=512))
    config.additional_config = {}
    s = make_scheduler(vs.StaticAsyncScheduler, config)
    so = copy.copy(s.schedule(False))
    s.dsdprof_metrics.k = 2  # the K of the step whose output was just processed
    for drafts, alarms in (([7, 7], 0), ([7] * 4, 1), ([], 1)):  # empty: n-gram may draft none
        so.num_invalid_spec_tokens = None
        s.update_draft_token_ids_in_output(DraftTokenIds(["gone"], [list(drafts)]), so)
        assert s.dsdprof_metrics.alarms[2] == alarms and so.num_invalid_spec_tokens == {}
    monkeypatch.setenv(pm.METRICS_ENV, "0")
    off = make_scheduler(vs.StaticAsyncScheduler, config)
    assert off.dsdprof_metrics is None
    assert off._draft_out.__func__ is AsyncScheduler.update_draft_token_ids_in_output


# the profiling scheduler's own keys (dsdprof.plugins.names; K_SEQ_ARG was misspelt "dsdprof_k_seq" here)
HOSTILE = [{K_EXTRA_ARG: 0, RUN_ARG: "x" * 64}, {K_EXTRA_ARG: float("nan")},
           {"dsdprof_trace": "../../etc/passwd", "dsdprof_wave": -1}, {K_SEQ_ARG: [99] * 1000},
           {K_SEQ_ARG: [0, 1, 2], RUN_ARG: "x" * 32}]


@pytest.mark.parametrize("kind", ["adaptive", "static"])
def test_hostile_request_keys_are_counted_and_change_nothing(tmp_path, kind, monkeypatch):
    import functools
    import itertools

    seen = {}
    for hostile in (False, True):  # the plugin's step clock pinned: both runs see the same step times
        monkeypatch.setattr(va, "_clock", functools.partial(next, itertools.count(0.0, 0.02)))
        s = _adaptive(tmp_path) if kind == "adaptive" else _static()
        for i in range(MAX_BS + 3):
            extra = HOSTILE[i % len(HOSTILE)] if hostile else None
            s.add_request(make_request(f"r{i}", 20 + i, 25 + 7 * i, extra))
        s.add_request(make_request("plain", 20, 5, {"other_key": 1}))  # not ours: not counted
        drive(s, FakeRunner(accept), "sync", True)
        seen[hostile] = {n: value(s, n) for n in ("dsdprof:spec_decode_num_drafts_total",
                                                  "dsdprof:spec_decode_num_accepted_tokens_total",
                                                  "dsdprof:k_switches_total",
                                                  "dsdprof:silent_noop_steps_total")}
        seen[hostile]["ignored"] = value(s, "dsdprof:ignored_requests_total")
    assert seen[False].pop("ignored") == 0 and seen[True].pop("ignored") == MAX_BS + 3
    assert seen[True] == seen[False]


def test_metrics_off_leaves_vllms_methods_and_no_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv(pm.METRICS_ENV, "0")
    s = _static()
    assert s.dsdprof_metrics is None
    assert s._update.__func__ is Scheduler.update_from_output  # what each of its methods calls: vLLM's
    assert s._add.__func__ is Scheduler.add_request and s._draft.__func__ is Scheduler.update_draft_token_ids
    _load(s, 3)
    drive(s, FakeRunner(accept), "sync", True)
    monkeypatch.delenv(pm.METRICS_ENV)
    config = copy.copy(vllm_config(4, MAX_BS, max_model_len=512))
    config.additional_config = {pm.CONFIG_KEY: False}
    assert make_scheduler(vs.StaticScheduler, config).dsdprof_metrics is None


def test_buckets_cover_every_batch_size_once():
    for top in (1, 2, 3, 16, 17, 256):
        covered = [n for lo, hi in pm.buckets(top) for n in range(lo, hi + 1)]
        assert covered == list(range(1, top + 1))
    assert [pm.bucket_label(*b) for b in pm.buckets(6)] == ["1", "2", "3-4", "5-6"]


def test_dashboard_and_docs_name_only_metrics_that_exist():
    exported = set()
    for name in pm.COUNTERS:
        exported |= {name + "_total"}
    exported |= set(pm.GAUGES)
    dash = (REPO / "docs" / "grafana" / "dsdprof.json").read_text()
    used = set(re.findall(r"dsdprof:[a-z_]+", dash))
    assert used and used <= exported, used - exported
    assert {"dsdprof:steps_total", "dsdprof:silent_noop_steps_total",
            "dsdprof:num_speculative_tokens"} <= used
    doc = (REPO / "docs" / "observability.md").read_text()
    documented = set(re.findall(r"dsdprof:[a-z_]+", doc))
    assert exported <= documented, exported - documented
    assert documented <= exported | {n[:-6] for n in exported if n.endswith("_total")}, documented - exported


def test_watch_parses_what_prometheus_client_writes_and_warns_an_operator(tmp_path):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from dsdprof.report.watch import parse_metrics, summarize

    broken = _static(k_served=2)
    _load(broken, 4)
    drive(broken, IgnoresK(accept), "sync", True)
    text = generate_latest(broken.dsdprof_metrics.registry).decode()
    text += 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m \\"q\\""} 3.0\n'
    ours = {(n, tuple(sorted(lab.items())), v) for n, lab, v in parse_metrics(text)}
    theirs = {(s.name, tuple(sorted(s.labels.items())), s.value)
              for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert ours == theirs  # the stdlib parser reads what Prometheus' own parser reads
    snap = summarize(parse_metrics(text))
    assert snap["mode"] == "static" and snap["alarms"]["silent_noop_steps"] > 0
    assert any("silent no-op" in w for w in snap["warnings"])
    assert any("differ" in w for w in snap["warnings"]) and not snap["agree"]  # vLLM's 3 drafts vs ours
    assert [r["bucket"] for r in snap["schedule"]] == ["1", "2", "3-4", "5-8"]
    assert sum(r["steps"].get("2", 0) for r in snap["schedule"]) > 0 and snap["steps_k0"] == 0
    assert summarize([])["warnings"] == ["no dsdprof metrics here: serve with `dsdprof serve` "
                                         "(docs/observability.md)"]


def test_watch_bad_url_is_one_line_and_exit_2():
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    for url in ("ftp://x", "http://127.0.0.1:1"):
        res = CliRunner().invoke(app, ["watch", url, "--json"])
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and "URL" in lines[0], res.output
