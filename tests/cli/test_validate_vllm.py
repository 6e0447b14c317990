"""``dsdprof validate`` end to end on real vLLM (CPU build) with one toy pair: five engine starts."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("vllm")

from dsdprof.cli.app import app  # noqa: E402
from dsdprof.report.compare import compare  # noqa: E402

# counts, drafted K and the rows, not step times: vLLM's engine core in-process (tests/conftest.py)
pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("inproc_engine_core")]


@pytest.fixture(scope="module")
def toy(toy_tiny):
    """The session's tiny toy pair (tests/conftest.py), for every validate run here (each starts its own
    engines): these tests check the arms' drafted K and the rows, not which K is fastest."""
    return toy_tiny


def write_spec(path, toy, waves: int, output_len: int, batch_sizes=(1, 2)) -> None:
    """A validate spec for the toy pair (batch sizes 1 and 2 unless told)."""
    path.write_text(f"""
[engine]
model = "{toy.target}"
draft_model = "{toy.draft}"
method = "draft_model"
dtype = "float32"
max_model_len = 256
extra = {{ enforce_eager = true }}
[sweep]
batch_sizes = {list(batch_sizes)}
waves = {waves}
output_len = {output_len}
warmup = 1
[workload]
input_len = 16
num_prompts = 16
""")


def test_validate_serves_table_through_vllm_schedule(toy, tmp_path):
    """The table's DSD engine is vLLM's own per-batch-size lookup, configured by the export's
    ``vllm_speculative_config`` (what ``dsdprof export --format vllm`` writes): every steady step of a
    DSD cell must draft the table's K at its batch size (the cell fails otherwise), across three
    ranges. (This was also test_exported_schedule_drives_real_vllm's claim; one engine start fewer.)"""
    table = {
        "schema": "dsdprof.ktable/v1", "num_speculative_tokens": 3,
        "ranges": [[1, 1, 2], [2, 3, 1], [4, 1 << 20, 3]],
        "points": [{"batch_size": 1, "k": 2}, {"batch_size": 2, "k": 1}, {"batch_size": 4, "k": 3}],
        "provenance": {"model": str(toy.target), "draft_model": str(toy.draft), "method": "draft_model"},
    }
    (tmp_path / "t.json").write_text(json.dumps(table))
    write_spec(tmp_path / "s.toml", toy, waves=1, output_len=16, batch_sizes=(1, 2, 4))
    out = tmp_path / "val"
    r = CliRunner().invoke(app, ["validate", str(tmp_path / "t.json"), str(tmp_path / "s.toml"),
                                 "--fixed-k", "2", "--out", str(out), "--fail-on-regret", "1000"])
    assert r.exit_code == 0, r.output
    assert "regret" in r.output
    df = pd.read_parquet(out)
    assert len(df) == 3 * 3 and (df["status"] == "ok").all(), df[["cell_id", "error"]]
    assert (df["design"] == "paired").all() and all(list(b) == [0] for b in df["sample_block"])  # the default
    van = df[df["mode"] == "vanilla"]
    assert (van["num_drafts"] == 0).all()
    fixed = df[df["mode"] == "fixed"]
    assert (fixed["num_drafts"] > 0).all()
    assert (fixed["num_draft_tokens"] / fixed["num_drafts"]).tolist() == pytest.approx([2.0] * 3, rel=0.02)
    dsd = df[df["mode"] == "dsd"].set_index("batch_size")
    # vLLM's own lookup picked K by the batch size of each step (the requests carried no dsdprof
    # K): BS 1 drafts K=2; BS 2 drafts K=1, except on tail steps where one request has finished
    # and the other runs alone at BS 1 (K=2); BS 4 drafts K=3 in its steady steps, its tails K=1
    # at 3 and 2 requests, K=2 at 1.
    per_draft = dsd["num_draft_tokens"] / dsd["num_drafts"]
    assert dsd["num_spec_tokens"].to_dict() == {1: 2, 2: 1, 4: 3}
    steady = dsd["drafted_per_draft"].tolist()  # the steady steps' (tails at a smaller batch excluded)
    assert steady == pytest.approx(dsd["num_spec_tokens"].astype(float).tolist())
    assert per_draft.loc[1] == pytest.approx(2.0, rel=0.01)
    assert 1.0 <= per_draft.loc[2] <= 1.3 and 1.0 <= per_draft.loc[4] <= 3.0
    c = compare(df)
    assert c["batch_size"].tolist() == [1, 2, 4]
    assert c["dsd_k_observed"].tolist() == pytest.approx(per_draft.sort_index().tolist())


def test_validate_steps_design_runs_every_variant_in_one_engine(toy, tmp_path):
    """--design steps --adaptive: two engines (vanilla, the adaptive one); fixed K, the table and the
    plugin are arms of one K sequence inside the same waves, each row from its own steps."""
    from dsdprof.measure.vllm.trace import read_trace
    from tests.support.simulate import synthetic_table

    table = synthetic_table({b: {k: 0.03 + 0.003 * k + 0.001 * b * k for k in range(4)} for b in (1, 2)},
                            (0.8,) * 3)
    table["provenance"] = {"model": str(toy.target), "draft_model": str(toy.draft), "method": "draft_model"}
    (tmp_path / "t.json").write_text(json.dumps(table))
    # the tiny pair accepts ~0.9 a draft, so a request's 96 tokens take ~30 steps a wave: several
    # steady steps per arm in each of the 2 waves (at 40 tokens, one wave had none: intervals unknown)
    write_spec(tmp_path / "s.toml", toy, waves=2, output_len=96)
    out = tmp_path / "val"
    r = CliRunner().invoke(app,
                           ["validate", str(tmp_path / "t.json"), str(tmp_path / "s.toml"), "--fixed-k", "1",
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
    # the table's arm ran its K
    assert (dsd["drafted_per_draft"] == dsd["num_spec_tokens"].astype(float)).all()
    steps = read_trace(out / "_traces" / "adaptive-bs1-steps-r0.jsonl")
    assert {s.arm for s in steps if s.wave >= 0} == {-2, -1, 1, 2}
    c = compare(df)
    assert c["tops_adaptive"].notna().all() and c["adaptive_regret_lo"].notna().all()
