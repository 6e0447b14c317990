"""Bad input through the CLI: one line on stderr, exit code 2, no traceback, nothing written or
overwritten (every file that existed before is byte-identical after)."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.formats.versions import PARQUET_METADATA_KEY

runner = CliRunner()

SIM_SPEC = """\
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
waves = {waves}

[workload]
input_len = 16000

[sim]
hardware = "RTX 4090"
acceptance_alpha = 0.8
"""


def one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    err = result.stderr.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("error: ")
    assert "Traceback" not in result.output + result.stderr
    for n in needles:
        assert n in err, err
    return err


def snapshot(*roots: Path) -> dict[str, bytes]:
    files = {}
    for root in roots:
        if root.is_file():
            files[str(root)] = root.read_bytes()
        elif root.is_dir():
            files.update({str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()})
    return files


@pytest.fixture
def spec(tmp_path) -> Path:
    p = tmp_path / "sim.toml"
    p.write_text(SIM_SPEC.format(waves=20))
    return p


@pytest.fixture
def run(tmp_path, spec) -> Path:
    out = tmp_path / "run"
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def sweep(spec: Path, out: Path, *extra: str):
    return runner.invoke(app, ["sweep", str(spec), "--out", str(out), *extra])


# ----------------------------------------------------------------------------- --out

def test_out_that_cannot_be_created(tmp_path, spec, monkeypatch):
    parent = tmp_path / "locked"
    parent.mkdir()
    if os.geteuid() != 0:
        parent.chmod(0o555)
    else:  # root ignores permissions: make the filesystem refuse instead
        def refuse(self, *a, **k):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        monkeypatch.setattr(Path, "mkdir", refuse)
    try:
        one_line_error(sweep(spec, parent / "run"), "out=", "cannot be created", "Permission denied")
    finally:
        parent.chmod(0o755)
    assert list(parent.iterdir()) == []


def test_read_only_out(run, spec, monkeypatch):
    import filelock

    before = snapshot(run)

    def read_only(self, *a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(run / "_dsdprof.lock"))

    monkeypatch.setattr(filelock.FileLock, "acquire", read_only)
    one_line_error(sweep(spec, run, "--resume"), "out=", "not writable", "Read-only file system")
    assert snapshot(run) == before


def test_out_under_a_file_and_out_a_file(tmp_path, spec):
    f = tmp_path / "plain.txt"
    f.write_text("keep")
    one_line_error(sweep(spec, f / "run"), "out=", "which is a file")
    one_line_error(sweep(spec, f / "a" / "b"), "out=", "which is a file")
    one_line_error(sweep(spec, f), "out=", "not a directory")
    one_line_error(sweep(spec, f, "--resume"), "out=", "not a directory")
    assert f.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "sim.toml"]


def test_existing_out_without_resume_and_foreign_directory(tmp_path, spec, run):
    before = snapshot(run)
    one_line_error(sweep(spec, run), "out=", "--resume")
    assert snapshot(run) == before
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("x")
    one_line_error(sweep(spec, foreign, "--resume"), "not a dsdprof run")
    assert snapshot(foreign) == {str(foreign / "notes.txt"): b"x"}


def test_out_in_use_names_the_holder(spec, run):
    from dsdprof.config.spec import load_spec
    from dsdprof.io.manifest import normalised_spec_dump
    from dsdprof.io.store import SweepWriter

    with SweepWriter(run, normalised_spec_dump(load_spec(spec)), resume=True):
        before = snapshot(run)
        one_line_error(sweep(spec, run, "--resume"), "is in use by", f"pid {os.getpid()}")
        assert snapshot(run) == before


# ----------------------------------------------------------------------------- full disk

def _full_disk(monkeypatch, target):
    def write(*args, **kwargs):
        where = args[1] if len(args) > 1 else kwargs["where"]
        with open(where, "wb") as fh:
            fh.write(b"PAR1 half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(target[0], target[1], write)


def test_full_disk_while_claiming_out(tmp_path, spec, monkeypatch):
    import dsdprof.io.store as storage

    def no_space(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(storage, "write_bytes_atomic", no_space)
    one_line_error(sweep(spec, tmp_path / "run"), "out=", "No space left on device")
    assert not (tmp_path / "run").exists()


def test_full_disk_while_writing_a_part_file(tmp_path, spec, run, monkeypatch):
    fresh = tmp_path / "fresh"
    _full_disk(monkeypatch, (pq, "write_table"))
    r = sweep(spec, fresh)
    assert r.exit_code == 2 and "Traceback" not in r.output + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == r.stderr.strip().splitlines()[-1]
    assert "No space left on device" in errors[0] and "--resume" in errors[0]
    assert not [p for p in fresh.iterdir() if p.name.endswith(".tmp") or p.name.startswith("part-")]
    # a resume on a full disk: the failed cells' rows stay as they were
    before = snapshot(run)
    r = sweep(spec, run, "--resume")
    assert r.exit_code == 2 and "No space left on device" in r.stderr
    after = snapshot(run)  # every part file as it was, nothing archived, no temp file
    assert {k: v for k, v in after.items() if not k.endswith("_sweep.json")} == \
        {k: v for k, v in before.items() if not k.endswith("_sweep.json")}
    monkeypatch.undo()
    assert sweep(spec, fresh, "--resume").exit_code == 0
    df = pd.read_parquet(fresh)
    assert len(df) == 12 and df.cell_id.is_unique


# ----------------------------------------------------------------------------- manifests and resumes

@pytest.mark.parametrize("content, needle", [
    ("[1, 2, 3]", "holds a JSON list"),
    ('"a string"', "holds a JSON str"),
    ("{oops", "unreadable JSON"),
    ('{"manifest": "dsdprof.run/v9", "spec": {}}', "unknown manifest version"),
    ('{"schema_version": "dsdprof.measurements/v1", "spec": {}}', "older dsdprof"),
])
def test_bad_manifest(spec, run, content, needle):
    (run / "_sweep.json").write_text(content)
    before = snapshot(run)
    one_line_error(sweep(spec, run, "--resume"), "_sweep.json", needle)
    assert snapshot(run) == before


def test_non_utf8_manifest(spec, run):
    (run / "_sweep.json").write_bytes(b"\xff\xfe{")
    before = snapshot(run)
    one_line_error(sweep(spec, run, "--resume"), "_sweep.json", "unreadable")
    assert snapshot(run) == before


def test_resume_with_another_spec(tmp_path, run):
    before = snapshot(run)
    other = tmp_path / "other.toml"
    other.write_text(SIM_SPEC.format(waves=5))
    one_line_error(sweep(other, run, "--resume"),
                   f"spec.sweep.waves=5: differs from the run being resumed in {run} (was 20)")
    other.write_text(SIM_SPEC.format(waves=20).replace("RTX 4090", "H100 SXM"))
    one_line_error(sweep(other, run, "--resume"), "spec.sim.hardware='H100 SXM'", "(was 'RTX 4090')")
    assert snapshot(run) == before


def test_repeated_resumes_keep_one_row_per_cell(spec, run):
    for _ in range(3):
        assert sweep(spec, run, "--resume").exit_code == 0
    df = pd.read_parquet(run)
    assert len(df) == 12 and df.cell_id.is_unique and (df.status == "failed").any()


# ----------------------------------------------------------------------------- spec bounds

@pytest.mark.parametrize("edit, needle", [
    (("batch_sizes = [1, 8, 64]", "batch_sizes = [1, 99999999999999999999]"), "sweep.batch_sizes="),
    (("batch_sizes = [1, 8, 64]", "batch_sizes = [1, 9223372036854775807]"), "must be in 1..1048576"),
    (("waves = 20", "waves = 99999999999999999999"), "sweep.waves="),
    (("batch_sizes = [1, 8, 64]\nnum_spec_tokens = [0, 2, 4]\nwaves = 20",
      "batch_sizes = [1048576]\nnum_spec_tokens = [0, 2, 4]\nwaves = 1000000\noutput_len = 1000000"),
     "overflows"),
    (("waves = 20", 'waves = "20"'), "sweep.waves="),
    (("input_len = 16000", "input_len = 16000\nseed = 18446744073709551616"), "workload.seed="),
    (("input_len = 16000", "input_len = 16000\ntemperature = inf"), "workload.temperature=inf"),
])
def test_spec_bounds(tmp_path, spec, edit, needle):
    spec.write_text(SIM_SPEC.format(waves=20).replace(*edit))
    one_line_error(sweep(spec, tmp_path / "out"), needle)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- analyze / export inputs

def _part(path: Path, hardware: str, version: str = "dsdprof.measurements/v2") -> None:
    df = pd.DataFrame({"batch_size": [1, 1, 2, 2], "num_spec_tokens": [0, 2, 0, 2],
                       "acceptance_length": [1.0, 2.2, 1.0, 2.1], "itl_s": [0.01, 0.012, 0.011, 0.014],
                       "status": ["ok"] * 4, "hardware": [hardware] * 4, "model": ["m"] * 4})
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = {PARQUET_METADATA_KEY: json.dumps({"schema_version": version, "hardware": hardware}).encode()}
    pq.write_table(table.replace_schema_metadata(meta), path)


def test_mixed_provenance_is_refused_unless_allowed(tmp_path):
    d = tmp_path / "pool"
    d.mkdir()
    _part(d / "a.parquet", "H100")
    _part(d / "b.parquet", "A100")
    out = tmp_path / "t.json"
    one_line_error(runner.invoke(app, ["analyze", str(d)]), "hardware=['A100', 'H100']", "--allow-mixed")
    one_line_error(runner.invoke(app, ["export", str(d), "-o", str(out)]), "hardware=", "--allow-mixed")
    assert not out.exists()
    r = runner.invoke(app, ["analyze", str(d), "--allow-mixed"])
    assert r.exit_code == 0, r.output
    assert "A100 | H100" in r.output
    r = runner.invoke(app, ["export", str(d), "--allow-mixed", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["provenance"]["hardware"] == "A100 | H100"


def test_unknown_measurement_schema_version(tmp_path):
    p = tmp_path / "future.parquet"
    _part(p, "H100", version="dsdprof.measurements/v99")
    one_line_error(runner.invoke(app, ["analyze", str(p)]), "schema_version='dsdprof.measurements/v99'")
    d = tmp_path / "mixed"
    d.mkdir()
    _part(d / "a.parquet", "H100", version="dsdprof.measurements/v1")
    _part(d / "b.parquet", "H100", version="dsdprof.measurements/v2")
    one_line_error(runner.invoke(app, ["analyze", str(d)]), "schema_version=")
    assert runner.invoke(app, ["analyze", str(d), "--allow-mixed"]).exit_code == 0


def test_attempts_and_temp_files_are_not_measurements(spec, run):
    assert sweep(spec, run, "--resume").exit_code == 0
    assert list((run / "_attempts").glob("*.parquet"))
    r = runner.invoke(app, ["analyze", str(run), "--json"])
    assert r.exit_code == 0, r.output


# ----------------------------------------------------------------------------- plot

def test_plot_without_matplotlib(run, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    one_line_error(runner.invoke(app, ["plot", str(run), "-o", str(tmp_path / "png")]),
                   "matplotlib", "pip install 'dsdprof[plot]'")
    assert not (tmp_path / "png").exists()


def test_plot_out_under_a_file_and_atomic_pngs(run, tmp_path):
    pytest.importorskip("matplotlib")
    f = tmp_path / "file"
    f.write_text("keep")
    one_line_error(runner.invoke(app, ["plot", str(run), "-o", str(f / "png")]), "--out=")
    assert f.read_text() == "keep"
    png = tmp_path / "png"
    r = runner.invoke(app, ["plot", str(run), "-o", str(png)])
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in png.iterdir())
    assert names and all(n.endswith(".png") for n in names)  # no temp files left
    assert all((png / n).read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for n in names)


# ----------------------------------------------------------------------------- presentation

def test_sweep_help_shows_section_names():
    r = runner.invoke(app, ["sweep", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert "[engine], [sweep], [workload]" in r.output


def test_wide_analyze_table_is_not_cut_off_a_tty(tmp_path, monkeypatch):
    """Default: one line per batch size within 80 columns (terminal or not, COLUMNS=80 or unset);
    --wide: every K's column whole, none squeezed away or cut with an ellipsis."""
    from dsdprof.cli import app as cli

    rows = [{"batch_size": b, "num_spec_tokens": k, "acceptance_length": 1.0 + 0.8 * k ** 0.5,
             "itl_s": 0.0123456 + 0.0007 * k * b} for b in (1, 2, 4, 8, 16, 32, 64, 128) for k in range(13)]
    p = tmp_path / "wide.parquet"
    pd.DataFrame(rows).to_parquet(p)
    for columns in (None, "80"):  # off a TTY: the default width, and a narrow COLUMNS
        if columns:
            monkeypatch.setenv("COLUMNS", columns)
        monkeypatch.setattr(cli, "console", cli.make_console())
        monkeypatch.setattr(cli, "err_console", cli.make_console(stderr=True))
        r = runner.invoke(app, ["analyze", str(p)])
        assert r.exit_code == 0, r.output
        assert "…" not in r.output
        lines = r.stdout.splitlines()
        assert max(len(line) for line in lines) <= 80, r.stdout
        for b in (1, 2, 4, 8, 16, 32, 64, 128):  # one whole line per batch size, numbers unbroken
            row = [line for line in lines if line.split()[:1] == [str(b)]]
            assert len(row) == 1 and row[0].rstrip().endswith("x"), r.stdout
        r = runner.invoke(app, ["analyze", str(p), "--wide"])
        assert r.exit_code == 0 and "…" not in r.output
        header = next(line for line in r.stdout.splitlines() if "BS" in line and "vs" in line)
        assert "vs K=12" in header  # every column whole, none squeezed away


# ----------------------------------------------------------------------------- validate resumes

VLLM_SPEC = """\
[engine]
name = "vllm"
model = "tgt"
draft_model = "drf"
method = "draft_model"

[sweep]
batch_sizes = [1, 4]
num_spec_tokens = [0, 3]
waves = 2
"""


def test_validate_resume_of_another_run_is_refused_before_any_engine(tmp_path):
    """The validate runner shares the run manifest: another table, fixed K, --waves or a sweep
    directory is refused in one line, and the run directory is left exactly as it was."""
    from dsdprof.config.spec import load_spec
    from dsdprof.io.store import SweepWriter

    spec = tmp_path / "v.toml"
    spec.write_text(VLLM_SPEC)
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"schema": "dsdprof.ktable/v1", "ranges": [[1, 2, 3], [3, 1048576, 1]]}))
    run = tmp_path / "validate-run"
    dump = load_spec(spec).model_dump(mode="json")
    dump["validate"] = {"table": str(table), "ranges": [[1, 2, 3], [3, 1048576, 1]], "fixed_ks": [3],
                        "design": "paired"}
    with SweepWriter(run, dump) as w:  # what `dsdprof validate` wrote before it was interrupted
        w.start({"engine": "vllm", "hardware": "cpu"})
    before = snapshot(run)

    def validate(*extra):
        return runner.invoke(app, ["validate", str(table), str(spec), "--out", str(run), "--resume", *extra])

    one_line_error(validate("--waves", "5"), "spec.sweep.waves=5", "(was 2)")
    one_line_error(validate("--fixed-k", "4"), "spec.validate.fixed_ks[0]=4", "(was 3)")
    one_line_error(validate("--design", "cells"), "spec.validate.design", "(was 'paired')")
    other = tmp_path / "t2.json"
    other.write_text(table.read_text())
    one_line_error(runner.invoke(app, ["validate", str(other), str(spec), "--out", str(run), "--resume"]),
                   "spec.validate.table=")
    assert snapshot(run) == before


# ----------------------------------------------------------------------------- names users bring

@pytest.mark.parametrize("edit, needles", [
    (("num_spec_tokens =", "num_speculative_tokens ="),
     ("sweep.num_speculative_tokens=", "did you mean sweep.num_spec_tokens")),
    (("waves =", "wavs ="), ("sweep.wavs=", "did you mean sweep.waves")),
    (("input_len = 16000", "input_len = 16000\noutput_len = 64"),
     ("workload.output_len=", "did you mean sweep.output_len")),
    (("input_len = 16000", 'input_len = 16000\ndataset = "random"'),
     ("workload.dataset='random'", "vllm bench", "'synthetic'")),
    (("input_len = 16000", 'input_len = 16000\ndataset = "sharegtp"'),
     ("workload.dataset='sharegtp'", "'sharegpt'")),
    (('model = "Llama-3.1-8B"', 'model = "Llama-3-8B"'),
     ("engine.model='Llama-3-8B'", "did you mean Llama-3.1-8B?")),
    (('"RTX 4090"', '"B20"'), ("sim.hardware='B20'", "did you mean B200?")),
])
def test_vllm_names_and_near_misses_get_a_pointer(tmp_path, edit, needles):
    p = tmp_path / "s.toml"
    p.write_text(SIM_SPEC.format(waves=20).replace(*edit))
    one_line_error(runner.invoke(app, ["sweep", str(p), "--out", str(tmp_path / "run")]), *needles)
    assert not (tmp_path / "run").exists()


def test_show_reads_dsdprofs_own_vllm_and_trtllm_exports(tmp_path, run):
    vllm = tmp_path / "v.json"
    trt = tmp_path / "t.json"
    table = tmp_path / "t2.json"
    for fmt, path in (("vllm", vllm), ("trtllm", trt), ("table", table)):
        r = runner.invoke(app, ["export", str(run), "--format", fmt, "-o", str(path), "--allow-partial"])
        assert r.exit_code == 0, r.output
    ranges = json.loads(table.read_text())["ranges"]
    for path, kind in ((vllm, "vLLM --speculative-config"), (trt, "TensorRT-LLM speculative_config")):
        r = runner.invoke(app, ["show", str(path)])
        assert r.exit_code == 0, r.output
        assert kind in r.stdout
        first = f"{ranges[0][0]}" + ("+" if len(ranges) == 1 else f"-{ranges[0][1]}")
        assert first in r.stdout
    (tmp_path / "other.json").write_text('{"hello": 1}')
    one_line_error(runner.invoke(app, ["show", str(tmp_path / "other.json")]), "schema=None")


def test_sweep_overrides_are_validated_recorded_and_needed_to_resume(tmp_path, spec):
    out = tmp_path / "run"
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--dry-run", "--batch-sizes", "1,8",
                            "--num-spec-tokens", "0,2"])
    assert r.exit_code == 0, r.output
    assert "batch sizes 1, 8; K 0, 2" in r.stdout and "6 cells" in r.stdout
    assert "estimated duration" in r.stdout
    assert not out.exists()  # a dry run writes nothing
    one_line_error(runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--batch-sizes", "1,x"]),
                   "--batch-sizes='1,x'")
    one_line_error(runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--num-spec-tokens", "0,99"]),
                   "--num-spec-tokens='0,99'")
    one_line_error(runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--model", "Llama-3-8B"]),
                   "Llama-3-8B", "did you mean Llama-3.1-8B?")
    assert not out.exists()
    r = runner.invoke(app,
                      ["sweep", str(spec), "--out", str(out), "--batch-sizes", "1",
                       "--num-spec-tokens", "0,2",
                            "--model", "Llama-3.2-1B", "--draft-model", "Llama-3.2-1B"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "_sweep.json").read_text())
    sweep = manifest["spec"]["sweep"]
    assert sweep["batch_sizes"] == [1] and sweep["num_spec_tokens"] == [0, 2]
    assert manifest["spec"]["engine"]["model"] == "Llama-3.2-1B"
    one_line_error(runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--resume"]),
                   "differs from the run being resumed")
    r = runner.invoke(app,
                      ["sweep", str(spec), "--out", str(out), "--batch-sizes", "1",
                       "--num-spec-tokens", "0,2",
                            "--model", "Llama-3.2-1B", "--draft-model", "Llama-3.2-1B", "--resume"])
    assert r.exit_code == 0 and "3 skipped" in r.stdout, r.output


def test_dry_run_of_a_vllm_spec_checks_the_dataset_and_estimates(tmp_path):
    p = tmp_path / "v.toml"
    p.write_text(VLLM_SPEC)
    r = runner.invoke(app, ["sweep", str(p), "--out", str(tmp_path / "run"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "6 cells" in r.stdout and "assumed 20 ms per decode step" in " ".join(r.stdout.split())
    p.write_text(VLLM_SPEC + '[workload]\ndataset = "prompts.jsonl"\n')
    one_line_error(runner.invoke(app, ["sweep", str(p), "--out", str(tmp_path / "run"), "--dry-run"]),
                   "workload.dataset='prompts.jsonl'")


def test_help_keeps_section_names_and_shows_flags_without_a_value():
    r = runner.invoke(app, ["fleet", "--help"], env={"COLUMNS": "250"})
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "[fleet] out, and [[runs]] or base + [matrix]" in text and "Override [fleet] out" in text
    for cmd in ("sweep", "validate", "export", "analyze", "fleet"):
        r = runner.invoke(app, [cmd, "--help"], env={"COLUMNS": "250"})
        assert r.exit_code == 0 and "<bool>" not in r.output, (cmd, r.output)
    r = runner.invoke(app, ["sweep", "--help"], env={"COLUMNS": "250"})
    resume = next(line for line in r.output.splitlines() if "--resume" in line and "Continue" in line)
    assert resume.split("--resume")[1].split()[0] == "Continue"  # no value shown after the flag
    r = runner.invoke(app, ["validate", "--help"], env={"COLUMNS": "250"})
    assert "--max-regret" in r.output and "FRACTION" in r.output and "tokens/s per user" in r.output
    assert "TOPS" not in r.output and "--fail-on-regret" not in r.output  # deprecated: hidden, still accepted


def test_validate_on_a_sim_spec_prints_only_the_real_error(tmp_path, run, spec):
    table = tmp_path / "t.json"
    assert runner.invoke(app, ["export", str(run), "-o", str(table), "--allow-partial"]).exit_code == 0
    (tmp_path / "other.toml").write_text(SIM_SPEC.format(waves=20).replace('"Llama-3.1-8B"', '"Qwen3-8B"'))
    one_line_error(runner.invoke(app, ["validate", str(table), str(tmp_path / "other.toml"), "--out",
                                       str(tmp_path / "v")]), "engine.name='sim'", "real vLLM")
