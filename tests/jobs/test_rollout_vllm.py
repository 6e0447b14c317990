"""The rollout path on real vLLM (CPU build, toy pair), through the CLI as a user runs it: a lengths
JSONL logged by a trainer (``--lengths FILE.jsonl``, no ``-n``) and a rate list (``--rate 20,40``),
on the vanilla engine, a fixed K and the table served through vLLM's own schedule; then the replay
of the measured run. Checks what only a real engine can say: every token arrives, the batch shrinks
to 1, vLLM's lookup K at every step is the table's K at the number of requests it scheduled (prefill
chunks included), and the replay walks the engine's steps (vanilla: one token a step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsdprof.formats.ktable import k_for_batch_size

# tokens and K per step, not step times: vLLM's engine core in-process (tests/conftest.py)
pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("inproc_engine_core")]

TABLE = "tables/toy-dense-cpu.json"
LENGTHS = (2, 3, 4, 6, 9, 14)


def test_rollout_and_serving_on_vllm_from_a_lengths_file(tmp_path, toy_tiny):
    """On the session's tiny toy pair (tests/conftest.py): tokens and K per step, not step time."""
    from dsdprof.cli.app import app
    from dsdprof.io.rollouts import read_rollout_rows
    from dsdprof.report.rollout import replay_check

    text = Path("sweeps/toy-dense-cpu.toml").read_text()
    for name in ("target", "draft"):
        text = text.replace(f'"toy_models/dense/{name}"', json.dumps(str(getattr(toy_tiny, name))))
    (tmp_path / "spec.toml").write_text(text.replace("max_model_len = 512", "max_model_len = 128"))
    keys = ("output_len", None, "num_output_tokens", "length", None, "output_tokens")  # a trainer's log
    (tmp_path / "held.jsonl").write_text("".join(
        json.dumps(n if k is None else {k: n}) + "\n" for k, n in zip(keys, LENGTHS)))
    run = tmp_path / "run"
    r = CliRunner().invoke(app, ["rollout", TABLE, str(tmp_path / "spec.toml"), "--out", str(run),
                                 "--lengths", str(tmp_path / "held.jsonl"), "--rate", "20,40",
                                 "--serving-requests", "4", "--repeats", "1", "--fixed-k", "2",
                                 "--no-adaptive"])
    assert r.exit_code == 0, r.output + (r.stderr or "")
    plan = json.loads((run / "_rollout.json").read_text())
    assert plan["lengths"] == list(LENGTHS) and plan["variants"] == ["vanilla", "fixed-2", "dsd"]
    df = read_rollout_rows(run)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert sorted(zip(df["kind"], df["rate_per_s"])) == sorted(
        [("rollout", 0.0)] * 3 + [("serving", 20.0)] * 3 + [("serving", 40.0)] * 3)
    table = json.loads(Path(TABLE).read_text())
    ranges = [list(x) for x in table["ranges"]]
    for _, row in df.iterrows():
        want = LENGTHS if row["kind"] == "rollout" else tuple(plan["serving_lengths"])
        assert sorted(row["request_output_len"]) == sorted(want) and row["output_tokens"] == sum(want)
        if row["kind"] == "serving":  # the plan's Poisson arrivals for this rate
            assert sorted(row["request_arrival_s"]) == pytest.approx(
                sorted(plan["serving_arrivals"][f"{row['rate_per_s']:g}"]), abs=1e-6)
        bs, ks = list(row["step_batch_size"]), list(row["step_k"])
        if row["kind"] == "rollout":
            assert bs[0] == len(LENGTHS) and bs[-1] < bs[0]  # all N in the first step, then it shrinks
            assert row["step_prefill_tokens"][0] > 0
            if row["variant"] == "vanilla":  # one token a step: the longest request (14) ends alone
                assert bs[-1] == 1
        if row["variant"] == "vanilla":
            assert set(ks) <= {0, -1} and row["mean_k"] == 0
        elif row["variant"] == "fixed-2":
            assert set(ks) == {2} and row["mean_k"] == pytest.approx(2, abs=0.3)
        else:  # vLLM looked K up by every scheduled request, as the table's ranges say
            assert ks == [k_for_batch_size(ranges, b) for b in bs]
            assert row["mean_k"] > 1
    # The replay on the measured run: every rollout predicted from its own lengths; vanilla's decode
    # steps are the longest request's tokens after the prefill's first, as vLLM stepped them.
    chk = replay_check(df, table, runs=20)
    assert sorted(chk.rows["variant"]) == ["dsd", "fixed-2", "vanilla"]
    van = chk.rows.set_index("variant").loc["vanilla"]
    assert van["steps_measured"] == van["steps_predicted"] == max(LENGTHS) - 1
    assert (chk.rows["predicted_raw_s"] > 0).all()
    r = CliRunner().invoke(app, ["replay", str(run), TABLE, "--fit", str(run), "--runs", "20"])
    assert r.exit_code == 0 and "fixed-2" in r.output, r.output + (r.stderr or "")
