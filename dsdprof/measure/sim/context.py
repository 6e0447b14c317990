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


def attention_tile(tile_m: ArrayLike) -> ArrayLike:
    """The attention tile of a hardware profile: 128 rows on a GPU, none (1) where ``tile_m <= 1``."""
    return np.where(np.asarray(tile_m, dtype=float) > 1, float(ATTENTION_TILE_ROWS), 1.0)


def query_tokens(group: ArrayLike, tokens_per_seq: ArrayLike,
                 tile: ArrayLike = ATTENTION_TILE_ROWS) -> ArrayLike:
    """Query tokens of attention math per sequence: t while G·t fits one tile, else whole tiles
    ``pad(G·t) / G``.

    ``group`` G = query heads per KV head on one device (0 or less: no attention, treated as 1);
    ``tile`` <= 1: no tile (t). Inside the first tile only the useful rows are counted: the padded
    rows of a partly filled tile hide under the KV read on GPUs whose ridge point exceeds 128
    FLOP/byte (H100, H200, B200, A100); on compute-poor parts (H20) this undercounts the first tile.
    """
    g = np.maximum(np.asarray(group, dtype=float), 1.0)
    t = np.asarray(tokens_per_seq, dtype=float)
    tile = np.asarray(tile, dtype=float)
    rows = g * t
    padded = np.where((tile > 1) & (rows > tile), np.ceil(rows / np.maximum(tile, 1.0)) * tile, rows)
    return padded / g


def free_draft_length(group: ArrayLike, tile: ArrayLike = ATTENTION_TILE_ROWS) -> ArrayLike:
    """The longest draft whose K+1 query tokens share one tile: ``floor(tile / G) − 1`` (>= 0)."""
    g = np.maximum(np.asarray(group, dtype=float), 1.0)
    return np.maximum(np.floor(np.asarray(tile, dtype=float) / g) - 1.0, 0.0)


def max_batch_size(weights_bytes: ArrayLike, kv_per_seq_bytes: ArrayLike, memory_bytes: ArrayLike,
                   utilization: float) -> ArrayLike:
    """Sequences whose KV cache fits next to the weights: ``floor((M·u − W) / kv)`` (0 if none)."""
    free = np.asarray(memory_bytes, dtype=float) * utilization - np.asarray(weights_bytes, dtype=float)
    kv = np.maximum(np.asarray(kv_per_seq_bytes, dtype=float), 1e-30)
    return np.maximum(np.floor(free / kv), 0.0)


def decode_context(context_len: int, output_len: int) -> int:
    """Mean KV positions over a request's decode: its prompt plus half its output."""
    return int(context_len) + int(output_len) // 2
