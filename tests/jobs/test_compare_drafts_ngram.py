"""A drafter that proposes 0..K tokens a step (vLLM's n-gram, suffix decoding): its cells are
servers configured at K, every steady step counted; the exact-K check becomes an upper bound."""

from __future__ import annotations

import pytest

from dsdprof.formats.trace import Step
from dsdprof.measure.vllm.metrics import MetricSnapshot, build_measurement
from dsdprof.measure.vllm.trace import CellFailure, summarize


def _wave(drafted_per_step: list[tuple[int, ...]], accepted: list[tuple[int, ...]], dt: float = 0.1):
    """One measured wave: a prefill step, then one decode step per entry (duration ``dt``)."""
    bs = len(drafted_per_step[0])
    steps = [Step(0, 0.0, bs, 0, 64 * bs, 0, (), (), {})]
    for i, (d, a) in enumerate(zip(drafted_per_step, accepted)):
        gen = tuple(x + 1 for x in a)
        steps.append(Step(0, (i + 1) * dt, bs, bs, 0, 0, d, gen,
                          {f"r{j}": g for j, g in enumerate(gen)}, accepted=a))
    return steps


# BS 2 at K=3: full, short and empty drafts (no n-gram match), as vLLM's n-gram drafter proposes
DRAFTED = [(3, 0), (3, 2), (0, 0), (1, 3), (3, 3)]
ACCEPTED = [(2, 0), (3, 1), (0, 0), (1, 0), (0, 3)]


def test_exact_k_check_rejects_short_drafts_and_up_to_accepts_them():
    steps = _wave(DRAFTED, ACCEPTED)
    with pytest.raises(CellFailure, match="did not draft K=3"):
        summarize(steps, 2, 3, 3)
    t = summarize(steps, 2, 3, 3, up_to=True)
    # every request-step counts, the empty and short drafts included: AL = tokens / request-steps
    assert t.acceptance_length == pytest.approx((sum(map(sum, ACCEPTED)) + 10) / 10)
    assert t.steady_steps == 5 and t.itl_s == pytest.approx(0.1)
    # a draft is a request-step that drafted something; drafted per draft is their mean length
    assert t.num_drafts == 7 and t.num_draft_tokens == 18
    assert t.drafted_per_draft == pytest.approx(18 / 7)
    # position i: accepted at i / drafted at i (a short draft drafts only its first positions)
    assert t.acceptance_per_pos[0] == pytest.approx(5 / 7)
    assert t.acceptance_per_pos[2] == pytest.approx(2 / 5)


def test_up_to_still_rejects_a_draft_longer_than_k():
    steps = _wave([(3, 4)] + DRAFTED[1:], [(2, 4)] + ACCEPTED[1:])
    with pytest.raises(CellFailure, match="did not draft at most K=3"):
        summarize(steps, 2, 3, 3, up_to=True)


def test_vllm_counter_check_is_an_upper_bound_for_variable_drafters():
    steps = _wave(DRAFTED, ACCEPTED)
    t = summarize(steps, 2, 3, 3, up_to=True)
    after = MetricSnapshot(drafts=7, draft_tokens=18, accepted=sum(map(sum, ACCEPTED)))
    exact = build_measurement(t, MetricSnapshot(), after, [], 3, 1.0, expected_k=3, batch_size=2)
    assert "drafts: vLLM drafted 2.5714 tokens per draft" in exact.checks_failed
    ok = build_measurement(t, MetricSnapshot(), after, [], 3, 1.0, expected_k=3, batch_size=2, up_to=True)
    assert "drafts:" not in ok.checks_failed
    over = MetricSnapshot(drafts=7, draft_tokens=28, accepted=9)
    bad = build_measurement(t, MetricSnapshot(), over, [], 3, 1.0, expected_k=3, batch_size=2, up_to=True)
    assert "drafts: vLLM drafted 4.0000 tokens per draft" in bad.checks_failed


def test_compare_drafts_runs_variable_drafters_in_the_cells_design(tmp_path):
    from dsdprof.jobs.compare_drafts import PLAN_FILE, plan_drafts, write_plan

    plan = plan_drafts("sweeps/toy-dense-drafts-cpu.toml", tmp_path)
    assert plan.specs[("ngram", "code")].sweep.design == "cells"
    assert plan.specs[("draft-model", "code")].sweep.design == "paired"
    import json

    write_plan(plan, tmp_path)
    doc = json.loads((tmp_path / PLAN_FILE).read_text())
    assert {d["name"]: d["design"] for d in doc["drafts"]} == {"draft-model": "paired", "ngram": "cells"}


def test_vllm_engine_marks_variable_drafters_cells():
    from dsdprof.config.spec import parse_spec
    from dsdprof.measure.engine import Cell
    from dsdprof.measure.vllm.engine import VllmEngine

    base = {"engine": {"name": "vllm", "model": "toy_models/dense/target"},
            "sweep": {"batch_sizes": [1], "num_spec_tokens": [2], "design": "cells"}}
    for method, up_to in (("ngram", True), ("suffix", True), ("draft_model", False)):
        draft = {"draft_model": "toy_models/dense/draft"} if method == "draft_model" else {}
        spec = parse_spec({**base, "engine": {**base["engine"], "method": method, **draft}})
        eng = VllmEngine.__new__(VllmEngine)
        eng.spec, eng.out_dir = spec, None
        req = eng.cell_request(Cell(repeat=0, batch_size=1, mode="dsd", num_spec_tokens=2), 2)
        assert req.drafts_up_to_k is up_to, method


def test_suffix_decoding_runs_one_engine_per_k_in_the_cells_design(tmp_path):
    from dsdprof.jobs.compare_drafts import plan_drafts

    spec = tmp_path / "s.toml"
    spec.write_text('[engine]\nname = "vllm"\nmodel = "toy_models/dense/target"\n'
                    '[[drafts]]\nname = "sfx"\nmethod = "suffix"\n'
                    '[[drafts]]\nname = "ng"\nmethod = "ngram"\ndsd_mode = "dsd"\n'
                    '[[drafts]]\nname = "dm"\nmethod = "draft_model"\ndraft_model = '
                    '"toy_models/dense/draft"\n')
    plan = plan_drafts(spec, tmp_path)
    sfx, ng, dm = (plan.specs[(n, "all")] for n in ("sfx", "ng", "dm"))
    assert (sfx.sweep.design, sfx.engine.dsd_mode) == ("cells", "fixed")
    assert (ng.sweep.design, ng.engine.dsd_mode) == ("cells", "dsd")
    assert (dm.sweep.design, dm.engine.dsd_mode) == ("paired", "auto")
