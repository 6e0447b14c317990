"""``dsdprof toy-models --hidden N --layers N``: the tiny pairs the benchmarks and the vLLM tests
use are built by the command's own library call (no engine, no model built here: the builder is
recorded); bad values are one line naming the option and the value, exit 2."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.measure import toy_models
from dsdprof.measure.toy_models import DENSE, ToyModelConfig, toy_config

# benchmarks/bench_synthetic_truth.py's tiny pair (its committed truth): --build-tiny builds toy_config's
BENCH_TINY = ToyModelConfig(replace(DENSE, hidden=64, num_layers=2, intermediate=128, num_heads=2,
                                    num_kv_heads=1, head_dim=32))
# tests/conftest.py's tiny pair for the real-vLLM tests
TESTS_TINY = ToyModelConfig(replace(DENSE, hidden=256, num_layers=2, intermediate=512, num_heads=4,
                                    num_kv_heads=2))


@pytest.fixture()
def built(monkeypatch):
    got: list[tuple[str, ToyModelConfig]] = []

    def record(out, cfg):
        got.append((str(out), cfg))
        return toy_models.ToyPair(out / "target", out / "draft", cfg)

    monkeypatch.setattr(toy_models, "build_toy_pair", record)
    return got


def test_hidden_and_layers_build_the_benchmarks_tiny_pair(built, tmp_path):
    res = CliRunner().invoke(app, ["toy-models", str(tmp_path), "--kind", "dense", "--hidden", "64",
                                   "--layers", "2"])
    assert res.exit_code == 0, res.output
    assert built == [(str(tmp_path / "dense"), BENCH_TINY)]
    assert toy_config("dense", hidden=64, num_layers=2) == BENCH_TINY
    assert toy_config("dense", hidden=256, num_layers=2) == TESTS_TINY
    # the defaults are untouched without --hidden; explicit shape options win over the scaled ones
    assert toy_config("dense") == ToyModelConfig()
    assert toy_config("dense", hidden=64, num_heads=4, num_kv_heads=4).arch.num_heads == 4
    built.clear()
    res = CliRunner().invoke(app, ["toy-models", str(tmp_path), "--hidden", "128", "--layers", "3",
                                   "--heads", "4", "--kv-heads", "1", "--ffn", "96"])
    assert res.exit_code == 0, res.output
    shapes = [(c.kind, c.arch.hidden, c.arch.num_layers, c.arch.num_heads, c.arch.num_kv_heads,
               c.arch.intermediate) for _, c in built]
    assert shapes == [("dense", 128, 3, 4, 1, 96), ("moe", 128, 3, 4, 1, 96)]


@pytest.mark.parametrize("args, shown", [
    (["--hidden", "0"], "--hidden=0"), (["--layers", "1"], "--layers=1"), (["--layers", "65"], "--layers=65"),
    (["--hidden", "96", "--heads", "5"], "--heads=5"),
    (["--kind", "dense", "--kv-heads", "3"], "--kv-heads=3"),
    (["--experts", "1"], "--experts=1"), (["--kind", "big"], "--kind='big'"),
    # not a number: the same one line, not typer's multi-line error box
    (["--hidden", "abc"], "--hidden='abc'"), (["--layers", "2.5"], "--layers='2.5'"),
    (["--seed", "x"], "--seed='x'"), (["--residual-scale", "big"], "--residual-scale='big'"),
    (["--top-k", ""], "--top-k=''")])
def test_bad_values_are_one_line_naming_option_and_value(built, tmp_path, args, shown):
    res = CliRunner().invoke(app, ["toy-models", str(tmp_path), *args])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {shown}:"), res.output
    assert built == []  # checked before anything is built
