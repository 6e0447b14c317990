"""``dsdprof calibrate``: fit the analytic engine's efficiencies and overheads to a measured run,
test the fit on batch sizes held out of it, and write a validated hardware profile.

The fit itself is :mod:`dsdprof.measure.sim.calibrate`; this job adds what needs the decision
stage (optimal K on held-out batch sizes, :func:`dsdprof.decide.analysis.analyze`) and the I/O.
It returns a typed :class:`CalibrationResult`; the CLI renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypedDict

import numpy as np
import pandas as pd

from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.config.run import Run, validate_measurements
from dsdprof.decide.analysis import analyze
from dsdprof.errors import InputError
from dsdprof.io.runs import open_run
from dsdprof.measure.sim.calibrate import CalibrationTarget, design_for, mape, predict
from dsdprof.measure.sim.catalog import derived_draft, resolve_model, shadow_notices
from dsdprof.measure.sim.fit import LABELS, fit
from dsdprof.measure.sim.hardware import Efficiency, resolve_hardware, write_profile


@dataclass(frozen=True)
class HoldoutReport:
    """Fit on ``fit_batch_sizes``, predict ``heldout_batch_sizes``."""

    fit_batch_sizes: list[int]
    heldout_batch_sizes: list[int]
    efficiency: Efficiency
    fit_mape: float
    heldout_mape: float
    k_match_share: float  # predicted optimal K == measured optimal K, AL per K taken from the fit half
    k_match_share_measured_al: float  # same with each held-out cell's own measured AL
    per_batch: list[HeldOutBatch]


class HeldOutBatch(TypedDict):
    """One held-out batch size: the optimal K measured and predicted, and the ITL error (%)."""

    batch_size: int
    measured_k: int | None
    predicted_k: int | None
    predicted_k_measured_al: int | None
    itl_mape: float


def _optimal_k(df: pd.DataFrame, tolerance: float) -> dict[int, int]:
    opt = analyze(df, tolerance=tolerance).optimal
    return dict(zip(opt["batch_size"].astype(int), opt["k"].astype(int)))


def holdout(ct: CalibrationTarget, df: pd.DataFrame, tolerance: float = DEFAULT_TOLERANCE) -> HoldoutReport:
    """Fit on every other batch size (1st, 3rd, ...), predict the rest: ITL MAPE on held-out cells
    and the share of held-out batch sizes whose optimal K (``dsdprof.decide.analysis.analyze``) matches."""
    sizes = sorted(int(b) for b in df["batch_size"].unique())
    if len(sizes) < 2:
        raise InputError("batch_size", sizes, "need at least 2 batch sizes to hold some out")
    fit_bs, held_bs = sizes[0::2], sizes[1::2]
    fit_df = df[df["batch_size"].isin(fit_bs)]
    held = df[df["batch_size"].isin(held_bs)].copy()
    eff = fit(design_for(ct, fit_df), fit_df["itl_s"].to_numpy(), ct.hardware.efficiency).efficiency
    fit_pred = predict(design_for(ct, fit_df), eff)
    held_pred = predict(design_for(ct, held), eff)
    # AL is a property of draft and data, not of batch size: take the fit half's median per K
    key = held["num_spec_tokens"].astype(str) + "/" + (held["mode"].astype(str) if "mode" in held else "")
    fit_key = (fit_df["num_spec_tokens"].astype(str) + "/"
               + (fit_df["mode"].astype(str) if "mode" in fit_df else ""))
    al_by_key = fit_df.groupby(fit_key)["acceptance_length"].median()
    measured_k = _optimal_k(held, tolerance)
    pred_own = held.assign(itl_s=held_pred)
    al_fit = key.map(al_by_key).fillna(held["acceptance_length"]).to_numpy()
    pred_fit = pred_own.assign(acceptance_length=al_fit)
    k_own, k_fit = _optimal_k(pred_own, tolerance), _optimal_k(pred_fit, tolerance)
    per_batch: list[HeldOutBatch] = []
    for b in held_bs:
        rows = held["batch_size"] == b
        per_batch.append({"batch_size": b, "measured_k": measured_k.get(b), "predicted_k": k_fit.get(b),
                          "predicted_k_measured_al": k_own.get(b),
                          "itl_mape": mape(held_pred[rows.to_numpy()], held.loc[rows, "itl_s"].to_numpy())})
    share = lambda ks: float(np.mean([ks.get(b) == measured_k.get(b) for b in held_bs]))  # noqa: E731
    return HoldoutReport(fit_bs, held_bs, eff, mape(fit_pred, fit_df["itl_s"].to_numpy()),
                         mape(held_pred, held["itl_s"].to_numpy()), share(k_fit), share(k_own), per_batch)


@dataclass(frozen=True)
class CalibrationRequest:
    """What ``dsdprof calibrate`` was asked (None: take it from the measurements' provenance)."""

    measured: Path
    out: Path
    hardware: str | None = None
    model: str | None = None
    draft_model: str | None = None
    method: str | None = None
    dtype: str | None = None
    tp: int = 1
    context_len: int | None = None
    routing_correlation: float = 0.0
    tolerance: float = DEFAULT_TOLERANCE
    force: bool = False


@dataclass(frozen=True)
class Unidentified:
    """A parameter the batch sizes given cannot determine, and what the fit did with it."""

    name: str
    label: str
    reason: str
    value: float
    prior: float

    @property
    def kept_prior(self) -> bool:
        return abs(self.value - self.prior) <= 0.01 * max(abs(self.prior), 1e-6)


@dataclass(frozen=True)
class CalibrationResult:
    profile: Path
    target: str
    draft: str
    method: str
    base_hardware: str
    cells: int
    context_len: int
    efficiency: Efficiency
    itl_mape_pct: float
    batch_sizes: list[int]
    unidentified: list[Unidentified]
    uncertainty: dict[str, float]  # the fit's marginal standard deviation per parameter
    holdout: HoldoutReport | None
    notices: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"profile": str(self.profile), "efficiency": self.efficiency.__dict__,
               "fit_all": {"cells": self.cells, "itl_mape_pct": self.itl_mape_pct},
               "batch_sizes": self.batch_sizes,
               "not_identifiable": {u.name: u.reason for u in self.unidentified},
               "uncertainty": self.uncertainty}
        r = self.holdout
        if r is not None:
            out["holdout"] = {"fit_batch_sizes": r.fit_batch_sizes,
                              "heldout_batch_sizes": r.heldout_batch_sizes,
                              "fit_itl_mape_pct": r.fit_mape, "heldout_itl_mape_pct": r.heldout_mape,
                              "k_match_share": r.k_match_share,
                              "k_match_share_measured_al": r.k_match_share_measured_al,
                              "per_batch": r.per_batch}
        return out


def _sweep_context(run: Run) -> int | None:
    """Mean decode context of a sweep directory: input_len + output_len / 2 from its spec."""
    spec = next((m.spec for m in run.manifests if m.directory == run.path), None)
    return None if spec is None else spec.workload.input_len + spec.sweep.output_len // 2


def _target(req: CalibrationRequest, df: pd.DataFrame, run: Run) -> tuple[CalibrationTarget, str, list[str]]:
    prov = run.stored_provenance

    def first(col: str) -> str:
        return str(df[col].dropna().iloc[0]) if col in df.columns and not df[col].dropna().empty else ""

    def pick(given: str | None, key: str) -> str:
        return given or str(prov.get(key) or "") or first(key)
    hw_name = pick(req.hardware, "hardware")
    if not hw_name:
        raise InputError("--hardware", None, "measurements carry no hardware; pass a catalog name or profile")
    try:
        base = resolve_hardware(hw_name, "--hardware")
    except InputError:
        raise InputError("--hardware", hw_name, "not in the catalog and not a profile file; run "
                         "'dsdprof probe-hardware --out P.toml' and pass --hardware P.toml") from None
    model_name = pick(req.model, "model")
    if not model_name:
        raise InputError("--model", None, "measurements carry no model; pass --model")
    target = resolve_model(model_name, "--model")
    method = pick(req.method, "method") or "draft_model"
    draft_name = pick(req.draft_model, "draft_model")
    draft = resolve_model(draft_name, "--draft-model") if draft_name else derived_draft(target, method)
    notices = shadow_notices((("--model", model_name), ("--draft-model", draft_name)))
    ctx = req.context_len or _sweep_context(run) or 1024
    ct = CalibrationTarget(base, target, draft, pick(req.dtype, "dtype") or "auto", req.tp, ctx,
                           req.routing_correlation,
                           method)
    return ct, method, notices


def run_calibration(req: CalibrationRequest) -> CalibrationResult:
    """Fit, hold out, write the profile (validated before it replaces ``req.out``)."""
    if Path(req.out).exists() and not req.force:
        raise InputError("--out", str(req.out), "exists; pass --force to replace it")
    if not (0.0 <= req.tolerance < 1.0):
        raise InputError("--tolerance", req.tolerance, "must be in [0, 1)")
    run = open_run(req.measured, "calibrate")  # read once: rows, provenance, manifest
    df = validate_measurements(run.rows)
    ct, method, notices = _target(req, df, run)
    report = holdout(ct, df, req.tolerance) if df["batch_size"].nunique() >= 2 else None
    fitted = fit(design_for(ct, df), df["itl_s"].to_numpy(), ct.hardware.efficiency)
    eff = fitted.efficiency
    all_mape = mape(predict(design_for(ct, df), eff), df["itl_s"].to_numpy())
    sizes = sorted(int(b) for b in df["batch_size"].unique())
    draft = ct.draft.name if ct.draft else ""
    meta = {"source": "dsdprof calibrate", "measurements": str(req.measured), "cells": len(df),
            "model": ct.target.name, "draft_model": draft, "method": method,
            "dtype": ct.dtype, "context_len": ct.context_len, "base_hardware": ct.hardware.name,
            "fit_mape_pct": round(all_mape, 3), "batch_sizes": sizes,
            "not_identifiable": sorted(fitted.not_identifiable)}
    if report is not None:
        meta.update(heldout_fit_batch_sizes=report.fit_batch_sizes,
                    heldout_batch_sizes=report.heldout_batch_sizes,
                    heldout_itl_mape_pct=round(report.heldout_mape, 3),
                    heldout_k_match_share=round(report.k_match_share, 4),
                    heldout_k_match_share_measured_al=round(report.k_match_share_measured_al, 4))
    write_profile(req.out, replace(ct.hardware, efficiency=eff), meta, force=req.force)
    unidentified = [Unidentified(n, LABELS[n], reason, getattr(eff, n), getattr(ct.hardware.efficiency, n))
                    for n, reason in fitted.not_identifiable.items()]
    return CalibrationResult(Path(req.out), ct.target.name, draft, method, ct.hardware.name, len(df),
                             ct.context_len,
                             eff, all_mape, sizes, unidentified, fitted.std, report, notices)
