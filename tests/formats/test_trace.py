"""The step trace -> a cell's numbers (pure; the real engine is exercised in test_vllm_integration.py)."""

import json

import pytest

from dsdprof.measure.vllm.trace import CellFailure, Step, read_trace, steady_steps, summarize


def wave(w, t0, batch, k, accepted_per_step, output_len, prefill_tokens=32, step_s=0.1):
    """A gated wave: one prefill step, then decode steps until every request has output_len tokens;
    each request gains min(accepted+1, remaining) tokens per step and leaves when done."""
    steps = [Step(w, t0, batch, 0, batch * prefill_tokens, 0, (), (), {})]
    got = {f"r{i}": 0 for i in range(batch)}
    t, s = t0, 0
    while any(v < output_len for v in got.values()):
        live = [r for r, v in got.items() if v < output_len]
        t += step_s * (1 + 0.1 * len(live))
        acc = accepted_per_step(s)
        gen, delivered = [], {}
        for r in live:
            g = acc + 1
            d = min(g, output_len - got[r])
            got[r] += d
            gen.append(g)
            delivered[r] = d
        steps.append(Step(w, t, len(live), len(live), 0, 0, tuple([k] * len(live)), tuple(gen), delivered))
        s += 1
    return steps


def test_al_itl_tpot_identity_and_k():
    steps = wave(0, 0.0, 4, 3, lambda s: 2, output_len=26) + wave(1, 10.0, 4, 3, lambda s: 3, output_len=26)
    t = summarize(steps, batch_size=4, num_spec_tokens=3, positions=3)
    assert t.acceptance_length / t.itl_s * t.tpot_s == pytest.approx(1.0)
    assert t.drafted_per_draft == 3
    assert t.excluded_steps == 2  # the prefill steps
    # 26 tokens at 3 per step: 8 full steps + one trimmed to 2; AL counts the 3 generated (untrimmed)
    assert t.sample_acceptance_length[0] == pytest.approx(3.0)
    assert t.sample_acceptance_length[1] == pytest.approx(4.0)
    # accepted counted before trimming, delivered after
    assert t.generated_tokens > t.delivered_tokens
    assert t.all_delivered_tokens == 2 * 4 * 26  # every step of the measured waves
    assert t.acceptance_per_pos[0] == pytest.approx(1.0)
    assert t.itl_s == pytest.approx(0.1 * 1.4)


def test_tail_at_smaller_batch_is_excluded():
    # requests finish at different steps: the steps after the first finish run at a smaller batch
    steps = [Step(0, 0.0, 3, 0, 96, 0, (), (), {}),
             Step(0, 0.2, 3, 3, 0, 0, (2, 2, 2), (3, 3, 1), {"a": 3, "b": 3, "c": 1}),
             Step(0, 0.4, 3, 3, 0, 0, (2, 2, 2), (3, 2, 1), {"a": 1, "b": 2, "c": 1}),  # a finishes (trimmed)
             Step(0, 0.5, 2, 2, 0, 0, (2, 2), (3, 3), {"b": 3, "c": 3}),
             Step(0, 0.6, 1, 1, 0, 0, (2,), (3,), {"c": 3})]
    ss, excluded = steady_steps(steps, 3)
    assert [round(d, 3) for _, d in ss] == [0.2, 0.2] and excluded == 3
    t = summarize(steps, 3, 2, 2)
    assert t.acceptance_length == pytest.approx((7 + 6) / 6)  # generated, untrimmed
    assert t.num_accepted_tokens == 2 + 2 + 0 + 2 + 1 + 0


def test_prefill_sharing_a_step_and_other_waves_are_excluded():
    steps = [Step(0, 0.0, 2, 0, 64, 0, (), (), {}),
             Step(0, 0.1, 2, 1, 32, 0, (1,), (2,), {"a": 2}),  # b still prefilling (chunked)
             Step(0, 0.2, 2, 2, 0, 1, (1, 1), (2, 2), {"a": 2, "b": 2}),  # a request from elsewhere
             Step(0, 0.3, 2, 2, 0, 0, (1, 1), (2, 1), {"a": 2, "b": 1})]
    ss, excluded = steady_steps(steps, 2)
    assert len(ss) == 1 and excluded == 3


def test_warmup_waves_are_not_counted():
    steps = wave(-1, 0.0, 2, 1, lambda s: 1, 8) + wave(0, 5.0, 2, 1, lambda s: 0, 8)
    t = summarize(steps, 2, 1, 1)
    assert t.acceptance_length == pytest.approx(1.0) and t.excluded_steps == 1


def test_wrong_k_fails_the_cell():
    steps = wave(0, 0.0, 2, 2, lambda s: 1, 12)
    with pytest.raises(CellFailure, match="K not verified.*K=3"):
        summarize(steps, 2, 3, 3)
    with pytest.raises(CellFailure, match="K=0"):
        summarize(steps, 2, 0, 0)
    summarize(steps, 2, None, 2)  # unchecked


def test_missing_drafts_fail_a_speculative_cell():
    steps = [Step(0, 0.0, 2, 0, 64, 0, (), (), {}),
             Step(0, 0.1, 2, 2, 0, 0, (2, 0), (3, 1), {"a": 3, "b": 1})]
    with pytest.raises(CellFailure,
                       match=r"1 of 2 steady request-steps did not draft K=2 \(1 drafted 0, 1 drafted 2\)"):
        summarize(steps, 2, 2, 2)


def test_no_steady_step_fails():
    steps = [Step(0, 0.0, 1, 0, 64, 0, (), (), {}), Step(0, 0.1, 1, 1, 0, 0, (1,), (2,), {"a": 2})]
    with pytest.raises(CellFailure, match="no steady-state step"):
        summarize(steps, 2, 1, 1)


def test_read_trace_roundtrip(tmp_path):
    p = tmp_path / "t.jsonl"
    recs = [{"wave": 0, "t_end": 1.5, "scheduled": 1, "decoding": 1, "prefill_tokens": 0, "others": 0,
             "drafted": [2], "generated": [3], "delivered": {"x": 3}}]
    p.write_text(json.dumps(recs) + "\n" + json.dumps(recs) + "\n")
    steps = read_trace(p)
    assert len(steps) == 2 and steps[0].delivered == {"x": 3} and steps[0].drafted == (2,)
    assert read_trace(tmp_path / "missing.jsonl") == []


def test_finishing_step_counts_its_untrimmed_tokens():
    # draft = target, K 3: 23 decode tokens = 5 steps of 4 + a step that generated 4 but was trimmed to 3
    steps = [Step(0, 0.0, 1, 0, 32, 0, (), (), {})]
    steps += [Step(0, 0.1 * (i + 1), 1, 1, 0, 0, (3,), (4,), {"r": 4}, (False,), (3,)) for i in range(5)]
    steps.append(Step(0, 0.6, 1, 1, 0, 0, (3,), (4,), {"r": 3}, (True,), (3,)))
    t = summarize(steps, 1, 3, 3)
    assert t.acceptance_length == pytest.approx(4.0)  # unbiased: the trim is not the draft's doing
    assert t.acceptance_per_pos == pytest.approx((1.0, 1.0, 1.0))
    assert t.delivered_tokens == 23 and t.generated_tokens == 24


def test_one_steady_step_at_another_k_fails_the_cell():
    steps = wave(0, 0.0, 2, 3, lambda s: 1, 40)
    bad = steps[3]
    steps[3] = Step(bad.wave, bad.t_end, bad.scheduled, bad.decoding, 0, 0, (3, 2), bad.generated,
                    bad.delivered)
    with pytest.raises(CellFailure, match="1 of .* did not draft K=3"):
        summarize(steps, 2, 3, 3)


def test_stale_outputs_make_a_step_unsteady():
    # async scheduling: the step after a request finished ran it again; vLLM discarded its output
    steps = [Step(0, 0.0, 2, 0, 64, 0, (), (), {}),
             Step(0, 0.1, 2, 2, 0, 0, (1, 1), (2, 2), {"a": 2, "b": 2}),
             Step(0, 0.2, 2, 1, 0, 0, (1,), (2,), {"b": 2}, stale=1)]
    t = summarize(steps, 2, 1, 1)
    assert t.steady_steps == 1 and t.excluded_steps == 2
