"""Synthetic measurement sets with a known truth plus seeded noise (inputs to pure functions).

The truth is a closed-form step-time model; rows look like schema-v2 rows (per-wave samples).
Nothing here is a measurement: it exists so tests can score decisions against a known answer.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
KS = (0, 1, 2, 3, 4, 5)
ALPHA = 0.8  # per-position conditional acceptance of the chain drafter


def acceptance(k: int, alpha: float = ALPHA) -> float:
    return float(sum(alpha ** i for i in range(k + 1)))


def per_pos(k: int, alpha: float = ALPHA) -> list[float]:
    return [alpha ** i for i in range(1, k + 1)]


def dense_itl(b: int, k: int) -> float:
    """Fixed cost + draft steps + verification that turns compute-bound with B*(K+1) tokens."""
    return 0.010 + 0.0012 * k + 0.00012 * b * (k + 1)


def moe_itl(b: int, k: int, experts: int = 128, top_k: int = 8) -> float:
    """Loading the experts the step's tokens touch dominates at small batch (more tokens touch
    more experts), is paid anyway at mid batch (every expert loaded), and compute takes over at
    large batch: K* rises, then falls (2, 1, 2, 5, 5, 5, 4, 3 over BS 1..128 at 2 % tolerance)."""
    tokens = b * (k + 1)
    touched = 1.0 - (1.0 - top_k / experts) ** tokens
    return 0.004 + 0.001 * k + 0.040 * touched + 0.0001 * tokens


MOE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def truth(kind: str, batch_sizes=None, ks=KS) -> dict[int, dict[int, tuple[float, float]]]:
    """{batch_size: {k: (acceptance_length, itl_s)}}."""
    itl = dense_itl if kind == "dense" else moe_itl
    batch_sizes = batch_sizes or (BATCH_SIZES if kind == "dense" else MOE_BATCH_SIZES)
    return {b: {k: (acceptance(k), itl(b, k)) for k in ks} for b in batch_sizes}


def truth_goodput(t) -> dict[int, dict[int, float]]:
    return {b: {k: al / itl for k, (al, itl) in by_k.items()} for b, by_k in t.items()}


def truth_k(t, tolerance: float = 0.02) -> dict[int, int]:
    """The rule on exact numbers: smallest K within tolerance of the best."""
    out = {}
    for b, g in truth_goodput(t).items():
        best = max(g.values())
        out[b] = min(k for k, v in g.items() if v >= best * (1 - tolerance))
    return out


def noisy_rows(t, seed: int, repeats: int = 3, waves: int = 20, wave_noise: float = 0.06,
               repeat_noise: float = 0.02, al_noise: float = 0.04, samples: bool = True,
               vanilla: bool = True) -> pd.DataFrame:
    """One row per (batch size, K, repeat) in DSD mode (plus vanilla rows), lognormal noise:
    per wave on ITL (``wave_noise``) and AL (``al_noise``, K > 0), per repeat on ITL (drift)."""
    rng = np.random.default_rng(seed)
    rows = []
    for b, by_k in t.items():
        for r in range(repeats):
            cells = [("dsd", k, al, itl) for k, (al, itl) in by_k.items()]
            if vanilla:
                cells.append(("vanilla", 0, 1.0, by_k[0][1] * 0.95))
            for mode, k, al, itl in cells:
                drift = rng.lognormal(0.0, repeat_noise)
                s_itl = itl * drift * rng.lognormal(0.0, wave_noise, waves)
                s_al = np.ones(waves) if k == 0 else np.clip(
                    al * rng.lognormal(0.0, al_noise, waves), 1.0, k + 1.0)
                row = {"mode": mode, "batch_size": b, "num_spec_tokens": k, "repeat": r, "status": "ok",
                       "acceptance_length": float(s_al.mean()), "itl_s": float(s_itl.mean()),
                       "acceptance_per_pos": per_pos(k), "method": "eagle3"}
                if samples:
                    row["sample_acceptance_length"] = s_al.tolist()
                    row["sample_itl_s"] = s_itl.tolist()
                rows.append(row)
    return pd.DataFrame(rows)
