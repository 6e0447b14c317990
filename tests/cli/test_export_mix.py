"""``dsdprof export SOURCE --mix CAT=W,... [--draft NAME]``: a draft's K table for a traffic mix
(dsdprof.report.drafts.mix_export_table), every export format, bad input as one line, exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.formats.ktable import validate_table
from dsdprof.jobs.compare_drafts import PLAN_FILE
from tests.decide.test_drafts_domains import _grid

# code likes long drafts, text short ones at BS 1; at BS 8 both K 1
CELLS = {"code": {(1, 1): 1.3, (1, 2): 1.6, (1, 3): 1.9, (8, 1): 1.1, (8, 2): 1.0, (8, 3): 0.8},
         "text": {(1, 1): 1.2, (1, 2): 1.1, (1, 3): 0.9, (8, 1): 1.05, (8, 2): 0.9, (8, 3): 0.7}}


@pytest.fixture()
def comparison(tmp_path, monkeypatch):
    """A compare-drafts directory whose grids are CELLS (two drafts, the same grid)."""
    from dsdprof.report import drafts as rd

    out = tmp_path / "cmp"
    (out / "dm").mkdir(parents=True)
    plan = {"spec": "s.toml", "categories": {"code": 5, "text": 5},
            "drafts": [{"name": n, "method": m, "draft_model": None, "speculative_extra": {}}
                       for n, m in (("dm", "draft_model"), ("ngram", "ngram"))]}
    (out / PLAN_FILE).write_text(json.dumps(plan))
    grids = {"dm": _grid(CELLS), "ngram": _grid(CELLS)}
    monkeypatch.setattr(rd, "load_comparison", lambda root: rd.Comparison(
        out, plan, grids, {"model": "toy", "method": "draft_model"}, {}))
    return out


def _export(*args: str):
    return CliRunner().invoke(app, ["export", *args])


def _ks(doc) -> dict[int, int]:
    return {int(p["batch_size"]): int(p["k"]) for p in doc["points"]}


@pytest.mark.parametrize("mix, ks", [("code=1", {1: 3, 8: 1}), ("text=1", {1: 1, 8: 1}),
                                     # 0.3 code: K1 1.23, K2 1.25, K3 1.2 -> K2 at BS 1
                                     ("code=3,text=7", {1: 2, 8: 1}),
                                     ("code=0.7,text=0.3", {1: 3, 8: 1})])
def test_mix_moves_the_table(comparison, tmp_path, mix, ks):
    res = _export(str(comparison), "--mix", mix, "--draft", "dm", "-o", str(tmp_path / "t.json"))
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "t.json").read_text())
    validate_table(doc)
    assert _ks(doc) == ks
    assert doc["provenance"]["draft"] == "dm"


def test_a_draft_directory_names_its_draft_and_formats_follow(comparison):
    res = _export(str(comparison / "dm"), "--mix", "code=1", "--format", "vllm")
    assert res.exit_code == 0, res.output
    cfg = json.loads(res.stdout)
    assert cfg["num_speculative_tokens_per_batch_size"][0][2] == 3  # BS 1 -> K 3 for code traffic


@pytest.mark.parametrize("args, field", [
    (["--mix", "code=1"], "--mix='code=1'"),                 # two drafts: which one? (names --draft)
    ([], "SOURCE="),                                         # a comparison needs --mix
    (["--mix", "web=1", "--draft", "dm"], "--mix"),          # not a measured category
    (["--mix", "code=x", "--draft", "dm"], "--mix"),         # not a number
    (["--mix", "code=0,text=0", "--draft", "dm"], "--mix"),  # all zero
    (["--mix", "code=1", "--draft", "eagle"], "--draft"),    # no such draft
    (["--draft", "dm"], "--draft"),                          # --draft needs --mix
    (["--mix", "code=1", "--draft", "dm", "--context", "512"], "--context")])
def test_bad_mix_input_is_one_line_exit_2(comparison, args, field):
    res = _export(str(comparison), *args)
    assert res.exit_code == 2, res.output
    assert field in res.output and "Traceback" not in res.output
    assert "None" not in res.output  # what the user typed, not an option they left out
    assert len(res.output.strip().splitlines()) == 1


def test_mix_on_a_plain_run_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    res = _export(str(tmp_path / "run"), "--mix", "code=1")
    assert res.exit_code == 2 and "--mix" in res.output and "compare-drafts" in res.output
