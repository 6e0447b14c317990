"""dsdprof validate without vLLM: a fake worker factory stands in for the engines."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from dsdprof.engines.base import CellMeasurement
from dsdprof.errors import InputError
from dsdprof.report.validate import (
    dsd_llm_kwargs, is_validate_run, plan_validation, run_validation, table_warnings, worker_key,
)
from dsdprof.spec import parse_spec
from dsdprof.table import k_for_batch_size

TABLE = {
    "schema": "dsdprof.ktable/v1", "num_speculative_tokens": 3,
    "ranges": [[1, 2, 3], [3, 11, 1], [12, 1 << 20, 0]],
    "points": [{"batch_size": 1, "k": 3}, {"batch_size": 4, "k": 1}, {"batch_size": 16, "k": 0}],
    "provenance": {"model": "tgt", "draft_model": "drf", "method": "draft_model"},
}


def make_spec(batch_sizes=(1, 4, 16), repeats=1, **engine):
    e = {"name": "vllm", "model": "tgt", "draft_model": "drf", "method": "draft_model", "extra": {"enforce_eager": True}}
    e.update(engine)
    return parse_spec({"engine": e, "sweep": {"batch_sizes": list(batch_sizes), "num_spec_tokens": [0, 3],
                                              "waves": 2, "output_len": 8, "repeats": repeats}})


def measurement(k: int, tops: float, bs: int) -> CellMeasurement:
    al = 1.0 + 0.8 * k
    tpot = 1.0 / tops
    return CellMeasurement(
        acceptance_length=al, acceptance_per_pos=tuple([0.8] * k), num_drafts=10 if k else 0,
        num_draft_tokens=10 * k, num_accepted_tokens=8 * k, itl_s=al * tpot, itl_p50_s=al * tpot,
        itl_p90_s=al * tpot, itl_p99_s=al * tpot, tpot_s=tpot, tpot_p50_s=tpot, tpot_p90_s=tpot,
        tpot_p99_s=tpot, tokens_per_s_per_user=tops, tokens_per_s_total=tops * bs, num_requests=2 * bs,
        num_output_tokens=16 * bs, wall_s=1.0)


def model_tops(k: int, bs: int) -> float:
    """A dense-like toy: speculation pays at small batch sizes only."""
    return (1.0 + 0.8 * k) / (0.01 * (1 + 0.15 * k) + 0.0004 * bs * (k + 1))


class FakeWorker:
    def __init__(self, kwargs, log):
        self.kwargs, self.log, self.alive, self.info = kwargs, log, True, {"engine_version": "fake", "hardware": "fake-hw"}

    def run(self, req, timeout_s):
        self.log.append(("run", self.kwargs.get("speculative_config"), req))
        cfg = self.kwargs.get("speculative_config")
        if cfg is None:
            k = 0
        elif "num_speculative_tokens_per_batch_size" in cfg:  # what vLLM's lookup would pick
            k = k_for_batch_size(cfg["num_speculative_tokens_per_batch_size"], req.batch_size)
        else:
            k = cfg["num_speculative_tokens"]
        return measurement(k, model_tops(k, req.batch_size), req.batch_size)

    def stop(self):
        self.alive = False

    kill = stop


def factory(log, fail_keys=()):
    def start(kwargs, workload, timeout_s):
        cfg = kwargs.get("speculative_config")
        key = "vanilla" if cfg is None else ("dsd" if "num_speculative_tokens_per_batch_size" in cfg else f"fixed-{cfg['num_speculative_tokens']}")
        log.append(("start", key, kwargs))
        if key in fail_keys:
            raise RuntimeError("boom")
        return FakeWorker(kwargs, log)
    return start


def test_plan_interleaves_and_rotates():
    cells = plan_validation([4, 1], [3, 1], TABLE["ranges"], repeats=2)
    assert len(cells) == 2 * 2 * 4
    first = cells[:4]
    assert {c.batch_size for c in first} == {1}
    assert {(c.mode, c.num_spec_tokens) for c in first} == {("vanilla", 0), ("fixed", 1), ("fixed", 3), ("dsd", 3)}
    assert cells[4].mode != cells[0].mode  # order rotates
    assert [c for c in cells if c.mode == "dsd" and c.batch_size == 4][0].num_spec_tokens == 1
    assert worker_key(first[0]) in ("vanilla", "fixed-1", "fixed-3", "dsd")
    with pytest.raises(InputError, match="fixed-k"):
        plan_validation([1], [0], TABLE["ranges"], 1)
    with pytest.raises(InputError, match="fixed-k"):
        plan_validation([1], [], TABLE["ranges"], 1)


def test_dsd_kwargs_use_vllm_schedule_without_dsdprof_scheduler():
    spec = make_spec()
    kw = dsd_llm_kwargs({"model": "tgt", "max_num_seqs": 16}, TABLE, spec)
    cfg = kw["speculative_config"]
    assert cfg["num_speculative_tokens"] == 3
    assert cfg["num_speculative_tokens_per_batch_size"] == TABLE["ranges"]
    assert cfg["model"] == "drf" and cfg["method"] == "draft_model"
    assert "scheduler_cls" not in kw
    zero = dict(TABLE, ranges=[[1, 1 << 20, 0]])
    assert dsd_llm_kwargs({"model": "tgt"}, zero, spec) is None


def test_table_warnings_name_mismatches():
    spec = make_spec(batch_sizes=(1, 64), model="other")
    w = table_warnings(TABLE, spec)
    assert any("model='tgt'" in x for x in w)
    assert any("[64]" in x for x in w)
    assert table_warnings(TABLE, make_spec()) == []


def test_run_validation_writes_rows_and_serves_table(tmp_path):
    log = []
    out = tmp_path / "val"
    summary = run_validation(TABLE, make_spec(), out, [3], table_path="t.json", start_worker=factory(log))
    assert (summary.total, summary.ok, summary.failed) == (9, 9, 0)
    starts = [e for e in log if e[0] == "start"]
    assert sorted(s[1] for s in starts) == ["dsd", "fixed-3", "vanilla"]  # one engine each, kept alive
    for _, cfg, req in [e for e in log if e[0] == "run"]:
        assert req.num_spec_tokens is None  # never force K: vLLM's lookup decides
    df = pd.read_parquet(out)
    assert set(df["mode"]) == {"vanilla", "fixed", "dsd"}
    dsd = df[df["mode"] == "dsd"].set_index("batch_size")
    assert dsd.loc[1, "num_spec_tokens"] == 3 and dsd.loc[4, "num_spec_tokens"] == 1 and dsd.loc[16, "num_spec_tokens"] == 0
    assert (dsd["num_draft_tokens"] == dsd["num_drafts"] * dsd["num_spec_tokens"]).all()
    assert is_validate_run(out)
    meta = json.loads((out / "_sweep.json").read_text())
    assert meta["spec"]["validate"]["fixed_ks"] == [3]
    with pytest.raises(InputError, match="out"):  # never overwrites
        run_validation(TABLE, make_spec(), out, [3], start_worker=factory([]))


def test_failed_engine_start_becomes_failed_rows_and_resume_redoes_them(tmp_path):
    out = tmp_path / "val"
    s1 = run_validation(TABLE, make_spec(), out, [3], table_path="t.json", start_worker=factory([], fail_keys=("fixed-3",)))
    assert (s1.ok, s1.failed) == (6, 3)
    df = pd.read_parquet(out)
    assert (df.loc[df["status"] == "failed", "mode"] == "fixed").all()
    assert df.loc[df["status"] == "failed", "error"].str.contains("boom").all()
    log = []
    s2 = run_validation(TABLE, make_spec(), out, [3], table_path="t.json", resume=True, start_worker=factory(log))
    assert (s2.skipped, s2.ok) == (6, 3)
    assert [e[1] for e in log if e[0] == "start"] == ["fixed-3"]
    with pytest.raises(InputError, match="table"):
        run_validation(TABLE, make_spec(), out, [1], table_path="t.json", resume=True, start_worker=factory([]))


def test_cli_validate_prints_comparison_and_fails_on_regret(tmp_path, monkeypatch):
    from dsdprof.cli import app
    import dsdprof.report.validate as v

    monkeypatch.setattr(v, "start_engine_worker", factory([]))
    table = tmp_path / "t.json"
    table.write_text(json.dumps(TABLE))
    spec = tmp_path / "s.toml"
    spec.write_text('[engine]\nmodel = "tgt"\ndraft_model = "drf"\n[sweep]\nbatch_sizes = [1, 4, 16]\nwaves = 2\noutput_len = 8\n')
    runner = CliRunner()
    r = runner.invoke(app, ["validate", str(table), str(spec), "--out", str(tmp_path / "a"), "--fixed-k", "1", "--fixed-k", "3"])
    assert r.exit_code == 0, r.output
    assert "regret" in r.output and "DSD" in r.output
    # the toy model's best K at BS 16 is not 0, so the table's K=0 there costs goodput
    r = runner.invoke(app, ["validate", str(table), str(spec), "--out", str(tmp_path / "b"), "--fail-on-regret", "0.5"])
    assert r.exit_code == 1, r.output
    r = runner.invoke(app, ["validate", str(table), str(spec), "--out", str(tmp_path / "c"), "--fail-on-regret", "-1"])
    assert r.exit_code == 2 and "fail-on-regret" in r.output
    r = runner.invoke(app, ["validate", str(tmp_path / "missing.json"), str(spec)])
    assert r.exit_code == 2 and "table" in r.output
    # the report alone, from the finished run, without vLLM
    r = runner.invoke(app, ["validate-report", str(tmp_path / "a")])
    assert r.exit_code == 0 and "regret" in r.output
    r = runner.invoke(app, ["validate-report", str(tmp_path / "a"), "--fail-on-regret", "0.5"])
    assert r.exit_code == 1
