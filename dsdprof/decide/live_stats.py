"""Statistics of a rollout or serving run: makespan, tail, TTFT / TPOT / ITL percentiles, goodput,
the batch size vLLM looked K up with, and intervals over repeats paired by repeat.

Definitions (the ones of vLLM's ``bench serve`` where it has one):

* **makespan**: first arrival (t = 0) to the last token of the last request;
* **tail**: makespan minus the finish time of the request that completes 90 % of them
  (``ceil(0.9 N)``-th finish): the time the last 10 % of requests hold the engine alone;
* **TTFT**: first token minus arrival; **TPOT** (per user): ``(last - first) / (tokens - 1)``;
* **ITL**: every gap between two consecutive streamed chunks of a request (a chunk carries every
  token one engine step delivered: with speculation, several);
* **goodput**: requests per second (over the makespan) whose TTFT and TPOT met the SLOs.

Percentiles are linear between order statistics (numpy's default). Pure: plain values in and out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linear between order statistics; NaN when empty."""
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return math.nan
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class RequestTimes:
    arrival: float
    first: float  # first token (NaN: none)
    finish: float  # last token
    tokens: int
    itls: tuple[float, ...]  # gaps between consecutive chunks

    @property
    def ttft(self) -> float:
        return self.first - self.arrival

    @property
    def tpot(self) -> float:
        return (self.finish - self.first) / (self.tokens - 1) if self.tokens > 1 else math.nan


def request_times(arrival: float, chunk_t: Sequence[float], chunk_tokens: Sequence[int]) -> RequestTimes:
    """One request's times from its streamed chunks (times and cumulative token counts)."""
    if not chunk_t:
        return RequestTimes(arrival, math.nan, math.nan, 0, ())
    gaps = tuple(b - a for a, b in zip(chunk_t, chunk_t[1:]))
    return RequestTimes(arrival, chunk_t[0], chunk_t[-1], int(chunk_tokens[-1]), gaps)


def tail_time(finishes: Sequence[float], fraction: float = 0.9) -> float:
    """Makespan minus the finish of the request that completes ``fraction`` of them."""
    xs = sorted(finishes)
    if not xs:
        return math.nan
    k = max(1, math.ceil(fraction * len(xs)))
    return xs[-1] - xs[k - 1]


def summarize_requests(
    reqs: Sequence[RequestTimes], slo_ttft_s: float = 0.0, slo_tpot_s: float = 0.0
) -> dict[str, float]:
    """The row's request statistics (see the module docstring); SLO 0 = none."""
    finishes = [r.finish for r in reqs]
    makespan = max(finishes) if finishes else math.nan
    tokens = sum(r.tokens for r in reqs)
    itls = [g for r in reqs for g in r.itls]
    out: dict[str, float] = {
        "makespan_s": makespan,
        "output_tokens": tokens,
        "tokens_per_s": tokens / makespan if makespan and makespan > 0 else math.nan,
        "tail_s": tail_time(finishes),
    }
    for name, vals in (("ttft", [r.ttft for r in reqs]), ("tpot", [r.tpot for r in reqs]), ("itl", itls)):
        for q in (50, 90, 99):
            out[f"{name}_p{q}_s"] = percentile(vals, q / 100)
    out["e2e_p50_s"] = percentile([r.finish - r.arrival for r in reqs], 0.5)
    good = sum(
        1
        for r in reqs
        if (not slo_ttft_s or r.ttft <= slo_ttft_s)
        and (not slo_tpot_s or math.isnan(r.tpot) or r.tpot <= slo_tpot_s)
    )
    out["goodput_req_s"] = good / makespan if makespan and makespan > 0 else math.nan
    return out


def summarize_steps(
    batch: Sequence[int], decoding: Sequence[int], drafted: Sequence[float], ranges: list[list[int]] | None
) -> dict[str, float]:
    """K served (mean drafts per decoding request-step), and how often the batch size vLLM looked K
    up with differs from the requests decoding, in itself and in the table's K (``ranges``)."""
    from dsdprof.formats.ktable import k_for_batch_size

    n = len(batch)
    req_steps = sum(decoding)
    mean_k = sum(d * m for d, m in zip(drafted, decoding)) / req_steps if req_steps else math.nan
    differs = sum(1 for b, d in zip(batch, decoding) if b != d) / n if n else math.nan
    k_differs = math.nan
    if ranges and n:
        k_differs = (
            sum(
                1
                for b, d in zip(batch, decoding)
                if d > 0 and k_for_batch_size(ranges, b) != k_for_batch_size(ranges, d)
            )
            / n
        )
    return {"mean_k": mean_k, "steps": n, "lookup_differs": differs, "table_k_differs": k_differs}


@dataclass(frozen=True)
class PairedRatio:
    variant: str
    reference: str
    ratio: float  # geometric mean over repeats of value(variant) / value(reference), same repeat
    lo: float  # confidence interval (t over the repeats' log ratios); NaN with one repeat
    hi: float
    repeats: int


def paired_ratio(
    values: dict[int, float],
    reference: dict[int, float],
    variant: str,
    ref_name: str,
    confidence: float = 0.95,
) -> PairedRatio:
    """Ratio of ``variant`` to ``reference`` over the repeats both ran (paired: each repeat's
    variants ran the same requests back to back, so drift between repeats cancels); a Student-t
    interval on the mean log ratio."""
    from scipy.stats import t

    logs = [
        math.log(values[r] / reference[r])
        for r in sorted(values)
        if r in reference and values[r] > 0 and reference[r] > 0
    ]
    if not logs:
        return PairedRatio(variant, ref_name, math.nan, math.nan, math.nan, 0)
    mean = sum(logs) / len(logs)
    if len(logs) < 2:
        return PairedRatio(variant, ref_name, math.exp(mean), math.nan, math.nan, 1)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    half = float(t.ppf(0.5 + confidence / 2, len(logs) - 1)) * sd / math.sqrt(len(logs))
    return PairedRatio(
        variant, ref_name, math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs)
    )


def rotated_orders(variants: Sequence[str], repeats: int) -> list[list[str]]:
    """The variants' order in each repeat: rotated by one each repeat (every variant runs first
    equally often over ``len(variants)`` repeats), reversed every other full cycle so that no
    variant always follows the same one."""
    n = len(variants)
    out = []
    for r in range(repeats):
        base = list(variants) if (r // n) % 2 == 0 else list(reversed(variants))
        shift = r % n
        out.append(base[shift:] + base[:shift])
    return out
