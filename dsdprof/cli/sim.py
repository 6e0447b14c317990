"""CLI commands of the analytic engine: ``calibrate`` and ``probe-hardware`` (registered on the main
typer app by dsdprof.cli.app). Heavy imports (pandas, torch) happen inside the commands."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dsdprof.cli.common import Force, Tolerance, guarded, make_console
from dsdprof.config.defaults import DEFAULT_TOLERANCE


def _calibrate(
    measured: Path = typer.Argument(..., metavar="MEASURED",
                                    help="Sweep directory or Parquet file of real measurements."),
    out: Path = typer.Option(..., "--out", "-o",
                             help="Profile TOML to write (hardware peaks + fitted efficiency and "
                                  "overheads)."),
    hardware: str | None = typer.Option(None, "--hardware",
                                        help="Peaks to fit against: catalog name or a profile TOML (e.g. "
                                             "from probe-hardware). Default: the measurements' hardware if "
                                             "it is in the catalog."),
    model: str | None = typer.Option(None, "--model",
                                     help="Target: catalog name or config.json path. Default: from the "
                                          "measurements' provenance."),
    draft_model: str | None = typer.Option(None, "--draft-model",
                                           help="Draft: catalog name or config.json path. Default: from "
                                                "provenance."),
    method: str | None = typer.Option(None, "--method", help="Speculative method. Default: from provenance."),
    dtype: str | None = typer.Option(None, "--dtype",
                                     help="Engine dtype. Default: from provenance, else auto."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree of the measured engine."),
    context_len: int | None = typer.Option(None, "--context-len", min=1,
                                           help="Mean KV positions per sequence. Default: input_len + "
                                                "output_len/2 from the sweep's _sweep.json, else 1024."),
    routing_correlation: float = typer.Option(0.0, "--routing-correlation", min=0.0, max=0.999,
                                              metavar="RHO", help="MoE routing correlation rho."),
    tolerance: Tolerance = DEFAULT_TOLERANCE,
    force: Force = False,
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Fit a hardware profile to a measured sweep and write it, validated.

    Bandwidth/compute efficiency and per-step overheads are fitted by bounded least squares on
    ITL; the report says which of them the batch sizes given cannot determine (those keep the
    base profile's prior) and the error on batch sizes held out of a half fit."""
    from dsdprof.jobs.calibrate import CalibrationRequest, run_calibration

    res = run_calibration(CalibrationRequest(
        measured, out, hardware, model, draft_model, method, dtype, tp, context_len, routing_correlation,
        tolerance, force))
    for notice in res.notices:
        make_console(stderr=True).print(notice, style="yellow", markup=False, highlight=False, soft_wrap=True)
    if json_out:
        print(json.dumps(res.as_dict(), indent=2, default=str))
        return
    _render_calibration(res, make_console())


def print_sim_band(run, tolerance: float, console) -> None:
    """Under ``analyze``'s table of a sim run: the band of each K*'s cell, where K* could change
    within the model's error and what was assumed (nothing for a measured run)."""
    from dsdprof.measure.sim.band import run_band

    band = run_band(run, tolerance)
    if band is None:
        return
    for line in [band] if isinstance(band, str) else band.lines():
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def sim_band_record(run, tolerance: float) -> dict[str, object]:
    """``analyze --json``'s ``prediction_band`` of a sim run (the reason as text where it has none;
    {} for a measured run)."""
    from dsdprof.measure.sim.band import run_band

    band = run_band(run, tolerance)
    return {} if band is None else {"prediction_band": band if isinstance(band, str) else band.record()}


def _ms(v: float) -> str:
    return f"{v * 1e3:.3f} ms"


def _render_calibration(res, con) -> None:
    from rich.table import Table

    eff, r = res.efficiency, res.holdout
    con.print(f"calibrated {res.target} / {res.draft or '-'} ({res.method}) against {res.base_hardware}, "
              f"{res.cells} cells, context {res.context_len}")
    con.print(f"fitted: bandwidth eff {eff.bandwidth:.3f}, compute eff {eff.compute:.3f}, step overhead "
              f"{_ms(eff.step_overhead_s)}, per draft step {_ms(eff.draft_step_overhead_s)}, "
              f"DSD overhead {_ms(eff.dsd_overhead_s)}; ITL MAPE on all cells {res.itl_mape_pct:.1f}%")
    for u in res.unidentified:
        show = (lambda v: f"{v:.3f}") if u.name in ("bandwidth", "compute") else _ms  # noqa: E731
        kept = (f"kept at the prior {show(u.prior)}" if u.kept_prior
                else f"the data only bound it: {show(u.value)}, the value nearest the prior "
                     f"{show(u.prior)} that fits")
        con.print(f"not identifiable from batch sizes {res.batch_sizes}: {u.label} ({u.reason}); {kept}",
                  style="yellow", markup=False, highlight=False)
    if r is not None:
        t = Table(title=f"held out: fit on BS {r.fit_batch_sizes}, predict BS {r.heldout_batch_sizes}")
        for col in ("BS", "K* measured", "K* predicted", "K* pred. (measured AL)", "ITL MAPE %"):
            t.add_column(col, justify="right")
        for row in r.per_batch:
            t.add_row(str(row["batch_size"]), str(row["measured_k"]), str(row["predicted_k"]),
                      str(row["predicted_k_measured_al"]), f"{row['itl_mape']:.1f}")
        con.print(t)
        con.print(f"held-out ITL MAPE {r.heldout_mape:.1f}% (fit half {r.fit_mape:.1f}%); optimal K matches "
                  f"on {r.k_match_share:.0%} of held-out batch sizes "
                  f"({r.k_match_share_measured_al:.0%} with measured AL)")
    con.print(f"wrote {res.profile}")


def _probe_hardware(
    out: Path = typer.Option(..., "--out", "-o", help="Profile TOML to write."),
    device: str = typer.Option("auto", "--device", help="auto (cuda if visible, else cpu), cpu or cuda."),
    dtype: str | None = typer.Option(None, "--dtype",
                                     help="Matmul dtype: bfloat16 (GPU default), float16, float32 (CPU "
                                          "default)."),
    buffer_mb: int | None = typer.Option(None, "--buffer-mb", min=1,
                                         help="Bandwidth buffer size (default 4096 GPU, 1024 CPU)."),
    matmul_n: int | None = typer.Option(None, "--matmul-n", min=16,
                                        help="Square matmul size (default 8192 GPU, 2048 CPU)."),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Timed repeats; the best is kept."),
    force: Force = False,
) -> None:
    """Measure memory bandwidth and matmul throughput with torch and write a hardware profile."""
    from dsdprof.errors import InputError
    from dsdprof.measure.sim.hardware import write_profile
    from dsdprof.measure.sim.probe import probe

    if out.exists() and not force:
        raise InputError("--out", str(out), "exists; pass --force to replace it")
    res = probe(device=device, dtype=dtype, buffer_mb=buffer_mb, matmul_n=matmul_n, repeats=repeats)
    write_profile(out, res.hardware, res.meta, force=force)
    h, m = res.hardware, res.meta
    make_console().print(f"{h.name} ({m['device']}): read {m['read_bandwidth_tbs'] * 1e3:.1f} GB/s, copy "
                    f"{m['copy_bandwidth_tbs'] * 1e3:.1f} GB/s, {m['matmul_dtype']} matmul n={m['matmul_n']} "
                    f"{m['matmul_tflops']:.3f} TFLOP/s; decode-shaped efficiency: bandwidth "
                    f"{h.efficiency.bandwidth:.2f} (GEMV {m['gemv_bandwidth_tbs'] * 1e3:.1f} GB/s), "
                    f"compute {h.efficiency.compute:.2f}"
                    f"{f'; fp8 {h.fp8_tflops:.1f} TFLOP/s' if h.fp8_tflops else ''} -> wrote {out}")


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` and ``probe-hardware`` to ``app``."""
    app.command("calibrate")(guarded(_calibrate))
    app.command("probe-hardware")(guarded(_probe_hardware))
