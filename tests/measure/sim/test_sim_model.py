"""Step model, catalog, hardware and acceptance: reference points, formulas, vectorised == scalar."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsdprof.errors import InputError
from dsdprof.measure.sim import acceptance as acc
from dsdprof.measure.sim.catalog import MODELS, derived_draft, resolve_model
from dsdprof.measure.sim.hardware import HARDWARE, Efficiency, load_profile, resolve_hardware, write_profile
from dsdprof.measure.sim.hfconfig import load_hf_config
from dsdprof.measure.sim.model import (
    NO_DRAFT,
    HwArrays,
    arch_features,
    distinct_experts,
    padded,
    step_time,
)
from tests.support.sim_grid import ModelCase, predict_grid

# published totals (reference.md), billions
PUBLISHED = {"Llama-3.1-8B": 8.03, "Llama-3.1-70B": 70.6, "Qwen3-8B": 8.19, "Qwen3-30B-A3B": 30.5,
             "Qwen3-235B-A22B": 235, "Mixtral-8x7B": 46.7, "DeepSeek-V3": 671, "gpt-oss-20b": 20.9,
             "gpt-oss-120b": 116.8, "EAGLE3-Llama-3.1-8B": 0.42}
ACTIVE = {"Qwen3-30B-A3B": 3.3, "Qwen3-235B-A22B": 22, "Mixtral-8x7B": 12.9, "DeepSeek-V3": 37}


@pytest.mark.parametrize("name,total", PUBLISHED.items())
def test_catalog_parameter_counts_match_published(name, total):
    assert MODELS[name].total_params() / 1e9 == pytest.approx(total, rel=0.02)


@pytest.mark.parametrize("name,active", ACTIVE.items())
def test_catalog_active_parameters(name, active):
    assert MODELS[name].active_params() / 1e9 == pytest.approx(active, rel=0.03)


def test_llama8b_h100_bs1_between_floor_and_published():
    """Weight-read floor 4.79 ms (all 16.06 GB at 3.35 TB/s); published 6.3-7.5 ms."""
    f = arch_features(MODELS["Llama-3.1-8B"], "bfloat16", 1)
    hw = HwArrays.of(HARDWARE["H100 SXM"])
    t = float(step_time(hw, f, NO_DRAFT, 1, 0, 1024, 0.0, 0.0).total_s)
    assert 16.06e9 / 3.35e12 == pytest.approx(4.79e-3, rel=0.01)
    assert 4.4e-3 < t < 7.5e-3
    # at 100 % bandwidth and no overhead the step is the weight floor minus the embedding table
    ideal = HwArrays.of(HARDWARE["H100 SXM"].__class__(**{**HARDWARE["H100 SXM"].__dict__,
                                                          "efficiency": Efficiency(1.0, 1.0, *[0.0] * 8)}))
    t0 = float(step_time(ideal, f, NO_DRAFT, 1, 0, 1, 0.0, 0.0).total_s)
    assert t0 == pytest.approx(MODELS["Llama-3.1-8B"].dense_params() * 2 / 3.35e12, rel=0.01)


def test_distinct_experts_formula():
    assert distinct_experts(128, 8, 1) == pytest.approx(8)
    assert distinct_experts(128, 8, 4) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 4))
    assert distinct_experts(8, 2, 1000) == pytest.approx(8)
    assert distinct_experts(0, 0, 10) == 0


def test_padded_follows_small_m_tiles():
    """Row tile = next power of two, at least 16 (smallest tensor-core / swap-AB tile), at most
    the large tile; above it, multiples of the large tile. tile 1 (CPU profile): no padding."""
    n = np.array([0, 1, 7, 16, 17, 32, 33, 64, 65, 128, 129])
    assert list(padded(n, 64, 16)) == [0, 16, 16, 16, 32, 32, 64, 64, 128, 128, 192]
    assert list(padded(n, 1, 16)) == list(n)
    assert list(padded(np.array([1, 9]), 64, 8)) == [8, 16]


def _bs1_ms(hw_name, model="Llama-3.1-8B", dtype="bfloat16", tp=1, batch=1):
    m = MODELS[model]
    f = arch_features(m, dtype, tp)
    hw = HwArrays.of(HARDWARE[hw_name])
    return float(step_time(hw, f, NO_DRAFT, batch, 0, 1024, 0.0, 0.0).total_s) * 1e3, f, hw


def test_low_flop_gpu_bs1_is_bandwidth_bound():
    """H20 (148 bf16 TFLOP/s, 4.0 TB/s): Llama-3.1-8B BS 1 streams 15.01 GB at the bandwidth prior
    plus the fixed per-step / per-layer costs; padding one token to a 64-row tile made it
    compute-bound at 9.8 ms."""
    t, f, hw = _bs1_ms("H20")
    e = HARDWARE["H20"].efficiency
    fixed = (e.step_overhead_s + 32 * e.layer_overhead_s) * 1e3
    floor = float(f.dense_bytes) / (4.0e12 * e.bandwidth) * 1e3 + fixed
    assert t == pytest.approx(floor, rel=0.03) and t < 9.0, t
    flops_16 = 2 * 16 * float(f.dense_params) / (148e12 * 0.7) * 1e3
    assert flops_16 < t - fixed  # 16 rows of FLOPs stay under the weight read
    # the same physics still turns compute-bound once the batch fills 64-row tiles
    t64, *_ = _bs1_ms("H20", batch=64)
    assert t64 > 2 * t


def test_profile_keeps_min_tile(tmp_path):
    hw = HARDWARE["H100 SXM"].__class__(**{**HARDWARE["H100 SXM"].__dict__, "min_tile_m": 8})
    p = write_profile(tmp_path / "p.toml", hw)
    assert load_profile(p).min_tile_m == 8 and HwArrays.of(load_profile(p)).min_tile_m == 8


def test_routing_correlation_lowers_expert_cost():
    f = arch_features(MODELS["Qwen3-30B-A3B"], "bfloat16", 1)
    hw = HwArrays.of(HARDWARE["H100 SXM"])
    t_uniform = step_time(hw, f, NO_DRAFT, 1, 3, 1024, 0.0).total_s
    t_corr = step_time(hw, f, NO_DRAFT, 1, 3, 1024, 0.34).total_s
    assert t_corr < t_uniform
    # rho = 0.34: 4 tokens count as 4^0.66 ~ 2.5 independent tokens
    assert 4 ** (1 - 0.34) == pytest.approx(2.5, rel=0.02)


def test_tp_shrinks_step_and_adds_comm():
    m = MODELS["Llama-3.1-70B"]
    hw = HwArrays.of(HARDWARE["H100 SXM"])
    t1 = float(step_time(hw, arch_features(m, "bfloat16", 1), NO_DRAFT, 1, 0, 1024, 0, 0).total_s)
    t4 = float(step_time(hw, arch_features(m, "bfloat16", 4), NO_DRAFT, 1, 0, 1024, 0, 0).total_s)
    assert t4 < t1 / 2.5


def test_vanilla_cheaper_than_dsd_k0():
    f = arch_features(MODELS["Llama-3.1-8B"], "bfloat16", 1)
    d = arch_features(MODELS["EAGLE3-Llama-3.1-8B"], "bfloat16", 1)
    hw = HwArrays.of(HARDWARE["H100 SXM"])
    van = float(step_time(hw, f, NO_DRAFT, 4, 0, 512, 0, 0).total_s)
    k0 = float(step_time(hw, f, d, 4, 0, 512, 0, 1).total_s)
    assert k0 - van == pytest.approx(Efficiency().dsd_overhead_s)


def test_vectorised_equals_scalar():
    hws = [HARDWARE["H100 SXM"], HARDWARE["MI300X"], HARDWARE["RTX 4090"]]
    names = ["Llama-3.1-8B", "Qwen3-30B-A3B", "DeepSeek-V3", "gpt-oss-20b"]
    cases = [ModelCase(MODELS[n], derived_draft(MODELS[n], "eagle3"), tuple(acc.geometric(0.7, 5)), "auto",
                       8 if n == "DeepSeek-V3" else 1) for n in names]
    bs, ks = [1, 3, 16, 100], [0, 1, 2, 5]
    res = predict_grid(hws, cases, bs, ks, context_len=700, routing_correlation=0.2)
    assert res.itl_s.shape == (3, 4, 4, 4)
    for h, hw in enumerate(hws):
        for m, c in enumerate(cases):
            prec = "fp8" if c.target.compute_dtype == "fp8" else "bf16"
            hwa = HwArrays.of(hw, prec)
            tf = arch_features(c.target, c.dtype, c.tensor_parallel_size)
            df = arch_features(c.draft, c.dtype, c.tensor_parallel_size)
            for i, b in enumerate(bs):
                van = float(step_time(hwa, tf, NO_DRAFT, b, 0, 700, 0.2, 0.0).total_s)
                assert res.vanilla_itl_s[h, m, i] == pytest.approx(van, rel=1e-12)
                for j, k in enumerate(ks):
                    one = float(step_time(hwa, tf, df, b, k, 700, 0.2, 1.0).total_s)
                    assert res.itl_s[h, m, i, j] == pytest.approx(one, rel=1e-12)


def _kstar(model, hw, tp, bss, alpha=0.7, rho=0.0, dtype="bfloat16"):
    case = ModelCase(MODELS[model], derived_draft(MODELS[model], "eagle3"), tuple(acc.geometric(alpha, 7)),
                     dtype, tp)
    res = predict_grid([HARDWARE[hw]], [case], bss, list(range(8)), 1024, rho)
    return res.optimal_k[0, 0].tolist()


def test_dense_optimal_k_falls_monotonically():
    for hw in ("H100 SXM", "H200 SXM", "A100 80GB SXM", "MI300X"):
        ks = _kstar("Llama-3.1-8B", hw, 1, [1, 2, 4, 8, 16, 32, 64, 128, 256])
        assert all(a >= b for a, b in zip(ks, ks[1:])), (hw, ks)
        assert ks[0] >= 3 and ks[-1] < ks[0], (hw, ks)


@pytest.mark.parametrize("model,tp,rho", [("Qwen3-30B-A3B", 2, 0.0), ("Qwen3-30B-A3B", 2, 0.34),
                                          ("Mixtral-8x7B", 2, 0.0), ("Mixtral-8x7B", 2, 0.34)])
def test_moe_optimal_k_rises_then_falls(model, tp, rho):
    ks = [k for k in _kstar(model, "H100 SXM", tp, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], rho=rho)
          if k >= 0]  # -1: predicted out of memory
    peak = max(ks)
    first, last = ks.index(peak), len(ks) - 1 - ks[::-1].index(peak)
    assert ks[0] < peak and ks[-1] < peak and 0 < first and last < len(ks) - 1, ks


def test_moe_shape_comes_from_expert_loading():
    """Same MoE with every expert loaded anyway (top_k = E) behaves like a dense model."""
    from dataclasses import replace

    dense_like = replace(MODELS["Mixtral-8x7B"], experts_per_token=8, name="mixtral-all-experts")
    draft = derived_draft(MODELS["Mixtral-8x7B"], "eagle3")
    case = ModelCase(dense_like, draft, tuple(acc.geometric(0.7, 7)), "bfloat16", 4)
    grid = predict_grid([HARDWARE["H100 SXM"]], [case], [1, 2, 4, 8, 16, 32, 64], list(range(8)))
    ks = grid.optimal_k[0, 0].tolist()
    assert all(a >= b for a, b in zip(ks, ks[1:])), ks


def test_acceptance_conventions():
    assert acc.acceptance_length(acc.geometric(0.5, 3), 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert list(acc.from_conditional([0.8, 0.5])) == pytest.approx([0.8, 0.4])
    assert list(acc.extend(np.array([0.8, 0.4]), 4)) == pytest.approx([0.8, 0.4, 0.2, 0.1])
    with pytest.raises(InputError, match="non-increasing"):
        acc.check_unconditional([0.5, 0.7], "sim.acceptance_per_pos")
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        acc.check_unconditional([1.5], "sim.acceptance_per_pos")


def test_resolve_model_names_and_hf_config(tmp_path):
    assert resolve_model("meta-llama/Llama-3.1-8B-Instruct") is MODELS["Llama-3.1-8B"]
    assert resolve_model("qwen3-30b-a3b") is MODELS["Qwen3-30B-A3B"]
    cfg = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
           "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "intermediate_size": 6144,
           "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "mlp_only_layers": [],
           "decoder_sparse_step": 1, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = resolve_model(str(tmp_path))
    assert arch.total_params() == MODELS["Qwen3-30B-A3B"].total_params()
    with pytest.raises(InputError, match="engine.model"):
        resolve_model("no-such-model-xyz")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"hidden_size": 0}))
    with pytest.raises(InputError, match="hidden_size"):
        load_hf_config(tmp_path / "bad")


def test_hardware_catalog_and_profile_roundtrip(tmp_path):
    assert resolve_hardware("h100").name == "H100 SXM"
    assert resolve_hardware("MI-300X").name == "MI300X"
    assert len(HARDWARE) == 10 and resolve_hardware("h20").name == "H20"
    p = write_profile(tmp_path / "p.toml", HARDWARE["B200"], {"source": "test"})
    assert load_profile(p) == HARDWARE["B200"]
    with pytest.raises(InputError, match="exists"):
        write_profile(p, HARDWARE["B200"])
    (tmp_path / "bad.toml").write_text('schema = "dsdprof.hwprofile/v1"\n[hardware]\nname="x"\n'
                                       'bf16_tflops=1\nmemory_bandwidth_tbs=1\nmemory_gb=1\nturbo=true\n')
    with pytest.raises(InputError, match="turbo.*unknown key"):
        resolve_hardware(str(tmp_path / "bad.toml"))
    with pytest.raises(InputError, match="sim.hardware"):
        resolve_hardware("TPU v9")


def _llama2_13b():
    from dataclasses import replace
    return replace(MODELS["Llama-3.1-8B"], name="Llama-2-13B", num_layers=40, hidden=5120,
                   intermediate=13824, num_heads=40, num_kv_heads=40, vocab=32000)


def test_h20_decodes_dense_at_least_as_fast_as_h100_on_pre_fa3_kernels():
    """Published cross-check (Architects' Tech Alliance, "Performance Analysis of NVIDIA H20 and L20",
    https://besthub.dev/articles/performance-analysis-of-nvidia-h20-and-l20-ai-inference-chips-52fc67e4eda9):
    Llama2-13B FP16 at BS 16 on one GPU, H20 1.1x H100's token throughput (decode bandwidth-bound;
    its slower prefill is inside that average). The article reports the H20's launch, before
    FlashAttention-3 (July 2024): attention on useful rows only (attention_min_rows 1). The engine
    must not make H20 decode slower than H100 there (e.g. by an H20-only GEMM tile or efficiency)."""
    from dataclasses import replace
    f = arch_features(_llama2_13b(), "float16", 1)
    ms = {h: float(step_time(replace(HwArrays.of(HARDWARE[h]), attention_min_rows=1.0), f, NO_DRAFT,
                             16, 0, 1024, 0.0, 0.0).total_s) for h in ("H20", "H100 SXM")}
    assert 1.0 <= ms["H100 SXM"] / ms["H20"] <= 1.3, ms


def test_h20_fa3_decode_attention_matches_sglang():
    """H20 computes FA3's whole 128-row query tile (sim.context.FULL_TILE_GPUS). Published on H20
    with SGLang: FA3 decode attention 98 us per layer (FlashInfer 35 us) for Qwen3-235B-A22B TP 8,
    BS 32, 3.5k input (sglang#6151); end to end FA3 908 vs FlashInfer 2014 output tok/s, 2.2x, for
    QwQ-32B TP 4, BS 64, 12k in / 2k out (sglang#5630). Counting useful rows only (the model before
    this term) gives 17 us and 1.0x."""
    from dataclasses import replace

    from dsdprof.measure.sim.model import attention_term
    h20 = HwArrays.of(HARDWARE["H20"])
    assert h20.attention_min_rows == 128 and HwArrays.of(HARDWARE["H100 SXM"]).attention_min_rows == 1
    q235 = MODELS["Qwen3-235B-A22B"]
    m, c = attention_term(arch_features(q235, "bfloat16", 8), h20, 32, 1.0, 3512)
    per_layer_us = max(m / h20.efficiency.bandwidth, c / h20.efficiency.compute) / q235.num_layers * 1e6
    assert 0.6 * 98 <= per_layer_us <= 1.4 * 98, per_layer_us
    qwq = replace(MODELS["Llama-3.1-8B"], name="QwQ-32B", num_layers=64, hidden=5120, intermediate=27648,
                  num_heads=40, num_kv_heads=8, vocab=152064)
    f = arch_features(qwq, "bfloat16", 4)
    fa3, fi = (float(step_time(replace(h20, attention_min_rows=r), f, NO_DRAFT, 64, 0, 13000, 0.0, 0.0)
                     .total_s) for r in (128.0, 1.0))
    assert 1.6 <= fa3 / fi <= 3.2, (fa3, fi)


def test_full_tile_hides_under_kv_reads_off_h20():
    """Why only H20 carries the full tile: on the other catalog GPUs 128 rows (128 FLOP per bf16 KV
    byte) stay below the ridge at the fitted efficiencies, so the attention term would not move."""
    from dataclasses import replace

    from dsdprof.measure.sim.model import attention_term
    f = arch_features(MODELS["Llama-3.1-8B"], "bfloat16", 1)
    for name in ("H100 SXM", "H200 SXM", "A100 80GB SXM", "A100 40GB SXM", "MI300X", "B200"):
        hw = HwArrays.of(HARDWARE[name])
        full = replace(hw, attention_min_rows=128.0)
        t = [float(np.maximum(*(np.array(attention_term(f, h, 8, 1.0, 4096))
                                / [h.efficiency.bandwidth, h.efficiency.compute]))) for h in (hw, full)]
        assert t[1] == pytest.approx(t[0]), name
    h20 = HwArrays.of(HARDWARE["H20"])
    m, c = attention_term(f, h20, 8, 1.0, 4096)
    assert c / h20.efficiency.compute > 3 * m / h20.efficiency.bandwidth


def test_fp8_kv_cache_halves_attention_bytes():
    """--kv-cache-dtype fp8 stores one byte per KV element (vLLM docs, "Quantized KV Cache"): the
    attention term's KV reads halve against bf16; weights do not move."""
    m = MODELS["Llama-3.1-8B"]
    bf16, fp8 = arch_features(m, "fp8", 1), arch_features(m, "fp8", 1, "fp8")
    assert float(fp8.kv_full) == pytest.approx(float(bf16.kv_full) / 2)
    assert float(fp8.dense_bytes) == float(bf16.dense_bytes)
    hw = HwArrays.of(HARDWARE["H100 SXM"], "fp8")
    t = {kv: float(step_time(hw, f, NO_DRAFT, 64, 0, 4096, 0.0, 0.0).total_s)
         for kv, f in (("auto", bf16), ("fp8", fp8))}
    assert t["fp8"] < 0.9 * t["auto"], t
