"""The band around every prediction of the analytic engine, and where K* could change within it.

A cell's band is the prediction times the widest spread of its categories' whole-source error
(:data:`CATEGORY_ERRORS`, written by ``python benchmarks/sim_fidelity.py --band``;
``tests/measure/sim/test_sim_fidelity.py`` fails when it drifts), widened over the plausible
values of the inputs the spec does not state (:mod:`dsdprof.measure.sim.inputs`). K* is
recomputed under each of those values with the band's error placed wholly in the per-step cost
or wholly in the cost K adds (:func:`k_star_span`); the range is the lowest and highest K* found.
The method and what it measured: docs/sim.md ("The band").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from dsdprof.errors import InputError
from dsdprof.formats.ktable import choose_k
from dsdprof.measure.sim.acceptance import acceptance_length
from dsdprof.measure.sim.arch import ModelArch
from dsdprof.measure.sim.inputs import Assumption, Scenario
from dsdprof.measure.sim.model import (
    MEMORY_UTILIZATION,
    NO_DRAFT,
    ArchFeatures,
    arch_features,
    memory_bytes,
    step_time,
)

if TYPE_CHECKING:
    from dsdprof.config.run import Run
    from dsdprof.measure.sim.config import SimSetup

QUANTILES = (0.10, 0.90)  # the band: this central share of the whole-source published / predicted ratios
MIN_POINTS = 5  # a category with fewer scored points takes the spread of all points
ARCH_KINDS = ("dense", "moe", "mla")
FAMILY_NAMES = {"vllm": "vLLM", "overlap": "SGLang/TRT-LLM"}


@dataclass(frozen=True)
class CategoryError:
    """The whole-source error of one category: points, sources, MAPE (%) and the band's ends
    (published / predicted at :data:`QUANTILES`)."""

    name: str
    points: int
    sources: int
    mape_pct: float
    low: float
    high: float


# python benchmarks/sim_fidelity.py --band (53 scored points, 17 sources, sim-step-model/5, 2026-12-06)
CATEGORY_ERRORS: tuple[CategoryError, ...] = (
    CategoryError('dense', 40, 12, 8.9, 0.942, 1.214),
    CategoryError('moe', 5, 5, 13.5, 0.82, 1.164),
    CategoryError('mla', 8, 3, 9.5, 0.935, 1.255),
    CategoryError('fp8', 27, 5, 10.7, 0.952, 1.293),
    CategoryError('tp>1', 34, 9, 10.4, 0.951, 1.274),
    CategoryError('vLLM', 44, 13, 8.5, 0.947, 1.222),
    CategoryError('SGLang/TRT-LLM', 9, 4, 13.7, 0.861, 1.249),
    CategoryError('all', 53, 17, 9.4, 0.923, 1.235),
)


def arch_kind(target: ModelArch) -> str:
    return "mla" if target.mla is not None else ("moe" if target.num_experts else "dense")


def categories_of(kind: str, fp8: bool, tp: int, families: tuple[str, ...]) -> tuple[str, ...]:
    """The categories a prediction belongs to (engine families: ``vllm`` / ``overlap``)."""
    return (kind, *(["fp8"] if fp8 else []), *(["tp>1"] if tp > 1 else []),
            *(FAMILY_NAMES[f] for f in families))


@dataclass(frozen=True)
class ErrorBand:
    """Multipliers on a prediction: the widest spread of its categories."""

    categories: tuple[str, ...]
    low: float
    high: float

    def text(self) -> str:
        return f"{(self.low - 1) * 100:+.0f} % to {(self.high - 1) * 100:+.0f} %"


def error_band(categories: tuple[str, ...],
               table: tuple[CategoryError, ...] = CATEGORY_ERRORS) -> ErrorBand:
    by = {c.name: c for c in table}
    if "all" not in by:
        raise InputError("sim band", None, "no whole-source error table (CATEGORY_ERRORS is empty)")
    used = [by[c] if c in by and by[c].points >= MIN_POINTS else by["all"] for c in categories] or [by["all"]]
    return ErrorBand(categories, min(c.low for c in used), max(c.high for c in used))


@dataclass(frozen=True)
class CellBand:
    """One predicted cell: its step time and the band around it (seconds)."""

    batch_size: int
    k: int
    speculative: bool
    itl_s: float
    low_s: float
    high_s: float


@dataclass(frozen=True)
class KStarRange:
    """K* at one batch size and the lowest / highest K* within the band."""

    batch_size: int
    k: int
    k_low: int
    k_high: int

    def text(self) -> str:
        return f"{self.k}" if self.k_low == self.k_high else f"{self.k} ({self.k_low}-{self.k_high})"


@dataclass(frozen=True)
class SimBand:
    """A sim run's band: the error band, what was assumed, every cell's band and K* ranges."""

    error: ErrorBand
    assumptions: tuple[Assumption, ...]
    cells: tuple[CellBand, ...]
    k_star: tuple[KStarRange, ...]
    tolerance: float
    scenarios: int

    def cell(self, batch_size: int, k: int, speculative: bool = True) -> CellBand:
        return next(c for c in self.cells
                    if (c.batch_size, c.k, c.speculative) == (batch_size, k, speculative))

    def lines(self) -> list[str]:
        """What ``analyze`` prints under a sim run's table (80 columns)."""
        out = [f"within the model's error (ITL {self.error.text()}, {self.scenarios} input scenarios;",
               f"  whole-source error of {', '.join(self.error.categories)}):"]
        for r in self.k_star:
            c = self.cell(r.batch_size, r.k)
            out.append(f"  BS {r.batch_size}: K* {r.text()}, ITL {c.itl_s * 1e3:.2f} ms "
                       f"[{c.low_s * 1e3:.2f}, {c.high_s * 1e3:.2f}]")
        out += [f"  assumed: {a.text()}" for a in self.assumptions if not a.stated]
        out += [f"  stated: {a.key} {a.value}" for a in self.assumptions if a.stated]
        return out

    def record(self) -> dict[str, object]:
        """Plain JSON data (``analyze --json``'s ``prediction_band``)."""
        return asdict(self)

    def provenance(self) -> dict[str, str]:
        """String fields a sim run's provenance records (``extra_prediction_*`` in the run, then in
        its exported table)."""
        return {"prediction_band": f"{self.error.text()} ({', '.join(self.error.categories)}; "
                                   "whole-source error of the fidelity suite)",
                "prediction_k_star": f"tolerance {self.tolerance:.0%}: " + "; ".join(
                    f"BS {bs}: {text}" for bs, text in _groups(self.k_star)),
                "prediction_assumed": "; ".join(a.text() for a in self.assumptions) or "nothing",
                "prediction_note": self.note()}

    def note(self) -> str:
        """One line for ``export``: where K* could change within the band, and what was assumed."""
        moved = [r for r in self.k_star if r.k_low != r.k_high]
        where = ("at " + "; ".join(f"BS {bs}: K* {text}" for bs, text in _groups(moved)) if moved
                 else "nowhere on this grid")
        assumed = [a.key for a in self.assumptions if not a.stated]
        return (f"sim prediction: within the model's error ({self.error.text()}) K* could change {where} "
                f"at tolerance {self.tolerance:.0%}"
                + (f"; assumed, not stated: {', '.join(assumed)}" if assumed else ""))


def _groups(ranges: list[KStarRange] | tuple[KStarRange, ...]) -> list[tuple[str, str]]:
    """Consecutive batch sizes with the same K* range: ``[("1-8", "3 (3-4)"), ("16", "3")]``."""
    out: list[tuple[list[int], str]] = []
    for r in ranges:
        if out and out[-1][1] == r.text():
            out[-1][0].append(r.batch_size)
        else:
            out.append(([r.batch_size], r.text()))
    return [(f"{b[0]}" if len(b) == 1 else f"{b[0]}-{b[-1]}", t) for b, t in out]


def _features(setup: SimSetup, sc: Scenario) -> tuple[ArchFeatures, ArchFeatures]:
    tp = setup.tensor_parallel_size
    tgt = arch_features(setup.target, setup.dtype, tp, sc.kv_cache_dtype)
    drf = arch_features(setup.draft, setup.dtype, tp, sc.kv_cache_dtype) if setup.draft else NO_DRAFT
    return tgt, drf


def _grids(setup: SimSetup, sc: Scenario, bs: np.ndarray, ks: np.ndarray,
           context: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(DSD steps (BS x K), DSD steps at K 0 (BS), vanilla steps (BS)) under scenario ``sc``."""
    hw = setup.arrays(sc)
    tgt, drf = _features(setup, sc)
    rho, m = setup.routing_correlation, setup.method
    b = bs[:, None]
    dsd = step_time(hw, tgt, drf, b, ks[None, :], context, rho, 1.0, m).total_s
    k0 = step_time(hw, tgt, drf, bs, 0.0, context, rho, 1.0, m).total_s
    van = step_time(hw, tgt, NO_DRAFT, bs, 0.0, context, rho, 0.0, m).total_s
    return np.asarray(dsd, float), np.asarray(k0, float), np.asarray(van, float)


def sim_band(setup: SimSetup, batch_sizes: list[int], ks: list[int], tolerance: float,
             table: tuple[CategoryError, ...] = CATEGORY_ERRORS) -> SimBand:
    """The band of every cell of a ``batch_sizes`` x ``ks`` grid and K* ranges (module doc)."""
    assert setup.inputs is not None
    inputs = setup.inputs
    fp8 = resolve_fp8(setup)
    band = error_band(categories_of(arch_kind(setup.target), fp8, setup.tensor_parallel_size,
                                    inputs.families), table)
    bs, kk = np.asarray(batch_sizes, dtype=float), np.asarray(ks, dtype=float)
    grids = [_grids(setup, sc, bs, kk, setup.context_len) for sc in inputs.scenarios]
    dsd = np.stack([g[0] for g in grids])
    van = np.stack([g[2] for g in grids])
    al = np.array([acceptance_length(setup.acceptance, int(k)) for k in ks])
    tgt, drf = _features(setup, inputs.nominal)
    fits = np.ones((len(bs), len(ks)), dtype=bool)
    if setup.check_memory:
        have = setup.hardware.memory_gb * 1e9 * MEMORY_UTILIZATION
        need = memory_bytes(tgt, drf, bs[:, None], kk[None, :], setup.context_len)
        fits = np.asarray(need, float) <= have
    cells = [CellBand(int(b), int(k), True, float(dsd[0, i, j]), float(dsd[:, i, j].min() * band.low),
                      float(dsd[:, i, j].max() * band.high))
             for i, b in enumerate(batch_sizes) for j, k in enumerate(ks) if fits[i, j]]
    cells += [CellBand(int(b), 0, False, float(van[0, i]), float(van[:, i].min() * band.low),
                       float(van[:, i].max() * band.high)) for i, b in enumerate(batch_sizes)]
    ranges = []
    for i, b in enumerate(batch_sizes):
        cols = [j for j in range(len(ks)) if fits[i, j]]
        if not cols:
            continue
        r = k_star_span([ks[j] for j in cols], al[cols], [g[0][i, cols] for g in grids],
                        [float(g[1][i]) for g in grids], band, tolerance)
        ranges.append(KStarRange(int(b), *r))
    return SimBand(band, inputs.assumptions, tuple(cells), tuple(ranges), tolerance, len(inputs.scenarios))


def k_star_span(ks: list[int], al: np.ndarray, steps: list[np.ndarray], k0_steps: list[float],
                band: ErrorBand, tolerance: float) -> tuple[int, int, int]:
    """(nominal K*, lowest, highest) at one batch size: ``steps`` per scenario (nominal first), each
    step per K of ``ks``, ``k0_steps`` the scenario's DSD step at K 0; the band's error placed wholly
    in the per-step cost or wholly in the cost K adds, at either end (docs/sim.md, "The band")."""
    def k_star(t: np.ndarray) -> int:
        return choose_k({k: float(a / x) for k, a, x in zip(ks, al, t)}, tolerance)

    nominal = k_star(np.asarray(steps[0], dtype=float))
    found = [nominal]
    for t, t0 in zip(steps, k0_steps):
        t = np.asarray(t, dtype=float)
        found.append(k_star(t))
        added = t - t0
        span = max(float(added.max()), 1e-12)
        for r in (band.low, band.high):
            # wholly per step: (r - 1) T(B, 0) on every K (the most that keeps K 0's cell in its band);
            # wholly in what K adds: scaled so the largest K's cell reaches its band's edge (every
            # smaller K's cell stays inside, as its added cost is a smaller share of it)
            found += [k_star(t + (r - 1.0) * t0), k_star(t + (r - 1.0) * float(t.max()) * added / span)]
    return nominal, min(found), max(found)


def resolve_fp8(setup: SimSetup) -> bool:
    """FP8 weights (the category): an FP8 compute path or FP8 storage."""
    from dsdprof.measure.sim.dtypes import resolve_dtype

    return resolve_dtype(setup.target, setup.dtype).compute == "fp8"


def run_band(run: Run, tolerance: float) -> SimBand | str | None:
    """A sim run's :class:`SimBand` (from the spec that ran), the reason there is none (text), or
    None for a run that is not a sim run."""
    if str(run.provenance.get("engine", "")) != "sim":
        return None
    spec = run.spec
    if spec is None:
        return "no band: the run's manifest has no readable spec"
    from dsdprof.measure.sim.config import resolve

    try:
        setup = resolve(spec)
    except InputError as err:
        return f"no band: the run's spec no longer resolves ({err})"
    ks = sorted(int(k) for k in spec.sweep.num_spec_tokens)
    if spec.sweep.context_lens:
        return "no band for a context sweep yet (each context's K* stands alone)"
    return sim_band(setup, list(spec.sweep.batch_sizes), ks, tolerance)
