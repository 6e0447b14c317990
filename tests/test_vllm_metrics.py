import math
from types import SimpleNamespace as NS

import pytest

from dsdprof.engines.vllm_metrics import (
    ACCEPTED, ACCEPTED_PER_POS, DRAFT_TOKENS, DRAFTS, ITL, MetricSnapshot, RequestTiming,
    build_measurement, histogram_quantile, itl_histogram_buckets, percentile, snapshot_from_metrics,
)


def test_buckets_are_fine_and_increasing():
    b = itl_histogram_buckets()
    assert all(x < y for x, y in zip(b, b[1:]))
    assert b[0] <= 1e-4 and b[-1] >= 100
    assert max(y / x for x, y in zip(b, b[1:])) < 1.06


def test_histogram_quantile_interpolates():
    cum = [(1.0, 0), (2.0, 50), (4.0, 100), (math.inf, 100)]
    assert histogram_quantile(cum, 0.5) == pytest.approx(2.0)
    assert histogram_quantile(cum, 0.25) == pytest.approx(1.5)
    assert histogram_quantile(cum, 0.75) == pytest.approx(3.0)
    assert math.isnan(histogram_quantile([], 0.5))


def test_percentile():
    assert percentile([3, 1, 2], 0.5) == 2
    assert percentile([1, 2], 0.5) == 1.5


def test_snapshot_sums_engines_and_deltas():
    def metrics(scale):
        return [NS(name=DRAFTS, value=10 * scale), NS(name=DRAFT_TOKENS, value=30 * scale),
                NS(name=ACCEPTED, value=20 * scale), NS(name=ACCEPTED_PER_POS, values=[9 * scale, 7 * scale, 4 * scale]),
                NS(name=ITL, count=10 * scale, sum=0.1 * scale, buckets={"0.005": 0, "0.01": 5 * scale, "0.02": 10 * scale, "+Inf": 10 * scale}),
                NS(name="vllm:other", value=5)]
    before, after = snapshot_from_metrics(metrics(1)), snapshot_from_metrics(metrics(3))
    assert after.drafts == 30 and after.accepted_per_pos == (27, 21, 12)
    reqs = [RequestTiming(0.0, 0.63, 64), RequestTiming(0.0, 1.26, 64)]
    m = build_measurement(before, after, reqs, num_spec_tokens=3, wall_s=2.0)
    assert m.num_drafts == 20 and m.num_draft_tokens == 60 and m.num_accepted_tokens == 40
    assert m.acceptance_length == pytest.approx(1 + 40 / 20)
    assert m.acceptance_per_pos == pytest.approx((18 / 20, 14 / 20, 8 / 20))
    assert m.itl_s == pytest.approx(0.2 / 20)
    assert m.itl_p50_s == pytest.approx(0.01)
    assert m.tpot_s == pytest.approx((0.01 + 0.02) / 2)
    assert m.tokens_per_s_total == pytest.approx(64)
    assert m.num_requests == 2 and m.num_output_tokens == 128


def test_k0_cell_has_al_one():
    s = MetricSnapshot()
    m = build_measurement(s, s, [RequestTiming(0, 1, 11)], 0, 1.0)
    assert m.acceptance_length == 1.0 and m.acceptance_per_pos == ()
