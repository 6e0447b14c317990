"""The context-length side of the step model: the attention kernel's query tile under GQA, and
how many sequences of a context fit the KV cache. Pure numpy, broadcasting like
:mod:`dsdprof.measure.sim.model` (which calls :func:`query_tokens` from its attention term).

**Group and tile.** A decode attention kernel (FlashAttention-3 / FlashInfer with GQA packing)
puts the G query heads that share one KV head, times the t = K+1 query tokens of a request,
into the rows of one tile of :data:`ATTENTION_TILE_ROWS` rows; every tile reads the request's KV
once. So per KV head and position the kernel reads 2·d KV elements once and does the math of
``pad(G·t)`` rows, ``pad(n) = ceil(n / 128) · 128``::

    KV bytes    = B · kv_per_position · C                        (independent of K)
    attn FLOPs  = B · t · attn_per_token · C                     while G·t <= 128 (one tile)
                = B · pad(G · t) / G · attn_per_token · C        past it (whole tiles)

While ``G · (K+1) <= 128`` the extra draft tokens cost no attention time (the tile is computed
anyway and the step is KV-bandwidth bound: 128 FLOP per KV byte is below the ridge of H100,
H200, B200), so ``K = 128/G - 1`` is the longest nearly-free draft: 31 for
Llama-3.1-8B (G = 4), 15 for Qwen3-30B-A3B (G = 8). One more token opens a second tile and
doubles the attention math (compute bound past the ridge). MLA shares one latent KV across all
n_q heads (G = n_q per device): its tiles are already full, drafts cost attention math at once.
A profile with ``tile_m <= 1`` (a CPU) has no tile: t tokens cost t tokens of math.

**KV capacity.** A sequence at context C holds ``kv(C + K + 1)`` bytes per device; the batch
that fits is ``floor((memory · utilization − weights) / kv per sequence)``
(:func:`max_batch_size`). Beyond it vLLM cannot hold the batch: the cell is a predicted OOM.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ArrayLike = Any
ATTENTION_TILE_ROWS = 128  # query rows per attention tile (FA3 / FlashInfer decode, GQA-packed)
# Decode attention on the H20 computes its whole first query tile. FlashAttention-3, the Hopper default
# of vLLM V1 and of SGLang for Llama / Qwen / Gemma (https://github.com/sgl-project/sglang/issues/5064,
# April 2025), runs head dim <= 128 on 128-row query tiles (hopper/tile_size.h,
# tile_size_fwd_sm90: kBlockM 128) and the tensor cores compute every row, used or not: 128 rows are
# 128 FLOP per bf16 KV byte. Below the ridge of H100 / H200 / B200 / A100 / MI300X (136-236 FLOP/B at
# the fitted efficiencies) that hides under the KV read, so only the useful rows are counted there;
# the H20 (148 TFLOP/s, 4.0 TB/s: ~31 FLOP/B) turns compute-bound, as SGLang measured: FA3 decode
# attention 98 us vs FlashInfer's 35 us per layer on H20 (Qwen3-235B-A22B TP 8, BS 32, 3.5k input;
# https://github.com/sgl-project/sglang/pull/6151) and 908 vs 2014 output tok/s end to end (QwQ-32B
# TP 4, BS 64, 12k input; https://github.com/sgl-project/sglang/issues/5630). Newer FA3 builds pick
# one 64-row MMA warpgroup for short query tiles (use_one_mma_wg), which would halve it.
# MLA is left out: its decode runs FlashMLA (its own head tiling; fidelity.legacy_mla carries H20's).
FULL_TILE_GPUS = ("H20",)


def attention_tile(tile_m: ArrayLike) -> ArrayLike:
    """The attention tile of a hardware profile: 128 rows on a GPU, none (1) where ``tile_m <= 1``."""
    return np.where(np.asarray(tile_m, dtype=float) > 1, float(ATTENTION_TILE_ROWS), 1.0)


def query_tokens(group: ArrayLike, tokens_per_seq: ArrayLike,
                 tile: ArrayLike = ATTENTION_TILE_ROWS, min_rows: ArrayLike = 1) -> ArrayLike:
    """Query tokens of attention math per sequence: t while G·t fits one tile, else whole tiles
    ``pad(G·t) / G``; at least ``min_rows / G`` (the kernel's smallest tile, computed whole:
    a whole tile on :data:`FULL_TILE_GPUS`, see :func:`attention_min_rows`).

    ``group`` G = query heads per KV head on one device (0 or less: no attention, treated as 1);
    ``tile`` <= 1: no tile (t). With ``min_rows`` 1 only the useful rows of the first tile count
    (its padding hides under the KV read wherever the ridge exceeds the tile's FLOP per byte).
    """
    g = np.maximum(np.asarray(group, dtype=float), 1.0)
    t = np.asarray(tokens_per_seq, dtype=float)
    tile = np.asarray(tile, dtype=float)
    rows = g * t
    padded = np.where((tile > 1) & (rows > tile), np.ceil(rows / np.maximum(tile, 1.0)) * tile, rows)
    padded = np.where((tile > 1) & (rows > min_rows) & (rows <= tile) & (min_rows > 1), tile, padded)
    return np.maximum(padded, np.where(tile > 1, min_rows, 1.0)) / g


def attention_min_rows(name: str, tile_m: ArrayLike) -> ArrayLike:
    """Query rows the decode attention computes at least: a whole tile on :data:`FULL_TILE_GPUS`
    (a GPU profile, ``tile_m`` > 1), else 1 (the useful rows only)."""
    full = name in FULL_TILE_GPUS and float(np.max(tile_m)) > 1
    return float(ATTENTION_TILE_ROWS) if full else 1.0


def max_batch_size(weights_bytes: ArrayLike, kv_per_seq_bytes: ArrayLike, memory_bytes: ArrayLike,
                   utilization: float) -> ArrayLike:
    """Sequences whose KV cache fits next to the weights: ``floor((M·u − W) / kv)`` (0 if none)."""
    free = np.asarray(memory_bytes, dtype=float) * utilization - np.asarray(weights_bytes, dtype=float)
    kv = np.maximum(np.asarray(kv_per_seq_bytes, dtype=float), 1e-30)
    return np.maximum(np.floor(free / kv), 0.0)


def decode_context(context_len: int, output_len: int) -> int:
    """Mean KV positions over a request's decode: its prompt plus half its output."""
    return int(context_len) + int(output_len) // 2
