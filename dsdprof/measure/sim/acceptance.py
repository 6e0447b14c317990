"""Acceptance inputs for the analytic engine.

Convention: a vector ``p`` of **unconditional** per-position acceptance, ``p[i-1]`` = probability
that draft position i is accepted (positions 1..i all accepted), the quantity vLLM's
``acceptance_per_pos`` column stores (accepted_tokens_per_pos / num_drafts). Then

    AL(K) = 1 + Σ_{i=1..K} p_i

Conditional rates a_j (probability position j is accepted given 1..j-1 were) convert with
p_i = Π_{j≤i} a_j; a geometric α is a_j = α for every j, p_i = α^i. Acceptance does not depend on
batch size (greedy verification); positions beyond the given ones continue with the last
conditional rate p_i / p_{i-1}.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dsdprof.errors import InputError


def geometric(alpha: float, k_max: int) -> np.ndarray:
    """p_i = α^i for i = 1..k_max."""
    return alpha ** np.arange(1, k_max + 1, dtype=float)


def from_conditional(rates: list[float]) -> np.ndarray:
    """p_i = Π_{j≤i} a_j."""
    return np.cumprod(np.asarray(rates, dtype=float))


def extend(p: np.ndarray, k_max: int) -> np.ndarray:
    """First ``k_max`` positions of ``p``; missing ones continue geometrically with the last
    conditional rate p_n / p_{n-1} (p_1 when only one position is given)."""
    p = np.asarray(p, dtype=float)
    if len(p) >= k_max:
        return p[:k_max].copy()
    if len(p) == 0:
        raise InputError("sim.acceptance", [], "needs at least one position")
    ratio = p[-1] / p[-2] if len(p) >= 2 and p[-2] > 0 else p[0]
    ratio = float(min(max(ratio, 0.0), 1.0))
    tail = p[-1] * ratio ** np.arange(1, k_max - len(p) + 1, dtype=float)
    return np.concatenate([p, tail])


def acceptance_length(p: np.ndarray, k: int) -> float:
    """AL(K) = 1 + Σ_{i≤K} p_i."""
    return 1.0 + float(np.sum(p[:k]))


def check_unconditional(p: list[float], field: str) -> np.ndarray:
    """Values in [0, 1] and non-increasing (position i+1 can only be accepted after i)."""
    arr = np.asarray(p, dtype=float)
    if arr.ndim != 1 or len(arr) == 0 or not np.all(np.isfinite(arr)):
        raise InputError(field, p, "must be a non-empty list of numbers")
    if np.any(arr < 0) or np.any(arr > 1):
        raise InputError(field, p, "rates must lie in [0, 1]")
    if np.any(np.diff(arr) > 1e-6):
        raise InputError(field, p, "unconditional per-position rates must be non-increasing "
                                   "(use acceptance_conditional for conditional rates)")
    return arr


def from_measurements(path: str | Path, field: str = "sim.acceptance_from") -> np.ndarray:
    """Mean ``acceptance_per_pos`` per position over a measured sweep's ok speculative rows.

    Positions are averaged over the rows that drafted them (a K=3 row informs positions 1..3).
    """
    from dsdprof.io.readers import load_measurements  # pandas: imported only here

    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(field, str(path), "no such file or directory")
    df = load_measurements(p)
    if "acceptance_per_pos" not in df.columns:
        raise InputError(field, str(path), "has no acceptance_per_pos column")
    rows = df[df["num_spec_tokens"] > 0]
    if "mode" in rows.columns:
        rows = rows[rows["mode"] != "vanilla"]
    lists = [list(v) for v in rows["acceptance_per_pos"] if v is not None and len(v) > 0]
    if not lists:
        raise InputError(field, str(path), "no rows with per-position acceptance (K > 0)")
    width = max(len(v) for v in lists)
    sums, counts = np.zeros(width), np.zeros(width)
    for v in lists:
        sums[: len(v)] += np.asarray(v, dtype=float)
        counts[: len(v)] += 1
    mean = sums / counts
    return np.minimum.accumulate(np.clip(mean, 0.0, 1.0))  # enforce non-increasing
