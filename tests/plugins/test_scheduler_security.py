"""No client drives dsdprof's schedulers: vLLM's real Scheduler/AsyncScheduler with a fake runner
(tests/vllm_fakes.py), fed hostile ``extra_args`` the OpenAI server would pass through
(``vllm_xargs``). They never raise, stall or write, and no request changes another's K."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("vllm")

from dsdprof.plugins import vllm_adaptive as va  # noqa: E402
from dsdprof.plugins import vllm_profiling as vs  # noqa: E402
from tests.plugins.test_adaptive_plugin import shifted_table  # noqa: E402
from tests.vllm_fakes import FakeRunner, drive, make_request, make_scheduler, vllm_config  # noqa: E402

TOKEN = "s" * 32
KEYS = ("dsdprof_num_spec_tokens", "dsdprof_wave_size", "dsdprof_wave", "dsdprof_trace", "dsdprof_run")
HOSTILE = ["abc", "", -1, 0, 10**6, 2**63 - 1, -(2**63), math.nan, math.inf, 1.5, True, None, {"k": 3}, [3],
           "../../evil", "/tmp/dsdprof-evil", "a/b", ".hidden", "x" * 100000, b"3"]
MODES = ("sync", "async")


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _run(sched, mode, extras, max_tokens=12):
    runner = FakeRunner(lambda r, s, d: d)
    for i, extra in enumerate(extras):
        sched.add_request(make_request(f"r{i}", 16, max_tokens, extra, eos=False))
    received = drive(sched, runner, mode, spec=True, max_steps=2000)
    assert sorted(received) == [f"r{i}" for i in range(len(extras))]
    assert all(len(v) == max_tokens for v in received.values())  # nothing stalled, nothing lost
    return {d for _, d, _ in runner.samples}


@pytest.fixture
def serving(tmp_path, monkeypatch):
    """The adaptive plugin as `vllm serve` runs it: a table, no dsdprof run (no secret)."""
    monkeypatch.delenv("DSDPROF_RUN_TOKEN", raising=False)
    monkeypatch.delenv("DSDPROF_TRACE_DIR", raising=False)
    table = tmp_path / "table.json"
    table.write_text(json.dumps(shifted_table()))
    monkeypatch.setenv("DSDPROF_ADAPTIVE_TABLE", str(table))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def profiling(tmp_path, monkeypatch):
    """An engine a dsdprof run started: the run's secret and trace directory in its environment."""
    traces = tmp_path / "traces"
    traces.mkdir()
    monkeypatch.setenv("DSDPROF_RUN_TOKEN", TOKEN)
    monkeypatch.setenv("DSDPROF_TRACE_DIR", str(traces))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("mode", MODES)
def test_serving_plugin_ignores_every_profiling_key(serving, mode):
    cls = va.AdaptiveAsyncScheduler if mode == "async" else va.AdaptiveScheduler
    sched = make_scheduler(cls, vllm_config(4, 8))
    before = _files(serving)
    extras = [{"dsdprof_num_spec_tokens": 0, "dsdprof_wave_size": 10**6,
               "dsdprof_trace": str(serving / "evil"), "dsdprof_wave": 0, "dsdprof_run": "guess"},
              {"dsdprof_num_spec_tokens": "abc", "dsdprof_trace": "cell", "dsdprof_run": TOKEN},
              {"dsdprof_num_spec_tokens": 4}]
    drafted = _run(sched, mode, extras)
    # the table's K for 3 running requests (shifted_table: K=3 at BS 1-2, 2 from BS 3), never a client's
    assert drafted <= {2, 3} and 0 not in drafted and 4 not in drafted
    assert sched._dsdprof_reqs == {} and sched.dsdprof_ignored == 0  # not even read
    assert _files(serving) == before


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("key", KEYS)
def test_hostile_values_never_raise_stall_or_write(profiling, mode, key):
    cls = vs.TracingAsyncScheduler if mode == "async" else vs.TracingScheduler
    for value in HOSTILE:
        sched = make_scheduler(cls, vllm_config(5, 8))
        extra = {"dsdprof_run": TOKEN, "dsdprof_trace": "cell", "dsdprof_wave": 0, key: value}
        drafted = _run(sched, mode, [extra, dict(extra)])
        assert drafted <= {5} or key == "dsdprof_num_spec_tokens" and value == 0, (key, value, drafted)
    files = _files(profiling)
    assert all(f.startswith("traces/") for f in files), files  # only the run's trace directory
    assert set(files) <= {"traces/cell.jsonl", "traces/abc.jsonl"}  # plain names, inside the directory


@pytest.mark.parametrize("mode", MODES)
def test_wrong_or_missing_secret_is_ignored_and_counted(profiling, mode):
    cls = vs.TracingAsyncScheduler if mode == "async" else vs.TracingScheduler
    sched = make_scheduler(cls, vllm_config(5, 8))
    extras = [{"dsdprof_run": secret, "dsdprof_num_spec_tokens": 1, "dsdprof_wave_size": 10**6,
               "dsdprof_trace": "cell"}
              for secret in ("wrong", TOKEN[:-1], TOKEN + "x", 12345, None, "s" * 31 + "é")]
    extras.append({"dsdprof_num_spec_tokens": 1})
    assert _run(sched, mode, extras) == {5}  # vLLM's own K
    assert sched._dsdprof_reqs == {} and sched.dsdprof_ignored == len(extras)
    assert _files(profiling) == []


@pytest.mark.parametrize("mode", MODES)
def test_one_client_cannot_change_anothers_k(profiling, mode):
    cls = vs.TracingAsyncScheduler if mode == "async" else vs.TracingScheduler
    sched = make_scheduler(cls, vllm_config(5, 8))
    extras = [{"dsdprof_run": TOKEN, "dsdprof_num_spec_tokens": 3},
              {"dsdprof_num_spec_tokens": 0}, {"dsdprof_num_spec_tokens": 5, "dsdprof_run": "guess"}]
    assert _run(sched, mode, extras) == {3}


def test_a_bad_trace_directory_never_writes_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("DSDPROF_RUN_TOKEN", TOKEN)
    monkeypatch.setenv("DSDPROF_TRACE_DIR", str(tmp_path / "missing"))
    monkeypatch.chdir(tmp_path)
    sched = make_scheduler(vs.TracingScheduler, vllm_config(5, 8))
    _run(sched, "sync", [{"dsdprof_run": TOKEN, "dsdprof_trace": "cell", "dsdprof_num_spec_tokens": 2}])
    assert _files(tmp_path) == []
    monkeypatch.setenv("DSDPROF_RUN_TOKEN", "short")  # a short secret is none
    monkeypatch.setenv("DSDPROF_TRACE_DIR", str(tmp_path))
    sched = make_scheduler(vs.TracingScheduler, vllm_config(5, 8))
    assert _run(sched, "sync",
                [{"dsdprof_run": "short", "dsdprof_trace": "cell", "dsdprof_num_spec_tokens": 2}]) == {5}
    assert _files(tmp_path) == []
