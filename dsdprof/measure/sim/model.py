"""The step model: seconds per engine step at batch B with K drafts, one function per term.

An engine step in DSD mode = K draft forward passes at batch B, then one target forward pass that
verifies N = B·(K+1) tokens, plus fixed overheads::

    T(B, K) = Σ_verify-terms roof(N) + K · Σ_draft-terms roof(B) + comm
              + step_overhead + K · draft_step_overhead + [speculative] · dsd_overhead

    roof(term) = max(bytes / (BW · e_bw), flops / (F · e_c))      (per term, then summed)

Terms: :func:`dense_term` (weights every token passes through, GEMM FLOPs with tile
quantization), :func:`expert_term` (MoE experts: expected distinct experts loaded, routed FLOPs),
:func:`attention_term` (KV-cache reads at the context length, attention FLOPs) and
:func:`comm_seconds` (tensor-parallel all-reduces, not a roofline term). Vanilla steps are the
same with K = 0 and no speculative overhead.

Every function is pure numpy and broadcasts: pass floats for one cell or arrays shaped e.g.
(hardware, model, BS, K) for a whole grid (see ``tests/support/sim_grid.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from dsdprof.config.sim import KV_CACHE_DTYPES
from dsdprof.errors import InputError
from dsdprof.measure.sim.arch import ModelArch
from dsdprof.measure.sim.context import attention_min_rows, attention_tile, query_tokens
from dsdprof.measure.sim.dtypes import Storage, resolve_dtype
from dsdprof.measure.sim.hardware import Efficiency, Hardware

ArrayLike = Any  # float or numpy array (broadcastable)
MEMORY_UTILIZATION = 0.9  # fraction of device memory an engine may use (vLLM's default)

# Speculation overhead per method, relative to the profile's EAGLE-referenced
# (dsd_overhead_s, draft_step_overhead_s): (fixed factor, per-draft-step factor). Only EAGLE is
# fitted (vLLM's published BS-1 EAGLE K sweep, benchmarks/fidelity_points.toml); the others are
# priors from what the engine does per step: MTP and a draft model run the same propose /
# rejection-sample loop as EAGLE (their forward passes are costed by the roofline and per-layer
# terms); n-gram / suffix drafting is a CPU lookup with no draft forward, so no per-step launch
# cost, and keeps the fixed bookkeeping (rejection sampler, draft-token buffers).
METHOD_OVERHEAD: dict[str, tuple[float, float]] = {
    "eagle": (1.0, 1.0), "eagle3": (1.0, 1.0), "mtp": (1.0, 1.0), "draft_model": (1.0, 1.0),
    "ngram": (1.0, 0.0), "suffix": (1.0, 0.0),
}


@dataclass(frozen=True)
class ArchFeatures:
    """Per-device quantities of one model under a dtype and TP degree (floats or arrays)."""

    dense_bytes: ArrayLike  # always-read weights, bytes / tp
    dense_params: ArrayLike  # GEMM params per token / tp
    expert_bytes: ArrayLike  # one routed expert in one layer, bytes / tp
    expert_params: ArrayLike  # one routed expert / tp
    moe_layers: ArrayLike
    num_experts: ArrayLike
    top_k: ArrayLike
    kv_full: ArrayLike  # KV bytes per context position over full-attention layers, per device
    kv_sliding: ArrayLike  # same over sliding-window layers
    window: ArrayLike  # sliding window positions (0 = none)
    attn_full: ArrayLike  # attention FLOPs per query token per context position, full layers / tp
    attn_sliding: ArrayLike
    comm_bytes: ArrayLike  # ring all-reduce bytes per token per step over the link (0 if tp = 1)
    comm_count: ArrayLike  # all-reduces per forward: 2 per layer (0 if tp = 1)
    total_bytes: ArrayLike  # every stored weight / tp (memory capacity check)
    layers: ArrayLike = 0.0  # decoder layers (per-layer fixed cost)
    mla_layers: ArrayLike = 0.0  # layers with multi-head latent attention (their own fixed cost)
    token_units: ArrayLike = 0.0  # per token: layers x hidden / 4096 (per-token elementwise work)
    q_per_kv: ArrayLike = 1.0  # G: query heads sharing one KV head per device (attention tile, sim.context)

    @staticmethod
    def stack(items: list[ArchFeatures], shape: tuple[int, ...]) -> ArchFeatures:
        """One feature set whose fields are arrays of ``len(items)`` reshaped to ``shape``."""
        return ArchFeatures(**{f.name: np.array([float(getattr(i, f.name)) for i in items]).reshape(shape)
                               for f in fields(ArchFeatures)})


NO_DRAFT = ArchFeatures(*([0.0] * len(fields(ArchFeatures))))


def kv_bytes(kv_cache_dtype: str, storage: Storage, field: str = "sim.kv_cache_dtype") -> float:
    """Bytes per KV-cache element: the named dtype's, or the storage default for ``auto``."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InputError(field, kv_cache_dtype, f"must be one of {', '.join(KV_CACHE_DTYPES)}")
    b = KV_CACHE_DTYPES[kv_cache_dtype]
    return storage.kv if b is None else b


def arch_features(arch: ModelArch, dtype: str, tp: int, kv_cache_dtype: str = "auto") -> ArchFeatures:
    """Count bytes and FLOP coefficients of ``arch`` per device.

    KV bytes per position per layer: GQA 2·n_kv·d·b_kv / min(tp, n_kv) (heads shard, the rest
    replicate); MLA (kv_lora + rope)·b_kv, replicated. Attention FLOPs per query token per
    position per layer: GQA 4·n_q·d; MLA (absorbed) 2·n_q·(2·kv_lora + rope); both / tp.
    All-reduce: 2 per layer, ring payload 2·(tp-1)/tp · h · 2 bytes per token; each one pays the
    hardware's ``allreduce_latency_s`` once, whatever the TP degree (decode-sized all-reduces run
    as one-shot NVLink kernels; a ring's 2(tp-1) latency steps fitted the published points no
    better and made dense TP 8 slower than TP 4).
    """
    st = resolve_dtype(arch, dtype)
    kvb = kv_bytes(kv_cache_dtype, st)
    if arch.mla is None:
        kv_layer = 2 * arch.num_kv_heads * arch.head_dim * kvb / min(tp, arch.num_kv_heads)
        attn_layer = 4 * arch.num_heads * arch.head_dim / tp
        group = (arch.num_heads / tp) / (arch.num_kv_heads / min(tp, arch.num_kv_heads))
    else:
        m = arch.mla
        kv_layer = (m.kv_lora_rank + m.rope_dim) * kvb
        attn_layer = 2 * arch.num_heads * (2 * m.kv_lora_rank + m.rope_dim) / tp
        group = arch.num_heads / tp  # one latent KV shared by every head
    full = arch.num_layers - arch.sliding_layers
    routed = arch.moe_layers * arch.num_experts * arch.expert_params()
    embedding = arch.vocab * arch.hidden if arch.has_embedding and not arch.tied_embeddings else 0
    head = arch.head_params()
    dense_bytes = (arch.dense_params() - head) * st.linear + head * st.head
    return ArchFeatures(
        dense_bytes=dense_bytes / tp, dense_params=arch.dense_params() / tp,
        expert_bytes=arch.expert_params() * st.expert / tp, expert_params=arch.expert_params() / tp,
        moe_layers=arch.moe_layers if arch.is_moe else 0, num_experts=arch.num_experts if arch.is_moe else 0,
        top_k=arch.experts_per_token if arch.is_moe else 0,
        kv_full=full * kv_layer, kv_sliding=arch.sliding_layers * kv_layer, window=arch.sliding_window,
        attn_full=full * attn_layer, attn_sliding=arch.sliding_layers * attn_layer,
        comm_bytes=(2 * arch.num_layers * 2 * (tp - 1) / tp * arch.hidden * 2) if tp > 1 else 0.0,
        comm_count=2 * arch.num_layers if tp > 1 else 0,
        total_bytes=(dense_bytes + embedding * st.head + routed * st.expert) / tp,
        layers=arch.num_layers, mla_layers=arch.num_layers if arch.mla is not None else 0,
        token_units=arch.num_layers * arch.hidden / 4096.0,
        q_per_kv=max(group, 1.0),
    )


@dataclass(frozen=True)
class HwArrays:
    """Hardware side of the model (floats or arrays): peaks, and the profile's efficiencies and
    overheads (its ``Efficiency``)."""

    bandwidth: ArrayLike  # bytes/s
    flops: ArrayLike  # FLOP/s at the model's GEMM precision
    tile_m: ArrayLike  # largest GEMM row tile
    min_tile_m: ArrayLike  # smallest GEMM row tile
    link_bandwidth: ArrayLike  # bytes/s per direction (0 = none)
    allreduce_latency_s: ArrayLike
    memory_bytes: ArrayLike
    efficiency: Efficiency
    attention_min_rows: ArrayLike = 1.0  # smallest attention query tile computed (sim.context)

    @staticmethod
    def of(hw: Hardware, compute_dtype: str = "bf16") -> HwArrays:
        return HwArrays(hw.bandwidth_bytes_s, hw.peak_flops(compute_dtype), hw.tile_m, hw.min_tile_m,
                        hw.interconnect_gbs * 1e9, hw.allreduce_latency_s, hw.memory_gb * 1e9,
                        hw.efficiency, attention_min_rows(hw.name, hw.tile_m))


def padded(n: ArrayLike, tile: ArrayLike, min_tile: ArrayLike = 16) -> ArrayLike:
    """Rows a tensor-core GEMM computes for n token rows (tile quantization at small M).

    Kernels pick the row tile by M: the smallest power of two >= n, at least ``min_tile`` and at
    most ``tile`` (the large-M tile); n is padded to a multiple of it::

        t = clip(2^ceil(log2 n), min_tile, tile);   pad(n) = ceil(n / t) · t

    This is how vLLM's CUTLASS FP8 GEMM dispatches on Hopper (swap-AB tiles with 16, 32, 64 token
    columns for M ≤ 16, ≤ 32, ≤ 64; 64- and 128-row tiles above), and 16 rows is the smallest
    tensor-core MMA / Triton ``tl.dot`` block (fused-MoE ``BLOCK_SIZE_M`` 16 for small M). A
    decode step at BS 1 therefore costs 16 rows of FLOPs, not 64. ``tile`` ≤ ``min_tile``
    (e.g. 1 on a CPU profile) gives a fixed tile.
    """
    n = np.asarray(n, dtype=float)
    pow2 = np.exp2(np.ceil(np.log2(np.maximum(n, 1.0))))
    t = np.minimum(np.maximum(pow2, min_tile), tile)
    return np.ceil(n / t) * t


def dense_term(f: ArchFeatures, hw: HwArrays, n: ArrayLike) -> tuple[ArrayLike, ArrayLike]:
    """Weights every token passes through, at n tokens.

    mem = dense_bytes / BW;  flops = 2 · pad(n) · dense_params / F (:func:`padded`).
    Returns (mem_s, flop_s).
    """
    return f.dense_bytes / hw.bandwidth, 2.0 * padded(n, hw.tile_m, hw.min_tile_m) * f.dense_params / hw.flops


def distinct_experts(num_experts: ArrayLike, top_k: ArrayLike, n_eff: ArrayLike) -> ArrayLike:
    """Expected distinct experts per layer when n_eff independent tokens each pick top_k of E
    uniformly: E · (1 − (1 − k/E)^n_eff)  (0 for dense models)."""
    e = np.asarray(num_experts, dtype=float)
    safe = np.where(e > 0, e, 1.0)
    return np.where(e > 0, safe * (1.0 - (1.0 - top_k / safe) ** n_eff), 0.0)


def expert_term(f: ArchFeatures, hw: HwArrays, batch: ArrayLike, tokens_per_seq: ArrayLike,
                correlation: ArrayLike) -> tuple[ArrayLike, ArrayLike]:
    """MoE experts at ``batch`` sequences of ``tokens_per_seq`` tokens each (K+1 when verifying).

    Tokens of one sequence are correlated: they count as n_eff = B · t^(1 − ρ) independent tokens
    (ρ = 0 uniform routing; ρ ≈ 0.34 makes 4 tokens load 2.5× one token's experts, the figure
    reported for a production MoE). D = distinct_experts(E, k, n_eff);
    mem = L_moe · D · expert_bytes / BW;  flops = 2 · L_moe · D · pad(n·k / D) · expert_params / F.
    """
    t = np.asarray(tokens_per_seq, dtype=float)
    n = batch * t
    d = distinct_experts(f.num_experts, f.top_k, batch * t ** (1.0 - correlation))
    per_expert = np.where(d > 0, n * f.top_k / np.where(d > 0, d, 1.0), 0.0)
    mem = f.moe_layers * d * f.expert_bytes / hw.bandwidth
    flop = 2.0 * f.moe_layers * d * padded(per_expert, hw.tile_m, hw.min_tile_m) * f.expert_params / hw.flops
    return mem, flop


def attention_term(f: ArchFeatures, hw: HwArrays, batch: ArrayLike, tokens_per_seq: ArrayLike,
                   context: ArrayLike) -> tuple[ArrayLike, ArrayLike]:
    """KV-cache reads and attention math at context length C (sliding layers see min(C, W)).

    The t query tokens of a sequence share one pass over its KV cache, and their G·t query rows
    are computed in whole tiles; on H20 the first tile is computed whole (FA3's 128 rows: there,
    unlike on other GPUs, it is compute-bound; not for MLA) (:func:`dsdprof.measure.sim.context.query_tokens`,
    t' = pad(G·t)/G):
    mem = B · (kv_full · C + kv_sliding · min(C, W)) / BW;
    flops = B · t' · (attn_full · C + attn_sliding · min(C, W)) / F.
    """
    c = np.asarray(context, dtype=float)
    cs = np.where(np.asarray(f.window) > 0, np.minimum(c, f.window), 0.0)
    mem = batch * (f.kv_full * c + f.kv_sliding * cs) / hw.bandwidth
    min_rows = np.where(np.asarray(f.mla_layers) > 0, 1.0, hw.attention_min_rows)  # MLA: FlashMLA
    t = query_tokens(f.q_per_kv, tokens_per_seq, attention_tile(hw.tile_m), min_rows)
    flop = batch * t * (f.attn_full * c + f.attn_sliding * cs) / hw.flops
    return mem, flop


def comm_seconds(f: ArchFeatures, hw: HwArrays, n: ArrayLike) -> ArrayLike:
    """Tensor-parallel all-reduces: count · latency + n · comm_bytes / link (0 when tp = 1).

    2 all-reduces per layer, each paying ``allreduce_latency_s`` (TP-independent, see
    :func:`arch_features`) plus the ring payload over the link."""
    link = np.asarray(hw.link_bandwidth, dtype=float)
    per_token = np.where(link > 0, f.comm_bytes / np.where(link > 0, link, 1.0), 0.0)
    return f.comm_count * hw.allreduce_latency_s + n * per_token


def latency_seconds(f: ArchFeatures, hw: HwArrays, batch: ArrayLike, tokens_per_seq: ArrayLike,
                    correlation: ArrayLike) -> ArrayLike:
    """Fixed (latency-bound) costs of one forward pass that no roofline term captures.

    * per decoder layer: ``layer_overhead_s`` (norms, activations, rotary, KV writes, small-kernel
      launch latency; what vLLM/SGLang do not fuse away) × layers;
    * per MoE layer: ``moe_layer_overhead_s`` (router GEMM, top-k, token permute / combine);
    * per MLA layer: ``mla_layer_overhead_s`` (latent-attention decode on pre-FlashMLA kernels or
      on H20, see ``fidelity.legacy_mla``; 0 in the catalog for current kernels elsewhere);
    * per token: ``token_overhead_s`` × layers × hidden / 4096 (the elementwise work outside the
      GEMM roofline: norms, activations, rotary, quantization of activations, KV writes; it makes
      a memory-bound step grow smoothly with the tokens in it);
    * per distinct expert loaded: ``expert_overhead_s``. Small experts are latency-bound: a grouped
      GEMM on an expert of S bytes with n tokens takes max(S / (BW·e_bw), FLOPs / (F·e_c)) + t_e,
      i.e. it streams at an efficiency S / (S + t_e·BW·e_bw) of the dense GEMMs' that falls with the
      expert slice size S (per device, so also with TP) and rises with tokens per expert once the
      FLOP side binds (the roofline max of :func:`expert_term`).
    """
    t = np.asarray(tokens_per_seq, dtype=float)
    d = distinct_experts(f.num_experts, f.top_k, batch * t ** (1.0 - correlation))
    e = hw.efficiency
    return (f.layers * e.layer_overhead_s + f.moe_layers * e.moe_layer_overhead_s
            + f.moe_layers * d * e.expert_overhead_s + f.mla_layers * e.mla_layer_overhead_s
            + batch * t * f.token_units * e.token_overhead_s)


@dataclass(frozen=True)
class StepParts:
    """Unit-efficiency pieces of one step: roofline terms (last axis: verify dense/expert/attention,
    then K × draft dense/expert/attention) plus non-roofline seconds."""

    mem_s: np.ndarray
    flop_s: np.ndarray
    comm_s: ArrayLike
    k: ArrayLike
    speculative: ArrayLike
    fixed_s: ArrayLike = 0.0  # latency_seconds of the verify pass + K draft passes


def step_parts(hw: HwArrays, target: ArchFeatures, draft: ArchFeatures, batch: ArrayLike, k: ArrayLike,
               context: ArrayLike, correlation: ArrayLike = 0.0, speculative: ArrayLike = 1.0) -> StepParts:
    """Collect every term of a step at peak (efficiency 1). Draft terms are multiplied by K."""
    batch = np.asarray(batch, dtype=float)
    k = np.asarray(k, dtype=float)
    t = k + 1.0
    n = batch * t
    terms = [dense_term(target, hw, n), expert_term(target, hw, batch, t, correlation),
             attention_term(target, hw, batch, t, context)]
    d_terms = [dense_term(draft, hw, batch), expert_term(draft, hw, batch, 1.0, correlation),
               attention_term(draft, hw, batch, 1.0, context)]
    terms += [(k * m, k * c) for m, c in d_terms]
    shape = np.broadcast_shapes(*(np.shape(x) for pair in terms for x in pair))
    mem = np.stack([np.broadcast_to(m, shape) for m, _ in terms], axis=-1)
    flop = np.stack([np.broadcast_to(c, shape) for _, c in terms], axis=-1)
    comm = comm_seconds(target, hw, n) + k * comm_seconds(draft, hw, batch)
    fixed = (latency_seconds(target, hw, batch, t, correlation)
             + k * latency_seconds(draft, hw, batch, 1.0, correlation))
    return StepParts(mem, flop, comm, k, np.asarray(speculative, dtype=float), fixed)


def roofline_seconds(parts: StepParts, eff_bandwidth: ArrayLike, eff_compute: ArrayLike) -> np.ndarray:
    """Σ_terms max(mem_s / e_bw, flop_s / e_c) — the kernel time of the step."""
    eb = np.expand_dims(np.asarray(eff_bandwidth, dtype=float), -1)
    ec = np.expand_dims(np.asarray(eff_compute, dtype=float), -1)
    return np.maximum(parts.mem_s / eb, parts.flop_s / ec).sum(axis=-1)


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds per engine step, split into kernel time and fixed overheads."""

    kernel_s: np.ndarray
    overhead_s: np.ndarray
    total_s: np.ndarray


def step_time(hw: HwArrays, target: ArchFeatures, draft: ArchFeatures, batch: ArrayLike, k: ArrayLike,
              context: ArrayLike, correlation: ArrayLike = 0.0, speculative: ArrayLike = 1.0,
              method: str = "eagle", method_factors: tuple[ArrayLike, ArrayLike] | None = None) -> StepTime:
    """T = roofline_seconds + comm + latency + step_overhead
           + K · m_step · draft_step_overhead + spec · m_fixed · dsd_overhead.

    ``speculative`` = 0 for a vanilla engine (no drafter at all; pass K = 0), 1 for a DSD engine
    (which pays ``dsd_overhead_s`` even at K = 0). ``latency`` = :func:`latency_seconds` of the
    verify pass and of each of the K draft passes (the draft's layers, so the draft depth K and its
    TP all-reduces scale it); (m_fixed, m_step) = :data:`METHOD_OVERHEAD` [method], or
    ``method_factors`` (arrays, e.g. one per grid column) when given.
    """
    if method_factors is None:
        method_factors = METHOD_OVERHEAD.get(method, (1.0, 1.0))
    m_fixed, m_step = method_factors
    p = step_parts(hw, target, draft, batch, k, context, correlation, speculative)
    e = hw.efficiency
    kernel = roofline_seconds(p, e.bandwidth, e.compute) + p.comm_s + p.fixed_s
    overhead = (e.step_overhead_s + p.k * m_step * e.draft_step_overhead_s
                + p.speculative * m_fixed * e.dsd_overhead_s)
    overhead = np.broadcast_to(overhead, np.shape(kernel)) if np.ndim(kernel) else np.asarray(overhead)
    return StepTime(np.asarray(kernel), np.asarray(overhead), np.asarray(kernel + overhead))


def memory_bytes(target: ArchFeatures, draft: ArchFeatures, batch: ArrayLike, k: ArrayLike,
                 context: ArrayLike) -> ArrayLike:
    """Device memory needed: all weights / tp + KV for B sequences of C + K + 1 positions."""
    c = np.asarray(context, dtype=float) + np.asarray(k, dtype=float) + 1.0
    kv = lambda f: f.kv_full * c + f.kv_sliding * np.minimum(c, f.window)  # noqa: E731
    return target.total_bytes + draft.total_bytes + batch * (kv(target) + kv(draft))
