"""Model architectures for the analytic engine: a small catalog plus a HF ``config.json`` reader.

Facts come from the models' HF ``config.json`` (see ``../shared/reference.md``); the parameter
counts below are recomputed from them by :meth:`ModelArch.total_params` and checked in the tests
against the published totals. Draft heads (EAGLE-3, MTP) that have no catalog entry are derived
from the target by :func:`derived_draft`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError, did_you_mean
from dsdprof.measure.sim.arch import MLA, ModelArch
from dsdprof.measure.sim.hfconfig import load_hf_config


def _dense(name: str, layers: int, hidden: int, ffn: int, nq: int, nkv: int, d: int, vocab: int,
           **kw: Any) -> ModelArch:
    return ModelArch(name, layers, hidden, ffn, nq, nkv, d, vocab, **kw)


_MXFP4 = 4.25 / 8  # bytes per parameter of an MXFP4 tensor (4-bit values + 8-bit scale per 32)
# native storage of the quantized catalog checkpoints (as dsdprof.measure.sim.quant reads their config.json)
_FP8_BLOCK = dict(weight_bytes=1.0 + 4.0 / (128 * 128), head_weight_bytes=2.0, compute_dtype="fp8",
                  quantization="fp8 block 128x128")
_MXFP4_EXPERTS = dict(expert_weight_bytes=_MXFP4, quantization="mxfp4 (experts)")

_HF_IDS = {
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct",
    "Llama-3.1-405B": "meta-llama/Llama-3.1-405B-Instruct",
    "Llama-3.2-1B": "meta-llama/Llama-3.2-1B-Instruct", "Qwen3-8B": "Qwen/Qwen3-8B",
    "Qwen3-0.6B": "Qwen/Qwen3-0.6B",
    "Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B", "Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
    "Mixtral-8x7B": "mistralai/Mixtral-8x7B-Instruct-v0.1", "DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
    "gpt-oss-20b": "openai/gpt-oss-20b", "gpt-oss-120b": "openai/gpt-oss-120b",
    "EAGLE3-Llama-3.1-8B": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "DBRX": "databricks/dbrx-instruct",
    "EAGLE-LLaMA3-Instruct-8B": "lmsys/sglang-EAGLE-LLaMA3-Instruct-8B",
}

MODELS: dict[str, ModelArch] = {m.name: replace(m, hf_id=_HF_IDS.get(m.name, "")) for m in (
    _dense("Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128, 128256),
    _dense("Llama-3.1-70B", 80, 8192, 28672, 64, 8, 128, 128256),
    _dense("Llama-3.1-405B", 126, 16384, 53248, 128, 8, 128, 128256),
    _dense("Llama-3.2-1B", 16, 2048, 8192, 32, 8, 64, 128256, tied_embeddings=True),
    _dense("Qwen3-8B", 36, 4096, 12288, 32, 8, 128, 151936),
    _dense("Qwen3-0.6B", 28, 1024, 3072, 16, 8, 128, 151936, tied_embeddings=True),
    _dense("Qwen3-30B-A3B", 48, 2048, 6144, 32, 4, 128, 151936,
           num_experts=128, experts_per_token=8, moe_intermediate=768, moe_layers=48),
    _dense("Qwen3-235B-A22B", 94, 4096, 12288, 64, 4, 128, 151936,
           num_experts=128, experts_per_token=8, moe_intermediate=1536, moe_layers=94),
    _dense("Mixtral-8x7B", 32, 4096, 14336, 32, 8, 128, 32000,
           num_experts=8, experts_per_token=2, moe_intermediate=14336, moe_layers=32),
    _dense("DeepSeek-V3", 61, 7168, 18432, 128, 128, 128, 129280,
           num_experts=256, experts_per_token=8, moe_intermediate=2048, moe_layers=58,
           num_shared_experts=1, mla=MLA(1536, 512, 64, 128, 128), **_FP8_BLOCK),
    # DBRX (databricks/dbrx-instruct config.json: d_model 6144, 40 layers, 48 q / 8 kv heads,
    # ffn_hidden_size 10752, 16 experts top-4, vocab 100352): 131.6B total / 36.4B active
    _dense("DBRX", 40, 6144, 10752, 48, 8, 128, 100352,
           num_experts=16, experts_per_token=4, moe_intermediate=10752, moe_layers=40),
    _dense("gpt-oss-20b", 24, 2880, 2880, 64, 8, 64, 201088,
           num_experts=32, experts_per_token=4, moe_intermediate=2880, moe_layers=24,
           sliding_window=128, sliding_layers=12, **_MXFP4_EXPERTS),
    _dense("gpt-oss-120b", 36, 2880, 2880, 64, 8, 64, 201088,
           num_experts=128, experts_per_token=4, moe_intermediate=2880, moe_layers=36,
           sliding_window=128, sliding_layers=18, **_MXFP4_EXPERTS),
    # EAGLE-3 head for Llama-3.1-8B: one decoder layer whose q/k/v read [embedding; hidden]
    # (2h wide: + h*(nq+2nkv)*d extra), fc 3h -> h, a 32000-token draft LM head; embedding shared.
    _dense("EAGLE3-Llama-3.1-8B", 1, 4096, 14336, 32, 8, 128, 32000,
           extra_params=3 * 4096 * 4096 + 4096 * (32 + 16) * 128, has_embedding=False),
    # EAGLE-1 head for Llama-3-8B (lmsys/sglang-EAGLE-LLaMA3-Instruct-8B): one decoder layer, fc
    # 2h -> h; it reuses the target's embedding and 128256-token LM head, read every draft step.
    _dense("EAGLE-LLaMA3-Instruct-8B", 1, 4096, 14336, 32, 8, 128, 128256,
           extra_params=2 * 4096 * 4096, has_embedding=False),
    # DeepSeek-V3 MTP module: one MoE decoder layer + eh_proj (2h -> h), embedding and head shared.
    _dense("DeepSeek-V3-MTP", 1, 7168, 18432, 128, 128, 128, 129280,
           num_experts=256, experts_per_token=8, moe_intermediate=2048, moe_layers=1,
           num_shared_experts=1, mla=MLA(1536, 512, 64, 128, 128), extra_params=2 * 7168 * 7168,
           has_embedding=False, **_FP8_BLOCK),
)}

# Default draft for (target, method) when engine.draft_model is not given.
DEFAULT_DRAFTS: dict[tuple[str, str], str] = {
    ("Llama-3.1-8B", "eagle3"): "EAGLE3-Llama-3.1-8B",
    ("Llama-3.1-8B", "eagle"): "EAGLE3-Llama-3.1-8B",
    ("DeepSeek-V3", "mtp"): "DeepSeek-V3-MTP",
}


def _key(name: str) -> str:
    base = name.strip().rsplit("/", 1)[-1].lower()
    for suffix in ("-instruct", "-base", "-hf"):
        base = base.removesuffix(suffix)
    return base.replace("_", "-").replace(".", "").replace(" ", "")


_BY_KEY = {_key(n): m for n, m in MODELS.items()}
_BY_KEY.update({_key(alias): MODELS[name] for alias, name in {
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": "EAGLE3-Llama-3.1-8B", "Meta-Llama-3.1-8B": "Llama-3.1-8B",
    "Meta-Llama-3.1-70B": "Llama-3.1-70B", "Mixtral-8x7B-v0.1": "Mixtral-8x7B",
    "Mixtral-8x7B-Instruct-v0.1": "Mixtral-8x7B", "DeepSeek-V3-0324": "DeepSeek-V3"}.items()})


def _config_path(name_or_path: str) -> Path | None:
    """``name_or_path`` as a config.json file or a directory holding one, else None."""
    try:
        p = Path(name_or_path).expanduser()
        if p.is_file() or (p.is_dir() and (p / "config.json").is_file()):
            return p
    except (OSError, ValueError, RuntimeError):  # unreadable, NUL byte, unknown ~user
        return None
    return None


def shadowed_catalog_name(name_or_path: str) -> str | None:
    """The catalog model whose name ``name_or_path`` also matches when it is an existing config
    path (the path wins in :func:`resolve_model`; CLIs print a notice), else None."""
    path = _config_path(name_or_path) if isinstance(name_or_path, str) else None
    if path is None:
        return None
    name = path.parent.name if path.is_file() and path.name == "config.json" else name_or_path
    hit = _BY_KEY.get(_key(name))
    return hit.name if hit is not None else None


def shadow_notices(given: Iterable[tuple[str, str | None]]) -> list[str]:
    """One notice per (field, name) whose name is an existing config.json path also matching a
    catalog model: the path wins (its config.json is used); CLIs print these so nobody is surprised."""
    return [f"notice: {field}={name!r} is a local config.json path; using it, not the catalog model "
            f"{shadowed!r}" for field, name in given if name and (shadowed := shadowed_catalog_name(name))]


def resolve_model(name_or_path: str, field: str = "engine.model") -> ModelArch:
    """A config path (a ``config.json`` or a directory holding one) or a catalog name
    (case-insensitive, org prefix and ``-Instruct`` ignored). An existing path wins over a
    catalog name it also matches (see :func:`shadowed_catalog_name`)."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise InputError(field, name_or_path, "must be a catalog model name or a path to config.json")
    path = _config_path(name_or_path)
    if path is not None:
        return load_hf_config(path, field)
    hit = _BY_KEY.get(_key(name_or_path))
    if hit is not None:
        return hit
    try:
        exists = Path(name_or_path).expanduser().exists()
    except (OSError, ValueError, RuntimeError):
        exists = False
    if exists:
        return load_hf_config(name_or_path, field)  # a directory without config.json: a one-line error
    raise InputError(field, name_or_path,
                     f"unknown model; {did_you_mean(name_or_path, MODELS)}"
                     f"catalog: {', '.join(sorted(MODELS))}; "
                     "or give a path to config.json")


def derived_draft(target: ModelArch, method: str) -> ModelArch | None:
    """The draft a method implies when none is named.

    * ``ngram`` / ``suffix``: None (drafting is a CPU lookup, no forward pass).
    * catalog default (EAGLE-3 for Llama-3.1-8B, MTP for DeepSeek-V3) when there is one.
    * ``eagle``/``eagle3``: one dense decoder layer at the target's width (FFN = target's dense
      FFN, or 8/3 h rounded for MoE targets), fc 3h -> h, a 32000-token head, embedding shared.
    * ``mtp``: one of the target's own decoder layers + eh_proj 2h -> h, sharing embedding and head.
    """
    if method in ("ngram", "suffix", "ngram_gpu"):
        return None
    known = DEFAULT_DRAFTS.get((target.name, method))
    if known:
        return MODELS[known]
    h = target.hidden
    if method in ("eagle", "eagle3"):
        ffn = target.intermediate if not target.is_moe else 256 * round(8 * h / 3 / 256)
        quantized = bool(target.quantization)  # EAGLE heads ship unquantized (16-bit)
        return replace(
            target, name=f"{target.name}-eagle3-head (derived)", num_layers=1, intermediate=ffn,
            vocab=min(target.vocab, 32000), num_experts=0, experts_per_token=0, moe_intermediate=0,
            moe_layers=0, num_shared_experts=0, sliding_window=0, sliding_layers=0,
            extra_params=3 * h * h, has_embedding=False, expert_weight_bytes=None, hf_id="",
            weight_bytes=2.0 if quantized else target.weight_bytes, head_weight_bytes=None, quantization="",
            compute_dtype="bf16" if quantized else target.compute_dtype)
    if method == "mtp":
        return replace(target, name=f"{target.name}-mtp (derived)", num_layers=1,
                       moe_layers=1 if target.is_moe else 0, sliding_window=0, sliding_layers=0,
                       extra_params=2 * h * h, has_embedding=False, hf_id="")
    return None
