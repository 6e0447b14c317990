"""Crash tests on the analytic engine: real ``dsdprof sweep`` processes killed at random points.

After every ``kill -9`` the run directory must be readable with at most one row per cell and no
torn file visible to pandas; resuming to completion must give exactly one row per cell and an
intact manifest. Also: two sweeps on one OUT (the second exits 2 naming the holder; a killed
holder does not block), Ctrl-C (exit 130 with a one-line resume hint) and SIGTERM (exit 143, rows flushed).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from dsdprof.config.spec import load_spec
from dsdprof.io.manifest import parse_manifest
from dsdprof.io.runlock import HOLDER_NAME
from dsdprof.measure.engine import plan_cells


def holder_pid(out: Path) -> int | None:
    """The pid the holder file names."""
    try:
        return int(json.loads((out / HOLDER_NAME).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# The largest batch sizes do not fit an 80 GB card at this context (predicted out of memory), so
# every resume retries (and supersedes) failed cells as well as finishing the rest.
SPEC = """\
[engine]
name = "sim"
model = "Llama-3.1-8B"
draft_model = "EAGLE3-Llama-3.1-8B"
method = "eagle3"
dtype = "bfloat16"
max_model_len = 32768

[sweep]
batch_sizes = [{batch_sizes}]
num_spec_tokens = [0, 1, 2, 3, 4, 5, 6, 7]
waves = 20

[workload]
input_len = 1200

[sim]
hardware = "H100 SXM"
acceptance_alpha = 0.8
"""


def write_spec(path: Path, n_batch_sizes: int) -> Path:
    path.write_text(SPEC.format(batch_sizes=", ".join(str(b) for b in range(1, n_batch_sizes + 1))))
    return path


def expected_cells(spec_path: Path) -> set[str]:
    s = load_spec(spec_path).sweep
    return {c.cell_id for c in plan_cells(s.batch_sizes, s.num_spec_tokens, s.repeats, "dsd")}


def _default_sigint() -> None:
    # A shell without job control starts background commands (`make test &`, nohup jobs) with
    # SIGINT ignored, and Python keeps an inherited SIG_IGN: give the sweep the Ctrl-C of a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(spec: Path, out: Path, *extra: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
    with open(log, "ab") as err:
        return subprocess.Popen([sys.executable, "-m", "dsdprof.cli", "sweep", str(spec), "--out",
                                 str(out), *extra],
                                stdout=subprocess.DEVNULL, stderr=err, env=env, preexec_fn=_default_sigint)


def wait_for_holder(out: Path, pid: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while holder_pid(out) != pid:
        assert time.monotonic() < deadline, "sweep never took the lock"
        time.sleep(0.02)


def wait_for_start(out: Path, timeout_s: float = 30.0) -> None:
    """Until the engine has reported its provenance (cells run from here on)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if json.loads((out / "_sweep.json").read_text())["provenance"]:
                return
        except (OSError, ValueError, KeyError):
            pass
        assert time.monotonic() < deadline, "sweep never started"
        time.sleep(0.02)


def visible_rows(out: Path) -> pd.DataFrame:
    """What a reader sees: every visible file must be a complete Parquet file."""
    visible = [p for p in out.iterdir() if not p.name.startswith(("_", "."))]
    for p in visible:
        assert p.name.startswith("part-") and p.suffix == ".parquet", p.name
        pq.read_metadata(p)  # torn files would fail here
    return pd.read_parquet(out) if visible else pd.DataFrame(columns=["cell_id"])


@pytest.mark.slow  # subprocesses killed at chosen points
def test_kill_9_at_random_points_then_resume(tmp_path):
    spec = write_spec(tmp_path / "sim.toml", 400)  # 3,600 cells: a second or two a run
    out = tmp_path / "run"
    cells = expected_cells(spec)
    log = tmp_path / "stderr.log"
    rng = random.Random(20261129)
    kills = 0
    for attempt in range(5):
        proc = start(spec, out, *(["--resume"] if attempt else []), log=log)
        time.sleep(rng.uniform(0.3, 2.5))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=60)
        if out.exists():
            seen = visible_rows(out)
            assert seen.cell_id.is_unique, "a crash left two visible rows for a cell"
            assert set(seen.cell_id) <= cells
    assert kills >= 2, "the random delays should interrupt most runs"
    proc = start(spec, out, "--resume", log=log)
    assert proc.wait(timeout=120) == 0, log.read_text()[-2000:]
    rows = visible_rows(out)
    assert len(rows) == len(cells) and set(rows.cell_id) == cells
    assert (rows.status == "failed").any() and (rows.status == "ok").any()
    manifest = parse_manifest((out / "_sweep.json").read_text(), "test")  # hash matches its spec
    assert manifest["provenance"]["engine"] == "sim" and manifest["spec"]["sweep"]["batch_sizes"][-1] == 400
    assert not list(out.glob(".*.tmp")) and not list(out.glob("_corrupt-*"))
    assert "Traceback" not in log.read_text()


@pytest.mark.slow  # subprocesses killed at chosen points
def test_second_sweep_on_one_out_is_refused_and_a_killed_holder_does_not_block(tmp_path):
    spec = write_spec(tmp_path / "sim.toml", 400)
    out = tmp_path / "run"
    log = tmp_path / "first.log"
    first = start(spec, out, log=log)
    try:
        wait_for_holder(out, first.pid)
        second = subprocess.run([sys.executable, "-m", "dsdprof.cli", "sweep", str(spec), "--out",
                                 str(out), "--resume"],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        err = second.stderr.strip()
        assert err.count("\n") == 0 and "Traceback" not in err
        assert f"is in use by pid {first.pid} on " in err and f"(dsdprof sweep {spec} --out {out})" in err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert holder_pid(out) == first.pid  # the holder file survives kill -9 ...
    third = subprocess.run([sys.executable, "-m", "dsdprof.cli", "sweep", str(spec), "--out",
                            str(out), "--resume"],
                           capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr[-2000:]  # ... but the OS lock died with its process
    rows = pd.read_parquet(out)
    assert len(rows) == len(expected_cells(spec)) and rows.cell_id.is_unique


@pytest.mark.slow  # subprocesses killed at chosen points
@pytest.mark.parametrize("sig, code, word",
                         [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_and_sigterm_flush_and_say_how_to_resume(tmp_path, sig, code, word):
    """Ctrl-C, and SIGTERM (`kill`, a batch scheduler's stop), unwind the same way: the buffered rows
    are written, the lock is released, one line says how to resume; exit 130 / 143."""
    spec = write_spec(tmp_path / "sim.toml",
                      1000)  # 9,000 cells: the signal lands mid-run on a fast machine too
    out = tmp_path / "run"
    log = tmp_path / "stderr.log"
    proc = start(spec, out, log=log)
    wait_for_start(out)
    time.sleep(0.3)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == code
    text = log.read_text()
    assert text.strip().splitlines()[-1] == f"{word}: resume with dsdprof sweep {spec} --out {out} --resume"
    assert "Traceback" not in text
    partial = visible_rows(out)
    # the sim's write buffer was flushed, one row per cell
    assert len(partial) > 0 and partial.cell_id.is_unique
    assert holder_pid(out) is None  # lock released
    assert json.loads((out / "_sweep.json").read_text())["provenance"]["engine"] == "sim"
    done = subprocess.run([sys.executable, "-m", "dsdprof.cli", "sweep", str(spec), "--out",
                           str(out), "--resume"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(pd.read_parquet(out)) == len(expected_cells(spec))


# Every crash point of the write protocol, deterministically: a writer process that dies
# (os._exit, no cleanup) at its N-th rename or hard link, for every N, fresh and on a resume
# that supersedes failed rows. The writer runs alone here (no engine), so each process is cheap.
WRITER = r"""
import os, sys
from pathlib import Path
from dsdprof.formats.measurements import empty_row
from dsdprof.io.store import SweepWriter

SPEC = {"engine": {"name": "sim", "model": "m"}, "sweep": {"waves": 1}}
PROV = {"engine": "sim", "engine_version": "x", "model": "m", "hardware": "hw"}
CELLS = [f"dsd-bs{b}-k1-r0" for b in range(1, 9)]


def write_cells(out, crash_at=0):
    calls = [0]
    real_replace, real_link = os.replace, os.link

    def crashing(real):
        def op(*a, **k):
            calls[0] += 1
            if calls[0] == crash_at:
                os._exit(9)
            return real(*a, **k)
        return op

    os.replace, os.link = crashing(real_replace), crashing(real_link)
    resumed = (Path(out) / "_sweep.json").exists()
    try:
        with SweepWriter(out, SPEC, resume=True, flush_rows=3) as w:
            w.start(PROV)
            for b, cid in enumerate(CELLS, start=1):
                if cid not in w.done:
                    row = empty_row()
                    row.update(cell_id=cid, mode="dsd", batch_size=b, num_spec_tokens=1, repeat=0,
                               status="ok" if resumed or b <= 5 else "failed", acceptance_length=1.5,
                               itl_s=0.01)
                    w.write_row(row)
    finally:
        os.replace, os.link = real_replace, real_link
    return calls[0]


if __name__ == "__main__":
    print("calls", write_cells(sys.argv[1], int(sys.argv[2])))
"""


def crash_writer_at(out: Path, n: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WRITER, str(out), str(n)], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.slow  # subprocesses killed at chosen points
def test_every_crash_point_of_the_write_protocol(tmp_path):
    import shutil

    env: dict = {"__name__": "writer"}
    exec(WRITER, env)  # the same writer, in this process, finishes each crashed run
    cells = set(env["CELLS"])
    pristine = tmp_path / "pristine"
    fresh_calls = env["write_cells"](pristine)  # a fresh run: 3 of 8 cells fail
    assert (pd.read_parquet(pristine).status == "failed").sum() == 3
    shutil.copytree(pristine, tmp_path / "count")
    resume_calls = env["write_cells"](tmp_path / "count")  # a resume superseding them
    assert set(pd.read_parquet(tmp_path / "count").status) == {"ok"}
    shutil.rmtree(pristine / "_attempts", ignore_errors=True)
    scenarios = [("fresh", n)
                 for n in range(1, fresh_calls + 1)] + [("resume", n) for n in range(1, resume_calls + 1)]
    assert len(scenarios) >= 10
    for kind, n in scenarios:
        out = tmp_path / f"{kind}-{n}"
        if kind == "resume":
            shutil.copytree(pristine, out)
        died = crash_writer_at(out, n)
        assert died.returncode == 9, (kind, n, died.stdout, died.stderr[-1000:])
        if out.exists():
            seen = visible_rows(out)
            assert seen.cell_id.is_unique, (kind, n)
            if kind == "resume":  # a retry never takes a cell's row away, it replaces it
                assert set(seen.cell_id) == cells, (kind, n)
        env["write_cells"](out)  # resume to completion: the dead process's lock went with it
        rows = visible_rows(out)
        assert len(rows) == len(cells) and set(rows.cell_id) == cells, (kind, n)
        if kind == "resume":
            assert set(rows.status) == {"ok"}, (kind, n)  # every failed row was superseded
        parse_manifest((out / "_sweep.json").read_text(), str(out))
