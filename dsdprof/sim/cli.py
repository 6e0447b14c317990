"""CLI commands of the analytic engine: ``calibrate`` and ``probe-hardware`` (registered on the main
typer app by dsdprof.cli). Heavy imports (pandas, torch) happen inside the commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from dsdprof.cli_common import guarded


def _calibrate(
    measured: Path = typer.Argument(..., metavar="MEASURED", help="Sweep directory or Parquet file of real measurements."),
    out: Path = typer.Option(..., "--out", "-o", help="Profile TOML to write (hardware peaks + fitted efficiency and overheads)."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Peaks to fit against: catalog name or a profile TOML (e.g. from probe-hardware). Default: the measurements' hardware if it is in the catalog."),
    model: Optional[str] = typer.Option(None, "--model", help="Target: catalog name or config.json path. Default: from the measurements' provenance."),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="Draft: catalog name or config.json path. Default: from provenance."),
    method: Optional[str] = typer.Option(None, "--method", help="Speculative method. Default: from provenance."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Engine dtype. Default: from provenance, else auto."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree of the measured engine."),
    context_len: Optional[int] = typer.Option(None, "--context-len", min=1, help="Mean KV positions per sequence. Default: input_len + output_len/2 from the sweep's _sweep.json, else 1024."),
    routing_correlation: float = typer.Option(0.0, "--routing-correlation", min=0.0, max=0.999, help="MoE routing correlation rho."),
    tolerance: float = typer.Option(0.02, "--tolerance", help="Relative goodput tolerance for the optimal-K comparison."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Fit bandwidth/compute efficiency and per-step overheads to a measured sweep (bounded least
    squares on ITL), say which the batch sizes given cannot determine (those keep the base
    profile's prior), report the error on batch sizes held out of a half fit, and write a
    validated hardware profile."""
    from rich.console import Console
    from rich.table import Table

    from dsdprof.analysis import load_measurements, read_provenance
    from dsdprof.errors import InputError
    from dsdprof.sim.calibrate import (CalibrationTarget, calibrated_hardware, design_for, holdout, mape, predict,
                                       read_sweep_context)
    from dsdprof.sim.fit import LABELS, fit
    from dsdprof.sim.catalog import derived_draft, resolve_model, shadowed_catalog_name
    from dsdprof.sim.hardware import resolve_hardware, write_profile

    if out.exists() and not force:
        raise InputError("--out", str(out), "exists; pass --force to replace it")
    if not (0.0 <= tolerance < 1.0):
        raise InputError("--tolerance", tolerance, "must be in [0, 1)")
    df = load_measurements(measured)
    prov = read_provenance(measured)
    first = lambda col: str(df[col].dropna().iloc[0]) if col in df.columns and not df[col].dropna().empty else ""  # noqa: E731
    pick = lambda given, key: given or prov.get(key) or first(key)  # noqa: E731
    hw_name = pick(hardware, "hardware")
    if not hw_name:
        raise InputError("--hardware", None, "measurements carry no hardware; pass a catalog name or profile")
    try:
        base = resolve_hardware(hw_name, "--hardware")
    except InputError:
        raise InputError("--hardware", hw_name, "not in the catalog and not a profile file; run "
                         "'dsdprof probe-hardware --out P.toml' and pass --hardware P.toml") from None
    model_name = pick(model, "model")
    if not model_name:
        raise InputError("--model", None, "measurements carry no model; pass --model")
    target = resolve_model(model_name, "--model")
    method_name = pick(method, "method") or "draft_model"
    draft_name = pick(draft_model, "draft_model")
    draft = resolve_model(draft_name, "--draft-model") if draft_name else derived_draft(target, method_name)
    for flag, name in (("--model", model_name), ("--draft-model", draft_name)):
        shadowed = shadowed_catalog_name(name) if name else None
        if shadowed:
            Console(stderr=True).print(f"notice: {flag}={name!r} is a local config.json path; using it, not the "
                                       f"catalog model {shadowed!r}", style="yellow", markup=False, highlight=False,
                                       soft_wrap=True)
    ctx = context_len or (read_sweep_context(measured) if measured.is_dir() else None) or 1024
    ct = CalibrationTarget(base, target, draft, pick(dtype, "dtype") or "auto", tp, ctx, routing_correlation,
                           method_name)

    report = holdout(ct, df, tolerance) if df["batch_size"].nunique() >= 2 else None
    fitted = fit(design_for(ct, df), df["itl_s"].to_numpy(), base.efficiency)
    eff = fitted.efficiency
    all_mape = mape(predict(design_for(ct, df), eff), df["itl_s"].to_numpy())
    sizes = sorted(int(b) for b in df["batch_size"].unique())
    meta = {"source": "dsdprof calibrate", "measurements": str(measured), "cells": len(df),
            "model": target.name, "draft_model": draft.name if draft else "", "method": method_name,
            "dtype": ct.dtype, "context_len": ctx, "base_hardware": base.name, "fit_mape_pct": round(all_mape, 3),
            "batch_sizes": sizes, "not_identifiable": sorted(fitted.not_identifiable)}
    if report is not None:
        meta.update(heldout_fit_batch_sizes=report.fit_batch_sizes, heldout_batch_sizes=report.heldout_batch_sizes,
                    heldout_itl_mape_pct=round(report.heldout_mape, 3),
                    heldout_k_match_share=round(report.k_match_share, 4),
                    heldout_k_match_share_measured_al=round(report.k_match_share_measured_al, 4))
    write_profile(out, calibrated_hardware(base, eff), meta, force=force)  # validated before it replaces OUT
    result = {"profile": str(out), "efficiency": eff.__dict__, "fit_all": {"cells": len(df), "itl_mape_pct": all_mape},
              "batch_sizes": sizes, "not_identifiable": fitted.not_identifiable, "uncertainty": fitted.std}
    if report is not None:
        result["holdout"] = {"fit_batch_sizes": report.fit_batch_sizes, "heldout_batch_sizes": report.heldout_batch_sizes,
                             "fit_itl_mape_pct": report.fit_mape, "heldout_itl_mape_pct": report.heldout_mape,
                             "k_match_share": report.k_match_share,
                             "k_match_share_measured_al": report.k_match_share_measured_al,
                             "per_batch": report.per_batch}
    if json_out:
        print(json.dumps(result, indent=2, default=str))
        return
    con = Console()
    con.print(f"calibrated {target.name} / {draft.name if draft else '-'} ({method_name}) against {base.name}, "
              f"{len(df)} cells, context {ctx}")
    con.print(f"fitted: bandwidth eff {eff.bandwidth:.3f}, compute eff {eff.compute:.3f}, step overhead "
              f"{eff.step_overhead_s * 1e3:.3f} ms, per draft step {eff.draft_step_overhead_s * 1e3:.3f} ms, "
              f"DSD overhead {eff.dsd_overhead_s * 1e3:.3f} ms; ITL MAPE on all cells {all_mape:.1f}%")
    for name, reason in fitted.not_identifiable.items():
        value, prior = getattr(eff, name), getattr(base.efficiency, name)
        show = (lambda v: f"{v:.3f}") if name in ("bandwidth", "compute") else (lambda v: f"{v * 1e3:.3f} ms")  # noqa: E731
        kept = (f"kept at the prior {show(prior)}" if abs(value - prior) <= 0.01 * max(abs(prior), 1e-6)
                else f"the data only bound it: {show(value)}, the value nearest the prior {show(prior)} that fits")
        con.print(f"not identifiable from batch sizes {sizes}: {LABELS[name]} ({reason}); {kept}",
                  style="yellow", markup=False, highlight=False)
    if report is not None:
        t = Table(title=f"held out: fit on BS {report.fit_batch_sizes}, predict BS {report.heldout_batch_sizes}")
        for col in ("BS", "K* measured", "K* predicted", "K* pred. (measured AL)", "ITL MAPE %"):
            t.add_column(col, justify="right")
        for r in report.per_batch:
            t.add_row(str(r["batch_size"]), str(r["measured_k"]), str(r["predicted_k"]),
                      str(r["predicted_k_measured_al"]), f"{r['itl_mape']:.1f}")
        con.print(t)
        con.print(f"held-out ITL MAPE {report.heldout_mape:.1f}% (fit half {report.fit_mape:.1f}%); optimal K matches "
                  f"on {report.k_match_share:.0%} of held-out batch sizes "
                  f"({report.k_match_share_measured_al:.0%} with measured AL)")
    con.print(f"wrote {out}")


def _probe_hardware(
    out: Path = typer.Option(..., "--out", "-o", help="Profile TOML to write."),
    device: str = typer.Option("auto", "--device", help="auto (cuda if visible, else cpu), cpu or cuda."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Matmul dtype: bfloat16 (GPU default), float16, float32 (CPU default)."),
    buffer_mb: Optional[int] = typer.Option(None, "--buffer-mb", min=1, help="Bandwidth buffer size (default 4096 GPU, 1024 CPU)."),
    matmul_n: Optional[int] = typer.Option(None, "--matmul-n", min=16, help="Square matmul size (default 8192 GPU, 2048 CPU)."),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Timed repeats; the best is kept."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
) -> None:
    """Measure memory bandwidth and matmul throughput with torch and write a hardware profile."""
    from rich.console import Console

    from dsdprof.errors import InputError
    from dsdprof.sim.hardware import write_profile
    from dsdprof.sim.probe import probe

    if out.exists() and not force:
        raise InputError("--out", str(out), "exists; pass --force to replace it")
    res = probe(device=device, dtype=dtype, buffer_mb=buffer_mb, matmul_n=matmul_n, repeats=repeats)
    write_profile(out, res.hardware, res.meta, force=force)
    h, m = res.hardware, res.meta
    Console().print(f"{h.name} ({m['device']}): read {m['read_bandwidth_tbs'] * 1e3:.1f} GB/s, copy "
                    f"{m['copy_bandwidth_tbs'] * 1e3:.1f} GB/s, {m['matmul_dtype']} matmul n={m['matmul_n']} "
                    f"{m['matmul_tflops']:.3f} TFLOP/s; decode-shaped efficiency: bandwidth {h.efficiency.bandwidth:.2f} "
                    f"(GEMV {m['gemv_bandwidth_tbs'] * 1e3:.1f} GB/s), compute {h.efficiency.compute:.2f}"
                    f"{f'; fp8 {h.fp8_tflops:.1f} TFLOP/s' if h.fp8_tflops else ''} -> wrote {out}")


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` and ``probe-hardware`` to ``app``."""
    app.command("calibrate")(guarded(_calibrate))
    app.command("probe-hardware")(guarded(_probe_hardware))
