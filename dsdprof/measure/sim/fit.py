"""Bounded least-squares fit of the step model's efficiencies and overheads, with an
identifiability check.

Parameters θ = (e_bw, e_c, step_overhead_s, draft_step_overhead_s, dsd_overhead_s) in

    T_i = Σ_terms max(m_it / e_bw, f_it / e_c) + comm_i + o + d_k · K_i + d_0 · [speculative]_i

are fitted with :func:`scipy.optimize.least_squares` (trust-region reflective, bounds) on relative
residuals T_i / y_i − 1, efficiencies in log space within :data:`EFFICIENCY_BOUNDS` (inside what the
profile loader accepts), overheads ≥ 0. A weak pull towards the prior (the base hardware's
values; weight :data:`PRIOR_WEIGHT`, far below any measured signal) keeps parameters the data do
not determine at the prior instead of wandering to a bound: a sweep whose batch sizes never reach
compute-bound says nothing about e_c, and gets the prior back, flagged.

Identifiability: at the fit, J = ∂r/∂θ (efficiencies per unit log, overheads per median ITL).
With ε = max(RMS relative residual, :data:`NOISE_FLOOR`), the marginal uncertainty of θ_j is
ε · sqrt([(JᵀJ + δI)⁻¹]_jj); a parameter with uncertainty above :data:`MAX_STD` (±20 % of an
efficiency; ±0.2 median ITL of an overhead) is reported as not identifiable from the batch sizes
given, with the reason when it is a simple one (no compute-bound cell, no K > 0 cell, no vanilla
cell). Starting points: the prior, and the best of a scan over r = e_bw / e_c with a bounded
linear solve for the rest (T is linear in 1/e_bw and the overheads for fixed r).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dsdprof.errors import InputError
from dsdprof.measure.sim.hardware import Efficiency

_DEFAULT_EFFICIENCY = Efficiency()  # the fitted priors (frozen)

PARAMS = ("bandwidth", "compute", "step_overhead_s", "draft_step_overhead_s", "dsd_overhead_s")
LABELS = {"bandwidth": "bandwidth efficiency", "compute": "compute efficiency",
          "step_overhead_s": "step overhead", "draft_step_overhead_s": "per-draft-step overhead",
          "dsd_overhead_s": "DSD overhead"}
EFFICIENCY_BOUNDS = (1e-3, 100.0)  # the profile loader accepts (0, 100]
PRIOR_WEIGHT = 1e-3
NOISE_FLOOR = 0.01
MAX_STD = 0.2
_RATIOS = np.logspace(-3, 3, 121)


@dataclass(frozen=True)
class FitResult:
    """Fitted efficiency, and which parameters the measurements leave undetermined (name -> reason)."""

    efficiency: Efficiency
    not_identifiable: dict[str, str]
    std: dict[str, float]  # marginal uncertainty: log units for efficiencies, seconds for overheads
    rms_relative_error: float


class _Problem:
    """Residuals and Jacobian in x = (log e_bw, log e_c, o/ȳ, d_k/ȳ, d_0/ȳ) over the free parameters."""

    def __init__(self, d: Any, y: np.ndarray, prior: Efficiency, free: list[int]) -> None:
        self.prior = prior  # fields outside the five fitted ones are kept from it
        self.m, self.f = np.asarray(d.mem_s, float), np.asarray(d.flop_s, float)
        self.y, self.scale = y, float(np.median(y))
        self.extra = np.asarray(d.comm_s, float)
        ones, k, spec = np.ones_like(y), np.asarray(d.k, float), np.asarray(d.speculative, float)
        self.cols = np.stack([ones, k, spec], axis=1)
        self.prior_x = self.to_x(prior)
        self.free = free

    def to_x(self, e: Efficiency) -> np.ndarray:
        return np.array([np.log(e.bandwidth), np.log(e.compute), e.step_overhead_s / self.scale,
                         e.draft_step_overhead_s / self.scale, e.dsd_overhead_s / self.scale])

    def to_eff(self, x: np.ndarray) -> Efficiency:
        o, dk, d0 = (float(v * self.scale) for v in x[2:])
        return replace(self.prior, bandwidth=float(np.exp(x[0])), compute=float(np.exp(x[1])),
                       step_overhead_s=o, draft_step_overhead_s=dk, dsd_overhead_s=d0)

    def full(self, xf: np.ndarray) -> np.ndarray:
        x = self.prior_x.copy()
        x[self.free] = xf
        return x

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(T, memory-bound mask per term)."""
        mem, flop = self.m / np.exp(x[0]), self.f / np.exp(x[1])
        mem_bound = mem >= flop
        t = np.where(mem_bound, mem, flop).sum(axis=1) + self.extra + self.cols @ (x[2:] * self.scale)
        return t, mem_bound

    def data_jac(self, x: np.ndarray) -> np.ndarray:
        """∂(T_i / y_i) / ∂x_j for all five parameters."""
        mem, flop = self.m / np.exp(x[0]), self.f / np.exp(x[1])
        mem_bound = mem >= flop
        j = np.empty((len(self.y), 5))
        j[:, 0] = -np.where(mem_bound, mem, 0.0).sum(axis=1)
        j[:, 1] = -np.where(mem_bound, 0.0, flop).sum(axis=1)
        j[:, 2:] = self.cols * self.scale
        return j / self.y[:, None]

    def residuals(self, xf: np.ndarray) -> np.ndarray:
        x = self.full(xf)
        t, _ = self.predict(x)
        return np.concatenate([t / self.y - 1.0, PRIOR_WEIGHT * (xf - self.prior_x[self.free])])

    def jacobian(self, xf: np.ndarray) -> np.ndarray:
        j = self.data_jac(self.full(xf))[:, self.free]
        return np.vstack([j, PRIOR_WEIGHT * np.eye(len(self.free))])


def _bounds(free: list[int]) -> tuple[np.ndarray, np.ndarray]:
    lo = np.array([np.log(EFFICIENCY_BOUNDS[0])] * 2 + [0.0] * 3)
    hi = np.array([np.log(EFFICIENCY_BOUNDS[1])] * 2 + [np.inf] * 3)
    return lo[free], hi[free]


def _scan_start(p: _Problem) -> np.ndarray:
    """Best bounded linear fit of (1/e_bw, overheads) over a grid of r = e_bw / e_c."""
    from scipy.optimize import lsq_linear

    w = 1.0 / p.y
    lo_a, hi_a = 1.0 / EFFICIENCY_BOUNDS[1], 1.0 / EFFICIENCY_BOUNDS[0]
    best: tuple[float, np.ndarray] | None = None
    for r in _RATIOS:
        x_r = np.maximum(p.m, r * p.f).sum(axis=1)
        a_mat = np.column_stack([x_r, p.cols]) * w[:, None]
        sol = lsq_linear(a_mat, (p.y - p.extra) * w, bounds=([lo_a, 0, 0, 0], [hi_a, np.inf, np.inf, np.inf]))
        if best is None or sol.cost < best[0]:
            e_bw = 1.0 / sol.x[0]
            best = (sol.cost, np.array([np.log(e_bw), np.log(e_bw / r), *(sol.x[1:] / p.scale)]))
    lo, hi = _bounds(list(range(5)))
    assert best is not None  # the loop over r runs at least once
    return np.clip(best[1], lo, np.where(np.isfinite(hi), hi, 1e9))


def _reasons(p: _Problem, x: np.ndarray, d: Any) -> dict[str, str]:
    """Simple explanations for parameters without signal."""
    _, mem_bound = p.predict(x)
    active = (p.m > 0) | (p.f > 0)
    k, spec = np.asarray(d.k, float), np.asarray(d.speculative, float)
    out = {}
    if not np.any(~mem_bound & active):
        out["compute"] = "no measured cell is compute-bound at the fitted efficiencies"
    if not np.any(mem_bound & active):
        out["bandwidth"] = "no measured cell is bandwidth-bound at the fitted efficiencies"
    if not np.any(k > 0):
        out["draft_step_overhead_s"] = "no cell with K > 0"
    if not np.any(spec > 0):
        out["dsd_overhead_s"] = "no speculative (DSD-mode) cell"
    elif np.all(spec > 0):
        out["dsd_overhead_s"] = out["step_overhead_s"] = "no vanilla cell: only their sum is determined"
    return out


def fit(d: Any, itl_s: Any, prior: Efficiency = _DEFAULT_EFFICIENCY, fit_overheads: bool = True) -> FitResult:
    """Fit ``d`` (a :class:`~dsdprof.measure.sim.calibrate.Design`) to measured ITL; see the module doc.

    InputError when fewer than 2 cells, or non-positive / non-finite ITL, are given.
    """
    from scipy.optimize import least_squares

    y = np.asarray(itl_s, dtype=float)
    if len(y) < 2:
        raise InputError("measurements", len(y), "need at least 2 cells to calibrate")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise InputError("itl_s", float(y[~(np.isfinite(y) & (y > 0))][0]), "ITL must be positive and finite")
    clip = lambda v: min(max(v, EFFICIENCY_BOUNDS[0]), EFFICIENCY_BOUNDS[1])  # noqa: E731
    prior = replace(prior, bandwidth=clip(prior.bandwidth), compute=clip(prior.compute))
    free = list(range(5 if fit_overheads else 2))
    p = _Problem(d, y, prior, free)
    lo, hi = _bounds(free)
    best = None
    for start in (p.prior_x[free], _scan_start(p)[free]):
        sol = least_squares(p.residuals, np.clip(start, lo, hi), jac=p.jacobian, bounds=(lo, hi),
                            method="trf", x_scale=1.0, ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=500)
        if best is None or sol.cost < best.cost:
            best = sol
    assert best is not None  # two starts
    x = p.full(best.x)
    eff = p.to_eff(x)
    rel = p.predict(x)[0] / y - 1.0
    rms = float(np.sqrt(np.mean(rel**2)))
    j = p.data_jac(x)
    cov = max(rms, NOISE_FLOOR) ** 2 * np.linalg.inv(j.T @ j + 1e-6 * np.eye(5))
    std_x = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    std = {n: float(s if i < 2 else s * p.scale) for i, (n, s) in enumerate(zip(PARAMS, std_x))}
    reasons = _reasons(p, x, d)
    not_id = {}
    for i, name in enumerate(PARAMS):
        if i not in free:
            not_id[name] = "not fitted (fixed at the prior)"
        elif std_x[i] > MAX_STD:
            not_id[name] = reasons.get(name, f"the batch sizes given do not separate it from the other "
                                              f"parameters (uncertainty ±{std_x[i]:.2g}"
                                              f"{' in log' if i < 2 else ' median ITL'})")
    return FitResult(eff, not_id, std, rms)
