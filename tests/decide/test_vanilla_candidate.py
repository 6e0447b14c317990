"""Vanilla is a candidate (issue 30 part 7): where an engine without speculation beats every DSD K
beyond its interval, analyze, the table, the selector, the exports and the validate report say so.

Synthetic rows with a known truth (no vLLM): a step-time model where speculation wins at small batch
sizes and K=0 wins at large ones, and a vanilla engine whose step is ``VANILLA`` x the K=0 step
(vLLM's K=0 still runs the drafter: 5-12 % on the toy pair)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dsdprof.decide.analysis import analyze
from dsdprof.decide.vanilla import vanilla_records
from dsdprof.export.api import format_table
from dsdprof.export.table import build_table, vanilla_warning
from dsdprof.formats.ktable import TableError, validate_table
from dsdprof.report.vanilla import vanilla_line
from dsdprof.serve.runtime import KSelector, VanillaGap

SIZES = (1, 4, 16, 64, 256)
KS = (0, 1, 2, 3)
VANILLA = 0.88  # vanilla's step / K=0's: vanilla 1/0.88 - 1 = 13.6 % ahead of K=0


def _itl(b: int, k: int) -> float:
    return 0.010 + 0.0012 * k + 0.0004 * b * (k + 1)


def _al(k: int) -> float:
    return float(sum(0.7 ** i for i in range(k + 1)))


def rows(vanilla: float = VANILLA, seed: int = 0, wave_noise: float = 0.02, waves: int = 24, repeats: int = 3,
         with_vanilla: bool = True) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    out = []
    for b in SIZES:
        for r in range(repeats):
            cells = [("dsd", k, _al(k), _itl(b, k)) for k in KS]
            if with_vanilla:
                cells.append(("vanilla", 0, 1.0, _itl(b, 0) * vanilla))
            for mode, k, al, itl in cells:
                # no drift between repeats: the intervals' model
                s_itl = itl * rng.lognormal(0.0, wave_noise, waves)
                s_al = (np.ones(waves) if k == 0
                        else np.clip(al * rng.lognormal(0.0, 0.02, waves), 1.0, k + 1.0))
                out.append({"mode": mode, "batch_size": b, "num_spec_tokens": k, "repeat": r, "status": "ok",
                            "acceptance_length": float(s_al.mean()), "itl_s": float(s_itl.mean()),
                            "sample_acceptance_length": s_al.tolist(), "sample_itl_s": s_itl.tolist()})
    return pd.DataFrame(out)


def _truth_gain(b: int, vanilla: float = VANILLA) -> float:
    """vanilla goodput / the best K's - 1, from the exact model."""
    best = max(_al(k) / _itl(b, k) for k in KS)
    return (1.0 / (_itl(b, 0) * vanilla)) / best - 1.0


@pytest.fixture(scope="module")
def result():
    return analyze(rows())


# ----------------------------------------------------------------------------- analysis

def test_analysis_flags_where_vanilla_beats_every_k_with_the_gap_and_its_interval(result):
    opt = result.optimal.set_index("batch_size")
    flagged = [b for b in SIZES if opt.loc[b, "vanilla_faster"]]
    truth = [b for b in SIZES if _truth_gain(b) > 0.03]
    assert truth == [64, 256] and flagged == truth  # speculation wins at 1-16, vanilla at 64 and 256
    for b in flagged:
        lo, hi, gain = (opt.loc[b, c] for c in ("vanilla_gain_low", "vanilla_gain_high", "vanilla_gain"))
        assert 0 < lo <= gain <= hi
        assert lo <= _truth_gain(b) <= hi and abs(gain - _truth_gain(b)) < 0.03
    for b in (1, 4, 16):
        assert opt.loc[b, "vanilla_gain"] < 0 and not opt.loc[b, "vanilla_faster"]
    line = vanilla_line(result.optimal, result.confidence)
    assert line and "BS 64 +" in line and "BS 256 +" in line and "BS 16" not in line and "[" in line


def test_a_gap_inside_the_noise_is_not_called_and_k0_is_no_vanilla():
    noisy = analyze(rows(vanilla=0.985, wave_noise=0.15, waves=6, repeats=2, seed=3))
    opt = noisy.optimal.set_index("batch_size")
    assert opt.loc[256, "vanilla_gain"] > 0  # vanilla ahead on the point ...
    assert not opt["vanilla_faster"].any()  # ... but not beyond its interval
    none = analyze(rows(with_vanilla=False))  # the K=0 stand-in baseline is no vanilla engine
    assert not none.optimal["vanilla_faster"].any() and none.optimal["vanilla_gain"].isna().all()
    assert vanilla_line(none.optimal, none.confidence) is None


# ----------------------------------------------------------------------------- the table

def test_table_records_the_batch_size_ranges_and_old_readers_still_load(result):
    table = json.loads(json.dumps(build_table(result, source="synthetic")))
    records = table["vanilla_faster"]
    assert [(r["batch_size"], r["start"], r["end"]) for r in records] == [(64, 33, 128), (256, 129, 1 << 20)]
    assert records == vanilla_records(result.optimal)
    for r in records:
        assert 0 < r["ci_low"] <= r["gain"] <= r["ci_high"] and r["k"] == 0
    assert table["schema"] == "dsdprof.ktable/v2"  # an optional field: same version, old readers ignore it
    old = {k: v for k, v in table.items() if k != "vanilla_faster"}
    assert KSelector.from_dict(old).vanilla == () and validate_table(table)


@pytest.mark.parametrize("bad, field", [
    ([{"start": 0, "end": 4, "gain": 0.1}], "vanilla_faster[0].start"),
    ([{"start": 5, "end": 4, "gain": 0.1}], "vanilla_faster[0].end"),
    ([{"start": 1, "end": 4, "gain": -0.1}], "vanilla_faster[0].gain"),
    ([{"start": 1, "end": 9, "gain": 0.1}, {"start": 5, "end": 12, "gain": 0.1}], "vanilla_faster[1].start"),
    ([{"start": 1, "end": 4, "gain": 0.1, "ci_low": "x"}], "vanilla_faster[0].ci_low"),
    ("16..64", "vanilla_faster"),
])
def test_bad_vanilla_records_name_the_field(bad, field):
    doc = {"schema": "dsdprof.ktable/v1", "ranges": [[1, 1 << 20, 2]], "vanilla_faster": bad}
    with pytest.raises(TableError, match=field.replace("[", r"\[").replace("]", r"\]")):
        validate_table(doc)


# ----------------------------------------------------------------------------- the selector

def test_selector_exposes_it_and_select_is_unchanged(result):
    table = build_table(result, source="synthetic")
    sel = KSelector.from_dict(table)
    plain = KSelector.from_dict({k: v for k, v in table.items() if k != "vanilla_faster"})
    gap = sel.vanilla_faster(64)
    assert isinstance(gap, VanillaGap) and gap.start == 33 and gap.end == 128 and gap.gain > 0
    assert gap.ci_low <= gap.gain <= gap.ci_high and sel.vanilla_faster(10**6).start == 129
    assert sel.vanilla_faster(16) is None and sel.vanilla_faster(32) is None
    assert plain.vanilla_faster(64) is None
    assert [sel.select(b) for b in range(0, 5000)] == [plain.select(b) for b in range(0, 5000)]
    assert sel.select.__code__.co_code == plain.select.__code__.co_code  # the hot path knows nothing of it
    v3 = dict(table, schema="dsdprof.ktable/v3", contexts=[
        {"max_context": 4096, "ranges": table["ranges"],
         "vanilla_faster": [{"start": 1, "end": 8, "gain": 0.05}]},
        {"max_context": 1 << 24, "ranges": table["ranges"]}])
    s3 = KSelector.from_dict(v3)
    assert s3.for_context(100).vanilla_faster(4).gain == 0.05
    assert s3.for_context(10**6).vanilla_faster(4) is None
    assert s3.vanilla_faster(64) == gap  # the batch-size-only answer's records


# ----------------------------------------------------------------------------- the exports

def test_every_export_warns_with_the_gap(result):
    table = build_table(result, source="synthetic")
    for fmt, engine in (("vllm", "vLLM"), ("trtllm", "TensorRT-LLM"), ("table", "vLLM")):
        doc = format_table(table, fmt)
        assert len(doc.warnings) == 1, fmt
        w = doc.warnings[0]
        assert "33..128 +" in w and "129..1048576 +" in w and engine in w and "%" in w and "[" in w
    vllm = format_table(table, "vllm").doc
    # vLLM's config takes no unknown keys: the warning and the table say it
    assert "vanilla_faster" not in vllm
    plain = {k: v for k, v in table.items() if k != "vanilla_faster"}
    assert vanilla_warning(plain) is None and format_table(plain, "vllm").warnings == []


# ----------------------------------------------------------------------------- validate

def _validate_rows(vanilla: float, seed: int = 0) -> pd.DataFrame:
    """A validate run's rows: vanilla, fixed K=1 and K=3, and the table's DSD (K of the truth)."""
    rng = np.random.default_rng(seed)
    out = []
    for b in (1, 64):
        k_dsd = max(KS, key=lambda k: _al(k) / _itl(b, k))
        for r in range(3):
            for mode, k in (("vanilla", 0), ("fixed", 1), ("fixed", 3), ("dsd", k_dsd)):
                itl = _itl(b, k) * (vanilla if mode == "vanilla" else 1.0)
                s_itl = itl * rng.lognormal(0.0, 0.02, 16)
                s_al = np.full(16, _al(k) if mode != "vanilla" else 1.0)
                out.append({"mode": mode, "batch_size": b, "num_spec_tokens": k, "repeat": r, "status": "ok",
                            "acceptance_length": float(s_al.mean()), "itl_s": float(s_itl.mean()),
                            "sample_acceptance_length": s_al.tolist(), "sample_itl_s": s_itl.tolist(),
                            "tokens_per_s_per_user": float(s_al.mean() / s_itl.mean())})
    return pd.DataFrame(out)


def test_validate_report_says_where_vanilla_beats_every_variant():
    from dsdprof.report.vanilla import validate_vanilla, validate_vanilla_line

    gaps = validate_vanilla(_validate_rows(VANILLA), 0.9)
    assert list(gaps["batch_size"]) == [64]
    g = gaps.iloc[0]
    truth = 1.0 / VANILLA - 1.0  # DSD serves K=0 at 64: vanilla is 13.6 % ahead of it
    assert g["variant"] == "dsd" and g["gain_low"] <= truth <= g["gain_high"]
    assert abs(g["gain"] - truth) < 0.02
    line = validate_vanilla_line(gaps, 0.9)
    assert "BS 64 +1" in line and "over dsd" in line and "BS 1 " not in line
    assert validate_vanilla(_validate_rows(1.0), 0.9).empty  # no gap: nothing said
    assert validate_vanilla_line(validate_vanilla(_validate_rows(1.0), 0.9), 0.9) is None


# ----------------------------------------------------------------------------- the commands

def _write_run(out, frame: pd.DataFrame, prov: dict) -> None:
    from dsdprof.formats.measurements import empty_row
    from dsdprof.io.store import SweepWriter

    w = SweepWriter(out, {"engine": {}, "workload": {}})
    w.start(prov)
    for i, rec in enumerate(frame.to_dict("records")):
        row = empty_row()
        row.update(rec)
        row["cell_id"] = f"{row['mode']}-bs{row['batch_size']}-k{row['num_spec_tokens']}-r{i}"
        w.write_row(row)


PROV = {"engine": "vllm", "engine_version": "0.32.0", "model": "target", "draft_model": "draft",
        "method": "eagle3", "hardware": "cpu", "dtype": "bfloat16", "dataset": "synthetic", "seed": 0}


@pytest.mark.slow  # ~6 s
def test_analyze_export_and_validate_report_say_it(tmp_path):
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    runner = CliRunner()
    _write_run(tmp_path / "sweep", rows(), PROV)
    r = runner.invoke(app, ["analyze", str(tmp_path / "sweep")], terminal_width=80)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "vanilla (no speculative config) beats every K beyond its 90% interval at BS 64 +" in text
    assert "BS 256 +" in text and "BS 16 " not in text.split("beats every K")[1]
    r = runner.invoke(app, ["export", str(tmp_path / "sweep"), "--format", "vllm"], terminal_width=80)
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "vanilla (no speculative config) measured faster than every K at batch sizes 33..128 +" in err
    assert "route those batch sizes to a deployment without speculation" in err
    _write_run(tmp_path / "val", _validate_rows(VANILLA), dict(PROV, extra_run_kind="validate"))
    r = runner.invoke(app, ["validate-report", str(tmp_path / "val")], terminal_width=80)
    assert r.exit_code == 0, r.output
    want = "vanilla beats every speculative variant beyond its 90% interval at BS 64 +1"
    assert want in " ".join(r.stdout.split())


def test_plots_mark_vanilla(result):
    pytest.importorskip("matplotlib")
    from dsdprof.report import plots
    from dsdprof.report.compare import compare
    from dsdprof.report.vanilla import validate_vanilla

    fig = plots.optimal_k_figure(result)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert sum(t.startswith("vanilla\n+13") for t in texts) == 2  # BS 64 and 256, with the gap
    assert any("vanilla faster than every K" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    heat = plots.goodput_heatmap_figure(result)
    dashed = [p for p in heat.axes[0].patches if p.get_linestyle() == "--"]
    assert len(dashed) == 2 and "dashed: vanilla beats every K" in " ".join(heat._suptitle.get_text().split())
    df = _validate_rows(VANILLA)
    tops = plots.tops_figure(compare(df), {}, validate_vanilla(df, 0.9))
    assert [t.get_text()[:3] for t in tops.axes[0].texts] == ["+14"]
    plain = analyze(rows(with_vanilla=False))
    assert not [t for t in plots.optimal_k_figure(plain).axes[0].texts if t.get_text().startswith("vanilla")]


def test_show_says_it(result, tmp_path):
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    path = tmp_path / "t.json"
    path.write_text(json.dumps(build_table(result, source="synthetic")))
    r = CliRunner().invoke(app, ["show", str(path)], terminal_width=80)
    assert r.exit_code == 0
    assert "measured faster than every K at batch sizes 33..128 +" in " ".join(r.stdout.split())
