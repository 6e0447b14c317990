"""Turn vLLM metric snapshots (``LLM.get_metrics()``) and request outputs into a CellMeasurement.

Pure functions over plain values so they are testable without vLLM:

* spec-decode counters (``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
  ``..._num_accepted_tokens``, vector ``..._num_accepted_tokens_per_pos``): deltas over the cell;
  acceptance_length = 1 + accepted / drafts; acceptance_per_pos[i] = accepted_at_pos[i] / drafts.
* ``vllm:inter_token_latency_seconds``: a histogram with one sample per request per engine step;
  itl_s = delta sum / delta count; percentiles interpolated within the (fine) buckets dsdprof
  configures via :func:`itl_histogram_buckets`.
* TPOT per request from ``RequestOutput.metrics``: (last_token_ts - first_token_ts) /
  (num_generation_tokens - 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from dsdprof.engines.base import CellMeasurement

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
ITL = "vllm:inter_token_latency_seconds"


def itl_histogram_buckets(lo: float = 1e-4, hi: float = 120.0, ratio: float = 1.05) -> list[float]:
    """Geometric bucket bounds (5 % apart) so ITL percentiles are resolved to within ~5 %."""
    out, b = [], lo
    while b < hi:
        out.append(round(b, 9))
        b *= ratio
    return out


@dataclass(frozen=True)
class MetricSnapshot:
    """The few metric values dsdprof needs, summed over engines/labels."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()
    itl_count: float = 0.0
    itl_sum: float = 0.0
    itl_buckets: tuple[tuple[float, float], ...] = ()  # (upper bound, cumulative count)


def snapshot_from_metrics(metrics: Iterable[object]) -> MetricSnapshot:
    """Collapse ``LLM.get_metrics()`` output into a :class:`MetricSnapshot`."""
    drafts = draft_tokens = accepted = itl_count = itl_sum = 0.0
    per_pos: list[float] = []
    buckets: dict[float, float] = {}
    for m in metrics:
        name = getattr(m, "name", "")
        if name == DRAFTS:
            drafts += m.value
        elif name == DRAFT_TOKENS:
            draft_tokens += m.value
        elif name == ACCEPTED:
            accepted += m.value
        elif name == ACCEPTED_PER_POS:
            vals = list(m.values)
            if len(vals) > len(per_pos):
                per_pos.extend([0.0] * (len(vals) - len(per_pos)))
            for i, v in enumerate(vals):
                per_pos[i] += v
        elif name == ITL:
            itl_count += m.count
            itl_sum += m.sum
            for le, c in m.buckets.items():
                bound = math.inf if le in ("+Inf", "inf", "Inf") else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + c
    return MetricSnapshot(drafts, draft_tokens, accepted, tuple(per_pos), itl_count, itl_sum,
                          tuple(sorted(buckets.items())))


def histogram_delta(before: MetricSnapshot, after: MetricSnapshot) -> list[tuple[float, float]]:
    prev = dict(before.itl_buckets)
    return [(b, c - prev.get(b, 0.0)) for b, c in after.itl_buckets]


def histogram_quantile(cumulative: list[tuple[float, float]], q: float) -> float:
    """Prometheus-style quantile: linear interpolation inside the bucket holding rank q*N."""
    if not cumulative or cumulative[-1][1] <= 0:
        return math.nan
    total = cumulative[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            span = count - lower_count
            frac = 0.0 if span <= 0 else (rank - lower_count) / span
            return lower_bound + (bound - lower_bound) * frac
        lower_bound, lower_count = bound, count
    return lower_bound


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 1]) of raw values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class RequestTiming:
    first_token_ts: float
    last_token_ts: float
    num_generation_tokens: int

    @property
    def tpot_s(self) -> float:
        if self.num_generation_tokens < 2:
            return math.nan
        return (self.last_token_ts - self.first_token_ts) / (self.num_generation_tokens - 1)


def build_measurement(before: MetricSnapshot, after: MetricSnapshot, requests: list[RequestTiming],
                      num_spec_tokens: int, wall_s: float) -> CellMeasurement:
    """Combine metric deltas and per-request timings of one cell's measured waves."""
    drafts = after.drafts - before.drafts
    draft_tokens = after.draft_tokens - before.draft_tokens
    accepted = after.accepted - before.accepted
    per_pos = []
    for i in range(num_spec_tokens):
        a = after.accepted_per_pos[i] if i < len(after.accepted_per_pos) else 0.0
        b = before.accepted_per_pos[i] if i < len(before.accepted_per_pos) else 0.0
        per_pos.append((a - b) / drafts if drafts > 0 else 0.0)
    acceptance_length = 1.0 + accepted / drafts if drafts > 0 else 1.0

    itl_count = after.itl_count - before.itl_count
    itl_sum = after.itl_sum - before.itl_sum
    cumulative = histogram_delta(before, after)
    tpots = [r.tpot_s for r in requests if not math.isnan(r.tpot_s)]
    tpot_mean = sum(tpots) / len(tpots) if tpots else math.nan
    itl_mean = itl_sum / itl_count if itl_count > 0 else math.nan
    num_tokens = sum(r.num_generation_tokens for r in requests)
    return CellMeasurement(
        acceptance_length=acceptance_length,
        acceptance_per_pos=tuple(per_pos),
        num_drafts=int(drafts), num_draft_tokens=int(draft_tokens), num_accepted_tokens=int(accepted),
        itl_s=itl_mean,
        itl_p50_s=histogram_quantile(cumulative, 0.50),
        itl_p90_s=histogram_quantile(cumulative, 0.90),
        itl_p99_s=histogram_quantile(cumulative, 0.99),
        tpot_s=tpot_mean,
        tpot_p50_s=percentile(tpots, 0.50), tpot_p90_s=percentile(tpots, 0.90),
        tpot_p99_s=percentile(tpots, 0.99),
        tokens_per_s_per_user=1.0 / tpot_mean if tpot_mean and tpot_mean > 0 else math.nan,
        tokens_per_s_total=num_tokens / wall_s if wall_s > 0 else math.nan,
        num_requests=len(requests), num_output_tokens=num_tokens, wall_s=wall_s,
    )
