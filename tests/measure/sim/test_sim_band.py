"""The band around sim predictions and the stated inputs (dsdprof/measure/sim/band.py, inputs.py).
Fast: no fits (the fidelity figures are in test_sim_fidelity.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.config.spec import parse_spec
from dsdprof.errors import InputError
from dsdprof.measure.sim import band as sb
from dsdprof.measure.sim.config import resolve
from dsdprof.measure.sim.engine import SimEngine
from dsdprof.measure.sim.hardware import HARDWARE, OVERLAP_STEP_OVERHEAD_S
from dsdprof.measure.sim.model import HwArrays, arch_features, step_time
from tests.support import fidelity_band as fb

runner = CliRunner()
BS, KS = [1, 8, 64, 256], [0, 1, 2, 3, 4, 5]


def spec(model="Llama-3.1-8B", method="eagle3", hardware="H100 SXM", tp=1, dtype="bfloat16", **sim):
    return parse_spec({
        "engine": {"name": "sim", "model": model, "method": method, "dtype": dtype,
                   "tensor_parallel_size": tp, "max_model_len": 4096},
        "sweep": {"batch_sizes": BS, "num_spec_tokens": KS, "waves": 1, "output_len": 64},
        "sim": {"hardware": hardware, "acceptance_alpha": 0.75, "context_len": 1024, **sim}})


def band(**kw) -> sb.SimBand:
    return sb.sim_band(resolve(spec(**kw)), BS, KS, 0.02)


def test_defaults_do_not_move_the_prediction():
    """Nothing stated: the nominal scenario is the catalog's (vLLM, auto KV, current kernels)."""
    eng = SimEngine(spec())
    m = HARDWARE["H100 SXM"]
    f = arch_features(eng.setup.target, "bfloat16", 1)
    d = arch_features(eng.setup.draft, "bfloat16", 1)
    want = step_time(HwArrays.of(m, "bf16"), f, d, 8.0, 3.0, 1024, 0.0, 1.0, "eagle3").total_s
    assert eng.predict_itl(8, 3, True) == pytest.approx(float(want), rel=1e-12)


def test_stated_serving_engine_sets_the_prediction_and_narrows_the_band():
    vllm, sglang = SimEngine(spec()), SimEngine(spec(serving_engine="sglang"))
    gap = vllm.predict_itl(1, 3, True) - sglang.predict_itl(1, 3, True)
    assert gap == pytest.approx(HARDWARE["H100 SXM"].efficiency.step_overhead_s - OVERLAP_STEP_OVERHEAD_S)
    free, stated = band(), band(serving_engine="vllm", kv_cache_dtype="auto")
    assert [a.key for a in free.assumptions if not a.stated] == ["serving_engine", "kv_cache_dtype"]
    assert all(a.stated for a in stated.assumptions) and stated.scenarios == 1 < free.scenarios
    for c in stated.cells:  # stated: the category spread around the one prediction
        f = free.cell(c.batch_size, c.k, c.speculative)
        assert f.itl_s == pytest.approx(c.itl_s)
        assert c.low_s == pytest.approx(c.itl_s * stated.error.low)
        assert f.low_s < c.low_s <= c.itl_s <= c.high_s <= f.high_s
    assert stated.error.categories == ("dense", "vLLM")
    assert "SGLang/TRT-LLM" in free.error.categories  # not stated: both engine families' spreads


def test_k_star_range_contains_the_analysis_k_and_every_scenario(tmp_path):
    b = band(model="DeepSeek-V3", method="mtp", hardware="H200 SXM", tp=8, dtype="fp8")
    keys = {a.key for a in b.assumptions if not a.stated}
    assert {"MLA kernels (engine_version)", "fp8_gemm", "kv_cache_dtype", "serving_engine"} <= keys
    assert b.error.categories[:3] == ("mla", "fp8", "tp>1")
    assert all(r.k_low <= r.k <= r.k_high for r in b.k_star)
    assert any(r.k_low < r.k_high for r in b.k_star)  # the MLA kernel era moves K* somewhere
    # the pre-FlashMLA era is inside the band: each cell's high end covers its prediction
    old = SimEngine(spec(model="DeepSeek-V3", method="mtp", hardware="H200 SXM", tp=8, dtype="fp8",
                         serving_engine="sglang", engine_version="0.4.1"))
    assert old.setup.hardware.efficiency.mla_layer_overhead_s > 100e-6
    for bs in BS:
        c = b.cell(bs, 2)
        assert c.low_s < c.itl_s < old.predict_itl(bs, 2, True) <= c.high_s


def test_k_star_range_matches_analyze_and_export(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[engine]\nname = "sim"\nmodel = "Llama-3.1-8B"\nmethod = "eagle3"\ndtype = "bfloat16"\n'
                    '[sweep]\nbatch_sizes = [1, 8, 64, 256]\nnum_spec_tokens = [0, 1, 2, 3, 4, 5]\n'
                    'output_len = 64\nwaves = 1\n'
                    '[sim]\nhardware = "H100"\nacceptance_alpha = 0.75\ncontext_len = 1024\n')
    out = tmp_path / "run"
    sweep = runner.invoke(app, ["sweep", str(path), "--out", str(out)])
    assert sweep.exit_code == 0 and "not measurements; assumed (state them in [sim] to narrow the band): " \
        "serving_engine vllm" in sweep.stderr
    r = runner.invoke(app, ["analyze", str(out)])
    assert r.exit_code == 0, r.output
    b = band()
    for k in b.k_star:
        assert f"BS {k.batch_size}: K* {k.text()}, ITL" in r.stdout
    assert "assumed: serving_engine vllm (band covers sglang, tensorrt-llm)" in r.stdout
    j = json.loads(runner.invoke(app, ["analyze", str(out), "--json"]).stdout)
    assert [o["k"] for o in j["optimal"]] == [k.k for k in b.k_star]  # nominal K* = the analysis's
    assert j["prediction_band"]["k_star"] == [
        {"batch_size": k.batch_size, "k": k.k, "k_low": k.k_low, "k_high": k.k_high} for k in b.k_star]
    assert len(j["prediction_band"]["cells"]) == len(BS) * (len(KS) + 1)
    e = runner.invoke(app, ["export", str(out), "-o", str(tmp_path / "t.json")])
    assert e.exit_code == 0 and "K* could change" in e.stderr
    prov = json.loads((tmp_path / "t.json").read_text())["provenance"]
    assert prov["extra_prediction_k_star"].startswith("tolerance 2%: BS 1: ")
    assert "serving_engine vllm" in prov["extra_prediction_assumed"]


def test_error_band_takes_the_widest_category_and_thin_ones_fall_back():
    ce = sb.CategoryError
    table = (ce("dense", 40, 12, 9.0, 0.9, 1.2), ce("mla", 2, 1, 50.0, 0.5, 3.0),
             ce("fp8", 20, 5, 10.0, 0.95, 1.4), ce("all", 62, 17, 9.0, 0.92, 1.25))
    b = sb.error_band(("dense", "fp8"), table)
    assert (b.low, b.high) == (0.9, 1.4)
    thin = sb.error_band(("mla",), table)  # 2 points < MIN_POINTS: all points' spread
    assert (thin.low, thin.high) == (0.92, 1.25)
    with pytest.raises(InputError):
        sb.error_band(("dense",), ())


def test_category_errors_are_quantiles_of_the_ratios():
    r = np.linspace(0.8, 1.3, 11)
    cats = [("dense", "vLLM")] * 6 + [("moe", "vLLM")] * 5
    t = {c.name: c for c in fb.category_errors(cats, r, [f"s{i % 3}" for i in range(11)])}
    assert t["all"].points == 11 and t["dense"].points == 6 and t["moe"].sources == 3
    assert t["dense"].low == pytest.approx(np.quantile(r[:6], 0.1), abs=1e-3)
    assert t["moe"].high == pytest.approx(np.quantile(r[6:], 0.9), abs=1e-3)


@pytest.mark.parametrize("sim, field", [
    ({"serving_engine": "trtllm"}, "sim.serving_engine"),
    ({"engine_version": "0.4.1"}, "sim.engine_version"),
    ({"serving_engine": "vllm", "engine_version": "latest"}, "sim.engine_version"),
    ({"fp8_gemm": "cublas"}, "sim.fp8_gemm"),
    ({"attention_backend": "flash"}, "sim.attention_backend"),
])
def test_bad_stated_input_is_one_line_exit_2(tmp_path, sim, field):
    path = tmp_path / "s.toml"
    extra = "".join(f'{k} = "{v}"\n' for k, v in sim.items())
    path.write_text('[engine]\nname = "sim"\nmodel = "Llama-3.1-8B"\nmethod = "eagle3"\ndtype = "bfloat16"\n'
                    '[sweep]\nbatch_sizes = [1]\nnum_spec_tokens = [0, 1]\noutput_len = 8\n'
                    '[sim]\nhardware = "H100"\nacceptance_alpha = 0.7\n' + extra)
    r = runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and f"{field}=" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout and len(r.stderr.strip().splitlines()) == 1


def test_h20_attention_backend_and_fp8_path():
    """FLASHINFER on H20 computes the useful query rows only (faster at long context); marlin runs
    FP8 weights at the bf16 rate (slower where the step is compute-bound)."""
    fa3 = SimEngine(spec(model="Qwen3-8B", method="eagle3", hardware="H20", context_len=3000))
    fi = SimEngine(spec(model="Qwen3-8B", method="eagle3", hardware="H20", context_len=3000,
                        attention_backend="FLASHINFER"))
    assert fi.predict_itl(64, 3, True) < fa3.predict_itl(64, 3, True)
    b = sb.sim_band(fa3.setup, BS, KS, 0.02)
    assert b.cell(64, 3).low_s <= fi.predict_itl(64, 3, True) * b.error.low + 1e-12
    kw = dict(model="Llama-3.1-8B", method="eagle3", dtype="fp8")
    deep, marlin = SimEngine(spec(**kw)), SimEngine(spec(**kw, fp8_gemm="marlin"))
    assert marlin.predict_itl(256, 5, True) > deep.predict_itl(256, 5, True)
    assert marlin.predict_itl(1, 0, True) == pytest.approx(deep.predict_itl(1, 0, True))  # memory-bound


def test_profile_hardware_counts_its_overheads_as_stated(tmp_path):
    from dsdprof.measure.sim.hardware import write_profile

    prof = tmp_path / "gpu.toml"
    write_profile(prof, replace(HARDWARE["H100 SXM"], name="my-h100"))
    b = sb.sim_band(resolve(spec(hardware=str(prof))), BS, KS, 0.02)
    serving = next(a for a in b.assumptions if a.key == "serving_engine")
    assert serving.stated and serving.value == "as step_overhead_s gives"
