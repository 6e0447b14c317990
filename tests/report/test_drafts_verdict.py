"""A verdict per category before any mix: the drafts' own vanillas are checked per category and
batch size, and a mix inherits its worst category. The held-out case of issue 48: at BS 8 the two
``json`` sweeps' vanillas were 28 % apart (1,196 vs 932 tok/s) and ``prose``'s 0.9 %; weighting the
vanillas first averaged that to under 15 % and the batch size was called "tied". Every renderer
(80-column text, Markdown, JSON, the ranking PNG, the HTML panel) marks it unsettled."""

from __future__ import annotations

import json

import pytest

from dsdprof.decide.drafts import rank_drafts, recommend, vanilla_spreads
from dsdprof.report.drafts import Comparison
from tests.decide.test_drafts_domains import _grid

# A and B tied within their intervals at BS 1 and 8 in both categories
CELLS = {"json": {(1, 2): 1.50, (8, 2): 1.20}, "prose": {(1, 2): 1.30, (8, 2): 1.10}}


def _drafts():
    a, b = _grid(CELLS), _grid({c: {bk: s + 0.01 for bk, s in cells.items()} for c, cells in CELLS.items()})
    at8 = a["batch_size"] == 8
    a.loc[at8 & (a["category"] == "json"), "vanilla_goodput"] = 1196 / 8
    b.loc[at8 & (b["category"] == "json"), "vanilla_goodput"] = 932 / 8  # 28.3 % apart
    a.loc[at8 & (a["category"] == "prose"), "vanilla_goodput"] = 100.0
    b.loc[at8 & (b["category"] == "prose"), "vanilla_goodput"] = 100.9  # 0.9 % apart
    return {"A": a, "B": b}


def _comparison(tmp_path) -> Comparison:
    plan = {"spec": "s.toml", "categories": {"json": 5, "prose": 5},
            "drafts": [{"name": n, "method": "draft_model", "draft_model": None} for n in ("A", "B")]}
    return Comparison(tmp_path, plan, _drafts(), {"model": "toy"}, {})


def test_a_mix_inherits_its_worst_category():
    grids = _drafts()
    mix = {"json": 1.0, "prose": 1.0}
    # the mix-weighted vanillas are 14.8 % apart, under the 15 % tolerance: the old check said tied
    van = rank_drafts(grids, mix).set_index(["batch_size", "draft"])["vanilla_goodput"]
    assert van.loc[(8, "A")] / van.loc[(8, "B")] - 1 < 0.15
    spreads = vanilla_spreads(grids, mix).set_index(["batch_size", "category"])["spread"]
    assert spreads.loc[(8, "json")] == pytest.approx(1196 / 932 - 1)
    assert spreads.loc[(8, "prose")] == pytest.approx(0.009)
    r = rank_drafts(grids, mix).set_index(["batch_size", "draft"])
    assert set(r.loc[8, "verdict"]) == {"vanillas disagree"}
    assert r.loc[(8, "A"), "vanilla_category"] == "json"
    assert r.loc[(8, "A"), "vanilla_spread"] == pytest.approx(0.283, abs=1e-3)
    assert set(r.loc[1, "verdict"]) == {"tied"}
    rec = recommend(rank_drafts(grids, mix))
    assert rec["unsettled"] == [8] and "BS 8 (json: vanillas 28 % apart)" in rec["text"]
    # a mix without json is settled: prose's vanillas agree
    r = rank_drafts(grids, {"json": 0.0, "prose": 1.0}).set_index(["batch_size", "draft"])
    assert set(r.loc[8, "verdict"]) == {"tied"}


def test_every_renderer_marks_the_unsettled_batch_size(tmp_path):
    from dsdprof.report.drafts import drafts_json, drafts_markdown
    from dsdprof.report.drafts_text import drafts_text, ranking_figure
    from dsdprof.report.html.panels import drafts_panels

    comp = _comparison(tmp_path)
    mix = {"json": 1.0, "prose": 1.0}
    text = drafts_text(comp, mix)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "BS 8: json 28 % apart" in " ".join(text.split())
    assert [ln.split()[-1] for ln in text.splitlines() if ln.startswith("     8 ")] == ["disagree"] * 2
    assert "BS 8: json 28 % apart" in drafts_markdown(comp, mix)
    doc = json.loads(json.dumps(drafts_json(comp, mix)))  # plain JSON: no NaN, no numpy scalars
    assert doc["unsettled"] == [{"batch_size": 8, "category": "json",
                                 "vanilla_spread": pytest.approx(0.283, abs=1e-3)}]
    assert {r["verdict"] for r in doc["ranking"] if r["batch_size"] == 8} == {"vanillas disagree"}
    assert doc["recommendation"]["unsettled"] == [8]
    from dsdprof.report.drafts import drafts_figure

    titles = [ax.get_title() for ax in drafts_figure(comp, mix).axes]
    assert titles[0] == "BS 1"
    assert titles[1].startswith("BS 8: vanillas disagree") and "json 28 %" in titles[1]
    fig = ranking_figure(comp, mix)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert any(t.startswith("vanillas disagree") and "json 28 %" in t for t in labels), labels
    (panel,) = drafts_panels(comp)
    assert any("vanillas disagree" in n and "BS 8: json 28 %" in n for n in panel.notes), panel.notes
    chart = str(panel.charts[0])
    assert "vanillas disagree: not settled" in chart


def test_drafts_report_json_marks_it_too(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dsdprof.cli.app import app
    from dsdprof.report import drafts as rd

    monkeypatch.setattr(rd, "load_comparison", lambda root: _comparison(tmp_path))
    res = CliRunner().invoke(app, ["drafts-report", str(tmp_path), "--mix", "json=1,prose=1", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [u["batch_size"] for u in doc["unsettled"]] == [8]
    assert doc["mix"] == {"json": 0.5, "prose": 0.5}
    res = CliRunner().invoke(app, ["drafts-report", str(tmp_path), "--table", str(tmp_path / "t.json")])
    assert res.exit_code == 2 and res.output.startswith("error: --table=") and "None" not in res.output
    (tmp_path / "r.md").write_text("mine")
    res = CliRunner().invoke(app, ["drafts-report", str(tmp_path), "--text", str(tmp_path / "r.txt"),
                                   "--md", str(tmp_path / "r.md")])
    assert res.exit_code == 2 and res.output.startswith("error: --md=") and "--force" in res.output
    assert not (tmp_path / "r.txt").exists()  # nothing written when one output is refused
