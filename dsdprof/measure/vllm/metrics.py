"""vLLM's own metrics for a cell, kept as cross-checks of the step trace (pure functions).

The headline numbers of a cell come from the engine-core step trace
(:mod:`dsdprof.measure.vllm.trace`); vLLM's counters count accepted drafts *before* output is trimmed
at ``max_tokens`` and its ITL histogram has a sample for every step of a wave (tails at a smaller
batch included), so they are reported beside the trace, not instead of it:

* spec-decode counters (``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
  ``..._num_accepted_tokens``, vector ``..._num_accepted_tokens_per_pos``): deltas over the cell;
  vllm_acceptance_length = 1 + accepted / drafts.
* ``vllm:inter_token_latency_seconds``: a histogram with one sample per request per engine step;
  vllm_itl_s = delta sum / delta count.
* TPOT per request from ``RequestOutput.metrics``: (last_token_ts - first_token_ts) /
  (delivered tokens - 1); vllm_tpot_s is their mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from dsdprof.measure.engine import CellMeasurement

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
ITL = "vllm:inter_token_latency_seconds"


@dataclass(frozen=True)
class MetricSnapshot:
    """The few metric values dsdprof needs, summed over engines/labels."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()
    itl_count: float = 0.0
    itl_sum: float = 0.0


def snapshot_from_metrics(metrics: Iterable[object]) -> MetricSnapshot:
    """Collapse ``LLM.get_metrics()`` output into a :class:`MetricSnapshot`."""
    drafts = draft_tokens = accepted = itl_count = itl_sum = 0.0
    per_pos: list[float] = []
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
    return MetricSnapshot(drafts, draft_tokens, accepted, tuple(per_pos), itl_count, itl_sum)


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


def build_measurement(trace, before: MetricSnapshot, after: MetricSnapshot, requests: list[RequestTiming],
                      num_spec_tokens: int, wall_s: float) -> CellMeasurement:
    """A cell's measurement: headline numbers from the step ``trace`` (a
    :class:`dsdprof.measure.vllm.trace.TraceSummary`), cross-checks from vLLM's metric deltas and the
    requests' timestamps over the same measured waves."""
    drafts = after.drafts - before.drafts
    accepted = after.accepted - before.accepted
    itl_count = after.itl_count - before.itl_count
    itl_sum = after.itl_sum - before.itl_sum
    tpots = [r.tpot_s for r in requests if not math.isnan(r.tpot_s)]
    num_tokens = sum(r.num_generation_tokens for r in requests)
    t = trace
    return CellMeasurement(
        acceptance_length=t.acceptance_length,
        acceptance_per_pos=tuple(t.acceptance_per_pos[:num_spec_tokens]),
        num_drafts=t.num_drafts, num_draft_tokens=t.num_draft_tokens,
        num_accepted_tokens=t.num_accepted_tokens,
        itl_s=t.itl_s, itl_p50_s=t.itl_p50_s, itl_p90_s=t.itl_p90_s, itl_p99_s=t.itl_p99_s,
        tpot_s=t.tpot_s, tpot_p50_s=t.tpot_p50_s, tpot_p90_s=t.tpot_p90_s, tpot_p99_s=t.tpot_p99_s,
        tokens_per_s_per_user=1.0 / t.tpot_s if t.tpot_s > 0 else math.nan,
        tokens_per_s_total=num_tokens / wall_s if wall_s > 0 else math.nan,
        num_requests=len(requests), num_output_tokens=num_tokens, wall_s=wall_s,
        drafted_per_draft=t.drafted_per_draft, steady_steps=t.steady_steps,
        excluded_steps=t.excluded_steps,
        sample_acceptance_length=tuple(t.sample_acceptance_length), sample_itl_s=tuple(t.sample_itl_s),
        vllm_acceptance_length=1.0 + accepted / drafts if drafts > 0 else 1.0,
        vllm_itl_s=itl_sum / itl_count if itl_count > 0 else math.nan,
        vllm_tpot_s=sum(tpots) / len(tpots) if tpots else math.nan,
    )
