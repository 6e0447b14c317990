"""Real vLLM (CPU build) with locally built toy models. Slow: a few engine starts.

That an exported table drives vLLM's own per-batch-size lookup is checked, step by step, by
tests/cli/test_validate_vllm.py::test_validate_serves_table_through_vllm_schedule (its DSD engine
is configured by the same ``vllm_speculative_config``)."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("vllm")

from dsdprof.config.spec import parse_spec  # noqa: E402
from dsdprof.decide.analysis import analyze_path  # noqa: E402
from dsdprof.io.runs import open_run  # noqa: E402
from dsdprof.measure.runner import run_sweep  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def toy(toy_tiny):
    """The session's tiny toy pair (tests/conftest.py): these tests count tokens and drafts, not time,
    with vLLM's engine core in-process (``inproc_engine_core``, tests/conftest.py). Only the optimal-K
    test, which measures which K is fastest, runs the default pair (``toy_dense``) in the served layout."""
    return toy_tiny


def _spec(target, draft, batch_sizes, ks, waves=3, output_len=32, design="cells", **engine):
    return parse_spec({
        "engine": {"name": "vllm", "model": str(target), "draft_model": str(draft), "method": "draft_model",
                   "dtype": "float32", "max_model_len": 512, "extra": {"enforce_eager": True}, **engine},
        "sweep": {"batch_sizes": batch_sizes, "num_spec_tokens": ks, "waves": waves,
                  "output_len": output_len, "warmup": 1, "design": design},
        "workload": {"dataset": "synthetic", "input_len": 32, "num_prompts": 64, "seed": 0},
    })


def test_draft_equal_target_counts_delivered_tokens_at_the_rows_k(toy, tmp_path, inproc_engine_core):
    # The prefill step samples the first token; the other 23 of output_len 24 are not a multiple
    # of K+1 for K = 1 or 3, so the last step of every request is trimmed at max_tokens.
    spec = _spec(toy.target, toy.target, [1, 2], [0, 1, 3], waves=2, output_len=24)
    events = []
    summary = run_sweep(spec, tmp_path / "run", on_progress=events.append)
    assert summary.failed == 0 and summary.speculation_mode == "dsd"
    df = pd.read_parquet(tmp_path / "run")
    assert set(df["mode"]) == {"vanilla", "dsd"}
    assert len(df) == 2 * (1 + 3)
    for row in df.itertuples():
        k = row.num_spec_tokens
        # AL / ITL and 1 / TPOT describe the same steady-state window
        assert row.acceptance_length / row.itl_s == pytest.approx(1 / row.tpot_s, rel=0.02), row.cell_id
        assert row.steady_steps > 0 and row.excluded_steps >= spec.sweep.waves  # the prefill steps
        assert len(row.sample_acceptance_length) == spec.sweep.waves
        if k:
            assert row.drafted_per_draft == pytest.approx(k, rel=0.02), row.cell_id
            assert list(row.acceptance_per_pos) == pytest.approx([1.0] * k), row.cell_id
            # counted before vLLM trims at max_tokens: every step produced K+1 (draft = target),
            # although the last step of a request delivered only what was left of its 23 tokens
            assert row.acceptance_length == pytest.approx(k + 1, rel=1e-9), row.cell_id
            # vLLM's own (untrimmed) counters agree exactly
            assert row.vllm_acceptance_length == pytest.approx(row.acceptance_length, rel=1e-9), row.cell_id
        else:
            assert row.acceptance_length == 1.0 and row.num_draft_tokens == 0
        # delivered (after trimming): every measured request got exactly output_len tokens
        want = spec.sweep.waves * row.batch_size * 24
        assert row.trace_output_tokens == row.num_output_tokens == want, row.cell_id
    assert (df["itl_s"] > 0).all() and (df["tpot_s"] > 0).all()
    assert (df["engine"] == "vllm").all() and df["hardware"].iloc[0]
    assert df["consistent"].all()
    assert [e.phase for e in events].count("done") == len(df)
    log = (tmp_path / "run" / "_logs" / "engine-dsd.log").read_text()
    # the layout asked for: vLLM prefixes its engine core's lines by its process' name
    assert log and ("(EngineCore pid=" in log) != inproc_engine_core, log[-2000:]
    assert len(list((tmp_path / "run" / "_traces").glob("*.jsonl"))) == len(df)


@pytest.mark.usefixtures("inproc_engine_core")
def test_paired_design_runs_every_k_in_the_same_waves(toy, tmp_path):
    """The default design: one trace per batch size, every K in it, K switched per step; each
    K's step time from its own steps, acceptance pooled by draft position. Draft = target accepts
    every draft, so AL(K) = K + 1 exactly, pooled and from the K's own steps."""
    spec = _spec(toy.target, toy.target, [1, 2], [0, 1, 3], waves=2, output_len=40, design="paired")
    summary = run_sweep(spec, tmp_path / "run")
    assert summary.failed == 0 and summary.speculation_mode == "dsd"
    df = pd.read_parquet(tmp_path / "run")
    dsd = df[df["mode"] == "dsd"]
    assert len(dsd) == 2 * 3 and (df["design"] == "paired").all()
    # vanilla: one K's share of the 2 waves (1), raised to 2 (measure.engine.vanilla_waves), wave j
    # beside the group's wave block j (each group wave a block: unit_layout)
    van = df[df["mode"] == "vanilla"]
    assert all(list(b) == [0, 1]
               for b in van["sample_block"]) and all(list(b) == [0, 1] for b in dsd["sample_block"])
    assert van["consistent"].all() and (van["num_requests"] == 2 * van["batch_size"]).all()
    for row in dsd.itertuples():
        k = row.num_spec_tokens
        assert row.acceptance_length == pytest.approx(k + 1, rel=1e-9), row.cell_id
        assert row.acceptance_length_own == pytest.approx(k + 1, rel=1e-9), row.cell_id
        assert row.drafted_per_draft == pytest.approx(k), row.cell_id
        assert row.steady_steps > 0 and len(row.sample_itl_s) == len(row.sample_acceptance_length)
        assert row.consistent, row.checks_failed  # tokens and counters over the shared waves
    for b in (1, 2):  # every K of a batch size holds the same waves
        assert len({len(r) for r in dsd[dsd["batch_size"] == b]["sample_itl_s"]}) == 1
    traces = sorted(p.name for p in (tmp_path / "run" / "_traces").glob("*.jsonl"))
    assert traces == ["dsd-bs1-paired-r0.jsonl", "dsd-bs2-paired-r0.jsonl", "vanilla-bs1-k0-r0.jsonl",
                      "vanilla-bs2-k0-r0.jsonl"]
    res = analyze_path(open_run(tmp_path / "run", "analyze"))
    assert res.intervals_known


def test_toy_pair_optimal_k_falls_with_batch_size(toy_dense, tmp_path):
    """The default pair (step time is the claim), in the default (paired) design: every K of a batch
    size inside the same 4 waves, a third of the engine time of 3 waves per cell."""
    toy = toy_dense
    spec = _spec(toy.target, toy.draft, [1, 16], [0, 1, 2, 3, 4], waves=4, design="paired")
    run_sweep(spec, tmp_path / "run")
    df = pd.read_parquet(tmp_path / "run")
    dsd4 = df[(df["mode"] == "dsd") & (df["num_spec_tokens"] == 4)]
    assert (dsd4["acceptance_length"] < 4.9).all() and (dsd4["acceptance_length"] > 1.5).all()  # realistic
    res = analyze_path(open_run(tmp_path / "run", "analyze"))
    k = dict(zip(res.optimal["batch_size"], res.optimal["k"]))
    assert k[1] >= k[16], res.optimal
    assert k[1] >= 1


def test_models_that_cannot_resolve_or_load_stop_before_any_cell(toy, tmp_path):
    # served layout: the one-line error is the one users get (vLLM's root cause read from the engine log)
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"], "model_type": "nonsense"}')
    for target, draft, field in ((tmp_path / "missing", toy.draft, "engine.model"),
                                 (toy.target, tmp_path / "missing", "engine.draft_model"),
                                 (broken, toy.draft, "engine.model")):
        (tmp_path / "s.toml").write_text(f"""
[engine]
model = "{target}"
draft_model = "{draft}"
dtype = "float32"
max_model_len = 256
extra = {{ enforce_eager = true }}
[sweep]
batch_sizes = [1]
num_spec_tokens = [0, 1]
waves = 1
output_len = 8
[workload]
input_len = 8
num_prompts = 4
""")
        out = tmp_path / f"run-{field}-{target.name}"
        r = CliRunner().invoke(app, ["sweep", str(tmp_path / "s.toml"), "--out", str(out)])
        assert r.exit_code == 2, r.output
        lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and field in lines[0], r.output
        assert "Traceback" not in r.output
        assert not list(out.glob("part-*.parquet")) if out.exists() else True


@pytest.mark.usefixtures("inproc_engine_core")
def test_fixed_mode_runs_one_engine_per_k(toy, tmp_path):
    spec = _spec(toy.target, toy.target, [2], [0, 2], waves=1, output_len=25, dsd_mode="fixed")
    summary = run_sweep(spec, tmp_path / "run")
    df = pd.read_parquet(tmp_path / "run")
    assert summary.speculation_mode == "fixed" and summary.failed == 0
    assert sorted(df["mode"]) == ["fixed", "vanilla"]
    fixed = df[df["mode"] == "fixed"].iloc[0]
    assert fixed["num_spec_tokens"] == 2
    assert fixed["num_draft_tokens"] / fixed["num_drafts"] == pytest.approx(2)
    assert fixed["acceptance_length"] == pytest.approx(3.0, rel=0.01)
    assert analyze_path(open_run(tmp_path / "run", "analyze")).optimal.iloc[0]["k"] in (0, 2)
