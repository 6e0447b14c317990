"""Pure tests: acceptance by category, the K of a traffic mix, per-category regret, draft ranking."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dsdprof.decide.domains import best_k, category_regret, check_weights, mix_table, mixed_grid, per_position
from dsdprof.decide.drafts import draft_memory, rank_drafts, recommend
from dsdprof.errors import InputError
from dsdprof.measure.categories import category_counts, parse_mix, split_by_category
from tests.support.toy_domains import toy_category_prompts


def _grid(spec: dict[str, dict[tuple[int, int], float]], hw: float = 0.02) -> pd.DataFrame:
    rows = []
    for cat, cells in spec.items():
        for (b, k), s in cells.items():
            rows.append({"category": cat, "batch_size": b, "num_spec_tokens": k,
                         "acceptance_length": 1 + k / 2, "itl_s": 0.01 * (1 + k),
                         "acceptance_per_pos": [0.9 - 0.1 * i for i in range(k)], "speedup": s,
                         "speedup_low": s - hw, "speedup_high": s + hw, "vanilla_goodput": 100.0})
    return pd.DataFrame(rows)


# code likes long drafts, text short ones; at BS 1 only
GRID = _grid({"code": {(1, 1): 1.3, (1, 2): 1.6, (1, 3): 1.9},
              "text": {(1, 1): 1.2, (1, 2): 1.1, (1, 3): 0.9}})


def test_mix_k_moves_with_the_weights():
    assert mix_table(GRID, {"code": 1, "text": 0})["k"].tolist() == [3]
    assert mix_table(GRID, {"code": 0, "text": 1})["k"].tolist() == [1]
    # 0.3 code: K1 0.3*1.3+0.7*1.2=1.23, K2 0.3*1.6+0.7*1.1=1.25, K3 0.3*1.9+0.7*0.9=1.2 -> K2
    t = mix_table(GRID, {"code": 0.3, "text": 0.7})
    assert t["k"].tolist() == [2]
    assert t["speedup"].iloc[0] == pytest.approx(1.25)


def test_mix_interval_adds_halfwidths_in_quadrature():
    m = mixed_grid(GRID, {"code": 1, "text": 1})
    r = m[m["num_spec_tokens"] == 1].iloc[0]
    assert r["speedup"] == pytest.approx(1.25)
    assert r["speedup_high"] - r["speedup"] == pytest.approx((2 * (0.5 * 0.02) ** 2) ** 0.5)


def test_mix_leaves_out_cells_missing_a_weighted_category():
    g = GRID[~((GRID["category"] == "text") & (GRID["num_spec_tokens"] == 3))]
    assert sorted(mixed_grid(g, {"code": 1, "text": 1})["num_spec_tokens"]) == [1, 2]
    assert sorted(mixed_grid(g, {"code": 1, "text": 0})["num_spec_tokens"]) == [1, 2, 3]


def test_regret_per_category():
    r = category_regret(GRID, {1: 2}).set_index("category")
    assert r.loc["code", "own_k"] == 3 and r.loc["text", "own_k"] == 1
    assert r.loc["code", "regret"] == pytest.approx(1 - 1.6 / 1.9)
    assert r.loc["text", "regret"] == pytest.approx(1 - 1.1 / 1.2)
    assert category_regret(GRID, {1: 3}).set_index("category").loc["code", "regret"] == 0


def test_best_k_ties_take_the_smaller_k_and_per_position_uses_the_largest_k():
    g = _grid({"a": {(4, 1): 1.5, (4, 2): 1.5}})
    assert best_k(g)["k"].tolist() == [1]
    pp = per_position(GRID).set_index("category")
    assert pp.loc["code", "k"] == 3 and len(pp.loc["code", "acceptance_per_pos"]) == 3


def test_weights_checked():
    assert check_weights({"code": 3}, ["code", "text"]) == {"code": 1.0, "text": 0.0}
    with pytest.raises(ValueError):
        check_weights({"code": 0}, ["code"])
    assert parse_mix("code=3, text=1", ["code", "text"]) == {"code": 0.75, "text": 0.25}
    for bad in ("code", "code=x", "code=-1", "web=1", "code=0"):
        with pytest.raises(InputError):
            parse_mix(bad, ["code", "text"])


def test_rank_wins_ties_and_recommendation_ranges():
    # A leads BS 1 clearly, B leads BS 16 clearly, BS 4 within intervals
    a = _grid({"c": {(1, 2): 1.8, (4, 2): 1.3, (16, 1): 0.9}})
    b = _grid({"c": {(1, 2): 1.2, (4, 2): 1.31, (16, 1): 1.1}})
    r = rank_drafts({"A": a, "B": b}, {"c": 1}).set_index(["batch_size", "draft"])
    assert r.loc[(1, "A"), "verdict"] == "wins" and r.loc[(1, "B"), "verdict"] == "behind"
    assert r.loc[(4, "B"), "rank"] == 1 and r.loc[(4, "B"), "verdict"] == "tied"
    assert r.loc[(4, "A"), "verdict"] == "tied"
    assert r.loc[(16, "B"), "verdict"] == "wins"
    rec = recommend(rank_drafts({"A": a, "B": b}, {"c": 1}))
    assert rec["ranges"] == [[1, 3, "A", []], [4, None, "B", ["A"]]]
    assert "BS 4+: B (tied: A)" in rec["text"]
    one = recommend(rank_drafts({"A": a}, {"c": 1}))
    assert one["draft"] == "A"


def test_drafts_whose_own_vanillas_disagree_get_no_verdict_there():
    """A cells-design draft's vanilla runs minutes from its K cells: on a drifting machine its
    speedup is over a slow (or fast) vanilla. The vanillas are one configuration, so a spread
    beyond the tolerance is drift, and that batch size is left unsettled, not won."""
    a = _grid({"c": {(1, 2): 1.8, (16, 1): 1.2}})
    b = _grid({"c": {(1, 2): 1.2, (16, 1): 1.7}})
    b.loc[b["batch_size"] == 16, "vanilla_goodput"] = 50.0  # half of A's: B's speedup is inflated
    r = rank_drafts({"A": a, "B": b}, {"c": 1}).set_index(["batch_size", "draft"])
    assert r.loc[(1, "A"), "verdict"] == "wins" and r.loc[(1, "A"), "vanilla_spread"] == 0
    assert r.loc[(16, "B"), "rank"] == 1 and r.loc[(16, "B"), "verdict"] == "vanillas disagree"
    assert r.loc[(16, "A"), "verdict"] == "vanillas disagree"
    assert abs(r.loc[(16, "A"), "vanilla_spread"] - 1.0) < 1e-9
    rec = recommend(rank_drafts({"A": a, "B": b}, {"c": 1}))
    assert rec["unsettled"] == [16] and "not settled at BS 16" in rec["text"], rec
    b.loc[b["batch_size"] == 16, "vanilla_goodput"] = 90.0  # 11 % apart: within the tolerance
    r = rank_drafts({"A": a, "B": b}, {"c": 1}).set_index(["batch_size", "draft"])
    assert r.loc[(16, "B"), "verdict"] == "wins"
    assert recommend(rank_drafts({"A": a, "B": b}, {"c": 1}))["unsettled"] == []


def test_draft_memory(tmp_path):
    assert draft_memory(None, "float32", 100, 20, 4)["weights_bytes"] == 0
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 8,
                                                "num_key_value_heads": 2, "hidden_size": 512}))
    (d / "model.safetensors").write_bytes(b"x" * 1000)
    m = draft_memory(str(d), "float32", 100, 20, 4, batch_size=3)
    assert m["weights_bytes"] == 1000
    assert m["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 4
    assert m["kv_bytes"] == m["kv_bytes_per_token"] * 124 * 3


def test_categories_split_and_toy_sets(tmp_path):
    recs = toy_category_prompts(5, seed=1)
    assert category_counts(recs) == {"code": 5, "text": 5}
    assert recs == toy_category_prompts(5, seed=1)
    shipped = Path(__file__).parents[2] / "sweeps/prompts/toy-domains.jsonl"
    assert [json.loads(line) for line in shipped.read_text().splitlines()] == toy_category_prompts()
    src = tmp_path / "w.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs)
                   + json.dumps({"category": "writing", "turns": ["mt-bench style"]}) + "\n")
    paths = split_by_category(src, tmp_path / "out", ["text", "writing"])
    assert list(paths) == ["text", "writing"]
    assert len(paths["text"].read_text().splitlines()) == 5
    with pytest.raises(InputError):
        split_by_category(src, tmp_path / "out", ["web"])
    # code prompts repeat their character 8-grams far more than text prompts (what n-gram drafting
    # feeds on): about 0.5 against 0.02
    def repeats(text: str) -> float:
        grams = [text[i:i + 8] for i in range(len(text) - 7)]
        return 1 - len(set(grams)) / len(grams)
    code = [repeats(r["prompt"]) for r in recs if r["category"] == "code"]
    text = [repeats(r["prompt"]) for r in recs if r["category"] == "text"]
    assert min(code) > 0.3 > 0.05 > max(text)


def test_compare_drafts_plans_one_sweep_per_draft_and_category(tmp_path):
    from dsdprof.jobs.compare_drafts import PLAN_FILE, run_compare_drafts

    seen = []
    got = run_compare_drafts("sweeps/toy-dense-drafts-cpu.toml", tmp_path,
                             run_one=lambda spec, d, again: seen.append((spec, d)) or d.name)
    assert [(d.parent.name, d.name) for _, d in seen] == [
        ("draft-model", "code"), ("ngram", "code"), ("draft-model", "text"), ("ngram", "text")]
    by = {(d.parent.name, d.name): s for s, d in seen}
    assert by[("ngram", "code")].engine.method == "ngram"
    assert by[("ngram", "code")].engine.draft_model is None
    assert by[("draft-model", "text")].engine.draft_model == "toy_models/dense/draft"
    assert by[("draft-model", "text")].workload.dataset.endswith("_prompts/text.jsonl")
    # n-gram drafts 0..K tokens a step: the cells design (tests/jobs/test_compare_drafts_ngram.py)
    assert by[("ngram", "code")].sweep.design == "cells"
    assert by[("ngram", "code")].sweep.model_copy(update={"design": "paired"}) == \
        by[("draft-model", "text")].sweep
    assert json.loads((tmp_path / PLAN_FILE).read_text())["categories"] == {"code": 64, "text": 64}
    assert len(got) == 4


@pytest.mark.parametrize("drafts, field", [
    ("", "drafts"), ('[[drafts]]\nmethod = "ngram"\n', "drafts[0].name"),
    ('[[drafts]]\nname = "a"\n[[drafts]]\nname = "a"\n', "drafts[1].name"),
    ('[[drafts]]\nname = "a"\nmodel = "x"\n', "drafts[0].model")])
def test_compare_drafts_bad_spec_names_the_field(tmp_path, drafts, field):
    from dsdprof.jobs.compare_drafts import plan_drafts

    p = tmp_path / "s.toml"
    p.write_text('[engine]\nmodel = "m"\n' + drafts)
    with pytest.raises(InputError) as err:
        plan_drafts(p, tmp_path)
    assert err.value.field == field


SIM_SPEC = '''
[engine]
name = "sim"
model = "Llama-3.1-8B"
dtype = "bfloat16"
max_model_len = 4096
[sweep]
batch_sizes = [1, 64]
num_spec_tokens = [1, 2, 3]
waves = 2
output_len = 32
[workload]
dataset = "w.jsonl"
input_len = 256
[sim]
hardware = "H100 SXM"
context_len = 512
acceptance_per_pos = [0.7, 0.5, 0.35]
[[drafts]]
name = "eagle3"
method = "eagle3"
draft_model = "EAGLE3-Llama-3.1-8B"
[[drafts]]
name = "ngram"
method = "ngram"
'''


def test_compare_drafts_and_report_end_to_end_on_the_analytic_engine(tmp_path, monkeypatch):
    """The CLI path (sweeps, report, mix table) on the sim engine: plumbing, not acceptance."""
    from typer.testing import CliRunner

    from dsdprof.cli.app import app
    from dsdprof.formats.ktable import validate_table

    monkeypatch.chdir(tmp_path)
    recs = [{"category": "code", "prompt": "x"}, {"category": "text", "prompt": "y"},
            {"category": "text", "prompt": "z"}]
    (tmp_path / "w.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "s.toml").write_text(SIM_SPEC)
    runner = CliRunner()
    res = runner.invoke(app, ["compare-drafts", "s.toml", "--out", "out"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["drafts-report", "out", "--mix", "code=1,text=3", "--md", "r.md",
                              "--draft", "ngram", "--table", "t.json"])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "r.md").read_text()
    assert "mix: code 25 %, text 75 %" in md
    # n-gram drafting costs no draft forward pass: with the same acceptance it must lead
    assert "**Recommendation:** ngram at every measured batch size" in md
    doc = json.loads((tmp_path / "t.json").read_text())
    validate_table(doc)
    assert doc["provenance"]["mix"] == "code=0.25,text=0.75"
    # export --mix: the same table from a real compare-drafts directory (and from the draft's own)
    for src in (["out", "--draft", "ngram"], ["out/ngram"]):
        res = runner.invoke(app, ["export", *src, "--mix", "code=1,text=3"])
        assert res.exit_code == 0, res.output
        got = json.loads(res.stdout)
        def when_aside(d: dict) -> dict:  # created_at: when each was written
            return {**d, "provenance": {k: v for k, v in d["provenance"].items() if k != "created_at"}}
        assert when_aside(got) == when_aside(doc)
    # the 80-column text report (printed without --md/--text) and the ranking plot
    res = runner.invoke(app, ["drafts-report", "out", "--mix", "code=1,text=3", "--ranking-plot", "r.png"])
    assert res.exit_code == 0, res.output
    assert "Recommendation: ngram at every measured batch size" in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    res = runner.invoke(app, ["drafts-report", "out", "--mix", "web=1"])
    assert res.exit_code == 2 and "--mix" in res.output and "Traceback" not in res.output


def test_drafted_per_step_is_the_effective_k_of_a_variable_drafter():
    from dsdprof.decide.domains import drafted_per_step

    # cells design (n-gram): 2 rows of BS 4, 50 + 30 steady steps, 120 + 40 draft tokens at K 3
    rows = pd.DataFrame({"design": ["cells", "cells"], "batch_size": [4, 4], "steady_steps": [50, 30],
                         "num_draft_tokens": [120, 40]})
    assert drafted_per_step(rows, 3) == pytest.approx(160 / 320)
    # the paired design's rows always drafted K (their steady steps count only the timed ones)
    assert drafted_per_step(rows.assign(design="paired"), 3) == 3.0
