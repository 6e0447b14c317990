"""Analytic engine inputs from HF config.json: quantization_config, malformed fields, path vs catalog."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.config.spec import parse_spec
from dsdprof.errors import InputError
from dsdprof.measure.engine import Cell
from dsdprof.measure.factory import make_engine
from dsdprof.measure.sim.catalog import MODELS, resolve_model, shadow_notices, shadowed_catalog_name
from dsdprof.measure.sim.dtypes import resolve_dtype
from dsdprof.measure.sim.hardware import HARDWARE
from dsdprof.measure.sim.hfconfig import load_hf_config
from dsdprof.measure.sim.model import (
    NO_DRAFT,
    HwArrays,
    arch_features,
    memory_bytes,
    step_time,
)
from dsdprof.measure.sim.quant import parse_quantization

runner = CliRunner()

LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
             "num_hidden_layers": 80, "vocab_size": 128256, "torch_dtype": "bfloat16",
             "tie_word_embeddings": False, "_name_or_path": "test/Llama-3.1-70B-quantized"}

# quantization_config blocks as the producers write them (llm-compressor, ModelOpt, AutoAWQ,
# GPTQModel, DeepSeek-V3, gpt-oss, bitsandbytes)
CT_FP8_DYNAMIC = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "ignore": ["lm_head"], "kv_cache_scheme": None,
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                    "dynamic": False, "group_size": None, "observer": "minmax"},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                              "dynamic": True},
        "output_activations": None}}}


def _ct_int(bits, group, symmetric=True, acts=None, fmt="pack-quantized"):
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": acts,
                                          "weights": {"num_bits": bits, "type": "int", "symmetric": symmetric,
                                                      "strategy": "group" if group else "channel",
                                                      "group_size": group, "actorder": None}}}}


NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
CASES = {
    "fp8 block (DeepSeek-V3)": ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                 "weight_block_size": [128, 128]}, 1 + 4 / 16384, None, "fp8"),
    "fp8 per-tensor": ({"quant_method": "fp8", "activation_scheme": "static"}, 1.0, None, "fp8"),
    "fbgemm_fp8": ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                    "modules_to_not_convert": ["lm_head"]}, 1.0, None, "fp8"),
    "compressed-tensors FP8 dynamic": (CT_FP8_DYNAMIC, 1.0, None, "fp8"),
    "compressed-tensors W4A16 g128 sym": (_ct_int(4, 128), 0.5 + 2 / 128, None, "bf16"),
    "compressed-tensors W4A16 g128 asym": (_ct_int(4, 128, symmetric=False), 0.5 + 2.5 / 128, None, "bf16"),
    "compressed-tensors W8A8 int8": (
        _ct_int(8, None, acts={"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True},
                fmt="int-quantized"), 1.0, None, "int8"),
    "compressed-tensors NVFP4": ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                                  "ignore": ["lm_head"], "config_groups": {"group_0": {
                                      "targets": ["Linear"], "weights": NVFP4,
                                      "input_activations": {**NVFP4, "dynamic": "local"}}}},
                                 0.5 + 1 / 16, None, "fp4"),
    "modelopt FP8": ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                      "exclude_modules": ["lm_head"]}, 1.0, None, "fp8"),
    "modelopt NVFP4": ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                        "exclude_modules": ["lm_head"]}, 0.5 + 1 / 16, None, "fp4"),
    "modelopt nested (hf_quant_config.json)": (
        {"quant_method": "modelopt", "producer": {"name": "modelopt"},
         "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}}, 1.0, None, "fp8"),
    "modelopt mixed": ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"},
        "model.layers.0.mlp.shared_expert.up_proj": {"quant_algo": "FP8"},
        "model.layers.0.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16},
        "model.layers.1.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16}}}, 1.0, 0.5 + 1 / 16, "fp8"),
    "AWQ": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
            0.5 + 2.5 / 128, None, "bf16"),
    "GPTQ": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
              "damp_percent": 0.01}, 0.5 + 2.5 / 128, None, "bf16"),
    "GPTQ per channel": ({"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": True},
                         0.5, None, "bf16"),
    "GPTQ 8 bit": ({"quant_method": "gptq", "bits": 8, "group_size": 128}, 1 + 3 / 128, None, "bf16"),
    "mxfp4 (gpt-oss)": ({"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
        2.0, 0.5 + 1 / 32, "bf16"),
    "bitsandbytes nf4": ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                          "bnb_4bit_use_double_quant": True}, 0.5 + (1 + 4 / 256) / 64, None, "bf16"),
}


@pytest.mark.parametrize("name", CASES)
def test_quantization_bytes_and_precision(name):
    cfg, linear, expert, compute = CASES[name]
    q = parse_quantization(cfg)
    assert q.linear_bytes == pytest.approx(linear, rel=1e-9), name
    assert q.expert_bytes == pytest.approx(expert if expert is not None else linear, rel=1e-9), name
    assert q.compute == compute and q.head_bytes == 2.0, name


def test_gptq_lm_head_flag_quantizes_the_head():
    q = parse_quantization({"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": True})
    assert q.head_bytes == pytest.approx(0.5 + 2.5 / 128)


@pytest.mark.parametrize("cfg,field", [
    ({"quant_method": "hqq"}, "quantization_config.quant_method"),
    ({"quant_method": "awq", "bits": "four", "group_size": 128}, "quantization_config.bits"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 12.5}, "quantization_config.group_size"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "quantization_config.weight_block_size"),
    ({"quant_method": "modelopt", "quant_algo": "INT3"}, "quantization_config.quant_algo"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": True}}}},
     "quantization_config.config_groups.g.weights.num_bits"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"type": "int"}}}},
     "quantization_config.config_groups.g.weights.num_bits"),  # missing: was a TypeError traceback
    ("fp8", "quantization_config"),
])
def test_malformed_quantization_config_names_the_field(cfg, field):
    with pytest.raises(InputError) as err:
        parse_quantization(cfg, "engine.model")
    assert err.value.field == f"engine.model:{field}"


def _model_dir(tmp_path, name, cfg):
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _ms(arch, hardware, tp, dtype="bfloat16"):
    st = resolve_dtype(arch, dtype)
    f = arch_features(arch, dtype, tp)
    t = float(step_time(HwArrays.of(HARDWARE[hardware], st.compute), f, NO_DRAFT, 1, 0, 1024, 0, 0).total_s)
    return t * 1e3, f


@pytest.mark.parametrize("quant", [CT_FP8_DYNAMIC, CASES["modelopt FP8"][0], CASES["fp8 per-tensor"][0]])
def test_fp8_70b_on_h100_is_near_the_fp8_weight_floor(tmp_path, quant):
    """FP8 Llama-3.1-70B, 4 x H100, BS 1: the 1-byte weights (16-bit LM head) at the bandwidth
    prior plus the fixed costs, well under the 2-byte weights' step."""
    arch = load_hf_config(_model_dir(tmp_path, "m", {**LLAMA_70B, "quantization_config": quant}))
    t, f = _ms(arch, "H100 SXM", 4)
    bf16, _ = _ms(MODELS["Llama-3.1-70B"], "H100 SXM", 4)
    head = 128256 * 8192
    weights = (MODELS["Llama-3.1-70B"].dense_params() - head) * 1.0 + head * 2.0
    assert float(f.dense_bytes) == pytest.approx(weights / 4)
    floor = weights / 4 / 3.35e12 * 1e3
    e, hw = HARDWARE["H100 SXM"].efficiency, HARDWARE["H100 SXM"]
    fixed = (e.step_overhead_s + 80 * e.layer_overhead_s + 160 * hw.allreduce_latency_s) * 1e3
    assert t == pytest.approx(floor / e.bandwidth + fixed, rel=0.05), (t, floor)
    assert bf16 - fixed == pytest.approx(2 * (t - fixed), rel=0.1)  # the weight-read part halves


def test_fp8_70b_fits_where_bf16_does_not(tmp_path):
    """One H200 (127 GB usable): bf16 70B (141 GB) is out of memory, FP8 (73 GB) fits."""
    d = _model_dir(tmp_path, "fp8-70b", {**LLAMA_70B, "quantization_config": CT_FP8_DYNAMIC})

    def engine(model):
        return make_engine(parse_spec({
            "engine": {"name": "sim", "model": model, "method": "ngram", "dtype": "bfloat16",
                       "max_model_len": 4096, "tensor_parallel_size": 1},
            "sweep": {"batch_sizes": [1, 8], "num_spec_tokens": [0, 2]},
            "sim": {"hardware": "H200 SXM", "context_len": 1024, "acceptance_alpha": 0.7}}))

    fp8 = engine(str(d))
    m = fp8.measure(Cell(0, 8, "dsd", 2))
    assert 0.01 < m.itl_s < 0.03  # ~73 GB at 4.8 TB/s at the bandwidth prior, plus the fixed costs
    assert fp8.provenance()["extra"]["quantization"] == "compressed-tensors float-quantized w8a8 channel"
    with pytest.raises(MemoryError, match="out of memory"):
        engine("Llama-3.1-70B").measure(Cell(0, 1, "dsd", 2))


def test_awq_and_gptq_stream_about_a_quarter():
    arch = MODELS["Llama-3.1-8B"]
    for q in (CASES["AWQ"][0], CASES["GPTQ"][0]):
        from dataclasses import replace

        p = parse_quantization(q)
        qa = replace(arch, weight_bytes=p.linear_bytes, head_weight_bytes=p.head_bytes,
                     compute_dtype=p.compute, quantization=p.label)
        dense = lambda a: float(arch_features(a, "auto", 1).dense_bytes)  # noqa: E731
        ratio = dense(qa) / dense(arch)
        assert 0.3 < ratio < 0.35  # 4-bit linears + 16-bit LM head (0.53 B of 7.5 B)


def test_quantized_checkpoint_keeps_its_storage_under_16_bit_dtypes():
    ds = MODELS["DeepSeek-V3"]
    auto, bf16 = resolve_dtype(ds, "auto"), resolve_dtype(ds, "bfloat16")
    assert auto == bf16 and auto.linear == pytest.approx(1.0, abs=1e-3)
    assert auto.head == 2.0 and auto.compute == "fp8"
    with pytest.raises(InputError) as err:
        resolve_dtype(ds, "float32")
    assert err.value.field == "engine.dtype"
    llama = resolve_dtype(MODELS["Llama-3.1-8B"], "fp8")  # online FP8: LM head stays 16-bit
    assert llama.linear == 1.0 and llama.head == 2.0 and llama.compute == "fp8"


def test_quantized_memory_counts_embedding_and_head_at_16_bit(tmp_path):
    arch = load_hf_config(_model_dir(tmp_path, "m", {**LLAMA_70B, "quantization_config": CASES["AWQ"][0]}))
    f = arch_features(arch, "auto", 1)
    m = MODELS["Llama-3.1-70B"]
    head = 128256 * 8192
    want = (m.dense_params() - head) * (0.5 + 2.5 / 128) + 2 * head * 2.0  # + embedding table
    assert float(memory_bytes(f, NO_DRAFT, 0, 0, 0)) == pytest.approx(want)


# ----------------------------------------------------------------------------- malformed config.json

QWEN_MOE = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
            "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
            "num_experts_per_tok": 8, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("key,value", [("num_experts", "eight"), ("num_experts", 8.5),
                                       ("num_experts", True), ("num_experts", [128]), ("num_experts", -1),
                                       ("num_key_value_heads", "8"),
                                       ("moe_intermediate_size", {"x": 1}), ("num_experts_per_tok", 500),
                                       ("head_dim", 1e40), ("mlp_only_layers", "none"), ("hidden_size", None),
                                       ("decoder_sparse_step", 1.5), ("num_key_value_heads", 64)])
def test_malformed_config_field_is_named(tmp_path, key, value):
    cfg = {**QWEN_MOE, key: value}
    if value is None:
        del cfg[key]
    with pytest.raises(InputError) as err:
        load_hf_config(_model_dir(tmp_path, "m", cfg))
    assert err.value.field == f"engine.model:{key}"


def test_integral_floats_are_accepted(tmp_path):
    arch = load_hf_config(_model_dir(tmp_path, "m", {**QWEN_MOE, "num_experts": 128.0}))
    assert arch.num_experts == 128 and arch.total_params() == MODELS["Qwen3-30B-A3B"].total_params()


def test_cli_malformed_num_experts_is_one_line_exit_2(tmp_path):
    d = _model_dir(tmp_path, "bad-moe", {**QWEN_MOE, "num_experts": "eight"})
    spec = tmp_path / "s.toml"
    spec.write_text(f'[engine]\nname = "sim"\nmodel = "{d}"\nmethod = "ngram"\n'
                    '[sweep]\nbatch_sizes = [1]\nnum_spec_tokens = [0, 1]\n'
                    '[sim]\nhardware = "H100"\nacceptance_alpha = 0.8\n')
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.exit_code == 2 and "Traceback" not in r.stderr + r.stdout
    want = "error: engine.model:num_experts='eight': must be a non-negative integer in config.json"
    assert errors == [want]
    assert not any((tmp_path / "o").rglob("*.parquet"))


# ----------------------------------------------------------------------------- path vs catalog name

TINY_LLAMA = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 8, "vocab_size": 1000, "intermediate_size": 1024,
              "torch_dtype": "float32"}


def test_local_directory_named_like_a_catalog_model_uses_its_config(tmp_path, monkeypatch):
    d = _model_dir(tmp_path, "Llama-3.1-8B", TINY_LLAMA)
    for given in (str(d), str(d / "config.json")):
        arch = resolve_model(given)
        assert arch.num_layers == 2 and arch.hidden == 512 and arch.compute_dtype == "fp32"
        assert shadowed_catalog_name(given) == "Llama-3.1-8B"
    assert shadow_notices([("--model", str(d)), ("--draft-model", None), ("x", "Qwen3-8B")]) == [
        f"notice: --model={str(d)!r} is a local config.json path; using it, not the catalog model "
        "'Llama-3.1-8B'"]
    monkeypatch.chdir(tmp_path)  # a relative name that is both a directory here and a catalog model
    assert resolve_model("Llama-3.1-8B").num_layers == 2
    monkeypatch.chdir(d)  # no such directory here: the catalog entry
    assert resolve_model("Llama-3.1-8B") is MODELS["Llama-3.1-8B"]
    assert shadowed_catalog_name("Llama-3.1-8B") is None
    (tmp_path / "Qwen3-8B").mkdir()  # a directory without config.json does not shadow the catalog
    monkeypatch.chdir(tmp_path)
    assert resolve_model("Qwen3-8B") is MODELS["Qwen3-8B"]


def test_cli_sweep_prints_a_notice_when_a_path_shadows_the_catalog(tmp_path):
    d = _model_dir(tmp_path, "Llama-3.1-8B", TINY_LLAMA)
    spec = tmp_path / "s.toml"
    spec.write_text(f'[engine]\nname = "sim"\nmodel = "{d}"\nmethod = "ngram"\ndtype = "auto"\n'
                    '[sweep]\nbatch_sizes = [1]\nnum_spec_tokens = [0, 1]\noutput_len = 8\n'
                    '[sim]\nhardware = "H100"\nacceptance_alpha = 0.8\n')
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output + r.stderr
    notice = " ".join(r.stderr.split())
    assert "config.json" in notice and "catalog model 'Llama-3.1-8B'" in notice
    import pandas as pd

    df = pd.read_parquet(tmp_path / "o")
    # 2 tiny fp32 layers are far faster than the catalog's 8B model would be: fixed costs only
    e = HARDWARE["H100 SXM"].efficiency
    assert df["itl_s"].max() < e.step_overhead_s + e.dsd_overhead_s + 0.5e-3


def test_cli_calibrate_prints_the_shadow_notice(tmp_path):
    from dsdprof.measure.sim.calibrate import design_for, predict
    from dsdprof.measure.sim.hardware import Efficiency
    from tests.measure.sim.test_sim_calibrate import CT, synthetic

    d = _model_dir(tmp_path, "Llama-3.1-8B", {**TINY_LLAMA, "torch_dtype": "bfloat16"})
    df = synthetic()
    from dataclasses import replace

    ct = replace(CT, target=load_hf_config(d), draft=None)
    df = df[df["mode"] == "vanilla"].copy()
    df["itl_s"] = predict(design_for(ct, df), Efficiency())
    df = df.assign(model=str(d), draft_model="", method="ngram", hardware="H100 SXM", dtype="bfloat16",
                   status="ok")
    df.to_parquet(tmp_path / "m.parquet")
    r = runner.invoke(app, ["calibrate", str(tmp_path / "m.parquet"), "--out", str(tmp_path / "p.toml"),
                            "--context-len", "1024", "--json"])
    assert r.exit_code == 0, r.output + r.stderr
    assert "catalog model 'Llama-3.1-8B'" in " ".join(r.stderr.split())
    json.loads(r.stdout)  # the notice stays off stdout


def test_multimodal_text_config_keeps_its_quantization(tmp_path):
    cfg = {"model_type": "llava", "text_config": {**TINY_LLAMA, "quantization_config": CASES["AWQ"][0]}}
    arch = load_hf_config(_model_dir(tmp_path, "m", cfg))
    assert arch.weight_bytes == pytest.approx(0.5 + 2.5 / 128) and arch.num_layers == 2


@pytest.mark.parametrize("name", ["a\x00b", "~no-such-user-xyz/model", ""])
def test_unusable_model_names_are_input_errors(name):
    with pytest.raises(InputError) as err:
        resolve_model(name)
    assert err.value.field == "engine.model"
    assert shadowed_catalog_name(name) is None
