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

:func:`cross_checks` compares them with the trace; a row records the failed checks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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


def snapshot_from_metrics(metrics: Iterable[Any]) -> MetricSnapshot:
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


def cross_checks(trace, drafts: float, draft_tokens: float, accepted: float, requests: list[RequestTiming],
                 expected_k: int | None, batch_size: int, timing_tolerance: float,
                 up_to: bool = False) -> list[str]:
    """The cell's independent cross-checks; one line per failed check, naming it and by how much.

    * ``tokens``: tokens the trace saw delivered over the measured waves == tokens the requests
      received (the client's outputs).
    * ``drafts``: vLLM's own counters drafted exactly K tokens per draft (none at K=0; ``up_to``,
      a drafter that proposes 0..K tokens: at most K).
    * ``counters``: drafts, draft tokens and accepted tokens of the trace (every step of the
      measured waves) == vLLM's spec-decode counter deltas, i.e. AL over those steps == vLLM's AL.
    * ``timing`` (BS 1): acceptance_length / itl_s within ``timing_tolerance`` of the request's own
      rate from vLLM's timestamps, (tokens - 1) / (last_token_ts - first_token_ts).
    """
    failures = []
    client = sum(r.num_generation_tokens for r in requests)
    seen = trace.all_delivered_tokens
    if seen != client:
        failures.append(f"tokens: the trace delivered {seen} tokens, the requests received {client} "
                        f"({(seen - client) / client if client else math.inf:+.2%})")
    if expected_k is not None:
        if expected_k == 0 and drafts:
            failures.append(f"drafts: vLLM counted {drafts:.0f} drafts, the row says K=0")
        elif expected_k > 0:
            dpd = draft_tokens / drafts if drafts else 0.0
            if (dpd > expected_k * (1 + 1e-9)) if up_to else abs(dpd - expected_k) > 1e-9 * expected_k:
                failures.append(f"drafts: vLLM drafted {dpd:.4f} tokens per draft, the row says "
                                f"K={expected_k} "
                                f"({(dpd - expected_k) / expected_k:+.2%})")
    mine = (trace.all_drafts, trace.all_draft_tokens, trace.all_accepted_tokens)
    theirs = (drafts, draft_tokens, accepted)
    if any(abs(a - b) > 0.5 for a, b in zip(mine, theirs)):
        al_mine = 1 + mine[2] / mine[0] if mine[0] else 1.0
        al_theirs = 1 + accepted / drafts if drafts else 1.0
        failures.append(f"counters: trace drafts/draft tokens/accepted {mine[0]}/{mine[1]}/{mine[2]} vs "
                        f"vLLM's "
                        f"{theirs[0]:.0f}/{theirs[1]:.0f}/{theirs[2]:.0f} (AL {al_mine:.4f} vs "
                        f"{al_theirs:.4f}, "
                        f"{(al_mine - al_theirs) / al_theirs:+.2%})")
    if batch_size == 1 and trace.itl_s > 0:
        spans = [(r.num_generation_tokens - 1, r.last_token_ts - r.first_token_ts) for r in requests
                 if r.num_generation_tokens > 1]
        span = sum(t for _, t in spans)
        if span > 0:
            client_rate = sum(n for n, _ in spans) / span
            rate = trace.acceptance_length / trace.itl_s
            rel = rate / client_rate - 1.0
            if abs(rel) > timing_tolerance:
                failures.append(f"timing: AL/ITL {rate:.2f} tok/s vs {client_rate:.2f} tok/s from vLLM's "
                                f"request "
                                f"timestamps ({rel:+.1%}, tolerance {timing_tolerance:.0%})")
    return failures


def build_measurement(trace, before: MetricSnapshot, after: MetricSnapshot, requests: list[RequestTiming],
                      num_spec_tokens: int, wall_s: float, expected_k: int | None = None, batch_size: int = 0,
                      timing_tolerance: float = 0.25, up_to: bool = False) -> CellMeasurement:
    """A cell's measurement: headline numbers from the step ``trace`` (a
    :class:`dsdprof.measure.vllm.trace.TraceSummary`), cross-checks (:func:`cross_checks`) against
    vLLM's metric deltas and the requests' outputs and timestamps over the same measured waves."""
    drafts = after.drafts - before.drafts
    draft_tokens = after.draft_tokens - before.draft_tokens
    accepted = after.accepted - before.accepted
    itl_count = after.itl_count - before.itl_count
    itl_sum = after.itl_sum - before.itl_sum
    tpots = [r.tpot_s for r in requests if not math.isnan(r.tpot_s)]
    num_tokens = sum(r.num_generation_tokens for r in requests)
    failures = cross_checks(trace, drafts, draft_tokens, accepted, requests, expected_k, batch_size,
                            timing_tolerance, up_to)
    failures += [trace.acceptance_check] if trace.acceptance_check else []
    t = trace
    return CellMeasurement(
        **{**t.step_stats(), "acceptance_per_pos": tuple(t.acceptance_per_pos[:num_spec_tokens])},
        tokens_per_s_per_user=1.0 / t.tpot_s if t.tpot_s > 0 else math.nan,
        tokens_per_s_total=num_tokens / wall_s if wall_s > 0 else math.nan,
        num_requests=len(requests), num_output_tokens=num_tokens, wall_s=wall_s,
        drafted_per_draft=t.drafted_per_draft, acceptance_length_own=t.acceptance_length_own,
        steady_steps=t.steady_steps,
        excluded_steps=t.excluded_steps,
        sample_acceptance_length=tuple(t.sample_acceptance_length), sample_itl_s=tuple(t.sample_itl_s),
        vllm_acceptance_length=1.0 + accepted / drafts if drafts > 0 else 1.0,
        vllm_itl_s=itl_sum / itl_count if itl_count > 0 else math.nan,
        vllm_tpot_s=sum(tpots) / len(tpots) if tpots else math.nan,
        vllm_drafted_per_draft=draft_tokens / drafts if drafts > 0 else 0.0,
        trace_output_tokens=t.all_delivered_tokens,
        checks_failed="; ".join(failures),
    )
