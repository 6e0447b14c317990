"""Synthetic paired-design sweeps with a known truth, built step by step (inputs to coverage checks).

Each batch size's group runs every K inside the same waves, as the paired design does
(:func:`dsdprof.measure.vllm.worker.k_sequence`, hold 2): a step verifies the K the step before it
proposed, and a K is timed on its **pure** steps only (verified and proposed that K). Per step:

* **time**: the truth's ITL(B, K) x a per-wave drift shared by every K of the wave (lognormal,
  ``drift``) x a within-wave AR(1) noise (lag-1 correlation ``rho``, marginal ``step_sd``) x
  ``outlier_factor`` for a share ``outliers`` of steps (drawn independently);
* **acceptance**: each of the ``B`` requests accepts draft position ``j`` with probability
  ``alpha`` given it accepted ``j - 1`` (independent from step to step), counted per wave and
  pooled by draft position over the group as v6 rows are
  (:func:`dsdprof.measure.vllm.trace.pool_acceptance`): AL(K) = 1 + sum_{j<=K} accepted_j / drafted_j.

Rows look like schema-v6 paired rows (``design = "paired"``, one sample per wave, ``sample_block``).
The truth: AL(K) = 1 + sum_{j<=K} alpha^j, ITL from :func:`tests.synthetic.dense_itl` (or the
model given). Nothing here is a measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from tests.synthetic import dense_itl


@dataclass(frozen=True)
class Scenario:
    name: str
    drift: float = 0.03  # per-wave lognormal sd shared by every K of the wave
    step_sd: float = 0.04  # per-step lognormal sd (marginal)
    rho: float = 0.0  # lag-1 correlation of the step noise within a wave
    outliers: float = 0.0  # share of steps outlier_factor times slower
    outlier_factor: float = 3.0
    alpha: float = 0.8  # per-position conditional acceptance
    waves: int = 20
    repeats: int = 1
    steps: int = 48  # steps per wave (the K sequence cycles)
    hold: int = 2


SCENARIOS = (
    Scenario("drift", drift=0.05),
    Scenario("ar1", rho=0.6, step_sd=0.05),
    Scenario("outliers", outliers=0.01, step_sd=0.03),
    Scenario("all", drift=0.05, rho=0.5, outliers=0.01, step_sd=0.04, repeats=2, waves=10),
)

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# batch sizes where gpu_itl puts a K within 0.5 % of the 2 % tolerance (0.975-0.985 of the best):
# the hardest decisions, where a wrong one is most likely
BOUNDARY_BATCH_SIZES = (24, 48, 100, 156, 200, 208)
KS = (0, 1, 2, 3, 4, 5)


def gpu_itl(b: int, k: int) -> float:
    """A step-time shape with K* falling from 5 to 1 over BS 1-256 (memory-bound to compute-bound),
    several batch sizes near a 2 % boundary."""
    return 0.010 + 0.0004 * k + 0.00002 * b * (k + 1) + 0.0000004 * (b * (k + 1)) ** 1.5


def truth_al(k: int, alpha: float) -> float:
    return 1.0 + sum(alpha ** j for j in range(1, k + 1))


def truth_goodput(sc: Scenario, batch_sizes=BATCH_SIZES, ks=KS,
                  itl: Callable[[int, int], float] = gpu_itl) -> dict[int, dict[int, float]]:
    return {b: {k: truth_al(k, sc.alpha) / itl(b, k) for k in ks} for b in batch_sizes}


def truth_k(goodput: dict[int, dict[int, float]], tolerance: float = 0.02) -> dict[int, int]:
    out = {}
    for b, g in goodput.items():
        best = max(g.values())
        out[b] = min(k for k, v in g.items() if v >= best * (1 - tolerance))
    return out


def _sequence(ks: tuple[int, ...], wave: int, hold: int, steps: int) -> np.ndarray:
    from dsdprof.measure.vllm.worker import k_sequence

    seq = k_sequence(ks, wave, hold)
    return np.array([seq[j % len(seq)] for j in range(steps + 1)])


def _step_noise(rng: np.random.Generator, sc: Scenario, n: int) -> np.ndarray:
    e = rng.normal(0.0, sc.step_sd, n)
    u = np.empty(n)
    u[0] = e[0]
    c = math.sqrt(1.0 - sc.rho ** 2)
    for j in range(1, n):
        u[j] = sc.rho * u[j - 1] + c * e[j]
    return u


def group_rows(sc: Scenario, b: int, ks: tuple[int, ...], rng: np.random.Generator,
               itl: Callable[[int, int], float] = gpu_itl) -> list[dict]:
    """One batch size's paired rows (one per K and repeat)."""
    kmax = max(ks)
    rows = []
    for r in range(sc.repeats):
        s_itl = {k: [] for k in ks}
        dur = {k: [] for k in ks}
        own = {k: [0.0, 0] for k in ks}  # the K's own steps: accepted drafts, request-steps
        acc = np.zeros((sc.waves, kmax + 1))
        dr = np.zeros((sc.waves, kmax + 1))
        for w in range(sc.waves):
            seq = _sequence(ks, r * sc.waves + w, sc.hold, sc.steps)
            verified, proposed = seq[:-1], seq[1:]
            noise = rng.normal(0.0, sc.drift) + _step_noise(rng, sc, sc.steps)
            t = np.array([itl(b, int(k)) for k in verified]) * np.exp(noise)
            if sc.outliers:
                t = t * np.where(rng.random(sc.steps) < sc.outliers, sc.outlier_factor, 1.0)
            pure = verified == proposed
            for k in ks:
                sel = pure & (verified == k)
                dur[k].extend(t[sel].tolist())
                s_itl[k].append(float(t[sel].mean()))
                n = int((verified == k).sum()) * b  # request-steps that verified K drafts
                alive = n
                for j in range(1, k + 1):
                    dr[w, j] += n
                    alive = rng.binomial(alive, sc.alpha)
                    acc[w, j] += alive
                    own[k][0] += alive
                own[k][1] += n
        p_tot = np.divide(acc.sum(0), dr.sum(0), out=np.zeros(kmax + 1), where=dr.sum(0) > 0)
        p_wave = np.divide(acc, dr, out=np.zeros_like(acc), where=dr > 0)
        for k in ks:
            rows.append({
                "mode": "dsd", "design": "paired", "method": "eagle3", "batch_size": b, "num_spec_tokens": k,
                "repeat": r, "status": "ok", "acceptance_length": float(1.0 + p_tot[1:k + 1].sum()),
                "acceptance_length_own": 1.0 + own[k][0] / max(1, own[k][1]),
                "itl_s": float(np.mean(dur[k])),
                "sample_acceptance_length": (1.0 + p_wave[:, 1:k + 1].sum(1)).tolist(),
                "sample_itl_s": s_itl[k], "sample_block": list(range(sc.waves)),
                "acceptance_per_pos": p_tot[1:].tolist(),
            })
    return rows


def dataset(sc: Scenario, seed: int, batch_sizes=BATCH_SIZES, ks=KS,
            itl: Callable[[int, int], float] = gpu_itl) -> pd.DataFrame:
    rng = np.random.default_rng((seed, 4242))
    return pd.DataFrame([row for b in batch_sizes for row in group_rows(sc, b, ks, rng, itl)])


def score(result, goodput: dict[int, dict[int, float]], tolerance: float = 0.02) -> dict[str, float]:
    """Coverage of the ratio-to-best and margin intervals, and the decisions, against the truth."""
    want = truth_k(goodput, tolerance)
    cov = tot = mcov = mtot = 0
    for c in result.cells.itertuples():
        g = goodput[int(c.batch_size)]
        true = g[int(c.num_spec_tokens)] / max(g.values())
        if not math.isnan(c.ratio_low):
            tot += 1
            cov += c.ratio_low - 1e-9 <= true <= c.ratio_high + 1e-9
    wrong = decided = 0
    wrong_bs = []
    for o in result.optimal.itertuples():
        g = goodput[int(o.batch_size)]
        if o.runner_up is not None and str(o.runner_up) != "<NA>" and not math.isnan(o.ci_low):
            mtot += 1
            true = g[int(o.k)] / g[int(o.runner_up)]
            mcov += o.ci_low - 1e-9 <= true <= o.ci_high + 1e-9
        if o.decided:
            decided += 1
            if int(o.k) != want[int(o.batch_size)]:
                wrong += 1
                wrong_bs.append(int(o.batch_size))
    return {"covered": cov, "intervals": tot, "margin_covered": mcov, "margins": mtot,
            "decided": decided, "wrong": wrong, "wrong_bs": wrong_bs, "batch_sizes": len(result.optimal)}
