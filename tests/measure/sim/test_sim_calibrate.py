"""Calibration recovers known factors from synthetic data; calibrate / probe-hardware CLIs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.config.spec import parse_spec
from dsdprof.errors import InputError
from dsdprof.jobs.calibrate import holdout
from dsdprof.measure.engine import Cell
from dsdprof.measure.factory import make_engine
from dsdprof.measure.sim.calibrate import CalibrationTarget, design_for, predict
from dsdprof.measure.sim.catalog import MODELS
from dsdprof.measure.sim.fit import fit
from dsdprof.measure.sim.hardware import HARDWARE, Efficiency, load_profile

runner = CliRunner()
TRUE = Efficiency(bandwidth=0.72, compute=0.5, step_overhead_s=0.9e-3, draft_step_overhead_s=0.35e-3,
                  dsd_overhead_s=0.25e-3)
CT = CalibrationTarget(HARDWARE["H100 SXM"], MODELS["Llama-3.1-8B"], MODELS["EAGLE3-Llama-3.1-8B"],
                       "bfloat16", 1, 1024)


def synthetic(ct=CT, eff=TRUE, noise=0.0, bss=(1, 2, 4, 8, 16, 32, 64, 128, 256), ks=range(6), alpha=0.8):
    rows = [{"batch_size": b, "num_spec_tokens": 0, "mode": "vanilla"} for b in bss]
    rows += [{"batch_size": b, "num_spec_tokens": k, "mode": "dsd"} for b in bss for k in ks]
    df = pd.DataFrame(rows)
    rng = np.random.default_rng(0)
    df["itl_s"] = predict(design_for(ct, df), eff) * (1 + noise * rng.standard_normal(len(df)))
    df["acceptance_length"] = [1 + sum(alpha**i for i in range(1, k + 1)) for k in df["num_spec_tokens"]]
    df["acceptance_per_pos"] = [[alpha**i for i in range(1, k + 1)] for k in df["num_spec_tokens"]]
    return df


def test_fit_recovers_known_factors():
    df = synthetic()
    eff = fit(design_for(CT, df), df["itl_s"].to_numpy()).efficiency
    for name in ("bandwidth", "compute", "step_overhead_s", "draft_step_overhead_s", "dsd_overhead_s"):
        assert getattr(eff, name) == pytest.approx(getattr(TRUE, name), rel=0.01), name


def test_fit_recovers_moe_factors_with_tp():
    ct = CalibrationTarget(HARDWARE["MI300X"], MODELS["Qwen3-30B-A3B"], None, "bfloat16", 2, 512, 0.3)
    from dsdprof.measure.sim.catalog import derived_draft

    ct = CalibrationTarget(ct.hardware, ct.target, derived_draft(ct.target, "eagle3"), "bfloat16", 2, 512,
                           0.3)
    true = Efficiency(0.6, 0.8, 2e-3, 0.1e-3, 0.0)
    df = synthetic(ct, true)
    eff = fit(design_for(ct, df), df["itl_s"].to_numpy()).efficiency
    assert eff.bandwidth == pytest.approx(0.6, rel=0.01) and eff.compute == pytest.approx(0.8, rel=0.02)
    assert eff.dsd_overhead_s == pytest.approx(0.0, abs=2e-5)


def test_fit_with_noise_stays_close():
    df = synthetic(noise=0.02)
    eff = fit(design_for(CT, df), df["itl_s"].to_numpy()).efficiency
    assert eff.bandwidth == pytest.approx(TRUE.bandwidth, rel=0.1)
    assert eff.step_overhead_s == pytest.approx(TRUE.step_overhead_s, rel=0.5)


def test_holdout_on_noise_free_data_is_exact():
    rep = holdout(CT, synthetic())
    assert rep.fit_batch_sizes == [1, 4, 16, 64, 256] and rep.heldout_batch_sizes == [2, 8, 32, 128]
    assert rep.heldout_mape < 0.2 and rep.k_match_share == 1.0 and rep.k_match_share_measured_al == 1.0


def test_holdout_detects_a_wrong_model():
    """Data from a different physics (ITL linear in B*(K+1)) cannot be fitted exactly."""
    df = synthetic()
    k = df["num_spec_tokens"]
    df["itl_s"] = 0.01 + 0.0005 * k + 0.00008 * df["batch_size"] * (k + 1)
    rep = holdout(CT, df)
    assert rep.heldout_mape > 1.0


def test_fit_rejects_too_few_cells():
    df = synthetic().iloc[:1]
    with pytest.raises(InputError):
        fit(design_for(CT, df), df["itl_s"].to_numpy())


def _write_measured(tmp_path, df):
    df = df.assign(model="meta-llama/Llama-3.1-8B-Instruct",
                   draft_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                   method="eagle3", hardware="H100 SXM", dtype="bfloat16", status="ok")
    p = tmp_path / "measured.parquet"
    df.to_parquet(p)
    return p


def test_cli_calibrate_writes_profile_that_reproduces_itl(tmp_path):
    p = _write_measured(tmp_path, synthetic())
    out = tmp_path / "prof.toml"
    r = runner.invoke(app, ["calibrate", str(p), "--out", str(out), "--context-len", "1024", "--json"])
    assert r.exit_code == 0, r.output + r.stderr
    doc = json.loads(r.stdout)
    assert doc["holdout"]["heldout_itl_mape_pct"] < 0.2 and doc["holdout"]["k_match_share"] == 1.0
    hw = load_profile(out)
    assert hw.efficiency.bandwidth == pytest.approx(TRUE.bandwidth, rel=0.01)
    spec = parse_spec({"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3",
                                  "dtype": "bfloat16", "max_model_len": 4096},
                       "sweep": {"batch_sizes": [32], "num_spec_tokens": [3]},
                       "sim": {"hardware": str(out), "context_len": 1024, "acceptance_alpha": 0.8}})
    m = make_engine(spec).measure(Cell(0, 32, "dsd", 3))
    df = synthetic()
    want = df[(df.batch_size == 32) & (df.num_spec_tokens == 3) & (df["mode"] == "dsd")]["itl_s"].iloc[0]
    assert m.itl_s == pytest.approx(want, rel=0.005)
    r = runner.invoke(app, ["calibrate", str(p), "--out", str(out)])
    assert r.exit_code == 2 and "exists" in r.stderr


@pytest.mark.parametrize("args,needle", [(["--hardware", "TPU v9"], "--hardware"),
                                         (["--model", "GPT-9"], "--model"),
                                         (["--tolerance", "2"], "--tolerance")])
def test_cli_calibrate_bad_input(tmp_path, args, needle):
    p = _write_measured(tmp_path, synthetic())
    r = runner.invoke(app, ["calibrate", str(p), "--out", str(tmp_path / "x.toml"), *args])
    assert r.exit_code == 2 and needle in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "x.toml").exists()


def test_cli_calibrate_missing_measurements(tmp_path):
    r = runner.invoke(app, ["calibrate", str(tmp_path / "nothing"), "--out", str(tmp_path / "x.toml")])
    assert r.exit_code == 2 and "error:" in r.stderr


def test_cli_probe_hardware_cpu(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "cpu.toml"
    r = runner.invoke(app, ["probe-hardware", "--out", str(out), "--device", "cpu", "--buffer-mb", "16",
                            "--matmul-n", "128", "--repeats", "2"])
    assert r.exit_code == 0, r.output + r.stderr
    hw = load_profile(out)
    assert hw.memory_bandwidth_tbs > 0 and hw.bf16_tflops > 0
    # efficiencies are decode-shaped GEMMs measured against the peaks: in (0, 1]
    assert 0 < hw.efficiency.bandwidth <= 1.0 and 0 < hw.efficiency.compute <= 1.0
    assert "decode-shaped efficiency" in r.output
    r = runner.invoke(app, ["probe-hardware", "--out", str(tmp_path / "y.toml"), "--device", "tpu"])
    assert r.exit_code == 2 and "--device" in r.stderr and not (tmp_path / "y.toml").exists()


def test_probe_times_back_to_back_calls_and_divides():
    from dsdprof.measure.sim import probe as probe_mod

    calls, syncs = [], []
    t = probe_mod._best_seconds(lambda: calls.append(1), lambda: syncs.append(1), repeats=3, inner=4)
    assert len(calls) == 1 + 3 * 4 and len(syncs) == 1 + 3  # one sync per sample, not per call
    assert t >= 0


def test_help_on_sim_commands():
    for cmd in ("calibrate", "probe-hardware"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "Usage" in r.output


# ----------------------------------------------------------------------------- bounded fit, identifiability


def test_bandwidth_bound_batch_sizes_leave_compute_efficiency_unidentified():
    """BS 1-4 never reach compute-bound: e_c gets no signal, keeps the prior, and is reported."""
    from dsdprof.measure.sim.fit import fit

    df = synthetic(bss=(1, 2, 4), noise=0.01)
    prior = CT.hardware.efficiency
    res = fit(design_for(CT, df), df["itl_s"].to_numpy(), prior)
    assert "compute" in res.not_identifiable and "compute-bound" in res.not_identifiable["compute"]
    assert res.efficiency.compute == pytest.approx(prior.compute, rel=1e-3)
    assert res.efficiency.bandwidth == pytest.approx(TRUE.bandwidth, rel=0.05)
    full = fit(design_for(CT, synthetic(noise=0.01)), synthetic(noise=0.01)["itl_s"].to_numpy(), prior)
    assert full.not_identifiable == {} and full.efficiency.compute == pytest.approx(TRUE.compute, rel=0.05)


@pytest.mark.parametrize("drop,names", [("vanilla", {"step_overhead_s", "dsd_overhead_s"}),
                                        ("k>0", {"draft_step_overhead_s"})])
def test_missing_cells_make_overheads_unidentified(drop, names):
    from dsdprof.measure.sim.fit import fit

    df = synthetic()
    df = df[df["mode"] != "vanilla"] if drop == "vanilla" else df[df["num_spec_tokens"] == 0]
    res = fit(design_for(CT, df), df["itl_s"].to_numpy(), CT.hardware.efficiency)
    assert names <= set(res.not_identifiable), res.not_identifiable
    if drop == "k>0":
        assert res.efficiency.draft_step_overhead_s == CT.hardware.efficiency.draft_step_overhead_s


def test_fit_stays_inside_loader_bounds_on_hostile_data():
    """ITL falling with batch size (no physical fit): parameters stay within the profile bounds."""
    from dsdprof.measure.sim.fit import EFFICIENCY_BOUNDS, fit

    df = synthetic(bss=(1, 2, 4, 8))
    df["itl_s"] = 0.05 / df["batch_size"]
    eff = fit(design_for(CT, df), df["itl_s"].to_numpy()).efficiency
    for v in (eff.bandwidth, eff.compute):
        assert EFFICIENCY_BOUNDS[0] <= v <= EFFICIENCY_BOUNDS[1]
    assert min(eff.step_overhead_s, eff.draft_step_overhead_s, eff.dsd_overhead_s) >= 0


def test_write_profile_validates_before_replacing(tmp_path):
    """The issue's case: a profile with compute efficiency 850 must not replace a good one."""
    from dataclasses import replace as dc_replace

    from dsdprof.measure.sim.hardware import write_profile

    good = tmp_path / "prof.toml"
    write_profile(good, HARDWARE["H100 SXM"])
    before = good.read_bytes()
    bad = dc_replace(HARDWARE["H100 SXM"], efficiency=dc_replace(TRUE, compute=850.0))
    with pytest.raises(InputError) as err:
        write_profile(good, bad, force=True)
    assert err.value.field == "prof.toml:efficiency.compute" and err.value.value == 850.0
    nan = dc_replace(HARDWARE["H100 SXM"], efficiency=dc_replace(TRUE, step_overhead_s=float("nan")))
    with pytest.raises(InputError):
        write_profile(good, nan, force=True)
    assert good.read_bytes() == before and load_profile(good) == HARDWARE["H100 SXM"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prof.toml"]  # no temp file left
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError) as err:
        write_profile(tmp_path / "afile" / "p.toml", HARDWARE["H100 SXM"])
    assert err.value.field == "--out"


def test_cli_calibrate_force_on_bandwidth_bound_sweep_keeps_a_loadable_profile(tmp_path):
    """calibrate --force over a good profile with batch sizes that never reach compute-bound: the
    new profile loads, its compute efficiency is the prior (not 850), and the CLI says so."""
    good = tmp_path / "good.toml"
    measured = _write_measured(tmp_path, synthetic(noise=0.01))
    r = runner.invoke(app, ["calibrate", str(measured), "--out", str(good), "--context-len", "1024"])
    assert r.exit_code == 0, r.output + r.stderr
    small = tmp_path / "small"
    small.mkdir()
    p = _write_measured(small, synthetic(bss=(1, 2, 4), noise=0.01))
    r = runner.invoke(app, ["calibrate", str(p), "--out", str(good), "--force", "--context-len", "1024"])
    assert r.exit_code == 0, r.output + r.stderr
    out = " ".join(r.stdout.split())
    assert "not identifiable from batch sizes [1, 2, 4]: compute efficiency" in out
    assert "kept at the prior 0.700" in out
    hw = load_profile(good)
    assert hw.efficiency.compute == pytest.approx(Efficiency().compute, rel=1e-3)
    assert hw.efficiency.bandwidth == pytest.approx(TRUE.bandwidth, rel=0.05)
    r = runner.invoke(app, ["calibrate", str(p), "--out", str(tmp_path / "j.toml"), "--json",
                            "--context-len", "1024"])
    doc = json.loads(r.stdout)
    assert "compute" in doc["not_identifiable"] and doc["batch_sizes"] == [1, 2, 4]
    import tomllib

    assert "compute" in tomllib.loads((tmp_path / "j.toml").read_text())["meta"]["not_identifiable"]
