"""The context-length side of the step model: the attention kernel's query tile under GQA. Pure
numpy, broadcasting like :mod:`dsdprof.measure.sim.model` (which calls :func:`query_tokens` from its
attention term).

**Group and tile.** A GQA decode kernel packs the G query heads of one KV head times the t = K+1
query tokens of a request into one tile of :data:`ATTENTION_TILE_ROWS` rows, and every tile reads
the request's KV once, so per KV head and position it reads 2·d KV elements once and does the
math of ``pad(G·t)`` rows (MLA: G = n_q per device; a profile with ``tile_m <= 1``, a CPU, has no
tile). **KV capacity**: a cell whose weights and KV (:func:`dsdprof.measure.sim.model.memory_bytes`)
exceed memory · utilization is a predicted OOM. Why K = 128/G − 1 is nearly free, and what it
predicts: docs/context.md ("The analytic engine").
"""

from __future__ import annotations

from typing import Any

import numpy as np

ArrayLike = Any
ATTENTION_TILE_ROWS = 128  # query rows per attention tile (FA3 / FlashInfer decode, GQA-packed)
# Decode attention on the H20 computes its whole first query tile (FlashAttention-3's 128-row query
# tiles turn compute-bound below its ~31 FLOP/B ridge; SGLang's measurements and the limits:
# docs/sim.md, "H20 decode attention"). MLA is left out: it runs FlashMLA (fidelity.legacy_mla).
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


def decode_context(context_len: int, output_len: int) -> int:
    """Mean KV positions over a request's decode: its prompt plus half its output."""
    return int(context_len) + int(output_len) // 2
