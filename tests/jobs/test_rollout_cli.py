"""``dsdprof rollout`` and ``dsdprof replay`` through the CLI on fake engines: a held-out lengths
JSONL and rate list go end to end (parsing, plan, rows, replay fitted on another run); bad input is
one line naming the field and value, exit 2, nothing started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from tests.cli.test_bad_input import one_line_error
from tests.jobs.test_rollout import FakeArrivalsWorker, _fake_table

runner = CliRunner()


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A spec whose model dirs exist (the fake engines load nothing), the fake table, and
    ``run_rollout`` on fake engines."""
    import dsdprof.jobs.rollout as job

    for name in ("target", "draft"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    text = Path("sweeps/toy-dense-cpu.toml").read_text()
    text = text.replace('"toy_models/dense/target"', json.dumps(str(tmp_path / "target")))
    text = text.replace('"toy_models/dense/draft"', json.dumps(str(tmp_path / "draft")))
    (tmp_path / "spec.toml").write_text(text)
    (tmp_path / "table.json").write_text(json.dumps(_fake_table()))
    real = job.run_rollout
    started = []

    def fake_run(*args, **kwargs):
        started.append(args)
        return real(*args, **kwargs, start_worker=FakeArrivalsWorker)

    monkeypatch.setattr(job, "run_rollout", fake_run)
    return tmp_path, started


def _args(tmp: Path, out: str, *more: str) -> list[str]:
    return ["rollout", str(tmp / "table.json"), str(tmp / "spec.toml"), "--out", str(tmp / out),
            "--fixed-k", "2", "--no-adaptive", *more]


def test_held_out_lengths_and_rates_end_to_end(setup):
    from dsdprof.io.rollouts import read_rollout_rows

    tmp, started = setup
    lens = [5, 32, 16, 4, 19, 8, 3, 48, 4]
    (tmp / "held.jsonl").write_text("\n".join([json.dumps({"output_len": n}) for n in lens[:5]]
                                              + [str(n) for n in lens[5:]]) + "\n")
    r = runner.invoke(app, _args(tmp, "run", "--lengths", str(tmp / "held.jsonl"), "--rate", "3,6",
                                 "--rate", "10", "--serving-requests", "4", "--repeats", "1",
                                 "--slo-tpot-ms", "60", "--slo-ttft-ms", "1000"))
    assert r.exit_code == 0, r.output + r.stderr
    df = read_rollout_rows(tmp / "run")
    roll = df[df["kind"] == "rollout"]
    assert len(roll) == 3  # -n defaults to the file's count
    assert all(sorted(x) == sorted(lens) for x in roll["request_output_len"])
    serving = df[df["kind"] == "serving"]
    assert sorted(set(serving["rate_per_s"])) == [3.0, 6.0, 10.0] and len(serving) == 9
    assert (serving["slo_tpot_s"] == 0.06).all() and (serving["goodput_req_s"] >= 0).all()
    # Goodput recomputed from the rows' request series at the run's SLOs agrees with the run's own
    # (computed from every streamed chunk); a TPOT SLO below every request's leaves none.
    from dsdprof.report.rollout import with_slo

    same = with_slo(df, 1.0, 0.06)
    assert same["goodput_req_s"].tolist() == pytest.approx(df["goodput_req_s"].tolist())
    assert 0 < df["goodput_req_s"].min() and (with_slo(df, 0, 1e-4)["goodput_req_s"] == 0).all()
    r = runner.invoke(app, ["rollout-report", str(tmp / "run"), "--slo-tpot-ms", "0.1"])
    assert r.exit_code == 0 and "serving" in r.output, r.output + r.stderr
    plan = json.loads((tmp / "run" / "_rollout.json").read_text())
    assert plan["lengths"] == lens and plan["lengths_spec"] == str(tmp / "held.jsonl")
    # The replay fitted on this run predicts a held-out lengths file, and checks a run against it.
    (tmp / "other.jsonl").write_text("\n".join(str(n) for n in (3, 3, 7, 9, 25)))
    r = runner.invoke(app, ["replay", str(tmp / "other.jsonl"), str(tmp / "table.json"), "--fit",
                            str(tmp / "run"), "--runs", "5"])
    assert r.exit_code == 0, r.output + r.stderr
    assert "fixed-2" in r.output and "fitted on" in r.output
    r = runner.invoke(app, ["replay", str(tmp / "run"), str(tmp / "table.json"), "--fit", str(tmp / "run"),
                            "--runs", "5", "--plot", str(tmp / "replay.png")])
    assert r.exit_code == 0, r.output + r.stderr
    assert "fitcal" in r.output and "mean over repeats" in r.output
    assert (tmp / "replay.png").read_bytes()[:4] == b"\x89PNG"
    assert len(started) == 1


@pytest.mark.parametrize(
    ("more", "needles"),
    [
        (["--rate", "0"], ["--rate", "'0'"]),
        (["--rate", "2,x"], ["--rate", "'2,x'"]),
        (["--rate", "4", "--rate", "4"], ["--rate", "given twice"]),
        (["--rate", "nan"], ["--rate", "'nan'"]),
        (["--lengths", "LENS:bad"], ["--lengths", "bad.jsonl:2", "output_len"]),
        (["--lengths", "LENS:missing"], ["--lengths", "missing.jsonl", "cannot read"]),
        (["--lengths", "LENS:empty"], ["--lengths", "empty.jsonl", "no lengths"]),
        (["--lengths", "LENS:zero"], ["--lengths", "zero.jsonl:1"]),
        (["--lengths", "lognormal:median=3"], ["--lengths", "sigma"]),
        (["-n", "0"], ["--num-requests", "0"]),
        (["--slo-tpot-ms", "-5"], ["--slo-tpot-ms", "-5"]),
        (["--slo-ttft-ms", "inf"], ["--slo-ttft-ms", "inf"]),
    ],
)
def test_bad_rollout_input_is_one_line(setup, more, needles):
    tmp, started = setup
    (tmp / "bad.jsonl").write_text('{"output_len": 4}\n{"tokens": 7}\n')
    (tmp / "empty.jsonl").write_text("\n\n")
    (tmp / "zero.jsonl").write_text('{"output_len": 0}\n')
    more = [str(tmp / (m.split(":")[1] + ".jsonl")) if m.startswith("LENS:") else m for m in more]
    r = runner.invoke(app, _args(tmp, "run", *more))
    one_line_error(r, *needles)
    assert not started and not (tmp / "run").exists()


def test_replay_fit_needs_a_rollout_run(setup, tmp_path):
    tmp, _ = setup
    (tmp / "l.jsonl").write_text("3\n5\n")
    r = runner.invoke(app, ["replay", str(tmp / "l.jsonl"), str(tmp / "table.json"), "--fit",
                            str(tmp / "nothing")])
    assert r.exit_code == 2 and "Traceback" not in r.output + r.stderr


def test_serving_ratios_pair_by_repeat_and_pick_the_best_fixed_k_per_rate():
    import pandas as pd

    from dsdprof.report.rollout import serving_ratios
    from tests.jobs.test_rollout import _row

    # makespan per (rate, variant); repeat r runs 10 % slower per step: the pairing cancels it
    base = {2.0: {"vanilla": 10.0, "fixed-2": 8.0, "fixed-4": 9.0, "dsd": 8.4},
            8.0: {"vanilla": 10.0, "fixed-2": 9.0, "fixed-4": 7.0, "dsd": 7.7}}
    rows = [_row(v, r, m * (1 + 0.1 * r), kind="serving", rate=rate)
            for rate, ms in base.items() for v, m in ms.items() for r in range(3)]
    s = serving_ratios(pd.DataFrame(rows)).set_index(["rate_per_s", "variant"])
    assert s.loc[(2.0, "dsd"), "best_fixed"] == "fixed-2" and s.loc[(8.0, "dsd"), "best_fixed"] == "fixed-4"
    assert s.loc[(2.0, "dsd"), "vs_best"] == pytest.approx(8.0 / 8.4)  # tokens/s = 100 / makespan
    assert s.loc[(8.0, "dsd"), "vs_vanilla"] == pytest.approx(10.0 / 7.7)
    assert s.loc[(8.0, "dsd"), "vs_best_lo"] == pytest.approx(7.0 / 7.7)  # no spread: a point interval


def test_report_and_replay_fit_80_columns(setup, monkeypatch):
    """Every table of ``rollout-report`` and ``replay`` (intervals, serving, the band) renders
    within 80 columns at COLUMNS=80: a wider line fails (the rollout table was 91 wide)."""
    import dsdprof.cli.rollout as cli

    tmp, _ = setup
    r = runner.invoke(app, _args(tmp, "run", "--lengths", "lognormal:median=10,sigma=1", "-n", "8",
                                 "--rate", "3", "--serving-requests", "4", "--repeats", "2"))
    assert r.exit_code == 0, r.output + r.stderr
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(cli, "console", cli.make_console())
    replay = ["replay", str(tmp / "run"), str(tmp / "table.json"), "--fit", str(tmp / "run"), "--runs", "3"]
    for cmd in (["rollout-report", str(tmp / "run")], replay):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 0, r.output + r.stderr
        wide = [line for line in r.stdout.splitlines() if len(line) > 80]
        assert not wide, "\n".join(wide)
        assert "…" not in r.stdout
    r = runner.invoke(app, ["rollout-report", str(tmp / "run")])
    for needle in ("makespan, paired by repeat", "TPOT99", "lookup%", "vs fixed-2 (best)",
                   "1.000 [1.000,1.000]"):
        assert needle in r.stdout, r.stdout
