"""Whole-grid evaluation: every (hardware, model, batch size, K) cell in one numpy pass.

Arrays are shaped (H, M, nB, nK): hardware on axis 0, model on axis 1, batch size on axis 2 and K
on axis 3; the step model's functions broadcast over them unchanged (see :mod:`dsdprof.measure.sim.model`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.measure.sim.arch import ModelArch
from dsdprof.measure.sim.context import ATTENTION_TILE_ROWS
from dsdprof.measure.sim.dtypes import resolve_dtype
from dsdprof.measure.sim.hardware import Efficiency, Hardware
from dsdprof.measure.sim.model import (
    MEMORY_UTILIZATION,
    METHOD_OVERHEAD,
    NO_DRAFT,
    ArchFeatures,
    HwArrays,
    arch_features,
    memory_bytes,
    step_time,
)


@dataclass(frozen=True)
class ModelCase:
    """One column of the grid: target, draft (None = n-gram / suffix), dtype, TP degree, and the
    unconditional per-position acceptance p_1..p_Kmax."""

    target: ModelArch
    draft: ModelArch | None
    acceptance: tuple[float, ...]
    dtype: str = "bfloat16"
    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    method: str = "eagle"  # speculation overhead factors (dsdprof.measure.sim.model.METHOD_OVERHEAD)


@dataclass(frozen=True)
class GridResult:
    """``itl_s``: (H, M, nB, nK) DSD-mode step seconds; ``vanilla_itl_s``: (H, M, nB);
    ``acceptance_length``: (M, nK); ``fits``: (H, M, nB, nK) memory check; ``optimal_k``: (H, M, nB)
    smallest K within ``tolerance`` of the best goodput AL / ITL (-1 where nothing fits)."""

    itl_s: np.ndarray
    vanilla_itl_s: np.ndarray
    acceptance_length: np.ndarray
    fits: np.ndarray
    optimal_k: np.ndarray
    batch_sizes: np.ndarray
    ks: np.ndarray


def _hw_arrays(hardwares: Sequence[Hardware], cases: Sequence[ModelCase]) -> HwArrays:
    """HwArrays with fields shaped (H, 1, 1, 1), except flops (H, M, 1, 1) by GEMM precision; the
    ``efficiency`` record's fields are such arrays too."""
    def stacked(records: Sequence[object], cls: type) -> dict[str, np.ndarray]:
        return {f.name: np.array([float(getattr(r, f.name)) for r in records]).reshape(-1, 1, 1, 1)
                for f in fields(cls) if f.name != "efficiency"}

    cols: dict[str, object] = dict(stacked([HwArrays.of(h) for h in hardwares], HwArrays))
    cols["efficiency"] = Efficiency(**stacked([h.efficiency for h in hardwares], Efficiency))
    precisions = [resolve_dtype(c.target, c.dtype).compute for c in cases]
    cols["flops"] = np.array([[h.peak_flops(p) for p in precisions] for h in hardwares]).reshape(
        len(hardwares), len(cases), 1, 1)
    return HwArrays(**cols)


def optimal_k(goodput: np.ndarray, ks: np.ndarray, tolerance: float, valid: np.ndarray) -> np.ndarray:
    """Smallest K (last axis) with goodput >= (1 - tol) · best; -1 where no K is valid."""
    g = np.where(valid, goodput, -np.inf)
    best = g.max(axis=-1, keepdims=True)
    ok = valid & (g >= best * (1.0 - tolerance))
    idx = np.argmax(ok, axis=-1)
    return np.where(ok.any(axis=-1), ks[idx], -1)


def predict_grid(hardwares: Sequence[Hardware], cases: Sequence[ModelCase], batch_sizes: Sequence[int],
                 ks: Sequence[int], context_len: float = 1024.0, routing_correlation: float = 0.0,
                 tolerance: float = DEFAULT_TOLERANCE) -> GridResult:
    """Evaluate the step model over the full grid in one vectorised pass."""
    b = np.asarray(batch_sizes, dtype=float).reshape(1, 1, -1, 1)
    k = np.asarray(ks, dtype=float).reshape(1, 1, 1, -1)
    kmax = int(max(ks))
    shape = (1, len(cases), 1, 1)
    tgt = ArchFeatures.stack([arch_features(c.target, c.dtype, c.tensor_parallel_size, c.kv_cache_dtype)
                              for c in cases], shape)
    drf = ArchFeatures.stack([arch_features(c.draft, c.dtype, c.tensor_parallel_size, c.kv_cache_dtype)
                              if c.draft else NO_DRAFT for c in cases], shape)
    hw = _hw_arrays(hardwares, cases)
    factors = np.array([METHOD_OVERHEAD.get(c.method, (1.0, 1.0)) for c in cases], dtype=float)
    per_case = (factors[:, 0].reshape(shape), factors[:, 1].reshape(shape))
    itl = step_time(hw, tgt, drf, b, k, context_len, routing_correlation, 1.0,
                    method_factors=per_case).total_s
    van = step_time(hw, tgt, NO_DRAFT, b, 0.0, context_len, routing_correlation, 0.0).total_s[..., 0]
    acc = np.zeros((len(cases), kmax))
    for i, c in enumerate(cases):
        p = np.asarray(c.acceptance[:kmax], dtype=float)
        acc[i, : len(p)] = p
    cum = np.concatenate([np.zeros((len(cases), 1)), np.cumsum(acc, axis=1)], axis=1)
    al = 1.0 + cum[:, np.asarray(ks, dtype=int)]  # (M, nK)
    fits = memory_bytes(tgt, drf, b, k, context_len) <= hw.memory_bytes * MEMORY_UTILIZATION
    goodput = al[None, :, None, :] / itl
    kstar = optimal_k(goodput, np.asarray(ks), tolerance, fits)
    return GridResult(itl, van, al, np.broadcast_to(fits, itl.shape), kstar,
                      np.asarray(batch_sizes), np.asarray(ks))


def free_draft_length(group: float | np.ndarray, tile: float = ATTENTION_TILE_ROWS) -> np.ndarray:
    """The longest draft whose K+1 query tokens share one attention tile: ``floor(tile / G) − 1``
    (>= 0; :mod:`dsdprof.measure.sim.context`)."""
    g = np.maximum(np.asarray(group, dtype=float), 1.0)
    return np.maximum(np.floor(np.asarray(tile, dtype=float) / g) - 1.0, 0.0)
