"""Toy target/draft pairs built locally (no download), for tests, ``make demo`` and CPU sweeps.

The target is a random-init Llama (dense) or Qwen3-MoE. The draft is the target's first decoder
layer with the target's embedding and LM head; in the target, every layer after the first has its
``o_proj`` and ``down_proj`` (experts' too) scaled by ``residual_scale``, so the later layers only
nudge the residual stream and the one-layer draft agrees with the target most of the time.
``residual_scale`` controls acceptance: 0 gives draft == target (AL = K+1); the default 0.016 gives
per-position acceptance around 0.8, 0.7, 0.6, 0.5 on the default dense pair; larger values lower it.
``dense_first`` (MoE only) makes the target's first decoder layer a dense MLP (Qwen3-MoE
``mlp_only_layers = [0]``, FFN ``intermediate_size``), and the draft, that layer, a dense Qwen3
(same weight names; vLLM's Qwen3-MoE class refuses a model without an MoE layer): drafting loads
no expert, and only the target's verify pass pays for the experts its tokens route to.

These models exercise the machinery; their numbers describe only the machine they ran on.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError
from dsdprof.measure.sim.arch import ModelArch

_CORPUS_WORDS = (
    "the model draft token verify batch step cache memory bandwidth compute expert layer head "
    "accept reject sample greedy speculative decoding latency throughput goodput serving engine "
    "request prompt output kernel tensor matrix vector scale sweep profile table runtime select "
    "a an of to in on for with by from at as is are was were be been it this that these those "
    "one two three four five six seven eight nine ten small large fast slow high low early late"
).split()


# The default targets: a 187 M-parameter fp32 dense one (12 layers, hidden 1024), whose one-layer draft
# has 19 M, sized so that on a small CPU the target step is weight-bandwidth bound at batch 1 and
# compute bound at batch 16 x (K+1) tokens, while a draft step costs about a tenth of a target step;
# and an MoE one of 8 layers of 32 experts (top-2) at hidden 512: ~110 M parameters, ~13 M active.
DENSE = ModelArch("toy-dense", num_layers=12, hidden=1024, intermediate=4096, num_heads=16, num_kv_heads=4,
                  head_dim=64, vocab=2048, weight_bytes=4.0, compute_dtype="fp32")
MOE = replace(DENSE, name="toy-moe", num_layers=8, hidden=512, intermediate=1536, num_heads=8,
              num_experts=32, experts_per_token=2, moe_intermediate=256, moe_layers=8)


@dataclass(frozen=True)
class ToyModelConfig:
    """A toy pair: the target's architecture (the draft is its first decoder layer) and how the
    weights are made."""

    arch: ModelArch = DENSE
    residual_scale: float = 0.016
    seed: int = 0
    max_position_embeddings: int = 4096

    @property
    def kind(self) -> str:
        return "moe" if self.arch.is_moe else "dense"

    @property
    def dense_first(self) -> bool:
        """MoE: the first layer is dense (``mlp_only_layers = [0]``), so the draft is dense."""
        return self.arch.is_moe and self.arch.moe_layers < self.arch.num_layers


# The option ``dsdprof toy-models`` gives each field, and the values it accepts (inclusive).
OPTIONS: dict[str, tuple[str, float, float]] = {
    "hidden": ("--hidden", 8, 8192), "num_layers": ("--layers", 2, 64),
    "intermediate": ("--ffn", 8, 65536), "num_heads": ("--heads", 1, 128),
    "num_kv_heads": ("--kv-heads", 1, 128), "num_experts": ("--experts", 2, 512),
    "experts_per_token": ("--top-k", 1, 64), "moe_intermediate": ("--expert-ffn", 8, 65536),
    "residual_scale": ("--residual-scale", 0.0, 10.0),
}


def scaled_shape(hidden: int) -> dict[str, int]:
    """The shape a ``hidden`` size given alone gets: FFN 2 x hidden, a head per 64 of hidden (at least
    2), two query heads per KV head. Hidden 64 is the synthetic-truth benchmark's tiny pair (2 heads,
    1 KV head, FFN 128), 256 the vLLM tests' (4, 2, 512)."""
    heads = max(2, hidden // 64)
    return {"intermediate": 2 * hidden, "num_heads": heads, "num_kv_heads": max(1, heads // 2)}


def toy_config(kind: str = "dense", dense_first: bool | None = None, **overrides: Any) -> ToyModelConfig:
    """The default toy config for ``kind`` with ``overrides`` (``residual_scale``, ``seed`` or a
    :class:`ModelArch` field; None values ignored). A ``hidden`` given without the FFN or head counts
    scales them with it (:func:`scaled_shape`). A value out of :data:`OPTIONS`' range, or a shape
    that does not divide, is an :class:`InputError` naming the option."""
    given = {k: v for k, v in overrides.items() if v is not None}
    for field, value in given.items():
        if field in OPTIONS:
            opt, lo, hi = OPTIONS[field]
            if not lo <= value <= hi:
                shown = f"{lo:g}..{hi:g}"
                raise InputError(opt, value, f"must be in {shown}")
    own = {k: given.pop(k) for k in ("residual_scale", "seed") if k in given}
    experts, top_k = (given.get(k, getattr(MOE, k)) for k in ("num_experts", "experts_per_token"))
    if kind != "moe":  # no experts (the MoE options apply to --kind moe, or to its half of both)
        given = {k: v for k, v in given.items()
                 if k not in ("num_experts", "experts_per_token", "moe_intermediate")}
    a = replace(MOE if kind == "moe" else DENSE,
                **{**(scaled_shape(int(given["hidden"])) if "hidden" in given else {}), **given})
    if a.hidden % a.num_heads:
        raise InputError("--heads", a.num_heads, f"must divide --hidden ({a.hidden})")
    if a.num_heads % a.num_kv_heads:
        raise InputError("--kv-heads", a.num_kv_heads, f"must divide --heads ({a.num_heads})")
    if dense_first and kind != "moe":
        raise InputError("--dense-first", True, "applies to --kind moe only")
    if top_k > experts:
        raise InputError("--top-k", top_k, f"must be <= --experts ({experts})")
    if kind == "moe":
        a = replace(a, moe_layers=a.num_layers - bool(dense_first))
    return ToyModelConfig(replace(a, head_dim=a.hidden // a.num_heads), **own)


def build_toy_models(out_dir: str | Path, kind: str = "both", **overrides: Any) -> list[ToyPair]:
    """``dsdprof toy-models``: one pair per kind (``dense``, ``moe`` or ``both``) in ``OUT/<kind>``,
    each from :func:`toy_config` (``overrides`` as there). Every config is checked before any
    model is built."""
    kinds = {"both": ["dense", "moe"], "dense": ["dense"], "moe": ["moe"]}.get(kind)
    if kinds is None:
        raise InputError("--kind", kind, "must be dense, moe or both")
    configs = {k: toy_config(k, **overrides) for k in kinds}
    return [build_toy_pair(Path(out_dir) / k, cfg) for k, cfg in configs.items()]


@dataclass(frozen=True)
class ToyPair:
    target: Path
    draft: Path
    config: ToyModelConfig


def _corpus(seed: int, n_lines: int = 4000) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(_CORPUS_WORDS) for _ in range(rng.randint(8, 40))) for _ in range(n_lines)]


def build_tokenizer(out_dir: Path, vocab_size: int, seed: int = 0):
    """Train a small byte-level BPE tokenizer and save it as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(str(out_dir))
    return fast


def _hf_config(cfg: ToyModelConfig, num_layers: int, tokenizer):
    a = cfg.arch
    common = dict(
        vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=num_layers,
        num_attention_heads=a.num_heads, num_key_value_heads=a.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32",
    )
    if cfg.kind == "dense":
        from transformers import LlamaConfig

        return LlamaConfig(intermediate_size=a.intermediate, head_dim=a.head_dim, **common)
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        intermediate_size=a.intermediate, moe_intermediate_size=a.moe_intermediate,
        num_experts=a.num_experts, num_experts_per_tok=a.experts_per_token,
        decoder_sparse_step=1, mlp_only_layers=[0] if cfg.dense_first else [], norm_topk_prob=True,
        head_dim=a.head_dim, **common)


def _draft_hf_config(cfg: ToyModelConfig, tokenizer):
    """The one-layer draft's config: the target's, except a dense Qwen3 when ``dense_first``."""
    if not cfg.dense_first:
        return _hf_config(cfg, 1, tokenizer)
    from transformers import Qwen3Config

    moe = _hf_config(cfg, 1, tokenizer)
    keep = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "max_position_embeddings",
            "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "head_dim", "rms_norm_eps",
            "attention_bias", "hidden_act", "rope_theta", "rope_scaling", "rope_parameters")
    kw = {k: getattr(moe, k) for k in keep if hasattr(moe, k)}
    return Qwen3Config(num_hidden_layers=1, intermediate_size=cfg.arch.intermediate, torch_dtype="float32",
                       **kw)


def _model_cls(kind: str):
    if kind == "dense":
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM
    from transformers import Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM


def build_toy_pair(out_dir: str | Path, config: ToyModelConfig | None = None) -> ToyPair:
    """Write ``OUT/target`` and ``OUT/draft`` (HF format, same tokenizer) and return their paths."""
    import torch

    config = config or toy_config("dense")
    if config.residual_scale < 0:
        raise InputError("--residual-scale", config.residual_scale, "must be >= 0")
    out = Path(out_dir)
    target_dir, draft_dir = out / "target", out / "draft"
    for d in (target_dir, draft_dir):
        d.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(target_dir, config.arch.vocab, config.seed)
    tokenizer.save_pretrained(str(draft_dir))

    torch.manual_seed(config.seed)
    cls = _model_cls(config.kind)
    target = cls(_hf_config(config, config.arch.num_layers, tokenizer)).to(torch.float32)
    with torch.no_grad():
        for i, layer in enumerate(target.model.layers):
            if i == 0:
                continue
            layer.self_attn.o_proj.weight.mul_(config.residual_scale)
            for name, param in layer.mlp.named_parameters():
                if "down_proj" in name:
                    param.mul_(config.residual_scale)
    target.save_pretrained(str(target_dir), safe_serialization=True)

    if config.dense_first:
        from transformers import Qwen3ForCausalLM
        cls = Qwen3ForCausalLM
    draft = cls(_draft_hf_config(config, tokenizer)).to(torch.float32)
    own = draft.state_dict()
    src = target.state_dict()
    draft.load_state_dict({k: src[k] for k in own}, strict=True)
    draft.save_pretrained(str(draft_dir), safe_serialization=True)
    (out / "toy_pair.json").write_text(json.dumps(
        {"target": str(target_dir), "draft": str(draft_dir), "config": asdict(config)}, indent=2))
    return ToyPair(target=target_dir, draft=draft_dir, config=config)
