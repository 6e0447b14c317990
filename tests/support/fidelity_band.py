"""The band of the analytic engine against published step times (:mod:`dsdprof.measure.sim.band`).

Every point is predicted the way a user would: its catalog model and GPU, TP, batch, K, context
and dtype, plus either **the inputs its publication states** (engine and version, KV-cache dtype)
or **defaults only** (nothing stated: vLLM, current kernels, ``auto`` KV; the band widens to the
plausible values of each). Each source is predicted by priors fitted with that whole source held
out, and its band's spreads come from the other sources only: with ``nested`` (the reported
figure) from a leave-one-source-out over those other sources, so the held-out source's published
figures enter neither the fit nor the band.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.formats.ktable import choose_k
from dsdprof.measure.sim import band as sb
from dsdprof.measure.sim.catalog import resolve_model
from dsdprof.measure.sim.dtypes import resolve_dtype
from dsdprof.measure.sim.hardware import resolve_hardware
from dsdprof.measure.sim.inputs import Stated, StatedInputs, engine_family, overlaps_cpu, resolve_inputs
from tests.support import fidelity as fid


def stated_of(pt: fid.Point) -> Stated:
    """What the publication of ``pt`` states: its engine (and a version when it names one) and
    KV-cache dtype. Engines other than SGLang / TensorRT-LLM (NIM) are fitted with vLLM's step
    overhead, so they count as the vLLM family."""
    e = pt.engine.lower()
    engine = ("sglang" if "sglang" in e else "tensorrt-llm") if overlaps_cpu(pt.engine) else "vllm"
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", e) if ("vllm" in e or "sglang" in e) else None
    return Stated(serving_engine=engine, engine_version=m.group(1) if m else None,
                  kv_cache_dtype=pt.kv_cache_dtype)


def user_inputs(pt: fid.Point, stated: bool) -> StatedInputs:
    """The inputs a user predicting ``pt`` would give (``stated``: what the publication states; else
    nothing), resolved as the engine resolves a spec's."""
    target = resolve_model(pt.model, pt.id)
    return resolve_inputs(stated_of(pt) if stated else Stated(), resolve_hardware(pt.hardware), target,
                          pt.dtype, resolve_dtype(target, pt.dtype).compute)


def categories(pt: fid.Point, families: tuple[str, ...]) -> tuple[str, ...]:
    target = resolve_model(pt.model, pt.id)
    fp8 = resolve_dtype(target, pt.dtype).compute == "fp8"
    return sb.categories_of(sb.arch_kind(target), fp8, pt.tp, families)


def table_of(points: list[fid.Point], predicted_s: np.ndarray) -> tuple[sb.CategoryError, ...]:
    """The category spreads of ``points`` whose whole-source predictions are ``predicted_s``."""
    cats = [categories(p, (engine_family(p.engine),)) for p in points]
    y = np.array([p.step_ms / 1e3 for p in points])
    return category_errors(cats, y / predicted_s, [p.source for p in points])


# Every category a point can fall in (:func:`dsdprof.measure.sim.band.categories_of`), and all points.
CATEGORY_NAMES = (*sb.ARCH_KINDS, "fp8", "tp>1", *sb.FAMILY_NAMES.values(), "all")


def category_errors(categories: list[tuple[str, ...]], ratios: np.ndarray,
                    sources: list[str]) -> tuple[sb.CategoryError, ...]:
    """Per category (and ``all``): published / predicted ratios of its points at
    :data:`dsdprof.measure.sim.band.QUANTILES` (the rows of ``CATEGORY_ERRORS``)."""
    r = np.asarray(ratios, dtype=float)
    out = []
    for name in CATEGORY_NAMES:
        sel = np.array([name == "all" or name in c for c in categories], dtype=bool)
        if not sel.any():
            continue
        lo, hi = np.quantile(r[sel], sb.QUANTILES)
        out.append(sb.CategoryError(name, int(sel.sum()), len({s for s, x in zip(sources, sel) if x}),
                                    round(float(np.mean(np.abs(1.0 / r[sel] - 1.0))) * 100, 1),
                                    round(float(lo), 3), round(float(hi), 3)))
    return tuple(out)


def shipped_table(points: list[fid.Point]) -> tuple[sb.CategoryError, ...]:
    """What :data:`dsdprof.measure.sim.band.CATEGORY_ERRORS` must hold: every source predicted by
    priors fitted on the others."""
    return table_of(points, fid.leave_one_source_out(points))


@dataclass(frozen=True)
class BandCheck(fid.PredictionErrors):
    """Every point predicted with its whole source held out: nominal, band, published (seconds)."""

    points: list[fid.Point]
    predicted_s: np.ndarray
    low_s: np.ndarray
    high_s: np.ndarray
    published_s: np.ndarray
    stated: bool

    @property
    def covered(self) -> np.ndarray:
        return (self.low_s <= self.published_s) & (self.published_s <= self.high_s)

    @property
    def coverage(self) -> float:
        return float(np.mean(self.covered))

    @property
    def width(self) -> np.ndarray:
        """The band's width relative to the nominal prediction."""
        return (self.high_s - self.low_s) / self.predicted_s


def _loso(t: fid.Terms, src: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Whole-source predictions of the points ``among`` (indices) from fits on the others of ``among``."""
    pred = np.full(len(src), np.nan)
    for s in np.unique(src[among]):
        held = among[src[among] == s]
        theta = fid.fit_params(t, among[src[among] != s])
        sub = fid.Terms(**{f: getattr(t, f)[held] for f in fid.Terms.__dataclass_fields__})
        pred[held] = fid.predict(sub, theta)
    return pred


def band_checks(points: list[fid.Point], nested: bool = True,
                flat: np.ndarray | None = None) -> tuple[BandCheck, BandCheck]:
    """(stated inputs, defaults only), each source held out whole (module doc). Without ``nested``
    the spreads come from the one-level leave-one-source-out of every other source, whose fits saw
    the held-out source (faster; ``flat``: those predictions when already computed)."""
    t = fid.terms(points)
    src = np.array([p.source for p in points])
    if not nested and flat is None:
        flat = _loso(t, src, np.arange(len(points)))
    out: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    order: list[int] = []
    for s in np.unique(src):
        held, train = np.flatnonzero(src == s), np.flatnonzero(src != s)
        theta = fid.fit_params(t, train)
        inner = _loso(t, src, train) if nested else flat
        assert inner is not None
        table = table_of([points[i] for i in train], inner[train])
        for i in held:
            order.append(i)
            for stated in (True, False):
                inputs = user_inputs(points[i], stated)
                scenarios = list(inputs.scenarios)
                pred = fid.predict(fid.terms([points[i]] * len(scenarios), scenarios), theta)
                band = sb.error_band(categories(points[i], inputs.families), table)
                out[stated].append((float(pred[0]), float(pred.min() * band.low),
                                    float(pred.max() * band.high)))
    idx = np.array(order)
    y = t.y_s[idx]
    pts = [points[i] for i in idx]

    def check(stated: bool) -> BandCheck:
        a = np.array(out[stated])
        return BandCheck(pts, a[:, 0], a[:, 1], a[:, 2], y, stated)

    return check(True), check(False)


@dataclass(frozen=True)
class KSpan:
    """A published BS-1 K sweep: the source's best K (lowest TPOT at its AL) and the K* the engine
    predicts for it with the source held out whole: nominal, lowest and highest within the band."""

    source: str
    best: int  # the published K* (dsdprof's rule on the published AL / step)
    k: int
    k_low: int
    k_high: int


def k_sweep_spans(points: list[fid.Point], stated: bool, flat: np.ndarray | None = None,
                  tolerance: float = DEFAULT_TOLERANCE) -> list[KSpan]:
    """Every source with a BS-1 K sweep (>= 2 speculative points at BS 1), predicted by priors
    fitted on the other sources, its band's spreads from theirs (one-level: ``flat``, the
    leave-one-source-out predictions of ``points``, computed when not given). K* on both sides by
    dsdprof's rule: the smallest K within ``tolerance`` of the best goodput (AL / step)."""
    t = fid.terms(points)
    src = np.array([p.source for p in points])
    if flat is None:
        flat = _loso(t, src, np.arange(len(points)))
    out = []
    for s in sorted(set(src)):
        sweep = sorted((p for p in points if p.source == s and p.method != "none" and p.batch == 1),
                       key=lambda p: p.k)
        if len(sweep) < 2:
            continue
        train = np.flatnonzero(src != s)
        theta = fid.fit_params(t, train)
        table = table_of([points[i] for i in train], flat[train])
        inputs = user_inputs(sweep[0], stated)
        steps, k0 = [], []
        for sc in inputs.scenarios:
            steps.append(fid.predict(fid.terms(sweep, [sc] * len(sweep)), theta))
            k0.append(float(fid.predict(fid.terms([replace(sweep[0], k=0)], [sc]), theta)[0]))
        band = sb.error_band(categories(sweep[0], inputs.families), table)
        al = np.array([p.al for p in sweep], dtype=float)
        y = np.array([p.step_ms for p in sweep])
        ks = [p.k for p in sweep]
        k, lo, hi = sb.k_star_span(ks, al, steps, k0, band, tolerance)
        out.append(KSpan(s, choose_k(dict(zip(ks, al / y)), tolerance), k, lo, hi))
    return out
