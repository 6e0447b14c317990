"""Fit the step model's efficiency factors and overheads to measured ITL, and test the fit on
batch sizes held out of it.

:func:`design` evaluates every step-model term at unit efficiency for each measured cell; the fit
itself (bounded least squares with an identifiability check) is :func:`dsdprof.measure.sim.fit.fit`.
pandas is imported by callers only (this module takes numpy arrays and DataFrames passed in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dsdprof.measure.sim.arch import ModelArch
from dsdprof.measure.sim.dtypes import resolve_dtype
from dsdprof.measure.sim.hardware import Efficiency, Hardware
from dsdprof.measure.sim.model import (
    METHOD_OVERHEAD,
    NO_DRAFT,
    HwArrays,
    arch_features,
    step_parts,
)


@dataclass(frozen=True)
class CalibrationTarget:
    """What was measured: architectures, dtype, TP, context length, base hardware (peaks)."""

    hardware: Hardware
    target: ModelArch
    draft: ModelArch | None
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    context_len: int = 1024
    routing_correlation: float = 0.0
    method: str = "eagle"
    kv_cache_dtype: str = "auto"


@dataclass(frozen=True)
class Design:
    """Per measured cell: unit-efficiency terms and the non-fitted seconds."""

    mem_s: np.ndarray  # (n, P)
    flop_s: np.ndarray  # (n, P)
    comm_s: np.ndarray  # (n,) non-fitted seconds: all-reduces + per-layer / MoE latency terms
    k: np.ndarray  # K times the method's per-step factor (the fitted per-draft-step overhead's column)
    speculative: np.ndarray  # [speculative] times the method's fixed factor


def design(ct: CalibrationTarget, batch: np.ndarray, k: np.ndarray, speculative: np.ndarray) -> Design:
    """Step-model terms for each (batch, K, speculative) cell (vanilla cells have no draft)."""
    tp = ct.tensor_parallel_size
    hw = HwArrays.of(ct.hardware, resolve_dtype(ct.target, ct.dtype).compute)
    tgt = arch_features(ct.target, ct.dtype, tp, ct.kv_cache_dtype)
    drf = arch_features(ct.draft, ct.dtype, tp, ct.kv_cache_dtype) if ct.draft else NO_DRAFT
    spec = np.asarray(speculative, dtype=float)
    b, kk = np.asarray(batch, dtype=float), np.asarray(k, dtype=float)
    # vanilla cells run K = 0 and no drafter, so draft terms vanish (multiplied by K = 0)
    p = step_parts(hw, tgt, drf, b, kk, ct.context_len, ct.routing_correlation, spec)
    m_fixed, m_step = METHOD_OVERHEAD.get(ct.method, (1.0, 1.0))
    extra = np.broadcast_to(np.asarray(p.comm_s) + np.asarray(p.fixed_s), b.shape).astype(float)
    return Design(p.mem_s, p.flop_s, extra, kk * m_step, spec * m_fixed)


def predict(d: Design, eff: Efficiency) -> np.ndarray:
    """T = Σ max(m/e_bw, f/e_c) + comm + o + d_k·K + d_0·spec."""
    kernel = np.maximum(d.mem_s / eff.bandwidth, d.flop_s / eff.compute).sum(axis=-1)
    return (kernel + d.comm_s + eff.step_overhead_s + d.k * eff.draft_step_overhead_s
            + d.speculative * eff.dsd_overhead_s)


def mape(pred: np.ndarray, actual: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    actual = np.asarray(actual, dtype=float)
    return float(np.mean(np.abs(np.asarray(pred) - actual) / actual) * 100.0)


def _speculative(df: Any) -> np.ndarray:
    if "mode" in df.columns:
        return (df["mode"].astype(str) != "vanilla").to_numpy(dtype=float)
    return (df["num_spec_tokens"].to_numpy() > 0).astype(float)


def design_for(ct: CalibrationTarget, df: Any) -> Design:
    return design(ct, df["batch_size"].to_numpy(), df["num_spec_tokens"].to_numpy(), _speculative(df))
