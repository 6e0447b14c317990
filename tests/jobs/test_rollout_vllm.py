"""The rollout path on real vLLM (CPU build, toy pair): one small rollout and one serving run on the
vanilla engine and on the table served through vLLM's own schedule. Checks what only a real engine
can say: every token arrives, the batch shrinks to 1, and vLLM's lookup K at every step is the
table's K at the number of requests it scheduled (prefill chunks included)."""

from __future__ import annotations

import json

import pytest

from dsdprof.formats.ktable import k_for_batch_size

pytestmark = pytest.mark.vllm


def test_rollout_and_serving_on_vllm(tmp_path, toy_tiny):
    """On the session's tiny toy pair (tests/conftest.py): tokens and K per step, not step time."""
    from dsdprof.config.spec import load_spec
    from dsdprof.io.rollouts import read_rollout_rows
    from dsdprof.jobs.rollout import RolloutPlan, run_rollout

    table = json.load(open("tables/toy-dense-cpu.json"))
    spec = load_spec("sweeps/toy-dense-cpu.toml")
    engine = {"max_model_len": 128, "model": str(toy_tiny.target), "draft_model": str(toy_tiny.draft)}
    spec = spec.model_copy(update={"engine": spec.engine.model_copy(update=engine)})
    lengths = (2, 3, 4, 6, 9, 14)
    plan = RolloutPlan(("vanilla", "dsd"), lengths, "test", repeats=1, rates=(20.0,),
                       serving_lengths=(3, 5, 4, 6), serving_arrivals={"20": [0.0, 0.05, 0.1, 0.3]})
    run_rollout(table, spec, tmp_path / "run", plan, "tables/toy-dense-cpu.json")
    df = read_rollout_rows(tmp_path / "run")
    assert len(df) == 4
    assert (df["status"] == "ok").all(), df["error"].tolist()
    ranges = [list(r) for r in table["ranges"]]
    for _, row in df.iterrows():
        want = sum(lengths) if row["kind"] == "rollout" else 18
        assert row["output_tokens"] == want
        want_lens = lengths if row["kind"] == "rollout" else (3, 4, 5, 6)
        assert sorted(row["request_output_len"]) == sorted(want_lens)
        assert row["makespan_s"] > 0 and row["steps"] > 0
        bs = list(row["step_batch_size"])
        if row["kind"] == "rollout":
            assert bs[0] == len(lengths) and bs[-1] < bs[0]  # all N in the first step, then the batch shrinks
            if row["variant"] == "vanilla":  # one token a step: the longest request (14) ends alone
                assert bs[-1] == 1
            assert row["step_prefill_tokens"][0] > 0
        ks = list(row["step_k"])
        if row["variant"] == "vanilla":
            assert set(ks) <= {0, -1} and row["mean_k"] == 0
        else:  # vLLM looked K up by every scheduled request, as the table's ranges say
            assert ks == [k_for_batch_size(ranges, b) for b in bs]
            assert row["mean_k"] > 1
