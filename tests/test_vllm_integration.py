"""Real vLLM (CPU build) with locally built toy models. Slow: a few engine starts."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("vllm")

from dsdprof.analysis import analyze_path  # noqa: E402
from dsdprof.engines.vllm_engine import EngineWorker, VllmEngine  # noqa: E402
from dsdprof.engines.vllm_worker import CellRequest, WorkerConfig  # noqa: E402
from dsdprof.spec import parse_spec  # noqa: E402
from dsdprof.sweep import run_sweep  # noqa: E402
from dsdprof.table import build_table, k_for_batch_size, vllm_speculative_config  # noqa: E402
from dsdprof.toy_models import ToyModelConfig, build_toy_pair  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return build_toy_pair(tmp_path_factory.mktemp("toy") / "dense", ToyModelConfig(kind="dense"))


def _spec(target, draft, batch_sizes, ks, waves=3, output_len=32, **engine):
    return parse_spec({
        "engine": {"name": "vllm", "model": str(target), "draft_model": str(draft), "method": "draft_model",
                   "dtype": "float32", "max_model_len": 512, "extra": {"enforce_eager": True}, **engine},
        "sweep": {"batch_sizes": batch_sizes, "num_spec_tokens": ks, "waves": waves,
                  "output_len": output_len, "warmup": 1},
        "workload": {"dataset": "synthetic", "input_len": 32, "num_prompts": 64, "seed": 0},
    })


def test_draft_equal_target_gives_al_k_plus_one(toy, tmp_path):
    spec = _spec(toy.target, toy.target, [1, 2], [0, 1, 3], waves=2, output_len=25)
    events = []
    summary = run_sweep(spec, tmp_path / "run", on_progress=events.append)
    assert summary.failed == 0 and summary.speculation_mode == "dsd"
    df = pd.read_parquet(tmp_path / "run")
    assert set(df["mode"]) == {"vanilla", "dsd"}
    assert len(df) == 2 * (1 + 3)
    for row in df[df["mode"] == "dsd"].itertuples():
        assert row.acceptance_length == pytest.approx(row.num_spec_tokens + 1, rel=0.01), row.cell_id
        assert len(row.acceptance_per_pos) == row.num_spec_tokens
        if row.num_spec_tokens:
            assert row.num_draft_tokens / row.num_drafts == pytest.approx(row.num_spec_tokens)
    assert (df["itl_s"] > 0).all() and (df["tpot_s"] > 0).all()
    assert (df["engine"] == "vllm").all() and df["hardware"].iloc[0]
    assert df["consistent"].all()
    assert [e.phase for e in events].count("done") == len(df)


def test_toy_pair_optimal_k_falls_with_batch_size(toy, tmp_path):
    spec = _spec(toy.target, toy.draft, [1, 16], [0, 1, 2, 3, 4], waves=3)
    run_sweep(spec, tmp_path / "run")
    df = pd.read_parquet(tmp_path / "run")
    dsd4 = df[(df["mode"] == "dsd") & (df["num_spec_tokens"] == 4)]
    assert (dsd4["acceptance_length"] < 4.9).all() and (dsd4["acceptance_length"] > 1.5).all()  # realistic
    res = analyze_path(tmp_path / "run")
    k = dict(zip(res.optimal["batch_size"], res.optimal["k"]))
    assert k[1] >= k[16], res.optimal
    assert k[1] >= 1


def test_exported_schedule_drives_real_vllm(toy, tmp_path):
    from dsdprof.analysis import Analysis

    optimal = pd.DataFrame({"batch_size": [1, 2, 4], "k": [3, 1, 2], "goodput": [1.0] * 3,
                            "acceptance_length": [1.0] * 3, "itl_s": [1.0] * 3,
                            "speedup_vs_baseline": [1.0] * 3})
    table = build_table(Analysis(cells=optimal, baseline=optimal, optimal=optimal, tolerance=0.02, monotonic=False,
                                 provenance={"method": "draft_model", "draft_model": str(toy.target)}))
    cfg = vllm_speculative_config(table)
    spec = _spec(toy.target, toy.target, [4], [3])
    kwargs = {**VllmEngine(spec).llm_kwargs("vanilla"), "speculative_config": cfg}
    worker = EngineWorker(WorkerConfig(kwargs, spec.workload), start_timeout_s=900)
    try:
        for b in (1, 2, 3, 4):
            expected = k_for_batch_size(table["ranges"], b)
            req = CellRequest(batch_size=b, num_spec_tokens=None, positions=3, waves=2, warmup=0,
                              output_len=25, temperature=0.0, seed=0)
            m = worker.run(req, timeout_s=600)
            assert m.num_drafts > 0
            # Requests reach the engine one by one, so a wave's first/last step can run at a
            # smaller batch (and so another K); the bulk of the steps must run the table's K.
            per_draft = m.num_draft_tokens / m.num_drafts
            others = {r[2] for r in table["ranges"]} - {expected}
            assert all(abs(per_draft - expected) < abs(per_draft - o) for o in others), (b, expected, per_draft)
    finally:
        worker.stop()


def test_failed_engine_is_a_row_not_a_dead_sweep(toy, tmp_path):
    spec = _spec(toy.target, tmp_path / "no-such-draft", [2], [2], waves=1, dsd_mode="dsd")
    summary = run_sweep(spec, tmp_path / "run")
    df = pd.read_parquet(tmp_path / "run")
    assert summary.ok == 1 and summary.failed == 1
    failed = df[df["status"] == "failed"].iloc[0]
    assert failed["mode"] == "dsd" and failed["error"]
    assert df[df["status"] == "ok"].iloc[0]["mode"] == "vanilla"


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
    assert analyze_path(tmp_path / "run").optimal.iloc[0]["k"] in (0, 2)
