"""The fidelity suite: published GPU step times vs the step model, leave-one-out.

Points live in ``benchmarks/fidelity_points.toml`` (source, setup, conversion to seconds per
step). :func:`terms` evaluates every term of the step model for each point at unit efficiency
(the model is linear in the fixed costs and in 1 / e_bw for the memory side), so a prediction for
any parameter vector is a few numpy operations; :func:`fit_params` fits the shared priors to a set
of points (bounded least squares on log(pred / published), scipy), and :func:`leave_one_out`
refits without each point in turn and predicts it. Nothing here is fitted on a single point: with
one point held out the rest (>= 20) determine the parameters.

Fitted parameters (:data:`PARAMS`), shared by all GPUs: bandwidth efficiency, per-layer,
per-MoE-layer and per-expert latency, all-reduce latency, the engine-step overhead, and the
speculation overhead (fixed, per draft step). Compute efficiency stays at its prior
(:data:`COMPUTE_EFFICIENCY`): the published points are decode steps, almost all bandwidth- or
latency-bound, and do not determine it.

The engine that measured a point matters for one term. SGLang (>= 0.4) overlaps the CPU
scheduling of step i+1 with the GPU work of step i ("zero-overhead batch scheduler",
https://lmsys.org/blog/2024-12-04-sglang-v0-4/#zero-overhead-batch-scheduler), and so does
TensorRT-LLM ("overlap scheduler", on by default:
https://nvidia.github.io/TensorRT-LLM/latest/features/overlap-scheduler.html). Their points get
their own engine-step overhead (:data:`ENGINE_PARAMS`, fitted on the SGLang points: about 0; the
suite has no TensorRT-LLM point, so for those it is a documented prior, not a fit) and do not drag
vLLM's. The shipped priors are vLLM's.

The headline figure is :func:`leave_one_source_out`: every publication (source) is predicted by
a fit that never saw any of its points, the analogue of a new measurement from a new setup.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dsdprof.errors import InputError
from dsdprof.measure.sim.catalog import resolve_model
from dsdprof.measure.sim.dtypes import resolve_dtype
from dsdprof.measure.sim.hardware import HARDWARE, Hardware, resolve_hardware
from dsdprof.measure.sim.inputs import (  # noqa: F401 - the suite's names for them (tests use fid.*)
    LEGACY_MLA_GPUS,
    Scenario,
    Stated,
    kv_cache_dtype_of,
    legacy_mla,
    overlaps_cpu,
)
from dsdprof.measure.sim.model import (
    METHOD_OVERHEAD,
    NO_DRAFT,
    HwArrays,
    arch_features,
    distinct_experts,
    step_parts,
)

POINTS_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity_points.toml"
PARAMS = ("bandwidth", "layer_overhead_s", "moe_layer_overhead_s", "expert_overhead_s", "allreduce_latency_s",
          "step_overhead_s", "dsd_overhead_s", "draft_step_overhead_s", "mla_layer_overhead_s",
          "token_overhead_s")
ENGINE_PARAMS = ("overlap_step_overhead_s",)  # fitted, not a GPU prior: overlap-scheduler engines' step
FIT_PARAMS = PARAMS + ENGINE_PARAMS
COMPUTE_EFFICIENCY = 0.70
GPUS = tuple(HARDWARE)  # per-GPU bandwidth multipliers follow FIT_PARAMS, in this order
# pull of each per-GPU log multiplier towards 0 (one point's residual ~ 0.07 vs a prior sd ~ 0.15)
GPU_PRIOR_WEIGHT = 0.5
_SCALE = np.array([1.0, 1e-6, 1e-6, 1e-6, 1e-6, 1e-3, 1e-3, 1e-3, 1e-6, 1e-6, 1e-3])  # 1 µs*4 ms*3 µs*2 ms
_START = np.array([0.8, 20.0, 50.0, 5.0, 5.0, 0.5, 0.5, 0.5, 50.0, 0.3, 0.5])
_UPPER = np.array([1.0, 1000.0, 2000.0, 200.0, 200.0, 20.0, 20.0, 20.0, 2000.0, 50.0, 20.0])
_LOWER = np.where(np.arange(len(_START)) == 0, 0.2, 0.0)
_KEYS = ("id", "source", "engine", "setup", "model", "hardware", "tp", "dtype", "kv_cache_dtype", "method",
         "batch", "k", "context", "published", "step_ms", "conversion", "scored")


@dataclass(frozen=True)
class Point:
    """One published figure converted to seconds per engine step."""

    id: str
    source: str
    engine: str
    setup: str
    model: str
    hardware: str
    tp: int
    dtype: str
    kv_cache_dtype: str
    method: str  # "none" = vanilla
    batch: int
    k: int
    context: int
    published: str
    step_ms: float
    conversion: str
    scored: bool
    draft: str = ""
    al: float | None = None


def load_points(path: str | Path = POINTS_FILE, scored_only: bool = True) -> list[Point]:
    """Read the points file; InputError (one line) on a missing key or a bad value."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise InputError("fidelity points", str(p), f"not readable as TOML ({err})") from None
    out = []
    for i, raw in enumerate(data.get("point", [])):
        missing = [k for k in _KEYS if k not in raw]
        if missing:
            raise InputError(f"point[{i}]", raw.get("id"), f"missing {', '.join(missing)}")
        extra = set(raw) - set(_KEYS) - {"draft", "al"}
        if extra:
            raise InputError(f"point[{i}].{sorted(extra)[0]}", raw.get("id"), "unknown key")
        pt = Point(**raw)
        if not (pt.step_ms > 0 and math.isfinite(pt.step_ms)) or pt.batch < 1 or pt.k < 0 or pt.tp < 1:
            raise InputError(f"point[{i}]", pt.id, "step_ms > 0, batch >= 1, k >= 0 and tp >= 1 required")
        if pt.scored or not scored_only:
            out.append(pt)
    return out


@dataclass(frozen=True)
class Terms:
    """Per point (arrays of length n), the step model at unit efficiency."""

    mem_s: np.ndarray  # (n, P) roofline memory seconds at e_bw = 1
    flop_s: np.ndarray  # (n, P) roofline compute seconds at e_c = 1
    link_s: np.ndarray  # all-reduce payload / link bandwidth
    n_allreduce: np.ndarray
    n_layers: np.ndarray  # target layers + K draft layers
    n_moe_layers: np.ndarray
    n_experts: np.ndarray  # Σ over MoE layers of distinct experts loaded, verify + K draft passes
    n_mla_layers: np.ndarray  # MLA layers of points on pre-FlashMLA kernels (legacy_mla), else 0
    n_token_units: np.ndarray  # tokens x layers x hidden / 4096, verify + K draft passes
    spec_step: np.ndarray  # K · method per-step factor
    spec_fixed: np.ndarray  # [speculative] · method fixed factor
    y_s: np.ndarray  # published seconds per step
    gpu: np.ndarray  # index into GPUS (-1: a profile file, no multiplier)
    overlap: np.ndarray  # 1.0 where an overlap-scheduler engine measured the point, else 0.0


def _features(pt: Point, sc: Scenario | None = None) -> tuple[Hardware, Any, Any]:
    hw = resolve_hardware(pt.hardware, f"{pt.id}.hardware")
    target = resolve_model(pt.model, f"{pt.id}.model")
    spec = pt.method != "none"
    draft = resolve_model(pt.draft, f"{pt.id}.draft") if (spec and pt.draft) else None
    kv = sc.kv_cache_dtype if sc else kv_cache_dtype_of(pt.engine, pt.dtype, pt.kv_cache_dtype)
    tgt = arch_features(target, pt.dtype, pt.tp, kv)
    drf = arch_features(draft, pt.dtype, pt.tp, kv) if draft else NO_DRAFT
    return hw, (target, tgt), drf


_KEEP_FITTED = Stated(step_overhead_given=True, mla_given=True)  # the fit's parameters carry those


def terms(points: list[Point], scenarios: list[Scenario] | None = None) -> Terms:
    """Evaluate the unit-efficiency terms of every point (see :class:`Terms`); with ``scenarios``
    (one per point), each point as if measured under its scenario (engine family, MLA kernel era,
    KV-cache dtype, FP8 GEMM path, attention tile: :mod:`dsdprof.measure.sim.inputs`) instead of
    what its publication states."""
    rows: dict[str, list[Any]] = {f: [] for f in Terms.__dataclass_fields__}
    for i, pt in enumerate(points):
        sc = scenarios[i] if scenarios is not None else None
        hw, (target, tgt), drf = _features(pt, sc)
        spec = pt.method != "none"
        compute = resolve_dtype(target, pt.dtype).compute
        hwa = sc.arrays(hw, _KEEP_FITTED, compute) if sc else HwArrays.of(hw, compute)
        b, k = float(pt.batch), float(pt.k)
        parts = step_parts(hwa, tgt, drf, b, k, float(pt.context), 0.0, 1.0 if spec else 0.0)
        link = float(parts.comm_s) - (tgt.comm_count + k * drf.comm_count) * hw.allreduce_latency_s
        d_t = float(distinct_experts(tgt.num_experts, tgt.top_k, b * (k + 1.0)))
        d_d = float(distinct_experts(drf.num_experts, drf.top_k, b))
        m_fixed, m_step = METHOD_OVERHEAD.get(pt.method, (1.0, 1.0)) if spec else (0.0, 0.0)
        rows["mem_s"].append(np.asarray(parts.mem_s, float))
        rows["flop_s"].append(np.asarray(parts.flop_s, float))
        rows["link_s"].append(link)
        rows["n_allreduce"].append(float(tgt.comm_count + k * drf.comm_count))
        rows["n_layers"].append(float(tgt.layers + k * drf.layers))
        rows["n_moe_layers"].append(float(tgt.moe_layers + k * drf.moe_layers))
        rows["n_experts"].append(float(tgt.moe_layers * d_t + k * drf.moe_layers * d_d))
        legacy = sc.legacy_mla if sc else legacy_mla(pt.engine, hw.name)
        rows["n_mla_layers"].append(float(tgt.mla_layers + k * drf.mla_layers) if legacy else 0.0)
        rows["n_token_units"].append(float(b * (k + 1.0) * tgt.token_units + k * b * drf.token_units))
        rows["spec_step"].append(k * m_step)
        rows["spec_fixed"].append(m_fixed)
        rows["y_s"].append(pt.step_ms / 1e3)
        rows["gpu"].append(GPUS.index(hw.name) if hw.name in GPUS else -1)
        rows["overlap"].append(1.0 if (sc.family == "overlap" if sc else overlaps_cpu(pt.engine)) else 0.0)
    return Terms(**{f: np.array(v, dtype=int if f == "gpu" else float) for f, v in rows.items()})


def predict(t: Terms, theta: np.ndarray) -> np.ndarray:
    """Seconds per step for parameters ``theta``: :data:`FIT_PARAMS` (natural units), then one log
    bandwidth multiplier and one log compute-efficiency multiplier per entry of :data:`GPUS`
    (optional: missing = 0)."""
    e_bw, lay, moe, exp, ar, step, d0, dk, mla, tok, ov_step = theta[:len(FIT_PARAMS)]
    e_c: float | np.ndarray = COMPUTE_EFFICIENCY  # an array once per-GPU multipliers apply
    mult = np.asarray(theta[len(FIT_PARAMS):], dtype=float)
    g = len(GPUS)
    if len(mult):
        pick = lambda m: np.exp(np.where(t.gpu >= 0, m[np.maximum(t.gpu, 0)], 0.0))[:, None]  # noqa: E731
        e_bw = e_bw * pick(mult[:g])
        e_c = e_c * pick(mult[g:2 * g]) if len(mult) >= 2 * g else e_c
    kernel = np.maximum(t.mem_s / e_bw, t.flop_s / e_c).sum(axis=1)
    return (kernel + t.link_s + t.n_allreduce * ar + t.n_layers * lay + t.n_moe_layers * moe
            + t.n_experts * exp + t.n_mla_layers * mla + t.n_token_units * tok
            + step * (1.0 - t.overlap) + ov_step * t.overlap + t.spec_fixed * d0 + t.spec_step * dk)


def fit_params(t: Terms, idx: np.ndarray | None = None) -> np.ndarray:
    """Bounded least squares of log(pred / published) over the points ``idx`` (all by default)."""
    from scipy.optimize import least_squares

    sel = np.arange(len(t.y_s)) if idx is None else np.asarray(idx)
    if len(sel) < len(FIT_PARAMS):
        raise InputError("fidelity points", len(sel),
                         f"need at least {len(FIT_PARAMS)} points to fit {len(FIT_PARAMS)} priors")
    sub = Terms(**{f: getattr(t, f)[sel] for f in Terms.__dataclass_fields__})

    g = 2 * len(GPUS)  # log multipliers: bandwidth, then compute efficiency, per GPU
    scale = np.concatenate([_SCALE, np.ones(g)])

    def resid(x: np.ndarray) -> np.ndarray:
        prior = GPU_PRIOR_WEIGHT * x[len(FIT_PARAMS):]
        return np.concatenate([np.log(predict(sub, x * scale) / sub.y_s), prior])

    start = np.concatenate([_START, np.zeros(g // 2), np.full(g // 2, -1.0)])  # compute: below the ridge
    lo, hi = np.concatenate([_LOWER, np.full(g, -3.0)]), np.concatenate([_UPPER, np.full(g, 1.0)])
    sol = least_squares(resid, start, bounds=(lo, hi), method="trf",
                        x_scale=np.concatenate([_START + 1.0, np.ones(g)]),
                        ftol=1e-10, xtol=1e-10, gtol=1e-10, max_nfev=4000)
    return sol.x * scale


class PredictionErrors:
    """``errors`` and ``mape`` of a result holding ``predicted_s`` and ``published_s`` (one home for
    both: :class:`LooResult` here, ``BandCheck`` in tests/support/fidelity_band.py)."""

    predicted_s: np.ndarray
    published_s: np.ndarray

    @property
    def errors(self) -> np.ndarray:
        return self.predicted_s / self.published_s - 1.0

    @property
    def mape(self) -> float:
        return float(np.mean(np.abs(self.errors)) * 100.0)


@dataclass(frozen=True)
class LooResult(PredictionErrors):
    """Leave-one-out: each point predicted by priors fitted on all the others."""

    points: list[Point]
    predicted_s: np.ndarray
    published_s: np.ndarray
    theta_all: np.ndarray  # fitted on every point: the shipped priors

    @property
    def low_share(self) -> float:
        """Share of points predicted below the published figure."""
        return float(np.mean(self.errors < 0))


def leave_one_out(points: list[Point]) -> LooResult:
    """Refit without each point, predict it; also the fit on all points."""
    t = terms(points)
    n = len(points)
    pred = np.empty(n)
    for i in range(n):
        theta = fit_params(t, np.delete(np.arange(n), i))
        pred[i] = predict(Terms(**{f: getattr(t, f)[i:i + 1] for f in Terms.__dataclass_fields__}), theta)[0]
    return LooResult(points, pred, t.y_s, fit_params(t))


def leave_one_source_out(points: list[Point]) -> np.ndarray:
    """Predicted seconds per point from priors fitted on the points of every *other* source
    (stricter than :func:`leave_one_out`: a source's own setup and conventions cannot help it)."""
    t = terms(points)
    src = np.array([p.source for p in points])
    pred = np.empty(len(points))
    for s in np.unique(src):
        held = np.flatnonzero(src == s)
        theta = fit_params(t, np.flatnonzero(src != s))
        pred[held] = predict(Terms(**{f: getattr(t, f)[held] for f in Terms.__dataclass_fields__}), theta)
    return pred


def predict_separate(train: list[Point], test: list[Point]) -> np.ndarray:
    """Seconds per step for ``test`` (e.g. a separate published set) from priors fitted on
    ``train`` only: nothing of ``test`` enters the fit."""
    return predict(terms(test), fit_params(terms(train)))


def gpu_theta(theta: np.ndarray, name: str) -> np.ndarray:
    """What one GPU gets: :data:`PARAMS` (shared values, bandwidth times its multiplier; not the
    engine parameters), then its compute efficiency (:data:`COMPUTE_EFFICIENCY` times its multiplier)."""
    out = np.append(np.array(theta[:len(PARAMS)], dtype=float), COMPUTE_EFFICIENCY)
    if name not in LEGACY_MLA_GPUS:  # current MLA kernels: no MLA term (see legacy_mla)
        out[PARAMS.index("mla_layer_overhead_s")] = 0.0
    n = len(FIT_PARAMS)
    if name in GPUS and len(theta) > n:
        i, g = GPUS.index(name), len(GPUS)
        out[0] *= float(np.exp(theta[n + i]))
        if len(theta) >= n + 2 * g:
            out[-1] *= float(np.exp(theta[n + g + i]))
    return out


def theta_of(hw: Hardware) -> np.ndarray:
    """The vector a hardware profile carries (as :func:`gpu_theta`: :data:`PARAMS`, then compute)."""
    e = hw.efficiency
    return np.array([e.bandwidth, e.layer_overhead_s, e.moe_layer_overhead_s, e.expert_overhead_s,
                     hw.allreduce_latency_s, e.step_overhead_s, e.dsd_overhead_s, e.draft_step_overhead_s,
                     e.mla_layer_overhead_s, e.token_overhead_s, e.compute])
