"""Read a Hugging Face ``config.json`` into a :class:`~dsdprof.measure.sim.catalog.ModelArch`.

Knows Llama/Mistral/Qwen2/Qwen3 (dense), Mixtral, Qwen2/Qwen3-MoE, DeepSeek-V2/V3 and gpt-oss key
names; EAGLE-3 heads' ``draft_vocab_size`` is honoured; ``quantization_config`` sets the weight
storage (:mod:`dsdprof.measure.sim.quant`). Every numeric field is type-checked: a malformed value is an
:class:`~dsdprof.errors.InputError` naming ``<field>:<key>`` (e.g. ``engine.model:num_experts``).
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError
from dsdprof.measure.sim.arch import MLA, ModelArch
from dsdprof.measure.sim.quant import parse_quantization

MAX_INT = 2**31  # larger than any real dimension; keeps byte counts finite


class _Fields:
    """Checked integer reads from a config dict; errors name ``<field>:<key>``."""

    def __init__(self, cfg: dict[str, Any], field: str) -> None:
        self.cfg, self.field = cfg, field

    def int(self, key: str, default: int | None = 0, positive: bool = False) -> int:
        """``cfg[key]`` as an int (``default`` when absent or null); InputError when malformed."""
        v = self.cfg.get(key)
        if v is None:
            if default is None:
                raise InputError(f"{self.field}:{key}", v, "missing in config.json")
            return default
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if positive else 0) or v > MAX_INT:
            what = "a positive integer" if positive else "a non-negative integer"
            raise InputError(f"{self.field}:{key}", v, f"must be {what} in config.json")
        return v

    def first(self, *keys: str) -> builtins.int:
        """The first of ``keys`` present and non-zero (0 when none is)."""
        for k in keys:
            v = self.int(k)
            if v:
                return v
        return 0

    def ints(self, key: str) -> list[builtins.int]:
        v = self.cfg.get(key)
        if v is None:
            return []
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise InputError(f"{self.field}:{key}", v, "must be a list of integers in config.json")
        return v


def read_config(path: str | Path, field: str = "engine.model") -> tuple[Path, dict[str, Any]]:
    """(config.json path, its object) for a file or a directory holding ``config.json``."""
    try:
        p = Path(path).expanduser()
        if p.is_dir():
            p = p / "config.json"
        found = p.is_file()
    except (OSError, ValueError, RuntimeError):
        found = False
    if not found:
        raise InputError(field, str(path), "not a catalog model and no config.json there")
    try:
        cfg = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError, OSError) as err:
        raise InputError(field, str(p), f"not valid JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise InputError(field, str(p), "config.json must hold an object")
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        text = cfg["text_config"]
        qc = cfg.get("quantization_config") or text.get("quantization_config")
        cfg = {**text, "quantization_config": qc}
    return p, cfg


def load_hf_config(path: str | Path, field: str = "engine.model") -> ModelArch:
    """Read a HF ``config.json`` (or a directory holding one) into a :class:`ModelArch`."""
    _, cfg = read_config(path, field)
    f = _Fields(cfg, field)
    hidden, layers = f.int("hidden_size", None, True), f.int("num_hidden_layers", None, True)
    nq = f.int("num_attention_heads", None, True)
    nkv = f.int("num_key_value_heads") or nq
    head_dim = f.int("head_dim") or hidden // nq
    vocab = f.int("draft_vocab_size") or f.int("vocab_size", None, True)
    n_exp = f.first("num_local_experts", "num_experts", "n_routed_experts")
    topk = f.first("num_experts_per_tok", "experts_per_token")
    if n_exp and not 1 <= topk <= n_exp:
        raise InputError(f"{field}:num_experts_per_tok", topk, f"must be between 1 and num_experts={n_exp}")
    if nkv > nq:
        raise InputError(f"{field}:num_key_value_heads", nkv, f"exceeds num_attention_heads={nq}")
    ffn = f.int("intermediate_size") or 4 * hidden
    moe_ffn = (f.int("moe_intermediate_size") or ffn) if n_exp else 0
    moe_layers = 0
    if n_exp:
        dense_layers = set(f.ints("mlp_only_layers"))
        first_dense = f.int("first_k_dense_replace")
        step = f.first("decoder_sparse_step", "moe_layer_freq") or 1
        moe_layers = sum(1 for i in range(layers)
                         if i >= first_dense and i not in dense_layers and (i + 1) % step == 0)
    mla = None
    if f.int("kv_lora_rank"):
        mla = MLA(f.int("q_lora_rank"), f.int("kv_lora_rank"), f.int("qk_rope_head_dim", 64),
                  f.int("qk_nope_head_dim", 128), f.int("v_head_dim", 128))
    shared_ffn = f.int("shared_expert_intermediate_size")
    n_shared = f.int("n_shared_experts") or (1 if shared_ffn else 0)
    window = f.int("sliding_window")
    layer_types = cfg.get("layer_types") or []
    if not isinstance(layer_types, list):
        raise InputError(f"{field}:layer_types", layer_types, "must be a list in config.json")
    sliding = sum(1 for t in layer_types if "sliding" in str(t))
    if window and not layer_types and cfg.get("use_sliding_window"):
        sliding = layers
    arch_names = (str(cfg.get("model_type", "")) + " " + str(cfg.get("architectures", ""))).lower()
    eagle, eagle3 = "eagle" in arch_names, "eagle3" in arch_names
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    wbytes = 4.0 if dtype in ("float32", "float") else 2.0
    quant = parse_quantization(cfg.get("quantization_config"), field)
    if quant is not None:
        storage: dict[str, Any] = dict(
            weight_bytes=quant.linear_bytes, expert_weight_bytes=quant.expert_bytes,
            head_weight_bytes=quant.head_bytes, compute_dtype=quant.compute, quantization=quant.label)
    else:
        storage = dict(weight_bytes=wbytes, compute_dtype="fp32" if wbytes == 4.0 else "bf16")
    return ModelArch(
        name=str(cfg.get("_name_or_path") or path), num_layers=layers, hidden=hidden,
        intermediate=ffn, num_heads=nq, num_kv_heads=nkv, head_dim=head_dim, vocab=vocab,
        num_experts=n_exp, experts_per_token=topk, moe_intermediate=moe_ffn, moe_layers=moe_layers,
        num_shared_experts=n_shared, shared_intermediate=shared_ffn // max(n_shared, 1),
        mla=mla, sliding_window=window if sliding else 0, sliding_layers=sliding,
        extra_params=(3 * hidden * hidden + hidden * (nq + 2 * nkv) * head_dim) if eagle3 else 0,
        has_embedding=not eagle, tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        **storage,
    )
