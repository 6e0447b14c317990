"""SimEngine through the real sweep runner and CLI: rows, shapes, bad input."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.config.spec import load_spec, parse_spec
from dsdprof.decide.analysis import analyze
from dsdprof.errors import InputError
from dsdprof.io.readers import load_measurements
from dsdprof.measure.engine import Cell, Engine
from dsdprof.measure.factory import make_engine
from dsdprof.measure.runner import run_sweep

runner = CliRunner()


def spec_dict(**sim):
    sim = {"hardware": "H100 SXM", "acceptance_alpha": 0.75, "context_len": 1024, **sim}
    return {"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3", "dtype": "bfloat16",
                       "max_model_len": 4096},
            "sweep": {"batch_sizes": [1, 4, 16, 64, 256], "num_spec_tokens": [0, 1, 2, 3, 4, 5], "waves": 3,
                      "output_len": 64},
            "sim": sim}


def test_engine_protocol_and_cell_fields():
    eng = make_engine(parse_spec(spec_dict()))
    assert isinstance(eng, Engine) and eng.name == "sim" and eng.speculation_mode == "dsd"
    prov = eng.provenance()
    assert prov["engine"] == "sim" and prov["draft_model"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert prov["model"] == "meta-llama/Llama-3.1-8B-Instruct" and prov["hardware"] == "H100 SXM"
    m = eng.measure(Cell(0, 16, "dsd", 3))
    assert m.acceptance_length == pytest.approx(1 + 0.75 + 0.75**2 + 0.75**3)
    assert m.acceptance_per_pos == pytest.approx((0.75, 0.75**2, 0.75**3))
    assert m.tpot_s == pytest.approx(m.itl_s / m.acceptance_length)
    assert m.itl_p50_s == m.itl_p99_s == m.itl_s
    assert m.tokens_per_s_total == pytest.approx(16 * m.tokens_per_s_per_user)
    assert m.num_requests == 3 * 16 and m.num_output_tokens == 3 * 16 * 64
    assert m.num_draft_tokens == 3 * m.num_drafts
    assert m.num_accepted_tokens / m.num_drafts == pytest.approx(m.acceptance_length - 1, abs=1e-3)
    van, k0 = eng.measure(Cell(0, 16, "vanilla", 0)), eng.measure(Cell(0, 16, "dsd", 0))
    assert van.num_drafts == 0 and van.acceptance_length == 1.0 and k0.itl_s > van.itl_s


def test_sim_sweep_rows_analyze_and_export(tmp_path):
    out = tmp_path / "run"
    summary = run_sweep(parse_spec(spec_dict()), out)
    assert summary.failed == 0 and summary.ok == 5 * 7
    df = pd.read_parquet(out)
    assert set(df["engine"]) == {"sim"} and set(df["mode"]) == {"vanilla", "dsd"}
    assert df["consistent"].all()
    res = analyze(load_measurements(out))
    assert res.monotonic and res.optimal["k"].iloc[0] > res.optimal["k"].iloc[-1]
    table = tmp_path / "t.json"
    r = runner.invoke(app, ["export", str(out), "-o", str(table)])
    assert r.exit_code == 0, r.output


def test_moe_sweep_is_non_monotonic(tmp_path):
    d = spec_dict(routing_correlation=0.34, acceptance_alpha=0.7)
    d["engine"].update(model="Mixtral-8x7B", tensor_parallel_size=2)
    d["sweep"]["batch_sizes"] = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    d["sweep"]["num_spec_tokens"] = list(range(8))
    run_sweep(parse_spec(d), tmp_path / "moe")
    res = analyze(load_measurements(tmp_path / "moe"))
    assert not res.monotonic and res.shape == "moe-like"


def test_shipped_specs_have_their_shapes(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "sweeps"
    # sim-step-model/4 (priors fitted on benchmarks/fidelity_points.toml): each verified token pays
    # the fitted per-token cost; the dense Llama tables are monotonic; Mixtral (large experts) rises
    # then falls; so does DeepSeek-V3 at TP 8 now that current MLA kernels carry no 26 ms of fixed
    # per-step MLA cost (expert loading is a large share of its step), and the small-expert Qwen3 once the
    # batch loads most experts (K* 2 -> 3 at BS 32 even at the spec's low acceptance, alpha 0.55; at
    # higher acceptance the rise is larger: test_small_expert_moe_k_star_rises_where_the_batch_saturates_
    # the_experts). docs/sim.md lists the tables.
    shapes = {"sim-llama8b-eagle3-h100": True, "sim-llama8b-eagle3-h200": True,
              "sim-qwen3-30b-a3b-h100": False,
              "sim-mixtral-h100": False, "sim-deepseek-v3-mtp-h200": False}
    for name, monotonic in shapes.items():
        run_sweep(load_spec(root / f"{name}.toml"), tmp_path / name)
        res = analyze(load_measurements(tmp_path / name))
        assert res.monotonic is monotonic, (name, res.optimal["k"].tolist())


def _k_star(model: str, bss: list[int], tp: int = 1, **acc) -> list[int]:
    """The sim's goodput-optimal K (0..7) per BS on one H200, context 512, EAGLE-3 head."""
    e = make_engine(parse_spec({
        "engine": {"name": "sim", "model": model, "method": "eagle3", "dtype": "bfloat16",
                   "max_model_len": 4096, "tensor_parallel_size": tp},
        "sweep": {"batch_sizes": bss, "num_spec_tokens": list(range(8))},
        "sim": {"hardware": "H200 SXM", "context_len": 512, **acc}}))
    out = []
    for b in bss:
        g = [(lambda m: m.acceptance_length / m.itl_s)(e.measure(Cell(0, b, "dsd", k))) for k in range(8)]
        out.append(max(range(8), key=g.__getitem__))
    return out


def test_small_expert_moe_k_star_rises_where_the_batch_saturates_the_experts():
    """docs/sim.md "MoE shape" (and the measured H200 proxy, docs/lab/gpu-h200.md): at the vLLM EAGLE-3
    sweep's acceptance, Qwen3-30B-A3B's K* is low at BS 1-4 and rises at BS 8-16 (B*k ~ E), then
    falls; a dense model's K* never rises with BS."""
    acc = {"acceptance_per_pos": [0.76, 0.60, 0.43, 0.29, 0.24, 0.14, 0.08]}
    bss = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    moe = _k_star("Qwen3-30B-A3B", bss, **acc)
    assert max(moe[3:5]) >= moe[0] + 2 and max(moe[:3]) == moe[0], moe  # the rise at BS 8-16
    assert moe[-1] < max(moe), moe  # and the fall at large BS
    dense = _k_star("Llama-3.1-8B", bss, **acc)
    assert all(a >= b for a, b in zip(dense, dense[1:])), dense


def test_out_of_memory_cells_are_failed_rows(tmp_path):
    d = spec_dict()
    d["engine"].update(model="DeepSeek-V3", method="mtp", dtype="auto")
    d["sweep"].update(batch_sizes=[1], num_spec_tokens=[0, 1])
    summary = run_sweep(parse_spec(d), tmp_path / "oom")
    df = pd.read_parquet(tmp_path / "oom")
    assert summary.failed == 3 and df["error"].str.contains("out of memory").all()


def test_acceptance_from_measured_parquet(tmp_path):
    rows = [{"batch_size": 1, "num_spec_tokens": k, "acceptance_length": 1 + sum([0.9, 0.6, 0.3][:k]),
             "itl_s": 0.01, "acceptance_per_pos": [0.9, 0.6, 0.3][:k], "mode": "dsd"} for k in (1, 2, 3)]
    pd.DataFrame(rows).to_parquet(tmp_path / "m.parquet")
    measured = str(tmp_path / "m.parquet")
    eng = make_engine(parse_spec(spec_dict(acceptance_alpha=None, acceptance_from=measured)))
    assert eng.measure(Cell(0, 1, "dsd", 3)).acceptance_length == pytest.approx(2.8)
    # K = 5 continues with the last conditional rate 0.3 / 0.6
    assert eng.measure(Cell(0, 1, "dsd", 5)).acceptance_per_pos[3:] == pytest.approx((0.15, 0.075))


def test_ngram_has_no_draft_model_cost():
    d = spec_dict()
    d["engine"].update(method="ngram")
    eng = make_engine(parse_spec(d))
    assert eng.provenance()["draft_model"] == ""
    k1, k3 = eng.measure(Cell(0, 1, "dsd", 1)), eng.measure(Cell(0, 1, "dsd", 3))
    assert k3.itl_s - k1.itl_s < 0.5e-3  # no forward passes, only per-step overhead


BAD = [
    ({"turbo": True}, "sim.turbo", "unknown key"),
    ({"hardware": "TPU v9"}, "sim.hardware", "TPU v9"),
    ({"acceptance_per_pos": [0.9]}, "sim", "one acceptance source"),
    ({"acceptance_alpha": None}, "sim", "acceptance source"),
    ({"acceptance_alpha": 1.5}, "sim.acceptance_alpha", "1.5"),
    ({"context_len": 99999}, "sim.context_len", "max_model_len"),
    ({"routing_correlation": 1.0}, "sim.routing_correlation", "1.0"),
    ({"acceptance_alpha": None, "acceptance_per_pos": [0.5, 0.9]}, "sim.acceptance_per_pos",
     "non-increasing"),
    ({"acceptance_alpha": None, "acceptance_from": "/no/such.parquet"}, "sim.acceptance_from", "no such"),
]


@pytest.mark.parametrize("sim,field,needle", BAD)
def test_bad_sim_input(sim, field, needle):
    with pytest.raises(InputError) as err:
        make_engine(parse_spec(spec_dict(**sim)))
    assert err.value.field == field and needle in str(err.value)


@pytest.mark.parametrize("engine,field", [
    ({"model": "GPT-9"}, "engine.model"), ({"method": "medusa"}, "engine.method"),
    ({"dtype": "int3"}, "engine.dtype"),
    ({"method": "ngram", "draft_model": "Llama-3.2-1B"}, "engine.draft_model"),
    ({"model": "Qwen3-8B", "method": "draft_model"}, "engine.draft_model")])
def test_bad_engine_input(engine, field):
    d = spec_dict()
    d["engine"].update(engine)
    with pytest.raises(InputError) as err:
        make_engine(parse_spec(d))
    assert err.value.field == field


def test_missing_sim_section():
    d = spec_dict()
    del d["sim"]
    with pytest.raises(InputError, match="needs a \\[sim\\] section"):
        make_engine(parse_spec(d))


def test_cli_sweep_bad_sim_key_is_one_line(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('[engine]\nname = "sim"\nmodel = "Llama-3.1-8B"\nmethod = "eagle3"\n'
                    '[sim]\nhardware = "H100"\nacceptance_alpha = 0.8\nwarp = 3\n')
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.exit_code == 2 and errors == ["error: sim.warp=3: unknown key"] and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").glob("*.parquet"))


def test_predictions_are_finite_everywhere():
    eng = make_engine(parse_spec(spec_dict()))
    for b in (1, 7, 333):
        for k in range(6):
            assert math.isfinite(eng.measure(Cell(0, b, "dsd", k)).itl_s)
