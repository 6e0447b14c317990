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


def regret(chosen: dict[int, int], goodput: dict[int, dict[int, float]]) -> dict[int, float]:
    """Per batch size, 1 - truth goodput of the chosen K / the best truth goodput there."""
    out = {}
    for b, k in chosen.items():
        g = goodput[b]
        out[b] = 1.0 - g[k] / max(g.values())
    return out


def truth_k(t, tolerance: float = 0.02) -> dict[int, int]:
    """The rule on exact numbers: smallest K within tolerance of the best."""
    out = {}
    for b, g in truth_goodput(t).items():
        best = max(g.values())
        out[b] = min(k for k, v in g.items() if v >= best * (1 - tolerance))
    return out


def noisy_rows(t, seed: int, repeats: int = 3, waves: int = 20, wave_noise: float = 0.06,
               repeat_noise: float = 0.02, al_noise: float = 0.04, samples: bool = True,
               vanilla: bool = True, outliers: float = 0.0, outlier_factor: float = 3.0) -> pd.DataFrame:
    """One row per (batch size, K, repeat) in DSD mode (plus vanilla rows), lognormal noise:
    per wave on ITL (``wave_noise``) and AL (``al_noise``, K > 0), per repeat on ITL (drift).
    ``outliers``: the share of waves (drawn independently) whose ITL is ``outlier_factor`` times
    slower (a GC pause, a noisy neighbour); the truth is the cell without them."""
    rng = np.random.default_rng(seed)
    out_rng = np.random.default_rng((seed,
                                     7919))  # its own stream: the clean noise is the same with or without
    rows = []
    for b, by_k in t.items():
        for r in range(repeats):
            cells = [("dsd", k, al, itl) for k, (al, itl) in by_k.items()]
            if vanilla:
                cells.append(("vanilla", 0, 1.0, by_k[0][1] * 0.95))
            for mode, k, al, itl in cells:
                drift = rng.lognormal(0.0, repeat_noise)
                s_itl = itl * drift * rng.lognormal(0.0, wave_noise, waves)
                if outliers:
                    s_itl = s_itl * np.where(out_rng.random(waves) < outliers, outlier_factor, 1.0)
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


class TruthEngine:
    """An Engine over a known truth with seeded noise, for orchestration tests of the budgeted
    sweep. Its rows are synthetic (provenance engine = "synthetic"), never measurements.

    ``chain=False`` makes AL(K) of smaller K fall 10 % short of what the largest K's per-position
    acceptance predicts (an n-gram-like drafter)."""

    name = "synthetic"
    speculation_mode = "dsd"

    def __init__(self, t, seed: int = 0, waves: int = 20, wave_noise: float = 0.05,
                 repeat_noise: float = 0.01,
                 al_noise: float = 0.03, method: str = "eagle3", chain: bool = True, mode: str = "dsd",
                 paired: bool = False):
        self.t, self.seed, self.waves, self.paired = t, seed, waves, paired
        self.wave_noise, self.repeat_noise, self.al_noise = wave_noise, repeat_noise, al_noise
        self.method, self.chain, self.speculation_mode = method, chain, mode
        self.kmax = max(max(by_k) for by_k in t.values())
        self.measured = []

    def provenance(self):
        from dsdprof.formats.measurements import Provenance

        return Provenance(engine="synthetic", engine_version="0", model="truth", draft_model="truth-draft",
                          method=self.method, hardware="none", dtype="none", dataset="synthetic",
                          seed=self.seed, dsdprof_version="0")

    def measure(self, cell):
        from dsdprof.measure.engine import CellMeasurement

        self.measured.append(cell)
        b, k = cell.batch_size, cell.num_spec_tokens
        al, itl = self.t[b][k]
        if cell.mode == "vanilla":
            al, itl = 1.0, self.t[b][0][1] * 0.95
        elif not self.chain and 0 < k < self.kmax:
            al = 1.0 + (al - 1.0) * 0.9
        rng = np.random.default_rng((self.seed, b, k, cell.repeat,
                                     ["vanilla", "dsd", "fixed"].index(cell.mode)))
        s_itl = itl * rng.lognormal(0.0, self.repeat_noise) * rng.lognormal(0.0, self.wave_noise, self.waves)
        if cell.group:  # paired: the Ks of a wave share its drift; each K keeps a quarter of the noise
            shared = np.random.default_rng((self.seed, b, cell.repeat, 99))
            s_itl = (itl * shared.lognormal(0.0, self.repeat_noise)
                     * shared.lognormal(0.0, self.wave_noise, self.waves)
                     * rng.lognormal(0.0, self.wave_noise / 4, self.waves))
        s_al = (np.ones(self.waves) if k == 0
                else np.clip(al * rng.lognormal(0.0, self.al_noise, self.waves), 1.0, k + 1.0))
        a, t_ = float(s_al.mean()), float(s_itl.mean())
        steps = self.waves * 32 / a
        return CellMeasurement(
            acceptance_length=a, acceptance_per_pos=tuple(per_pos(k)), num_drafts=int(steps * b) if k else 0,
            num_draft_tokens=int(steps * b * k), num_accepted_tokens=int(steps * b * (a - 1)), itl_s=t_,
            itl_p50_s=t_, itl_p90_s=t_, itl_p99_s=t_, tpot_s=t_ / a, tpot_p50_s=t_ / a, tpot_p90_s=t_ / a,
            tpot_p99_s=t_ / a, tokens_per_s_per_user=a / t_, tokens_per_s_total=b * a / t_,
            num_requests=self.waves * b, num_output_tokens=self.waves * b * 32,
            wall_s=steps * t_ / (len(cell.group) if cell.group else 1),
            sample_acceptance_length=tuple(s_al.tolist()), sample_itl_s=tuple(s_itl.tolist()))

    def close(self):
        pass
