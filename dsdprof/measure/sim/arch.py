"""A model's architecture as the step model sees it (:class:`ModelArch`, :class:`MLA`): the record
the catalog, HF ``config.json`` parsing and the step model share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    q_lora_rank: int  # 0 = no low-rank query
    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelArch:
    """One decoder-only transformer (or draft head), enough to count bytes and FLOPs per token.

    ``moe_layers`` of the ``num_layers`` carry experts (the rest a dense FFN of ``intermediate``);
    ``sliding_layers`` attend over at most ``sliding_window`` positions. ``weight_bytes`` (linear
    layers), ``expert_weight_bytes`` (routed experts) and ``head_weight_bytes`` (LM head, embedding,
    router) are the native storage in bytes per weight, scales included.
    ``extra_params``: weights read every step that the layer formula misses (EAGLE-3's fc, MTP's
    eh_proj). ``has_embedding``: False for heads sharing the target's embedding (not counted).
    """

    name: str
    num_layers: int
    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    moe_layers: int = 0
    num_shared_experts: int = 0
    shared_intermediate: int = 0
    mla: MLA | None = None
    sliding_window: int = 0
    sliding_layers: int = 0
    extra_params: int = 0
    has_embedding: bool = True
    tied_embeddings: bool = False
    weight_bytes: float = 2.0
    expert_weight_bytes: float | None = None
    compute_dtype: str = "bf16"  # bf16 | fp8 | int8 | fp4 | fp32 (native GEMM precision)
    head_weight_bytes: float | None = None  # LM head, embedding, router (None = weight_bytes)
    # non-empty: a quantized checkpoint (dsdprof.measure.sim.quant), kept under 16-bit dtypes
    quantization: str = ""
    hf_id: str = ""  # Hugging Face id vLLM would load (written into rows, so exports name it)

    @property
    def served_name(self) -> str:
        """The HF id when known, else the catalog / path name."""
        return self.hf_id or self.name

    # ---------------------------------------------------------------- parameter counts
    def attention_params(self) -> int:
        """Per layer. GQA: h*(nq*d) + 2*h*(nkv*d) + (nq*d)*h. MLA: q (low rank), kv_a, kv_b, o."""
        h = self.hidden
        if self.mla is None:
            return h * self.num_heads * self.head_dim * 2 + 2 * h * self.num_kv_heads * self.head_dim
        m, n = self.mla, self.num_heads
        q_out = n * (m.nope_dim + m.rope_dim)
        q = h * m.q_lora_rank + m.q_lora_rank * q_out if m.q_lora_rank else h * q_out
        kv = h * (m.kv_lora_rank + m.rope_dim) + m.kv_lora_rank * n * (m.nope_dim + m.v_head_dim)
        return q + kv + n * m.v_head_dim * h

    def expert_params(self) -> int:
        """One routed expert in one layer: gated FFN, 3 * h * f_expert."""
        return 3 * self.hidden * self.moe_intermediate

    def head_params(self) -> int:
        """LM head and MoE router: read every step, kept 16-bit by quantizers."""
        return self.vocab * self.hidden + self.moe_layers * self.hidden * self.num_experts

    def dense_params(self) -> int:
        """Weights every token passes through: attention, dense FFNs, shared experts, router,
        LM head and ``extra_params`` (not the embedding table: only B rows of it are read)."""
        dense_ffn = (self.num_layers - self.moe_layers) * 3 * self.hidden * self.intermediate
        shared = self.moe_layers * self.num_shared_experts * 3 * self.hidden * (
            self.shared_intermediate or self.moe_intermediate)
        router = self.moe_layers * self.hidden * self.num_experts
        head = self.vocab * self.hidden
        attention = self.num_layers * self.attention_params()
        return attention + dense_ffn + shared + router + head + self.extra_params

    def total_params(self) -> int:
        """Everything stored: dense + all routed experts + the embedding table (if own)."""
        experts = self.moe_layers * self.num_experts * self.expert_params()
        return self.dense_params() + experts + self._embedding()

    def _embedding(self) -> int:
        return self.vocab * self.hidden if self.has_embedding and not self.tied_embeddings else 0

    def active_params(self) -> int:
        experts = self.moe_layers * self.experts_per_token * self.expert_params()
        return self.dense_params() + experts + self._embedding()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.moe_layers > 0
