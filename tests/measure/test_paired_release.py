"""A paired sweep's analysis runs without the engines: each group's replay runs beside the next
unit's waves, the engines are released before the last one, and a run killed after the release
resumes by measuring the unfinished units again, whole.

The orchestration runs :class:`VllmEngine` and the real sweep loop over fake engine workers (no vLLM
engine): the DSD worker hands back the raw data of a real step trace (vLLM's real scheduler driven in
process, :mod:`tests.vllm_fakes`) as the real worker does with ``defer_analysis``."""

from __future__ import annotations

import threading

import pytest

from dsdprof.measure.engine import MODE_DSD, MODE_VANILLA
from tests.measure.test_paired_vanilla import FakeWorker, Machine, make_engine, read

pytest.importorskip("vllm")

from dsdprof.measure.vllm import engine as vllm_engine  # noqa: E402
from dsdprof.measure.vllm.metrics import MetricSnapshot  # noqa: E402
from dsdprof.measure.vllm.trace import summarize_paired  # noqa: E402
from dsdprof.measure.vllm.worker import PairedRaw  # noqa: E402
from tests.measure.test_paired import run_group  # noqa: E402

KS = (0, 1, 2)
WAVES = 4


@pytest.fixture
def traces(run_env):
    """A real paired trace per batch size (vLLM's scheduler, accepting the first 2 drafts)."""
    out = {}
    for b in (1, 4):
        out[b] = run_group(run_env, "sync", b, KS, lambda r, s, d: min(d, 2), waves=WAVES)[0]
        (run_env / "g.jsonl").unlink()
    return out


class Events:
    """What happened, in order: engine spans, stops, analyses begun and ended (thread-safe)."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.lock = threading.Lock()
        self.bs4 = threading.Event()  # the second unit's waves have begun

    def add(self, *event) -> None:
        with self.lock:
            self.log.append(event)
        if event[0] == "span" and event[2] == 4:
            self.bs4.set()


class RawWorker(FakeWorker):
    """The DSD worker hands back the group's raw data (a real trace) as the real worker does."""

    def __init__(self, config, timeout_s, machine, run, traces, events) -> None:
        super().__init__(config, timeout_s, machine, run)
        self.traces, self.events = traces, events

    def run(self, req, timeout_s):
        self.events.add("span", self.key, req.batch_size, req.span)
        out = super().run(req, timeout_s)
        if out is None or not req.group:
            return out
        assert req.defer_analysis  # the sweep's paired group: analysed outside the worker
        return PairedRaw(req, MetricSnapshot(), MetricSnapshot(), [], 1.0, steps=self.traces[req.batch_size])

    def stop(self) -> None:
        self.events.add("stop", self.key)
        super().stop()


def engine(tmp_path, traces, events, run=1, seed=0):
    machine = Machine(seed=seed)
    spec, eng = make_engine(tmp_path, machine, run=run, num_spec_tokens=list(KS), waves=WAVES)
    eng.pool._start = lambda c, t: RawWorker(c, t, machine, run, traces, events)
    return spec, eng, machine


@pytest.fixture
def analyses(monkeypatch):
    """Every analysis the engine runs, logged with its batch size at its start and end."""
    events = Events()
    real = vllm_engine.analyze_paired

    def logged(raw):
        events.add("analysis", raw.req.batch_size, threading.current_thread().name)
        if raw.req.batch_size == 1:  # still under way when the next unit's waves begin (no deadlock:
            events.add("overlap", events.bs4.wait(20))  # the sweep loop did not wait for it)
        out = real(raw)
        events.add("analysed", raw.req.batch_size)
        return out

    monkeypatch.setattr(vllm_engine, "analyze_paired", logged)
    return events


def test_the_replay_runs_beside_the_next_unit_and_after_the_engines_are_released(tmp_path, traces, analyses):
    from dsdprof.measure.runner import run_sweep

    events = analyses
    spec, eng, _ = engine(tmp_path, traces, events)
    summary = run_sweep(spec, tmp_path / "out", engine=eng)
    assert summary.ok == 8 and summary.failed == 0
    log = events.log
    # both groups were analysed on the background thread, not by the sweep loop
    assert [e[1:] for e in log if e[0] == "analysis"] == [(1, "dsdprof-analysis"), (4, "dsdprof-analysis")]
    # the last group's analysis finished after both engines stopped: none waited for it
    stops = [i for i, e in enumerate(log) if e[0] == "stop"]
    assert len(stops) == 2 and max(stops) < log.index(("analysed", 4))
    # the first group's analysis ran beside the second unit's waves
    assert ("overlap", True) in log
    # the rows are the replay's numbers, exactly as analysed in the worker before
    df = read(tmp_path / "out")
    assert (df["status"] == "ok").all() and len(df) == 8
    for b in (1, 4):
        truth = summarize_paired(traces[b], b, KS, max(KS))
        for k in KS:
            row = df[(df["batch_size"] == b) & (df["mode"] == MODE_DSD)
                     & (df["num_spec_tokens"] == k)].iloc[0]
            assert row["acceptance_length"] == pytest.approx(truth[k].acceptance_length, rel=1e-12)
            assert row["wall_s"] == pytest.approx(1.0 / len(KS))


def test_a_failed_analysis_fails_its_groups_rows_only(tmp_path, traces, monkeypatch):
    from dsdprof.measure.runner import run_sweep

    def broken(raw):
        if raw.req.batch_size == 4:
            raise RuntimeError("replay broke")
        return real(raw)

    real = vllm_engine.analyze_paired
    monkeypatch.setattr(vllm_engine, "analyze_paired", broken)
    spec, eng, _ = engine(tmp_path, traces, Events())
    run_sweep(spec, tmp_path / "out", engine=eng)
    df = read(tmp_path / "out")
    bad = df[df["status"] == "failed"]
    assert set(zip(bad["batch_size"], bad["mode"])) == {(4, MODE_DSD)} and len(bad) == len(KS)
    assert bad["error"].str.contains("RuntimeError: replay broke").all()
    assert (df.loc[df["mode"] == MODE_VANILLA, "status"] == "ok").all()


def test_a_kill_after_the_release_resumes_by_measuring_the_unfinished_units_again(tmp_path, traces, analyses):
    """Killed right after the engines were released (the last analysis not written): the resumed run
    measures every unit whose rows are not all on disk again, whole, and keeps the finished ones."""
    from dsdprof.measure.runner import run_sweep

    spec, eng, _ = engine(tmp_path, traces, analyses)
    release = eng.release

    def killed() -> None:
        release()
        raise KeyboardInterrupt

    eng.release = killed
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path / "out", engine=eng)
    first = read(tmp_path / "out")
    done = {b for b, n in first.groupby("batch_size").size().items() if n == 1 + len(KS)}
    assert 4 not in done  # the last unit's DSD rows were never written
    spec, eng2, machine2 = engine(tmp_path, traces, Events(), run=2, seed=1)
    summary = run_sweep(spec, tmp_path / "out", resume=True, engine=eng2)
    assert summary.ok == 8 - 4 * len(done) and summary.skipped == 4 * len(done)
    assert {e[1] for e in machine2.log} == {1, 4} - done  # the unfinished units ran again, as units
    df = read(tmp_path / "out")
    assert len(df) == 8 and (df["status"] == "ok").all()
    van = df[df["mode"] == MODE_VANILLA].set_index("batch_size")["num_output_tokens"].to_dict()
    assert van == {b: 1 if b in done else 2 for b in (1, 4)}  # the re-measured units' vanilla is new
