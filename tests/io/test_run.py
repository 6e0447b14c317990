"""A run opened once (dsdprof.io.runs.Run): the export path reads each file once, and the Run
answers what the path-based readers answer."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from dsdprof.config.run import RUN_KIND_SWEEP, RUN_KIND_VALIDATE
from dsdprof.config.spec import parse_spec
from dsdprof.errors import InputError
from dsdprof.export.api import export_document
from dsdprof.io.manifest import MANIFEST_NAME
from dsdprof.io.runs import open_run
from dsdprof.measure.runner import run_sweep


def _sim(**sweep):
    grid = {"batch_sizes": [1, 4], "num_spec_tokens": [0, 2], "waves": 3, **sweep}
    return parse_spec({"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3",
                                  "max_model_len": 70000},
                       "sweep": grid, "sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.9}})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    run_sweep(_sim(), base / "sweep")
    run_sweep(_sim(context_lens=[1024, 4096]), base / "ctx")
    return base


def _opens(monkeypatch, root: Path) -> Counter:
    """Count reads of files under ``root`` (bytes, text, ``open``, Parquet footers and bodies)."""
    import builtins

    import pandas as pd
    import pyarrow.parquet as pq

    opens: Counter = Counter()

    def wrap(owner, name):
        real = getattr(owner, name)

        def inner(*args, **kwargs):
            target = args[0] if args else ""
            if isinstance(target, (str, Path)) and str(target).startswith(str(root)):
                opens[Path(target).name] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, inner)

    for owner, name in ((Path, "read_bytes"), (Path, "read_text"), (pq, "read_schema"), (pq, "read_table"),
                        (pq, "ParquetFile"), (pd, "read_parquet"), (builtins, "open")):
        wrap(owner, name)
    return opens


def test_the_read_counter_counts_a_second_read(runs, monkeypatch):
    # the counter itself can disagree: a file read twice counts 2
    opens = _opens(monkeypatch, runs / "sweep")
    for _ in range(2):
        (runs / "sweep" / MANIFEST_NAME).read_text()
    with open(runs / "sweep" / MANIFEST_NAME) as fh:
        fh.read()
    assert opens[MANIFEST_NAME] == 3


@pytest.mark.parametrize("name", ["sweep", "ctx"])
@pytest.mark.parametrize("command", [["analyze"], ["analyze", "--json"], ["export"],
                                     ["export", "--format", "vllm"]])
def test_each_command_reads_each_file_of_the_run_once(runs, monkeypatch, name, command):
    """``dsdprof analyze`` and ``dsdprof export`` each read every Parquet part and manifest of a
    run exactly once (the run opened once: :func:`dsdprof.io.runs.open_run`)."""
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    run = runs / name
    files = sorted(p.name for p in run.glob("*.parquet")) + [MANIFEST_NAME]
    opens = _opens(monkeypatch, run)
    res = CliRunner().invoke(app, [command[0], str(run), *command[1:]])
    assert res.exit_code == 0, res.output
    assert dict(opens) == {f: 1 for f in files}


@pytest.mark.parametrize("name", ["sweep", "ctx", "validate"])
@pytest.mark.parametrize("command", ["report", "validate-report", "calibrate", "analyze"])
def test_every_reading_command_reads_each_file_once(runs, tmp_path, monkeypatch, name, command):
    """``report`` (which checks what it read as ``export`` and ``analyze`` do), ``validate-report``,
    ``calibrate`` and ``analyze`` read every Parquet part and manifest of a run once, whatever they
    then refuse (a sweep to ``validate-report``, a validate run to ``analyze``)."""
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    run = runs / name
    if name == "validate" and not run.exists():
        _validate_copy(runs / "sweep", run)
    files = sorted(p.name for p in run.glob("*.parquet")) + [MANIFEST_NAME]
    args = {"report": ["--output", str(tmp_path / "r.html")],
            "calibrate": ["--out", str(tmp_path / "p.toml")]}
    opens = _opens(monkeypatch, run)
    res = CliRunner().invoke(app, [command, str(run), *args.get(command, [])])
    assert res.exit_code in (0, 2), res.output
    assert dict(opens) == {f: 1 for f in files}, res.output


@pytest.mark.parametrize("command", ["report", "validate-report", "calibrate", "analyze", "export"])
def test_every_reading_command_reads_a_parquet_file_once(runs, tmp_path, monkeypatch, command):
    """Given one Parquet file, each command reads it (and its run's manifest) once: ``report`` asks
    whether it is a rollout file from the bytes the run reader then reads its rows from."""
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    part = sorted((runs / "sweep").glob("*.parquet"))[0]
    args = {"report": ["--output", str(tmp_path / "r.html")],
            "calibrate": ["--out", str(tmp_path / "p.toml")]}
    opens = _opens(monkeypatch, runs / "sweep")
    res = CliRunner().invoke(app, [command, str(part), *args.get(command, [])])
    assert res.exit_code in (0, 2), res.output
    assert dict(opens) == {part.name: 1, MANIFEST_NAME: 1}, res.output


def test_report_reads_a_rollout_file_once(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dsdprof.cli.app import app
    from dsdprof.io.rollouts import write_rollout_rows

    (tmp_path / "run").mkdir()
    src = write_rollout_rows(tmp_path / "run" / "r.parquet", [], {})
    opens = _opens(monkeypatch, src.parent)
    res = CliRunner().invoke(app, ["report", str(src), "--output", str(tmp_path / "r.html")])
    assert "rollout" in (tmp_path / "r.html").read_text(), res.output
    assert dict(opens) == {"r.parquet": 1}, res.output


def _validate_copy(sweep: Path, run_dir: Path) -> Path:
    """A copy of ``sweep`` whose manifest says it is a validate run."""
    import shutil

    shutil.copytree(sweep, run_dir)
    doc = json.loads((run_dir / MANIFEST_NAME).read_text())
    doc["spec"][RUN_KIND_VALIDATE] = {"table": "t.json"}
    (run_dir / MANIFEST_NAME).write_text(json.dumps(doc))
    return run_dir


def test_export_reads_a_table_file_once(runs, tmp_path, monkeypatch):
    """A table JSON given to ``export`` is read once (read, parsed and validated in one pass)."""
    table = tmp_path / "t.json"
    table.write_text(json.dumps(export_document(runs / "sweep", "table").doc))
    opens = _opens(monkeypatch, tmp_path)
    export_document(table, "vllm")
    assert dict(opens) == {"t.json": 1}


@pytest.mark.parametrize("name", ["sweep", "ctx"])
def test_export_reads_each_file_of_the_run_once(runs, monkeypatch, name):
    run = runs / name
    files = sorted(p.name for p in run.glob("*.parquet")) + [MANIFEST_NAME]
    opens = _opens(monkeypatch, run)
    export_document(run, "table")
    assert dict(opens) == {f: 1 for f in files}


@pytest.mark.parametrize("name", ["sweep", "ctx"])
def test_a_run_exports_as_its_path_does(runs, name):
    by_path = export_document(runs / name, "table").doc
    by_run = export_document(open_run(runs / name, "export"), "table").doc
    for doc in (by_path, by_run):
        doc["provenance"].pop("created_at")
    assert json.dumps(by_run, sort_keys=True) == json.dumps(by_path, sort_keys=True)
    assert ("contexts" in by_run) == (name == "ctx")


def test_run_kind_coverage_and_contexts_agree_with_the_path_readers(runs):
    from dsdprof.config.run import coverage, parse_manifest
    from dsdprof.config.spec import SweepSpec
    from dsdprof.io.runs import manifest_docs

    run = open_run(runs / "sweep")
    assert run.kind == RUN_KIND_SWEEP and run.contexts is None
    manifests = tuple(parse_manifest(d, doc) for d, doc in manifest_docs(runs / "sweep"))
    assert run.coverage == coverage(run.rows, manifests) and run.coverage.complete
    # the manifest typed: the SweepSpec that ran, its grid the coverage's
    assert isinstance(run.spec, SweepSpec) and run.spec.sweep.batch_sizes == [1, 4]
    assert run.coverage.batch_sizes == (1, 4) and run.coverage.grid_from == "manifest"
    ctx = open_run(runs / "ctx")
    assert sorted(ctx.contexts) == [1024, 4096] and sorted(ctx.context_coverage) == [1024, 4096]


def test_a_validate_manifest_makes_the_run_a_validate_run(runs, tmp_path):
    run_dir = _validate_copy(runs / "sweep", tmp_path / "v")
    run = open_run(run_dir)  # read as it is (validate-report's way): no refusal
    assert run.kind == RUN_KIND_VALIDATE and run.spec is None
    for command in ("export", "analyze"):  # refused first, whatever else the run holds
        with pytest.raises(InputError, match="is a validate run, not a sweep \\(its manifest says so\\)"):
            open_run(run_dir, command)
    with pytest.raises(InputError, match="is a validate run, not a sweep \\(its manifest says so\\)"):
        export_document(run_dir, "table")
