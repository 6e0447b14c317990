import json

import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app

runner = CliRunner()


def _one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0, err
    assert "Traceback" not in result.output + result.stderr
    for n in needles:
        assert n in err, err


@pytest.fixture
def measured(tmp_path, dense_like_frame):
    p = tmp_path / "m.parquet"
    dense_like_frame.to_parquet(p)
    return p


def test_help_on_every_command():
    for cmd in ["sweep", "analyze", "export", "show", "toy-models"]:
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "Usage" in r.output


def test_analyze_export_show_roundtrip(tmp_path, measured):
    r = runner.invoke(app, ["analyze", str(measured)])
    assert r.exit_code == 0 and "monotonic" in r.output
    r = runner.invoke(app, ["analyze", str(measured), "--json"])
    doc = json.loads(r.output)
    assert doc["monotonic"] is True and doc["optimal"][0]["batch_size"] == 1
    out = tmp_path / "t.json"
    r = runner.invoke(app, ["export", str(measured), "-o", str(out)])
    assert r.exit_code == 0, r.output
    table = json.loads(out.read_text())
    assert table["schema"] == "dsdprof.ktable/v2"
    r = runner.invoke(app, ["show", str(out)])
    assert r.exit_code == 0 and "profiled points" in r.output
    r = runner.invoke(app, ["export", str(out), "--format", "vllm"])
    cfg = json.loads(r.output)
    assert cfg["num_speculative_tokens_per_batch_size"] == table["ranges"]
    r = runner.invoke(app, ["export", str(measured), "--format", "vllm"])
    assert json.loads(r.output)["num_speculative_tokens"] == max(x[2] for x in table["ranges"])


def test_export_never_overwrites(tmp_path, measured):
    out = tmp_path / "t.json"
    out.write_text("keep me")
    r = runner.invoke(app, ["export", str(measured), "-o", str(out)])
    _one_line_error(r, "--output", "exists")
    assert out.read_text() == "keep me"
    r = runner.invoke(app, ["export", str(measured), "-o", str(out), "--force"])
    assert r.exit_code == 0 and json.loads(out.read_text())["schema"] == "dsdprof.ktable/v2"


def test_bad_inputs_are_one_line_exit_2(tmp_path, measured, dense_like_frame):
    _one_line_error(runner.invoke(app, ["analyze", str(tmp_path / "nope")]), "measurements=")
    _one_line_error(runner.invoke(app, ["analyze", str(measured), "--tolerance", "1.5"]), "tolerance=1.5")
    bad = dense_like_frame.copy()
    bad.loc[0, "itl_s"] = -1.0
    bp = tmp_path / "bad.parquet"
    bad.to_parquet(bp)
    _one_line_error(runner.invoke(app, ["analyze", str(bp)]), "itl_s=-1.0")
    _one_line_error(runner.invoke(app, ["export", str(bp), "-o", str(tmp_path / "o.json")]), "itl_s")
    assert not (tmp_path / "o.json").exists()
    _one_line_error(runner.invoke(app, ["export", str(measured), "--format", "yaml"]), "--format='yaml'")
    tj = tmp_path / "t.json"
    tj.write_text(json.dumps({"schema": "dsdprof.ktable/v1", "ranges": [[1, 4, 2], [6, 9, 1]]}))
    _one_line_error(runner.invoke(app, ["show", str(tj)]), "ranges[1]")
    spec = tmp_path / "s.toml"
    spec.write_text('[engine]\nmodel = "m"\ndraft_model = "d"\nfoo = 1\n')
    _one_line_error(runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "run")]), "engine.foo")
    assert not (tmp_path / "run").exists()
    _one_line_error(runner.invoke(app, ["sweep", str(tmp_path / "none.toml"), "--out", str(tmp_path / "r")]),
                    "spec=")
    _one_line_error(runner.invoke(app, ["toy-models", str(tmp_path / "t"), "--kind", "big"]), "--kind")


def test_sweep_refuses_existing_out(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('[engine]\nmodel = "m"\ndraft_model = "d"\n')
    out = tmp_path / "run"
    out.mkdir()
    (out / "precious.txt").write_text("x")
    _one_line_error(runner.invoke(app, ["sweep", str(spec), "--out", str(out)]), "out=", "--resume")
    assert (out / "precious.txt").read_text() == "x"


def test_sweep_where_every_cell_failed_exits_1_with_the_first_error(tmp_path):
    # a 70B in bf16 does not fit one 48 GB GPU: the analytic engine fails every cell, vanilla included
    spec = tmp_path / "s.toml"
    spec.write_text("""
[engine]
name = "sim"
model = "Llama-3.1-70B"
method = "ngram"
dtype = "bfloat16"
[sweep]
batch_sizes = [1, 2]
num_spec_tokens = [0, 2]
waves = 1
output_len = 16
[sim]
hardware = "L40S"
acceptance_per_pos = [0.7, 0.5]
""")
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "run")])
    assert r.exit_code == 1, r.output
    assert "every cell failed; first error:" in r.stderr and "out of memory" in r.stderr


# ----------------------------------------------------------------------------- partial runs, run kinds

OOM_SPEC = """\
[engine]
name = "sim"
model = "Llama-3.1-8B"
draft_model = "EAGLE3-Llama-3.1-8B"
method = "eagle3"
dtype = "bfloat16"
max_model_len = 32768
[sweep]
batch_sizes = [1, 8, 64]
num_spec_tokens = [0, 2, 4]
waves = 2
[workload]
input_len = {input_len}
[sim]
hardware = "RTX 4090"
acceptance_alpha = 0.8
"""


def _sim_run(tmp_path, name="run", input_len=16000):
    spec = tmp_path / f"{name}.toml"
    spec.write_text(OOM_SPEC.format(input_len=input_len))
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / name)])
    assert r.exit_code == 0, r.output
    return tmp_path / name


def test_export_refuses_batch_sizes_that_produced_no_number(tmp_path):
    """BS 8 and 64 are predicted out of memory on a 24 GB GPU at 16k context: analyze names them,
    export refuses in one line (naming them and why), --allow-partial records them in the table."""
    run = _sim_run(tmp_path)
    r = runner.invoke(app, ["analyze", str(run)])
    assert r.exit_code == 0 and "no ok cell at batch size 8, 64" in " ".join(r.stderr.split())
    _one_line_error(runner.invoke(app, ["export", str(run)]), "batch_sizes=[8, 64]", "out of memory",
                    "--allow-partial")
    _one_line_error(runner.invoke(app, ["export", str(run), "--format", "vllm"]), "batch_sizes=[8, 64]")
    r = runner.invoke(app, ["export", str(run), "--allow-partial"])
    assert r.exit_code == 0, r.output
    table = json.loads(r.stdout)
    assert "no ok cell at batch size 8, 64" in table["provenance"]["partial"]
    assert "partial run" in r.stderr


def test_export_refuses_an_interrupted_run_against_its_manifest_grid(tmp_path, dense_like_frame):
    """The rows alone look complete; the manifest's grid says BS 64 and K=5 were never run."""
    from dsdprof.formats.measurements import empty_row
    from dsdprof.io.store import SweepWriter

    run = tmp_path / "interrupted"
    done = dense_like_frame[(dense_like_frame["batch_size"] < 64) & (dense_like_frame["num_spec_tokens"] < 5)]
    grid = {"batch_sizes": sorted(int(b) for b in dense_like_frame["batch_size"].unique()),
            "num_spec_tokens": sorted(int(k) for k in dense_like_frame["num_spec_tokens"].unique())}
    with SweepWriter(run, {"engine": {}, "sweep": grid, "workload": {}}) as w:
        w.start({"engine": "vllm", "hardware": "cpu"})
        for i, rec in enumerate(done.to_dict("records")):
            row = empty_row()
            row.update(rec, mode="dsd", status="ok", cell_id=f"dsd-{i}")
            w.write_row(row)
    r = runner.invoke(app, ["export", str(run)])
    _one_line_error(r, "batch_sizes=[64]", "partial run")
    r = runner.invoke(app, ["analyze", str(run), "--json"])
    cov = json.loads(r.stdout)["coverage"]
    assert cov["missing_batch_sizes"] == [64] and [1, 5] in cov["missing_cells"]


@pytest.mark.slow  # ~3 s
def test_validate_runs_are_refused_by_export_and_analyze(tmp_path, dense_like_frame):
    from dsdprof.formats.measurements import empty_row
    from dsdprof.io.store import SweepWriter

    run = tmp_path / "validate-run"
    with SweepWriter(run, {"engine": {}, "sweep": {}, "validate": {"table": "t.json", "fixed_ks": [3]}}) as w:
        w.start({"engine": "vllm", "hardware": "cpu"})
        for i, rec in enumerate(dense_like_frame.to_dict("records")):
            row = empty_row()
            row.update(rec, mode="fixed", status="ok", cell_id=f"fixed-{i}")
            w.write_row(row)
    _one_line_error(runner.invoke(app, ["export", str(run)]), "is a validate run", "validate-report")
    _one_line_error(runner.invoke(app, ["analyze", str(run)]), "is a validate run")


@pytest.mark.slow  # ~3 s
def test_pooling_runs_of_different_input_len_needs_allow_mixed_and_is_recorded(tmp_path):
    both = tmp_path / "both"
    both.mkdir()
    _sim_run(both, "short", input_len=512)
    _sim_run(both, "long", input_len=1024)
    _one_line_error(runner.invoke(app, ["analyze", str(both)]), "spec.workload.input_len=", "--allow-mixed")
    _one_line_error(runner.invoke(app, ["export", str(both)]), "spec.workload.input_len=")
    r = runner.invoke(app, ["analyze", str(both), "--allow-mixed", "--json"])
    assert r.exit_code == 0, r.output
    prov = json.loads(r.stdout)["provenance"]
    assert prov["pooled_workload.input_len"] in ("1024 | 512", "512 | 1024")
    assert "short" in prov["pooled_runs"] and "long" in prov["pooled_runs"]
    r = runner.invoke(app, ["analyze", str(both), "--allow-mixed"])
    assert "pooled runs (--allow-mixed)" in r.stdout


@pytest.mark.slow  # four CLI subprocesses
def test_analyze_and_export_exit_0_quietly_on_a_closed_pipe(tmp_path, measured):
    """`dsdprof analyze | head`: stdout is a pipe whose reader has gone (closed before the first
    write, so every write fails): exit 0, no error line, no traceback."""
    import os
    import subprocess
    import sys

    procs = []
    for args in (["analyze", str(measured)], ["analyze", str(measured), "--wide"],
                 ["export", str(measured), "--format", "vllm"], ["analyze", str(measured), "--csv"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:  # the four start together: each spends seconds importing, the assertion is per process
            procs.append((args,
                          subprocess.Popen([sys.executable, "-m", "dsdprof.cli", *args], stdout=write_end,
                                                 stderr=subprocess.PIPE, text=True)))
        finally:
            os.close(write_end)
    for args, p in procs:
        _, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, (args, stderr)
        assert "error" not in stderr.lower() and "Traceback" not in stderr, (args, stderr)


# ----------------------------------------------------------------------------- progress in logs

def test_sweep_progress_in_a_log_is_one_plain_line_per_cell(tmp_path):
    """stderr not a terminal (nohup, Slurm, CI): no bar, one line per finished cell with the
    count, the cell, its status, the rate and the ETA."""
    run = tmp_path / "run"
    spec = tmp_path / "s.toml"
    spec.write_text(OOM_SPEC.format(input_len=16000))
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(run)])
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("sweep [")]
    assert len(lines) == 12 and "━" not in r.stderr
    assert lines[-1].startswith("sweep [12/12] ") and "cells/min" in lines[-1] and "ETA" in lines[-1]
    assert any("failed: MemoryError" in line for line in lines)


def test_log_progress_prints_a_periodic_line_while_a_cell_runs():
    import io
    import time
    from types import SimpleNamespace

    from rich.console import Console

    from dsdprof.cli.progress import LogProgress

    buf = io.StringIO()
    cell = SimpleNamespace(batch_size=64, num_spec_tokens=3, mode="dsd")
    with LogProgress(Console(file=buf, width=200), "sweep", heartbeat_s=0.05) as log:
        log(SimpleNamespace(phase="plan", index=0, total=4, cell=None, status="", message="4 cells"))
        log(SimpleNamespace(phase="start", index=0, total=4, cell=cell, status="", message=""))
        time.sleep(0.4)
    beats = [line for line in buf.getvalue().splitlines() if "running BS 64 K 3 dsd for" in line]
    assert beats and beats[0].startswith("sweep [0/4] ")


def test_log_progress_eta_counts_a_paired_unit_whole():
    """The first row of a paired unit arrives after the whole unit ran: the ETA counts all its rows."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from dsdprof.cli.progress import LogProgress
    from dsdprof.measure.engine import Cell

    clock = iter([0.0] + [60.0] * 20)
    buf = io.StringIO()
    log = LogProgress(Console(file=buf, width=200), "sweep", clock=lambda: next(clock))
    ks = (0, 1, 2)
    unit = [Cell(0, 1, "vanilla", 0, group=ks)] + [Cell(0, 1, "dsd", k, group=ks) for k in ks]
    log(SimpleNamespace(phase="plan", index=0, total=8, cell=None, status="", message="8 cells"))
    log(SimpleNamespace(phase="done", index=1, total=8, cell=unit[0], status="ok", message="",
                        acceptance_length=1.0, itl_s=0.1))
    first = buf.getvalue().splitlines()[-1]
    assert "ETA 1m00s" in first, first  # 4 rows in 60 s, 4 left (not 1 row in 60 s, 7 left)


def test_analyze_with_intervals_fits_80_columns_one_line_per_batch_size(tmp_path):
    """Repeats give intervals (and undecided sizes); margins up to +300 % stay within 80 columns."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(1)
    sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    rows = [dict(batch_size=b, num_spec_tokens=k, acceptance_length=1 + 0.8 * k ** 0.5, repeat=r,
                 itl_s=(0.0123 + 0.0007 * k * b ** 0.7) * (1 + 0.03 * rng.standard_normal()))
            for r in range(3) for b in sizes for k in range(8)]
    p = tmp_path / "noisy.parquet"
    pd.DataFrame(rows).to_parquet(p)
    r = runner.invoke(app, ["analyze", str(p)], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80, r.stdout
    body = [line for line in lines if line.split()[:1] and line.split()[0].isdigit()
            and line.rstrip().endswith("x")]
    assert [int(line.split()[0]) for line in body] == list(sizes)
    assert any(" no " in line for line in body) and any(" yes " in line for line in body)
    assert "still possible" in r.stdout  # undecided sizes name the Ks the data still allow


# --------------------------------------------------------------------------- a large sweep's start (issue 31)

HUGE_SPEC = """
[engine]
name = "sim"
model = "Llama-3.1-8B"
draft_model = "EAGLE3-Llama-3.1-8B"
method = "eagle3"
max_model_len = 4096
[sweep]
batch_sizes = [{sizes}]
num_spec_tokens = [0, 1, 2, 3, 4, 5, 6]
repeats = 140
waves = 3
output_len = 16
[sim]
hardware = "H100 SXM"
acceptance_alpha = 0.8
"""  # 1000 batch sizes x (7 K + vanilla) x 140 repeats = 1,120,000 cells


def _huge_spec(tmp_path):
    p = tmp_path / "huge.toml"
    p.write_text(HUGE_SPEC.format(sizes=", ".join(str(b) for b in range(1, 1001))))
    return p


def test_a_huge_sweep_prints_its_grid_before_building_a_cell(tmp_path, monkeypatch):
    """The order, not a wall-clock bound: the run's first event (the grid, from the spec's sizes)
    comes before the engine starts or any cell is built, and cells are built as the loop reaches
    them (a 1.12 M cell grid builds a handful before its first row)."""
    from dsdprof.config.spec import load_spec
    from dsdprof.measure import runner as runner_mod

    log: list[str] = []
    real_iter = runner_mod.iter_cells

    def counting_iter(*args, **kwargs):
        for cell in real_iter(*args, **kwargs):
            log.append("cell")
            yield cell

    class Enough(Exception):
        pass

    def on_progress(ev):
        log.append(f"{ev.phase}: {ev.message}" if ev.phase in ("begin", "plan") else ev.phase)
        if ev.phase == "done" and ev.index == 3:
            raise Enough

    monkeypatch.setattr(runner_mod, "iter_cells", counting_iter)
    with pytest.raises(Enough):
        runner_mod.run_sweep(load_spec(_huge_spec(tmp_path)), tmp_path / "run", on_progress=on_progress)
    assert log[0] == ("begin: grid 1000 batch sizes x (7 K + vanilla) x 140 repeat(s) = 1,120,000 cells; "
                      "starting engine sim"), log[:3]
    assert log[1] == "plan: 1,120,000 cells, speculation mode dsd, design cell by cell"
    assert log[2:] == ["cell", "start", "done"] * 3, log[:12]  # built one at a time, never ahead


@pytest.mark.slow  # a CLI subprocess
def test_a_huge_sweep_says_what_it_does_at_once_in_a_log(tmp_path):
    """As a user sees it (a subprocess, stderr a pipe): the first lines are the notice and the grid,
    before any cell; the time to them is printed, bounded loosely (the machine may be loaded)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "dsdprof.cli", "sweep", str(_huge_spec(tmp_path)), "--out",
           str(tmp_path / "run")]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        first = [proc.stderr.readline(), proc.stderr.readline()]
        elapsed = time.monotonic() - t0
    finally:
        proc.send_signal(signal.SIGTERM)  # SIGTERM unwinds like Ctrl-C: rows flushed, lock released
        proc.communicate(timeout=120)
    print(f"first two lines after {elapsed:.2f} s: {first}")
    assert first[0].startswith("engine 'sim': rows are analytic predictions"), first
    assert first[1].startswith("sweep: grid 1000 batch sizes") and "= 1,120,000 cells" in first[1], first
    assert elapsed < 60  # ~1 s here; before issue 31 the first line waited for all 1.12 M cells


def test_dry_run_counts_a_huge_grid_without_building_it(tmp_path, monkeypatch):
    """--dry-run counts cells and engine waves from the spec's sizes; the count is the cells the
    sweep runs (cross-checked cell by cell on small grids, every design, mode and context axis)."""
    from dsdprof.config.spec import load_spec, parse_spec
    from dsdprof.measure import runner as runner_mod

    real_iter = runner_mod.iter_cells
    monkeypatch.setattr(runner_mod, "iter_cells",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    plan = runner_mod.plan_sweep(load_spec(_huge_spec(tmp_path)))
    assert plan.cells == 1_120_000 and plan.engine_waves == 1_120_000 * 4
    r = runner.invoke(app, ["sweep", str(_huge_spec(tmp_path)), "--out", str(tmp_path / "run"), "--dry-run"])
    assert r.exit_code == 0 and "1,120,000 cells" in r.stdout and "(1000 values)" in r.stdout, r.output
    assert max(map(len, r.stdout.splitlines())) <= 80
    monkeypatch.setattr(runner_mod, "iter_cells", real_iter)
    for sweep in ({"batch_sizes": [1, 4, 16], "num_spec_tokens": [0, 2, 3], "waves": 5, "repeats": 2},
                  {"batch_sizes": [2, 8], "num_spec_tokens": [1, 2], "waves": 3, "design": "cells"},
                  {"batch_sizes": [2, 8], "num_spec_tokens": [0], "waves": 3},
                  {"batch_sizes": [1, 2], "num_spec_tokens": [0, 2], "waves": 4, "context_lens": [64, 512]}):
        spec = parse_spec({"engine": {"model": "m", "method": "ngram"}, "sweep": sweep})
        for mode in ("dsd", "fixed"):
            for paired in (False, True):
                grid = runner_mod.GridPlanner(spec).cells(mode, paired)
                cells = list(grid)
                assert len(grid) == len(cells) == len({c.cell_id for c in cells}), (sweep, mode)
                s = spec.sweep
                want = runner_mod.engine_waves(cells, s.waves, s.warmup)
                assert grid.engine_waves(s.waves, s.warmup) == want
                assert grid.paired == any(c.group for c in cells)


def test_log_heartbeat_is_at_most_10_s():
    """In a log, no more than HEARTBEAT_S <= 10 s pass without a line while the run is alive."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from dsdprof.cli.progress import HEARTBEAT_S, LogProgress

    assert HEARTBEAT_S <= 10
    now = [0.0]
    buf = io.StringIO()
    log = LogProgress(Console(file=buf, width=200), "sweep", clock=lambda: now[0])
    assert log.heartbeat_s == HEARTBEAT_S
    log(SimpleNamespace(phase="begin", index=0, total=0, cell=None, status="", message="grid ..."))
    now[0] = HEARTBEAT_S - 0.1
    assert log.beat() is None
    now[0] = HEARTBEAT_S
    assert log.beat() == "sweep [0/0] waiting; elapsed 10s"  # the engine still starting
    log(SimpleNamespace(phase="start", index=0, total=4,
                        cell=SimpleNamespace(batch_size=64, num_spec_tokens=3, mode="dsd"),
                        status="", message=""))
    now[0] = 2 * HEARTBEAT_S - 0.1
    assert log.beat() is None
    now[0] = 2 * HEARTBEAT_S
    assert log.beat() == "sweep [0/0] running BS 64 K 3 dsd for 10s; elapsed 20s"
    assert buf.getvalue().splitlines() == ["sweep: grid ...", "sweep [0/0] waiting; elapsed 10s",
                                           "sweep [0/0] running BS 64 K 3 dsd for 10s; elapsed 20s"]
