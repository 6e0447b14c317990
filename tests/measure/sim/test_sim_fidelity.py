"""The analytic engine against published GPU step times (benchmarks/fidelity_points.toml).

The headline is leave-one-SOURCE-out: every publication is predicted by priors fitted on the
other publications only, so neither a point nor its siblings from the same setup can vouch for
it. Leave-one-out (one point at a time) is checked too. Fast (a few s; numpy + scipy, no engine)."""

from __future__ import annotations

import numpy as np
import pytest

from dsdprof.config.spec import parse_spec
from dsdprof.errors import InputError
from dsdprof.measure.sim.band import CATEGORY_ERRORS
from dsdprof.measure.sim.catalog import MODELS
from dsdprof.measure.sim.config import resolve
from dsdprof.measure.sim.hardware import HARDWARE, OVERLAP_STEP_OVERHEAD_S, PRIOR_FROM
from dsdprof.measure.sim.model import METHOD_OVERHEAD, arch_features
from tests.support import fidelity as fid
from tests.support import fidelity_band as fb

# Achieved (53 points, 17 sources): leave-one-source-out 9.4 %, leave-one-out 6.2 %. Issue 36's goal
# for the whole-source figure is 10 %; each bound is what the model reaches plus ~0.5 point (within
# the goal), so a regression of the model or of the data fails it.
LOSO_MAPE_BOUND = 9.9
LOO_MAPE_BOUND = 7.0
# Issue 47's bars, whole source held out, each point described as a user would: with the inputs its
# publication states <= 10 % MAPE; with defaults only the band covers >= 80 % of published figures.
# Achieved (flat spreads, what this test runs): 9.4 % and 94 %; nested (the lab note's figure): 9.4 %
# and 98 %. The widths keep the band honest the other way: a band wide enough to cover anything fails.
STATED_MAPE_BAR, DEFAULTS_COVERAGE_BAR = 10.0, 0.80
STATED_WIDTH_BOUND, DEFAULTS_WIDTH_BOUND = 0.40, 0.60  # median (high - low) / prediction


@pytest.fixture(scope="module")
def loo() -> fid.LooResult:
    return fid.leave_one_out(fid.load_points())


@pytest.fixture(scope="module")
def loso(loo) -> np.ndarray:
    """Every point predicted by priors fitted with its whole source held out."""
    return fid.leave_one_source_out(loo.points)


@pytest.fixture(scope="module")
def bands(loo, loso) -> tuple[fb.BandCheck, fb.BandCheck]:
    return fb.band_checks(loo.points, nested=False, flat=loso)


def test_band_with_stated_inputs_and_with_defaults_only(bands):
    """Issue 47 part 3: every source held out whole; stated inputs <= 10 % MAPE, defaults only: the
    band covers >= 80 % of the published figures; stating the inputs helps; the band stays narrow
    enough to mean something."""
    stated, defaults = bands
    assert len(stated.points) == len(defaults.points) >= 50
    assert stated.mape <= STATED_MAPE_BAR, stated.mape
    assert defaults.coverage >= DEFAULTS_COVERAGE_BAR, defaults.coverage
    assert defaults.mape > stated.mape  # the stated inputs carry information
    assert stated.coverage >= 0.7, stated.coverage  # the category spread alone is a 10-90 % band
    assert np.median(stated.width) <= STATED_WIDTH_BOUND, np.median(stated.width)
    assert np.median(defaults.width) <= DEFAULTS_WIDTH_BOUND, np.median(defaults.width)
    assert np.all(defaults.width >= stated.width - 1e-9)  # unstated inputs only widen it


def test_k_star_within_the_band_against_published_k_sweeps(loo, loso):
    """The two published BS-1 K sweeps, each predicted with its whole source held out, K* by dsdprof's
    rule (2 %) on both sides: the published K* lies in the band's K* range. vLLM V1 EAGLE-1 (K 2, 4):
    published 2, predicted 2 (2-2). The vLLM EAGLE K 2-7 sweep: published 3, predicted 4 (3-5): held
    out, its per-draft-step cost rests on the other sweep alone and comes out ~30 % low; only the
    band's error placed wholly in the cost K adds (at the grid's largest K) reaches 3."""
    for stated in (True, False):
        spans = fb.k_sweep_spans(loo.points, stated, loso)
        assert len(spans) == 2
        assert all(s.k_low <= s.best <= s.k_high for s in spans), spans
        assert all(s.k_high - s.k_low <= 2 for s in spans), spans  # and the range stays narrow


def test_shipped_category_errors_are_the_suite_s(loo, loso):
    """band.py ships what the suite computes (python benchmarks/sim_fidelity.py --band prints it)."""
    assert fb.table_of(loo.points, loso) == CATEGORY_ERRORS


def test_leave_one_out_error_and_no_systematic_sign(loo):
    assert len(loo.points) >= 20
    assert loo.mape <= LOO_MAPE_BOUND, loo.mape
    assert 0.3 < loo.low_share < 0.7, loo.low_share  # fewer than 70 % on one side


def test_whole_source_held_out_error(loo, loso):
    """The headline: each source predicted by a fit that never saw any of its points."""
    pred = loso
    err = pred / loo.published_s - 1.0
    assert len({p.source for p in loo.points}) >= 15
    assert np.mean(np.abs(err)) * 100 <= LOSO_MAPE_BOUND, np.mean(np.abs(err))
    assert np.mean(np.abs(err)) > loo.mape / 100  # stricter than one point at a time, as it must be
    assert np.median(np.abs(err)) < 0.08


def test_overlap_scheduler_engines_get_their_own_step_overhead(loo):
    """SGLang / TensorRT-LLM points are fitted with their own step overhead; the fit finds it far
    below vLLM's (their overlap scheduler hides the CPU work), and hardware.py ships that value."""
    assert fid.overlaps_cpu("SGLang 0.4.1.post2") and fid.overlaps_cpu("TensorRT-LLM 0.17")
    assert fid.overlaps_cpu("trt-llm") and not fid.overlaps_cpu("vLLM 0.11.1 RC")
    assert not fid.overlaps_cpu("NVIDIA NIM 1.8.0")
    theta = loo.theta_all
    ov = theta[fid.FIT_PARAMS.index("overlap_step_overhead_s")]
    step = theta[fid.PARAMS.index("step_overhead_s")]
    assert ov < 0.25 * step and abs(ov - OVERLAP_STEP_OVERHEAD_S) < 50e-6
    assert sum(fid.overlaps_cpu(p.engine) for p in loo.points) >= 5
    # with the engine term removed (all points share one step overhead), whole-source error is worse
    t = fid.terms(loo.points)
    t1 = fid.Terms(**{**t.__dict__, "overlap": np.zeros_like(t.overlap)})
    src = np.array([p.source for p in loo.points])
    pred = np.empty(len(src))
    for s in np.unique(src):
        held = np.flatnonzero(src == s)
        th = fid.fit_params(t1, np.flatnonzero(src != s))
        sub = fid.Terms(**{f: getattr(t1, f)[held] for f in fid.Terms.__dataclass_fields__})
        pred[held] = fid.predict(sub, th)
    shared = np.mean(np.abs(pred / t.y_s - 1)) * 100
    assert shared > LOSO_MAPE_BOUND, shared


def test_separate_set_is_predicted_by_the_suite_fit_only(loo):
    """benchmarks/sim_fidelity.py --separate: the suite's fit predicts another file's points."""
    from dataclasses import replace

    pts = loo.points[:3]
    np.testing.assert_allclose(fid.predict_separate(loo.points, pts),
                               fid.predict(fid.terms(pts), loo.theta_all), rtol=1e-6)
    p = loo.points[0]
    vllm, trt = fid.predict_separate(loo.points, [replace(p, engine="vLLM 0.21"),
                                                  replace(p, engine="TensorRT-LLM 0.17")])
    step = loo.theta_all[fid.FIT_PARAMS.index("step_overhead_s")]
    ov = loo.theta_all[fid.FIT_PARAMS.index("overlap_step_overhead_s")]
    assert vllm - trt == pytest.approx(step - ov, rel=1e-6) and step - ov > 1e-3


def test_fp8_compute_path_on_hopper():
    """FP8 GEMMs reach 0.980 x bf16's share of datasheet on Hopper (published: DeepGEMM 1550 of 1979
    TFLOP/s on H800 vs bf16 790 of 989, reference.md); GPUs without an FP8 figure and probed profiles
    keep the datasheet rate."""
    h100, b200 = HARDWARE["H100 SXM"], HARDWARE["B200"]
    ratio = (1550 / 1979) / (790 / 989)
    assert h100.peak_flops("fp8") == pytest.approx(1979e12 * ratio, rel=1e-3)
    assert h100.peak_flops("bf16") == pytest.approx(989e12)
    assert b200.peak_flops("fp8") == pytest.approx(4500e12)
    assert HARDWARE["H20"].peak_flops("fp8") == pytest.approx(296e12 * ratio, rel=1e-3)


def test_mla_kernel_era(loso):
    """DeepSeek's MLA term applies to pre-FlashMLA engine releases and to H20 only (fidelity.legacy_mla);
    current kernels on other GPUs pay none, and the catalog ships it on H20 alone."""
    assert fid.legacy_mla("SGLang 0.4.1.post2", "H200 SXM") and fid.legacy_mla("vLLM 0.6.3", "H100 SXM")
    assert not fid.legacy_mla("SGLang 0.5.7", "H200 SXM") and not fid.legacy_mla("vLLM 0.8.0", "H200 SXM")
    assert not fid.legacy_mla("NVIDIA NIM 1.8.0", "H100 SXM")
    assert fid.legacy_mla("vLLM 0.13.0rc2", "H20")
    assert HARDWARE["H20"].efficiency.mla_layer_overhead_s > 100e-6
    assert all(hw.efficiency.mla_layer_overhead_s == 0 for n, hw in HARDWARE.items() if n != "H20")
    # the current-kernel DeepSeek-R1 source (SGLang 0.5.7) is predicted without any MLA term, and
    # within 25 % with its whole source held out (the older kernels' term would make it 3x too slow)
    pts = fid.load_points()
    held = [i for i, p in enumerate(pts) if "InferenceX" in p.source]
    assert len(held) >= 2
    pred = loso[held]
    y = np.array([pts[i].step_ms for i in held]) / 1e3
    assert np.all(np.abs(pred / y - 1) < 0.25), pred / y


def test_points_cover_dense_moe_tp_fp8_and_spec():
    pts = fid.load_points()
    moe = {p.model for p in pts if MODELS[p.model].is_moe}
    assert moe and {p.model for p in pts} - moe
    assert {1, 2, 8} <= {p.tp for p in pts}
    assert any(p.dtype == "fp8" or MODELS[p.model].compute_dtype == "fp8" for p in pts)
    assert any(p.kv_cache_dtype == "fp8" for p in pts)
    spec = [p for p in pts if p.method != "none"]
    assert len(spec) >= 4 and all(p.al and p.al > 1 for p in spec)
    assert max(p.batch for p in pts) >= 64 and all(p.source and p.conversion for p in pts)
    unscored = [p for p in fid.load_points(scored_only=False) if not p.scored]
    assert max(p.batch for p in unscored) >= 64 and all(p.conversion for p in unscored)


def test_shipped_priors_are_the_fit_on_all_points(loo):
    """The catalog's priors must be what the suite fits (refit when the points change)."""
    ar = fid.PARAMS.index("allreduce_latency_s")
    for name, hw in HARDWARE.items():
        want = fid.gpu_theta(loo.theta_all, PRIOR_FROM.get(name, name))
        if hw.interconnect_gbs <= 64:  # PCIe cards: 3x the NVLink all-reduce latency (stated assumption)
            want[ar] *= 3
        np.testing.assert_allclose(fid.theta_of(hw), want, rtol=0.02, atol=2e-6, err_msg=name)
    t = fid.terms(loo.points)
    in_sample = np.mean(np.abs(fid.predict(t, loo.theta_all) / t.y_s - 1)) * 100
    assert in_sample < loo.mape  # and the fit is better in sample than out of it


def test_bs1_optimal_k_matches_each_published_sweep(loo):
    """Every source with a BS-1 K sweep (vLLM EAGLE K 2-7: best K 4; vLLM V1 EAGLE-1 K 2, 4: best 2):
    the K with the lowest predicted TPOT at the published AL is the source's best K."""
    sources = {p.source for p in loo.points if p.method != "none" and p.batch == 1}
    checked = 0
    for source in sources:
        sweep = [p for p in loo.points if p.source == source and p.method != "none" and p.batch == 1]
        if len(sweep) < 2:
            continue
        t = fid.terms(sweep)
        al = np.array([p.al for p in sweep])
        published_best = sweep[int(np.argmin(t.y_s / al))].k
        assert sweep[int(np.argmin(fid.predict(t, loo.theta_all) / al))].k == published_best, source
        checked += 1
    assert checked >= 2


def test_kv_cache_dtype_key(tmp_path):
    base = {"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3", "dtype": "bfloat16"},
            "sweep": {"batch_sizes": [1], "num_spec_tokens": [0, 1]},
            "sim": {"hardware": "H100", "acceptance_alpha": 0.7}}
    assert resolve(parse_spec(base)).kv_cache_dtype == "auto"
    fp8 = resolve(parse_spec({**base, "sim": {**base["sim"], "kv_cache_dtype": "fp8"}}))
    assert fp8.kv_cache_dtype == "fp8"
    m = MODELS["Llama-3.1-8B"]
    kv8, kv16 = arch_features(m, "bfloat16", 1, "fp8").kv_full, arch_features(m, "bfloat16", 1).kv_full
    assert float(kv8) * 2 == float(kv16)
    with pytest.raises(InputError) as err:
        resolve(parse_spec({**base, "sim": {**base["sim"], "kv_cache_dtype": "int3"}}))
    assert err.value.field == "sim.kv_cache_dtype" and "fp8" in str(err.value)


def test_method_overheads():
    assert METHOD_OVERHEAD["ngram"][1] == 0.0 and METHOD_OVERHEAD["eagle3"] == (1.0, 1.0)


def test_bad_points_file_is_one_line(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text('[[point]]\nid = "x"\n')
    with pytest.raises(InputError, match="missing"):
        fid.load_points(p)


def test_grid_charges_each_method_its_own_speculation_overhead():
    from dsdprof.measure.sim import acceptance as acc
    from tests.support.sim_grid import ModelCase, predict_grid

    m = MODELS["Llama-3.1-8B"]
    cases = [ModelCase(m, None, tuple(acc.geometric(0.7, 4)), method=meth) for meth in ("eagle", "ngram")]
    g = predict_grid([HARDWARE["H100 SXM"]], cases, [1], [0, 3])
    e = HARDWARE["H100 SXM"].efficiency
    eagle, ngram = g.itl_s[0, 0, 0], g.itl_s[0, 1, 0]
    assert eagle[0] == pytest.approx(ngram[0])  # same fixed DSD overhead at K = 0
    assert eagle[1] - ngram[1] == pytest.approx(3 * e.draft_step_overhead_s)  # no per-step launch for n-gram


def test_bad_kv_cache_dtype_is_one_line_exit_2(tmp_path):
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    spec = tmp_path / "s.toml"
    spec.write_text('[engine]\nname = "sim"\nmodel = "Llama-3.1-8B"\nmethod = "eagle3"\ndtype = "bfloat16"\n'
                    '[sweep]\nbatch_sizes = [1]\nnum_spec_tokens = [0, 1]\noutput_len = 8\n'
                    '[sim]\nhardware = "H100"\nacceptance_alpha = 0.7\nkv_cache_dtype = "int3"\n')
    r = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "sim.kv_cache_dtype='int3'" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert len(r.stderr.strip().splitlines()) == 1


def test_trtllm_fp8_points_store_fp8_kv():
    """kv_cache_dtype "auto" on a TensorRT-LLM FP8 point is FP8 KV (its KvCacheConfig follows the
    ModelOpt checkpoint, whose PTQ quantizes KV to FP8 by default); vLLM / SGLang keep the model
    dtype under auto, and an explicit kv_cache_dtype always wins."""
    assert fid.kv_cache_dtype_of("TensorRT-LLM 0.12", "fp8", "auto") == "fp8"
    assert fid.kv_cache_dtype_of("trtllm-serve", "fp8", "auto") == "fp8"
    assert fid.kv_cache_dtype_of("vLLM 0.6.x", "fp8", "auto") == "auto"
    assert fid.kv_cache_dtype_of("SGLang 0.5.7", "fp8", "auto") == "auto"
    assert fid.kv_cache_dtype_of("TensorRT-LLM", "bfloat16", "auto") == "auto"
    assert fid.kv_cache_dtype_of("TensorRT-LLM", "fp8", "bfloat16") == "bfloat16"
    base = fid.load_points()[0]
    pts = [fid.Point(**{**base.__dict__, "id": e, "engine": e, "dtype": "fp8", "batch": 64, "context": 2048})
           for e in ("TensorRT-LLM 0.12", "vLLM 0.6.x")]
    t = fid.terms(pts)
    attention = t.mem_s[:, 2]  # verify attention (KV reads) column
    assert attention[0] == pytest.approx(attention[1] / 2)
    assert t.mem_s[0, 0] == pytest.approx(t.mem_s[1, 0])  # weights unchanged
