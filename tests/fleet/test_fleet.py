"""Fleet: the fleet file, local and URL outputs, sharded runs, K tables + index, and a real local Ray
cluster (CPU workers) running analytic-engine runs, with a worker killed mid-run.

The runs are real sweeps on the analytic engine (engine "sim"); nothing is faked. Worker deaths are
real too: the worker process SIGKILLs itself (dsdprof.fleet.runner._FaultInjection, switched on by
an environment variable the test sets) and Ray retries the task.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.errors import InputError
from dsdprof.fleet.orchestrate import ray_task_options, run_fleet, shard_tasks
from dsdprof.fleet.plan import parse_fleet, shard_batch_sizes
from dsdprof.fleet.runner import FAULT_DIR_ENV
from dsdprof.measure import runner as sweep_mod
from dsdprof.measure.runner import run_sweep
from tests.conftest import inproc_engine_env

SIM_FLUSH = getattr(sweep_mod, "SIM_FLUSH_ROWS", 0)  # rows the sweep buffers for the analytic engine


def _sim(batch_sizes=(1, 4, 16), ks=(0, 1, 2, 3), repeats=1, hardware="H100 SXM", **engine):
    return {
        "engine": {"name": "sim", "model": "Llama-3.1-8B", "draft_model": "EAGLE3-Llama-3.1-8B",
                   "method": "eagle3", "dtype": "bfloat16", **engine},
        "sweep": {"batch_sizes": list(batch_sizes), "num_spec_tokens": list(ks), "repeats": repeats,
                  "waves": 2, "output_len": 32},
        "workload": {"input_len": 256},
        "sim": {"hardware": hardware, "acceptance_alpha": 0.8},
    }


def _fleet(out, runs, **settings):
    return {"fleet": {"out": str(out), **settings}, "runs": runs}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root (but lock files, which an OS lock may touch) -> (size, mtime)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file() and not p.name.endswith(".lock")}


def _rows(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir)


def _cells(spec_dict) -> int:
    sw = spec_dict["sweep"]
    return len(sw["batch_sizes"]) * (1 + len(sw["num_spec_tokens"])) * sw.get("repeats", 1)


# ----------------------------------------------------------------------------- the fleet file

def test_matrix_crosses_models_drafts_hardware_and_tp(tmp_path):
    plan = parse_fleet({
        "fleet": {"out": "out"},
        "base": _sim(),
        "matrix": {"models": ["Llama-3.1-8B", "Qwen3-8B"],
                   "drafts": [{"draft_model": "EAGLE3-Llama-3.1-8B", "method": "eagle3"},
                              {"method": "ngram"}],
                   "hardware": ["H100 SXM", "H200 SXM"], "tensor_parallel_size": [1, 2],
                   "exclude": [{"model": "Qwen3-8B", "draft": "EAGLE3-Llama-3.1-8B"}]},
    }, base_dir=tmp_path)
    assert len(plan.runs) == 2 * 2 * 2 * 2 - 4
    assert plan.settings.out == str(tmp_path / "out")  # relative to the fleet file
    names = [r.name for r in plan.runs]
    assert "Llama-3.1-8B--EAGLE3-Llama-3.1-8B--H200-SXM--tp2" in names
    assert "Qwen3-8B--ngram--H100-SXM--tp1" in names
    ngram = next(r for r in plan.runs if r.name == "Qwen3-8B--ngram--H100-SXM--tp1")
    assert ngram.spec.engine.draft_model is None and ngram.spec.engine.method == "ngram"
    tp2 = next(r for r in plan.runs if r.name.endswith("H200-SXM--tp2"))
    assert tp2.spec.sim.hardware == "H200 SXM" and tp2.spec.engine.tensor_parallel_size == 2
    assert len({r.key for r in plan.runs}) == len(plan.runs)


@pytest.mark.parametrize("doc, field", [
    ({"fleet": {"out": "o", "outt": 1}, "runs": [{"spec": _sim()}]}, "fleet.outt"),
    ({"fleet": {"out": "o"}}, "fleet"),
    ({"fleet": {"out": "o"}, "runs": [{"spec": _sim()}], "matrix": {"models": ["x"]}}, "fleet"),
    ({"fleet": {"out": "o"}, "runs": [{"spec": {**_sim(), "sweeep": {}}}]}, "runs[0].sweeep"),
    ({"fleet": {"out": "o"}, "runs": [{"spec": "missing.toml"}]}, "runs[0].spec"),
    ({"fleet": {"out": "o"}, "runs": [{"spec": _sim(), "shards": 4}]}, "runs[0].shards"),
    ({"fleet": {"out": "o"}, "runs": [{"spec": _sim(), "hardware": "H900"}]}, "runs[0].sim.hardware"),
    ({"fleet": {"out": "o"},
      "runs": [{"spec": _sim(), "name": "a"}, {"spec": _sim(), "name": "a", "hardware": "B200"}]},
     "runs[1].name"),
    ({"fleet": {"out": "o"}, "runs": [{"spec": _sim(), "name": "a"}, {"spec": _sim(), "name": "b"}]},
     "runs[1]"),
    ({"fleet": {"out": "o"}, "runs": [{"spec": _sim(), "name": "_x"}]}, "runs[0].name"),
    ({"fleet": {"out": "o", "max_retries": -1}, "runs": [{"spec": _sim()}]}, "fleet.max_retries"),
])
def test_bad_fleet_files_name_the_field(tmp_path, doc, field):
    with pytest.raises(InputError) as err:
        parse_fleet(doc, base_dir=tmp_path)
    assert err.value.field == field, str(err.value)


@pytest.mark.slow  # a CLI subprocess
def test_cli_bad_fleet_file_is_one_line_exit_2(tmp_path):
    f = tmp_path / "fleet.toml"
    f.write_text('[fleet]\nout = "o"\n\n[[runs]]\nspec = "nope.toml"\n')
    res = subprocess.run([sys.executable, "-m", "dsdprof.cli", "fleet", str(f)],
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("error: runs[0].spec=")
    assert not (tmp_path / "o").exists()


def test_shards_share_batch_sizes_largest_first():
    assert shard_batch_sizes([1, 2, 4, 8, 16, 32, 64], 3) == [[1, 2, 64], [4, 32], [8, 16]]
    parts = shard_batch_sizes([1, 2, 4, 8], 4)
    assert sorted(b for p in parts for b in p) == [1, 2, 4, 8] and all(len(p) == 1 for p in parts)


def test_ray_options_ask_for_the_gpus_and_type(tmp_path):
    vllm = {"engine": {"name": "vllm", "model": "m", "draft_model": "d", "tensor_parallel_size": 4}}
    tp16 = {**vllm, "engine": {**vllm["engine"], "tensor_parallel_size": 16}}
    plan = parse_fleet(_fleet(tmp_path, [{"spec": vllm, "hardware": "H100"},
                                          {"spec": tp16, "hardware": "H100"},
                                          {"spec": _sim()}], gpus_per_node=8, max_retries=5), tmp_path)
    settings = plan.settings
    one, span, sim = (shard_tasks(r, settings, str(tmp_path))[0] for r in plan.runs)
    assert ray_task_options(one, "H100", settings) == {
        "num_cpus": 1.0, "max_retries": 5, "retry_exceptions": False, "name": f"dsdprof-fleet:{one.label}",
        "num_gpus": 4, "resources": {"accelerator_type:H100": 0.001}}
    o = ray_task_options(span, "H100", settings)
    assert o["num_gpus"] == 0 and o["resources"] == {"accelerator_type:H100": 0.001} and span.spans_nodes
    # vLLM places TP across nodes
    assert plan.runs[1].spec.engine.extra["distributed_executor_backend"] == "ray"
    assert "num_gpus" not in ray_task_options(sim, "H100 SXM", settings)  # the analytic engine needs no GPU
    cpu = parse_fleet(_fleet(tmp_path, [{"spec": vllm, "hardware": "H100"}], use_gpus=False), tmp_path)
    assert "num_gpus" not in ray_task_options(shard_tasks(cpu.runs[0], cpu.settings, "")[0],
                                              "H100", cpu.settings)


# ----------------------------------------------------------------------------- local fleets

def test_local_fleet_sharded_run_equals_plain_sweep_and_resubmit_does_no_work(tmp_path):
    out = tmp_path / "fleet"
    spec = _sim(batch_sizes=(1, 2, 4, 8, 16), ks=(0, 1, 2, 3, 4))
    plan = parse_fleet(_fleet(out, [{"spec": spec, "name": "split", "shards": 2},
                                    {"spec": spec, "name": "whole", "hardware": "H200 SXM"}]), tmp_path)
    events = []
    report = run_fleet(plan, on_event=events.append)
    assert report.complete and [o.state for o in report.outcomes] == ["done", "done"]
    assert [e.run for e in events if e.kind == "submit"] == ["split/s0", "split/s1", "whole"]

    split = _rows(out / "split")
    assert len(split) == split.cell_id.nunique() == _cells(spec)
    assert {p.name[:8] for p in (out / "split").glob("part-*")} == {"part-s0-", "part-s1-"}
    direct = run_sweep(plan.runs[0].spec, tmp_path / "direct")
    ref = _rows(tmp_path / "direct").set_index("cell_id")
    assert direct.total == len(split)
    got = split.set_index("cell_id").loc[ref.index]
    assert (got.itl_s == ref.itl_s).all() and (got.acceptance_length == ref.acceptance_length).all()
    # The sharded run directory is an ordinary run: one manifest with every batch size, and resumable.
    manifest = json.loads((out / "split" / "_sweep.json").read_text())
    assert manifest["spec"]["sweep"]["batch_sizes"] == [1, 2, 4, 8, 16]
    assert run_sweep(plan.runs[0].spec, out / "split", resume=True).skipped == len(split)

    index = json.loads((out / "tables" / "index.json").read_text())
    assert [(e["run"], e["hardware"], e["tensor_parallel_size"]) for e in index["tables"]] == [
        ("split", "H100 SXM", 1), ("whole", "H200 SXM", 1)]
    table = json.loads((out / "tables" / "split.json").read_text())
    assert table["ranges"] == index["tables"][0]["ranges"] and (out / "tables" / "split.vllm.json").is_file()
    assert [o.table for o in report.outcomes] == ["split.json", "whole.json"]

    before = _snapshot(out)
    events.clear()
    again = run_fleet(plan, on_event=events.append)
    assert [o.state for o in again.outcomes] == ["skipped", "skipped"] and again.complete
    assert {e.kind for e in events} == {"skip"}
    assert _snapshot(out) == before  # not a byte written


def test_changed_spec_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "fleet"
    run_fleet(parse_fleet(_fleet(out, [{"spec": _sim(), "name": "a"}]), tmp_path))
    before = _snapshot(out)
    changed = _sim()
    changed["sweep"]["waves"] = 3
    with pytest.raises(InputError, match="spec differs") as err:
        run_fleet(parse_fleet(_fleet(out, [{"spec": changed, "name": "a"}]), tmp_path))
    assert err.value.field == "runs[0]" and err.value.value == "a"
    assert _snapshot(out) == before


def test_url_out_stages_uploads_and_resumes_on_another_machine(tmp_path):
    remote = tmp_path / "bucket"
    url = f"file://{remote}/fleet"
    spec = _sim(batch_sizes=(1, 2, 4, 8), repeats=2)
    runs = [{"spec": spec, "name": "one"}, {"spec": spec, "name": "split", "shards": 2, "hardware": "B200"}]
    report = run_fleet(parse_fleet(_fleet(url, runs, staging=str(tmp_path / "stage-a")), tmp_path))
    assert report.complete and report.index == f"{url}/tables/index.json"
    fleet = remote / "fleet"
    for run in ("one", "split"):
        df = _rows(fleet / run)
        assert len(df) == df.cell_id.nunique() == _cells(spec)
        assert (fleet / run / "_sweep.json").is_file() and not (fleet / run / "_dsdprof.lock").exists()
    assert len(json.loads((fleet / "tables" / "index.json").read_text())["tables"]) == 2

    # Another machine (fresh staging) resumes a run that was cut short: its record says running and
    # one part file is missing. Only the missing cells are measured again.
    record = json.loads((fleet / "_fleet" / "runs" / "one.json").read_text())
    (fleet / "_fleet" / "runs" / "one.json").write_text(json.dumps({**record, "state": "running"}))
    parts = sorted((fleet / "one").glob("part-*.parquet"))
    lost = len(pd.read_parquet(parts[-1])) if len(parts) > 1 else 0
    if lost:
        parts[-1].unlink()
    again = run_fleet(parse_fleet(_fleet(url, runs, staging=str(tmp_path / "stage-b")), tmp_path))
    assert [o.state for o in again.outcomes] == ["done", "skipped"]
    worker = json.loads((fleet / "_fleet" / "runs" / "one.json").read_text())["workers"][0]
    assert worker["measured"] == lost and worker["skipped"] == _cells(spec) - lost
    df = _rows(fleet / "one")
    assert len(df) == df.cell_id.nunique() == _cells(spec)


def test_mirror_republishes_rewritten_parts_and_uploads_engine_logs(tmp_path):
    from dsdprof.config.spec import parse_spec
    from dsdprof.fleet.runner import Mirror, ShardTask, placement_for
    from dsdprof.fleet.store import FleetStore

    spec = parse_spec(_sim())
    local = FleetStore(str(tmp_path / "out"))
    p = placement_for(local, ShardTask("r", 1, 2, spec, local.out, None, ""))
    mirror = Mirror(local, p)
    mirror.restore()
    (p.work_dir / "part-00000-a.parquet").write_bytes(b"v1")
    mirror.push()
    published = tmp_path / "out" / "r" / "part-s1-00000-a.parquet"
    assert published.read_bytes() == b"v1"
    tmp = p.work_dir / ".part-00000-a.parquet.tmp"  # storage replaces a part with a retried row in place
    tmp.write_bytes(b"v2 longer")
    os.replace(tmp, p.work_dir / "part-00000-a.parquet")
    mirror.push()
    assert published.read_bytes() == b"v2 longer"
    (p.work_dir / "part-00000-a.parquet").unlink()  # merged away
    mirror.push()
    assert not published.exists()

    remote = FleetStore(f"file://{tmp_path}/bucket", str(tmp_path / "stage"))
    p = placement_for(remote, ShardTask("r", 0, 1, spec, remote.out, remote.staging, ""))
    mirror = Mirror(remote, p)
    mirror.restore()
    (p.work_dir / "_logs").mkdir()
    (p.work_dir / "_logs" / "engine-dsd.log").write_text("log")
    (p.work_dir / "_dsdprof.lock").write_text("")
    mirror.push()
    mirror.push_subdirs()
    assert (tmp_path / "bucket" / "r" / "_logs" / "engine-dsd.log").read_text() == "log"
    assert not (tmp_path / "bucket" / "r" / "_dsdprof.lock").exists()


def test_cli_fleet_export_and_show_list_the_index(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "fleet"
    f = tmp_path / "fleet.toml"
    f.write_text(f'[fleet]\nout = "{out}"\n\n[[runs]]\nname = "h100"\n[runs.spec.engine]\nname = "sim"\n'
                 'model = "Llama-3.1-8B"\ndraft_model = "EAGLE3-Llama-3.1-8B"\nmethod = "eagle3"\n'
                 '[runs.spec.sweep]\nbatch_sizes = [1, 8, 64]\nnum_spec_tokens = [0, 2, 4]\nwaves = 2\n'
                 '[runs.spec.sim]\nhardware = "H100 SXM"\nacceptance_alpha = 0.8\n')
    runner = CliRunner()
    res = runner.invoke(app, ["fleet", str(f), "--no-export"])
    assert res.exit_code == 0, res.output
    assert "h100" in res.output and not (out / "tables").exists()
    res = runner.invoke(app, ["fleet-export", str(out)])
    assert res.exit_code == 0 and "1 tables, 0 runs skipped" in res.output, res.output
    for target in (out, out / "tables" / "index.json"):
        res = runner.invoke(app, ["show", str(target)], terminal_width=200)
        assert res.exit_code == 0 and "Llama-3.1-8B" in res.output and "h100.json" in res.output, res.output
    res = runner.invoke(app, ["show", str(out / "tables" / "h100.json")], terminal_width=200)
    assert res.exit_code == 0 and "profiled points" in res.output  # a table is still shown as a table
    res = runner.invoke(app, ["fleet", str(f), "10.0.0.1:6379"])
    assert res.exit_code == 2


# ----------------------------------------------------------------------------- a local Ray cluster

@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    ray = pytest.importorskip("ray")
    fault_dir = tmp_path_factory.mktemp("faults")
    os.environ[FAULT_DIR_ENV] = str(fault_dir)
    env = {FAULT_DIR_ENV: str(fault_dir)}
    env.update({k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS")
                if k in os.environ})  # tests/conftest.py's
    # the one vLLM sweep here checks cells, status and acceptance, not step times: its engines' core
    # in-process (tests/conftest.py: inproc_engine_env); no other test on this cluster starts an engine
    env.update(inproc_engine_env())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    yield fault_dir
    ray.shutdown()
    os.environ.pop(FAULT_DIR_ENV, None)


def _big_sim():
    """A sim run long enough that the sweep has flushed rows to disk before the worker dies."""
    per_repeat = 8 * 6
    return _sim(batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128), ks=(0, 1, 2, 3, 4),
                repeats=math.ceil((max(SIM_FLUSH, 40) + 60) / per_repeat))


def _kill_after(fault_dir: Path, label: str, cells: int) -> Path:
    path = fault_dir / (label.replace("/", "__") + ".kill")
    path.write_text(str(cells))
    return path


@pytest.mark.slow  # a Ray cluster (~14 s with its start)
def test_ray_fleet_retries_a_killed_worker_and_resumes(ray_cluster, tmp_path):
    out = tmp_path / "fleet"
    big, small = _big_sim(), _sim()
    plan = parse_fleet(_fleet(out, [{"spec": big, "name": "big"},
                                    {"spec": small, "name": "split", "shards": 2, "hardware": "H200 SXM"},
                                    {"spec": small, "name": "b200", "hardware": "B200"}], max_retries=2),
                       tmp_path)
    kill = _kill_after(ray_cluster, "big", max(SIM_FLUSH, 40) + 20)
    report = run_fleet(plan, use_ray=True)
    assert report.complete, [(o.run.name, o.error) for o in report.outcomes]
    assert not kill.exists() and kill.with_suffix(".killed").exists()  # the worker did die
    worker = json.loads((out / "_fleet" / "runs" / "big.json").read_text())["workers"][0]
    # rows flushed before the kill are kept (how many depends on the flush timer on a loaded machine)
    assert worker["skipped"] >= 1 and worker["measured"] + worker["skipped"] == _cells(big)
    for name, spec in (("big", big), ("split", small), ("b200", small)):
        df = _rows(out / name)
        assert len(df) == df.cell_id.nunique() == _cells(spec), name
        assert (df.status == "ok").all()
    index = json.loads((out / "tables" / "index.json").read_text())
    assert sorted(e["run"] for e in index["tables"]) == ["b200", "big", "split"]

    before = _snapshot(out)
    events = []
    again = run_fleet(plan, use_ray=True, on_event=events.append)
    assert {o.state for o in again.outcomes} == {"skipped"} and {e.kind for e in events} == {"skip"}
    assert _snapshot(out) == before


@pytest.mark.slow  # a Ray cluster
def test_ray_fleet_without_retries_completes_on_resubmission(ray_cluster, tmp_path):
    out = tmp_path / "fleet"
    big = _big_sim()
    plan = parse_fleet(_fleet(out, [{"spec": big, "name": "big", "shards": 2},
                                    {"spec": _sim(), "name": "small", "hardware": "B200"}], max_retries=0),
                       tmp_path)
    _kill_after(ray_cluster, "big/s1", 30)
    first = run_fleet(plan, use_ray=True)
    states = {o.run.name: o for o in first.outcomes}
    assert states["small"].state == "done" and states["big"].state == "incomplete"
    error = states["big"].error
    assert "died" in error.lower() or "crash" in error.lower(), error
    assert not first.complete
    index = json.loads((out / "tables" / "index.json").read_text())
    assert [s["run"] for s in index["skipped"]] == ["big"]

    second = run_fleet(plan, use_ray=True)
    assert [o.state for o in second.outcomes] == ["done", "skipped"] and second.complete
    df = _rows(out / "big")
    assert len(df) == df.cell_id.nunique() == _cells(big)
    index = json.loads((out / "tables" / "index.json").read_text())
    assert sorted(e["run"] for e in index["tables"]) == ["big", "small"]


@pytest.mark.vllm
def test_ray_fleet_runs_a_small_vllm_cpu_sweep(ray_cluster, tmp_path, toy_tiny):
    pytest.importorskip("vllm")
    toy = toy_tiny  # the session's tiny toy pair (tests/conftest.py)
    spec = {"engine": {"name": "vllm", "model": str(toy.target), "draft_model": str(toy.draft),
                       "method": "draft_model", "dtype": "float32", "max_model_len": 512,
                       "extra": {"enforce_eager": True}},
            "sweep": {"batch_sizes": [1], "num_spec_tokens": [0, 1], "waves": 1, "output_len": 16},
            "workload": {"dataset": "synthetic", "input_len": 32, "num_prompts": 8}}
    out = tmp_path / "fleet"
    plan = parse_fleet(_fleet(out, [{"spec": spec, "name": "toy-cpu", "hardware": "cpu"}], use_gpus=False,
                              cpus_per_run=2), tmp_path)
    report = run_fleet(plan, use_ray=True)
    assert report.complete, report.outcomes[0].error
    df = _rows(out / "toy-cpu")
    assert sorted(df.cell_id) == ["dsd-bs1-k0-r0", "dsd-bs1-k1-r0", "vanilla-bs1-k0-r0"]
    assert (df.status == "ok").all() and (df.engine == "vllm").all() and (df.itl_s > 0).all()
    k1 = df[df.cell_id == "dsd-bs1-k1-r0"].iloc[0]
    assert 1.0 <= k1.acceptance_length <= 2.0
    index = json.loads((out / "tables" / "index.json").read_text())
    assert [e["run"] for e in index["tables"]] == ["toy-cpu"] and index["tables"][0]["engine"] == "vllm"
    assert {o.state for o in run_fleet(plan, use_ray=True).outcomes} == {"skipped"}


def test_resubmission_with_other_shards_is_refused_and_duplicate_rows_are_never_read(tmp_path):
    """A driver killed after its run finished leaves the record at "running"; resubmitting with
    other shards would measure every cell again into per-shard part files next to the first ones.
    It is refused in one line before anything is written, and analyze/export refuse a run
    directory that holds a cell twice."""
    import shutil

    out = tmp_path / "fleet"
    spec = _sim(batch_sizes=(1, 4, 16))
    run_fleet(parse_fleet(_fleet(out, [{"spec": spec, "name": "a"}]), tmp_path))
    record = out / "_fleet" / "runs" / "a.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "state": "running"}))  # the driver died
    before = _snapshot(out)
    with pytest.raises(InputError, match="was 1") as err:
        run_fleet(parse_fleet(_fleet(out, [{"spec": spec, "name": "a", "shards": 3}]), tmp_path))
    assert err.value.field == "runs[0].shards" and err.value.value == 3
    assert _snapshot(out) == before
    # same shards: resumes
    again = run_fleet(parse_fleet(_fleet(out, [{"spec": spec, "name": "a"}]), tmp_path))
    assert again.complete
    df = _rows(out / "a")
    assert len(df) == df.cell_id.nunique() == _cells(spec)

    part = next((out / "a").glob("part-*.parquet"))
    shutil.copy(part, part.with_name("part-s0-" + part.name[len("part-"):]))  # what a re-shard stored
    for cmd in ("analyze", "export"):
        r = CliRunner().invoke(app, [cmd, str(out / "a")])
        assert r.exit_code == 2 and "stored twice" in r.stderr and r.stderr.count("\n") == 1, r.output


def test_each_run_record_is_written_when_that_run_finishes(tmp_path):
    """The driver dies (Ctrl-C) as the second run starts: the first run's record already says done,
    so the resubmission skips it (no engine started) and runs only the second."""
    out = tmp_path / "fleet"
    runs = [{"spec": _sim(), "name": "first"}, {"spec": _sim(hardware="H200 SXM"), "name": "second"}]

    def die_on_second(ev):
        if ev.kind == "submit" and ev.run == "second":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_fleet(parse_fleet(_fleet(out, runs), tmp_path), on_event=die_on_second)
    records = {n: json.loads((out / "_fleet" / "runs" / f"{n}.json").read_text())["state"]
               for n in ("first", "second")}
    assert records == {"first": "done", "second": "running"}
    events = []
    again = run_fleet(parse_fleet(_fleet(out, runs), tmp_path), on_event=events.append)
    assert [o.state for o in again.outcomes] == ["skipped", "done"] and again.complete
    assert [e.run for e in events if e.kind == "submit"] == ["second"]


def test_default_run_names_stay_unique_when_paths_end_alike(tmp_path):
    """Two configs .../a/moe and .../b/moe: default names use the last path component, so they
    would collide; each gets a digest of its full model path instead."""
    specs = []
    for d in ("a", "b"):
        cfg = tmp_path / d / "moe"
        cfg.mkdir(parents=True)
        (cfg / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
            "intermediate_size": 1024,
            "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000,
            "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}))
        spec = _sim(batch_sizes=(1, 4))
        spec["engine"].update(model=str(cfg), method="ngram")
        spec["engine"].pop("draft_model")
        spec["sim"]["acceptance_per_pos"] = [0.5, 0.3, 0.2]
        spec["sim"].pop("acceptance_alpha")
        specs.append({"spec": spec})
    plan = parse_fleet(_fleet(tmp_path / "out", specs), tmp_path)
    names = [r.name for r in plan.runs]
    assert len(set(names)) == 2 and all(n.startswith("moe--ngram--") for n in names), names
