"""``dsdprof validate`` end to end on real vLLM (CPU build) with one toy pair: five engine starts."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("vllm")

from dsdprof.cli.app import app  # noqa: E402
from dsdprof.report.compare import compare  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def toy(toy_dense):
    """The session's toy pair (tests/conftest.py), for every validate run here (each starts its own engines)."""
    return toy_dense


def write_spec(path, toy, waves: int, output_len: int) -> None:
    """A validate spec for the toy pair at batch sizes 1 and 2."""
    path.write_text(f"""
[engine]
model = "{toy.target}"
draft_model = "{toy.draft}"
method = "draft_model"
dtype = "float32"
max_model_len = 256
extra = {{ enforce_eager = true }}
[sweep]
batch_sizes = [1, 2]
waves = {waves}
output_len = {output_len}
warmup = 1
[workload]
input_len = 16
num_prompts = 16
""")


def test_validate_serves_table_through_vllm_schedule(toy, tmp_path):
    table = {
        "schema": "dsdprof.ktable/v1", "num_speculative_tokens": 2,
        "ranges": [[1, 1, 2], [2, 1 << 20, 1]],
        "points": [{"batch_size": 1, "k": 2}, {"batch_size": 2, "k": 1}],
        "provenance": {"model": str(toy.target), "draft_model": str(toy.draft), "method": "draft_model"},
    }
    (tmp_path / "t.json").write_text(json.dumps(table))
    write_spec(tmp_path / "s.toml", toy, waves=1, output_len=16)
    out = tmp_path / "val"
    r = CliRunner().invoke(app, ["validate", str(tmp_path / "t.json"), str(tmp_path / "s.toml"),
                                 "--fixed-k", "2", "--out", str(out), "--fail-on-regret", "1000"])
    assert r.exit_code == 0, r.output
    assert "regret" in r.output
    df = pd.read_parquet(out)
    assert len(df) == 2 * 3 and (df["status"] == "ok").all(), df[["cell_id", "error"]]
    assert (df["design"] == "paired").all() and all(list(b) == [0] for b in df["sample_block"])  # the default
    van = df[df["mode"] == "vanilla"]
    assert (van["num_drafts"] == 0).all()
    fixed = df[df["mode"] == "fixed"]
    assert (fixed["num_drafts"] > 0).all()
    assert (fixed["num_draft_tokens"] / fixed["num_drafts"]).tolist() == pytest.approx([2.0, 2.0], rel=0.02)
    dsd = df[df["mode"] == "dsd"].set_index("batch_size")
    # vLLM's own lookup picked K by the batch size of each step (the requests carried no dsdprof
    # K): BS 1 drafts K=2; BS 2 drafts K=1, except on tail steps where one request has finished
    # and the other runs alone at BS 1 (K=2).
    per_draft = dsd["num_draft_tokens"] / dsd["num_drafts"]
    assert dsd.loc[1, "num_spec_tokens"] == 2 and dsd.loc[2, "num_spec_tokens"] == 1
    assert per_draft.loc[1] == pytest.approx(2.0, rel=0.01)
    assert 1.0 <= per_draft.loc[2] <= 1.3
    c = compare(df)
    assert c["batch_size"].tolist() == [1, 2]
    assert c["dsd_k_observed"].tolist() == pytest.approx(per_draft.sort_index().tolist())


def test_validate_steps_design_runs_every_variant_in_one_engine(toy, tmp_path):
    """--design steps --adaptive: two engines (vanilla, the adaptive one); fixed K, the table and the
    plugin are arms of one K sequence inside the same waves, each row from its own steps."""
    from dsdprof.measure.vllm.trace import read_trace
    from tests.support.simulate import synthetic_table

    table = synthetic_table({b: {k: 0.03 + 0.003 * k + 0.001 * b * k for k in range(4)} for b in (1, 2)}, (0.8,) * 3)
    table["provenance"] = {"model": str(toy.target), "draft_model": str(toy.draft), "method": "draft_model"}
    (tmp_path / "t.json").write_text(json.dumps(table))
    write_spec(tmp_path / "s.toml", toy, waves=2, output_len=40)
    out = tmp_path / "val"
    r = CliRunner().invoke(app, ["validate", str(tmp_path / "t.json"), str(tmp_path / "s.toml"), "--fixed-k", "1",
                                 "--fixed-k", "2", "--adaptive", "--design", "steps", "--out", str(out),
                                 "--fail-on-regret", "1000"])
    assert r.exit_code == 0, r.output
    df = pd.read_parquet(out)
    assert len(df) == 2 * 5 and (df["status"] == "ok").all(), df[["cell_id", "error"]]
    assert (df["design"] == "paired").all()
    assert not any(p.name.startswith(("engine-fixed", "engine-dsd")) for p in (out / "_logs").iterdir())
    fixed = df[df["mode"] == "fixed"]
    assert (fixed["drafted_per_draft"] == fixed["num_spec_tokens"].astype(float)).all()
    dsd = df[df["mode"] == "dsd"]
    assert (dsd["drafted_per_draft"] == dsd["num_spec_tokens"].astype(float)).all()  # the table's arm ran its K
    steps = read_trace(out / "_traces" / "adaptive-bs1-steps-r0.jsonl")
    assert {s.arm for s in steps if s.wave >= 0} == {-2, -1, 1, 2}
    c = compare(df)
    assert c["tops_adaptive"].notna().all() and c["adaptive_regret_lo"].notna().all()
