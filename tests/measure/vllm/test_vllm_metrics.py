"""vLLM's own metrics as cross-checks of the trace (pure functions, no vLLM)."""

import math
from types import SimpleNamespace as NS

import pytest

from dsdprof.measure.vllm.metrics import (
    ACCEPTED,
    ACCEPTED_PER_POS,
    DRAFT_TOKENS,
    DRAFTS,
    ITL,
    MetricSnapshot,
    RequestTiming,
    build_measurement,
    snapshot_from_metrics,
)
from dsdprof.measure.vllm.trace import Step, summarize


def _steps():
    # one wave, BS 2, K 3: prefill step, then 2 steady steps
    return [Step(0, 1.0, 2, 0, 64, 0, (), (), {}),
            Step(0, 1.1, 2, 2, 0, 0, (3, 3), (4, 2), {"a": 4, "b": 2}),
            Step(0, 1.3, 2, 2, 0, 0, (3, 3), (3, 4), {"a": 3, "b": 4})]


def test_snapshot_sums_engines_and_cross_checks():
    def metrics(scale):
        return [NS(name=DRAFTS, value=10 * scale), NS(name=DRAFT_TOKENS, value=30 * scale),
                NS(name=ACCEPTED, value=20 * scale),
                NS(name=ACCEPTED_PER_POS, values=[9 * scale, 7 * scale, 4 * scale]),
                NS(name=ITL, count=10 * scale, sum=0.1 * scale),
                NS(name="vllm:other", value=5)]
    before, after = snapshot_from_metrics(metrics(1)), snapshot_from_metrics(metrics(3))
    assert after.drafts == 30 and after.accepted_per_pos == (27, 21, 12)
    reqs = [RequestTiming(0.0, 0.63, 64), RequestTiming(0.0, 1.26, 64)]
    trace = summarize(_steps(), batch_size=2, num_spec_tokens=3, positions=3)
    m = build_measurement(trace, before, after, reqs, num_spec_tokens=3, wall_s=2.0)
    # headline numbers: the trace's
    assert m.acceptance_length == pytest.approx(13 / 4)
    assert m.itl_s == pytest.approx(0.15)
    assert m.acceptance_length / m.itl_s * m.tpot_s == pytest.approx(1.0)
    assert m.drafted_per_draft == 3 and m.steady_steps == 2 and m.excluded_steps == 1
    # cross-checks: vLLM's
    assert m.vllm_acceptance_length == pytest.approx(1 + 40 / 20)
    assert m.vllm_itl_s == pytest.approx(0.2 / 20)
    assert m.vllm_tpot_s == pytest.approx((0.01 + 0.02) / 2)
    assert m.tokens_per_s_total == pytest.approx(64)
    assert m.num_requests == 2 and m.num_output_tokens == 128


def test_request_timing_needs_two_tokens():
    assert math.isnan(RequestTiming(0, 1, 1).tpot_s)
    assert RequestTiming(0, 1, 11).tpot_s == pytest.approx(0.1)


def test_empty_snapshot_gives_al_one():
    s = MetricSnapshot()
    trace = summarize([Step(0, 0.0, 1, 0, 8, 0, (), (), {}), Step(0, 0.1, 1, 1, 0, 0, (0,), (1,), {"a": 1})],
                      1, 0, 0)
    m = build_measurement(trace, s, s, [RequestTiming(0, 1, 11)], 0, 1.0)
    assert m.vllm_acceptance_length == 1.0 and m.acceptance_per_pos == () and m.acceptance_length == 1.0
