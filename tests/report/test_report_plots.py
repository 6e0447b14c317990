"""dsdprof plot: figures from sweeps and validate runs (headless, PNG)."""

from __future__ import annotations

import struct

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("matplotlib")

from dsdprof.decide.analysis import analyze  # noqa: E402
from dsdprof.errors import InputError  # noqa: E402
from dsdprof.formats.measurements import empty_row  # noqa: E402
from dsdprof.io.store import SweepWriter  # noqa: E402
from dsdprof.report import plots  # noqa: E402
from dsdprof.report.compare import compare  # noqa: E402

PROV = {"engine": "vllm", "engine_version": "0.32.0", "model": "/tmp/toys/dense/target",
        "draft_model": "/tmp/toys/dense/draft", "method": "draft_model", "hardware": "CPU: Test (2 cores)",
        "dtype": "float32", "dataset": "synthetic", "seed": 0, "dsdprof_version": "0.1.0"}


def write_run(out, frame: pd.DataFrame, prov: dict) -> None:
    w = SweepWriter(out, {"engine": {}, "workload": {}})
    w.start(prov)
    for i, rec in enumerate(frame.to_dict("records")):
        row = empty_row()
        row.update(rec)
        row["status"] = "ok"
        row["cell_id"] = f"{row['mode']}-bs{row['batch_size']}-k{row['num_spec_tokens']}-r{i}"
        w.write_row(row)


def sweep_frame(dense_like_frame: pd.DataFrame) -> pd.DataFrame:
    df = dense_like_frame.copy()
    df["mode"] = "dsd"
    df["acceptance_per_pos"] = [[0.8 ** (i + 1) for i in range(k)] for k in df["num_spec_tokens"]]
    van = df[df["num_spec_tokens"] == 0].assign(mode="vanilla", itl_s=lambda d: d["itl_s"] * 0.9)
    return pd.concat([df, van], ignore_index=True)


def validate_frame() -> pd.DataFrame:
    rows = []
    for b, (van, k3, dsd_k, dsd) in {1: (50, 100, 3, 98), 4: (40, 60, 3, 61), 16: (30, 28, 1, 31),
                                     64: (20, 12, 0, 15)}.items():
        rows.append({"mode": "vanilla", "batch_size": b, "num_spec_tokens": 0, "tokens_per_s_per_user": van})
        rows.append({"mode": "fixed", "batch_size": b, "num_spec_tokens": 3, "tokens_per_s_per_user": k3,
                     "acceptance_per_pos": [0.9, 0.8, 0.7]})
        rows.append({"mode": "dsd", "batch_size": b, "num_spec_tokens": dsd_k, "tokens_per_s_per_user": dsd,
                     "acceptance_per_pos": [0.9, 0.8, 0.7][:dsd_k]})
    df = pd.DataFrame(rows)
    df["acceptance_length"] = 1.0 + df["num_spec_tokens"] * 0.5
    df["itl_s"] = df["acceptance_length"] / df["tokens_per_s_per_user"]
    df["acceptance_per_pos"] = [a if isinstance(a, list) else [] for a in df["acceptance_per_pos"]]
    return df


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow  # draws every figure, ~4 s
def test_sweep_plots_written_and_refuse_overwrite(tmp_path, dense_like_frame):
    run = tmp_path / "run"
    write_run(run, sweep_frame(dense_like_frame), PROV)
    out = tmp_path / "png"
    paths = plots.plot_results(run, out)
    assert sorted(p.name for p in paths) == ["acceptance_per_position.png", "goodput_heatmap.png",
                                             "optimal_k.png"]
    for p in paths:
        w, h = png_size(p)
        assert w > 600 and h > 400
    with pytest.raises(InputError, match="exists"):
        plots.plot_results(run, out)
    assert len(plots.plot_results(run, out, force=True)) == 3


def test_validate_run_gets_tops_plot(tmp_path):
    run = tmp_path / "val"
    write_run(run, validate_frame(), dict(PROV, extra_run_kind="validate"))
    names = sorted(p.name for p in plots.plot_results(run, tmp_path / "png"))
    assert names == ["acceptance_per_position.png", "tokens_per_s_per_user.png"]


def test_optimal_k_figure_axes_and_title(dense_like_frame):
    a = analyze(sweep_frame(dense_like_frame), provenance=PROV)
    fig = plots.optimal_k_figure(a)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert "batch size" in ax.get_xlabel() and "K" in ax.get_ylabel()
    title = fig._suptitle.get_text()
    assert "dense/target" in title and "CPU: Test" in title
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8", "16", "32", "64"]
    # the profiled optimum markers sit at the analysis' K: filled where decided, hollow where not
    marked = {}
    for line in ax.get_lines():
        if line.get_label().startswith(("goodput-optimal", "undecided")):
            marked.update({int(x): (int(y), line.get_label())
                           for x, y in zip(line.get_xdata(), line.get_ydata())})
    assert [marked[int(b)][0] for b in a.optimal["batch_size"]] == a.optimal["k"].tolist()
    for b, d in zip(a.optimal["batch_size"], a.optimal["decided"]):
        assert marked[int(b)][1].startswith("goodput-optimal" if d else "undecided")


def test_optimal_k_figure_marks_undecided_points_with_their_interval(dense_like_frame):
    """Two noisy repeats: undecided batch sizes are hollow, with a bar over the Ks still possible."""
    import numpy as np

    rng = np.random.default_rng(0)
    frames = []
    for r in range(3):
        f = sweep_frame(dense_like_frame).copy()
        f["repeat"] = r
        noise = np.where(f["batch_size"] >= 16, 0.08, 0.001)  # quiet small batches, noisy large ones
        f["itl_s"] = f["itl_s"] * (1 + noise * rng.standard_normal(len(f)))
        frames.append(f)
    a = analyze(pd.concat(frames, ignore_index=True), provenance=PROV)
    undecided = [int(b) for b, d in zip(a.optimal["batch_size"], a.optimal["decided"]) if not d]
    assert undecided and len(undecided) < len(a.optimal)  # the fixture must exercise both kinds
    ax = plots.optimal_k_figure(a).axes[0]
    hollow = [line for line in ax.get_lines() if line.get_label().startswith("undecided")]
    assert len(hollow) == 1 and sorted(int(x) for x in hollow[0].get_xdata()) == undecided
    bars = [c for c in ax.collections if c.get_segments()]
    spans = {int(seg[0][0]) for c in bars for seg in c.get_segments()}
    wide = [b for b, c in zip(a.optimal["batch_size"], a.optimal["contenders"])
            if int(b) in undecided and len(c) > 1]
    assert spans == {int(b) for b in wide}


def test_heatmap_marks_chosen_k(dense_like_frame):
    a = analyze(sweep_frame(dense_like_frame), provenance=PROV)
    fig = plots.goodput_heatmap_figure(a)
    ax = fig.axes[0]
    assert len(ax.patches) == len(a.optimal)  # one box per batch size
    assert "goodput" in fig.axes[1].get_ylabel()
    # the separate vanilla baseline gets its own row below K=0
    assert [t.get_text() for t in ax.get_yticklabels()] == ["vanilla"] + [str(k) for k in a.candidate_ks]


def test_tops_figure_lines():
    c = compare(validate_frame())
    fig = plots.tops_figure(c, PROV)
    top = fig.axes[0]
    labels = [line.get_label() for line in top.get_lines()]
    assert labels == ["vanilla (no speculation)", "fixed K=3", "DSD (table)"]
    assert "tokens/s per user" in top.get_ylabel()
    bottom_labels = [line.get_label() for line in fig.axes[1].get_lines()]
    assert "below vanilla" in bottom_labels  # BS 64: 15 vs 20


def test_acceptance_table_uses_largest_k_per_bs():
    acc = plots.acceptance_table(validate_frame())
    assert set(acc["k"]) == {3}
    assert acc[acc["batch_size"] == 1]["acceptance"].tolist() == [0.9, 0.8, 0.7]
    with pytest.raises(InputError):
        plots.acceptance_figure(validate_frame().assign(num_spec_tokens=0))


def test_provenance_line_shortens_paths():
    assert plots.provenance_line(PROV).startswith("dense/target + dense/draft (draft_model)")
    assert "sim (predicted)" in plots.provenance_line(dict(PROV, engine="sim"))
    assert plots.provenance_line({}) == ""


def test_cli_plot_errors_are_one_line(tmp_path):
    from dsdprof.cli.app import app

    r = CliRunner().invoke(app, ["plot", str(tmp_path / "missing"), "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "error:" in r.output


def test_acceptance_figure_collapses_identical_curves():
    df = validate_frame()
    fig = plots.acceptance_figure(df[df["num_spec_tokens"] == 3], PROV)  # same curve at every BS
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["every batch size (1..64)"]
    varied = df.copy()
    varied["acceptance_per_pos"] = [[0.9 - 0.001 * b, 0.8, 0.7] if k == 3 else a
                                    for b, k, a in zip(varied["batch_size"], varied["num_spec_tokens"],
                                                       varied["acceptance_per_pos"])]
    labels = [line.get_label() for line in plots.acceptance_figure(varied, PROV).axes[0].get_lines()]
    assert labels == ["BS 1 (K=3)", "BS 4 (K=3)", "BS 16 (K=3)", "BS 64 (K=3)"]


def test_validate_report_regret_gate_is_a_fraction_and_export_refuses_the_run(tmp_path):
    """--max-regret is a fraction like --tolerance and --noise; the old --fail-on-regret PCT still
    works with one deprecation line; export and analyze refuse a validate run in one line."""
    from dsdprof.cli.app import app

    runner = CliRunner()
    run = tmp_path / "val"
    write_run(run, validate_frame(), dict(PROV, extra_run_kind="validate"))
    from dsdprof.io.readers import read_measurements

    worst = compare(read_measurements(run))["regret"].max()
    assert 0.01 < worst < 0.5  # the fixture's regret sits between the two limits below
    r = runner.invoke(app, ["validate-report", str(run), "--max-regret", "0.5"])
    assert r.exit_code == 0 and "deprecated" not in r.stderr, r.output
    r = runner.invoke(app, ["validate-report", str(run), "--max-regret", "0.01"])
    assert r.exit_code == 1 and "regret above 1.0%" in r.stdout
    r = runner.invoke(app, ["validate-report", str(run), "--fail-on-regret", "1"])
    assert r.exit_code == 1 and "use --max-regret 0.01" in r.stderr
    for args in (["--max-regret", "5"], ["--max-regret", "0.1", "--fail-on-regret", "10"]):
        r = runner.invoke(app, ["validate-report", str(run), *args])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.output
    for cmd in ("export", "analyze"):
        r = runner.invoke(app, [cmd, str(run)])
        assert r.exit_code == 2 and "is a validate run" in r.stderr and r.stderr.count("\n") == 1, r.output
