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
    _one_line_error(runner.invoke(app, ["sweep", str(tmp_path / "none.toml"), "--out", str(tmp_path / "r")]), "spec=")
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
