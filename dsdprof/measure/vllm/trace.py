"""The step trace: what vLLM's engine core did in each step of a cell, and the cell's numbers from it.

dsdprof's scheduler subclass (:mod:`dsdprof.plugins.vllm_profiling`) runs inside vLLM's engine
core and appends one record per engine step to the cell's trace file (JSON lines, one list of
records per wave). A record (:class:`Step`) says which wave the step belonged to, when the step
ended, how many of the wave's requests it ran and how many of them were decoding (no prefill
tokens), the prefill tokens in the step, and per decoding request: draft tokens scheduled,
tokens the target generated (accepted drafts + the bonus token) and tokens the request was actually
**delivered** (after vLLM trimmed the output at ``max_tokens``/EOS), and whether it finished.

A cell's numbers come only from **steady-state steps** (:func:`summarize`): steps of a measured
wave in which exactly ``batch_size`` requests decode, none prefills, nothing outside the wave
shares the step, and the previous step belongs to the same wave (so the step's duration is the
time between two consecutive step ends of the engine loop: schedule + draft + verify + update).
Everything else (prefill steps, steps where the wave's tail runs at a smaller batch after its
first request finished) is excluded and counted.

Over the steady steps, with ``n_s`` decoding requests, ``t_s`` seconds and ``d_s`` tokens
delivered in step ``s``::

    acceptance_length = sum(d_s) / sum(n_s)        tokens delivered per request per step
    itl_s             = mean(t_s)                  seconds per engine step
    tpot_s            = sum(t_s * n_s) / sum(d_s)  request-seconds per delivered token

so ``acceptance_length / itl_s == 1 / tpot_s`` whenever every steady step has the same ``n_s``
(which is what steady means). Pure functions over plain values: testable without vLLM.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

# Keys of the request's SamplingParams.extra_args the scheduler understands.

K_TOLERANCE = 0.02  # drafted tokens per draft may differ from the row's K by at most this (relative)


@dataclass(frozen=True)
class Step:
    """One engine step of a traced wave (see the module docstring)."""

    wave: int
    t_end: float  # time.perf_counter() in the engine core when the step's update finished
    scheduled: int  # requests of this wave scheduled in the step
    decoding: int  # of which decoding (no prefill tokens)
    prefill_tokens: int  # prompt tokens of any request in the step
    others: int  # requests scheduled in the step that do not belong to this wave
    drafted: tuple[int, ...]  # per decoding request: draft tokens scheduled
    generated: tuple[int, ...]  # per decoding request: tokens generated (accepted + bonus), untrimmed
    delivered: dict[str, int] = field(default_factory=dict)  # request id -> tokens delivered
    finished: tuple[bool, ...] = ()  # per decoding request: it finished in this step

    @classmethod
    def from_json(cls, d: dict) -> "Step":
        return cls(int(d["wave"]), float(d["t_end"]), int(d["scheduled"]), int(d["decoding"]),
                   int(d["prefill_tokens"]), int(d.get("others", 0)), tuple(d["drafted"]),
                   tuple(d["generated"]), {str(k): int(v) for k, v in d["delivered"].items()},
                   tuple(bool(x) for x in d.get("finished", ())))


class CellFailure(RuntimeError):
    """The trace shows the cell did not measure what its row says (no steady step, wrong K)."""


@dataclass(frozen=True)
class TraceSummary:
    acceptance_length: float
    acceptance_per_pos: tuple[float, ...]
    itl_s: float
    itl_p50_s: float
    itl_p90_s: float
    itl_p99_s: float
    tpot_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    drafted_per_draft: float
    steady_steps: int
    excluded_steps: int
    delivered_tokens: int
    generated_tokens: int
    sample_acceptance_length: tuple[float, ...]  # one per measured wave with steady steps
    sample_itl_s: tuple[float, ...]


def read_trace(path: str | Path) -> list[Step]:
    """All step records in a trace file (missing file: no steps)."""
    p = Path(path)
    if not p.is_file():
        return []
    steps = []
    for line in p.read_text().splitlines():
        if line.strip():
            steps.extend(Step.from_json(d) for d in json.loads(line))
    return steps


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def steady_steps(steps: Iterable[Step], batch_size: int) -> tuple[list[tuple[Step, float]], int]:
    """(steady steps with their durations, number of excluded steps of measured waves)."""
    steady: list[tuple[Step, float]] = []
    excluded = 0
    prev: Step | None = None
    for s in steps:
        if s.wave < 0:
            prev = s
            continue
        ok = (s.scheduled == batch_size and s.decoding == batch_size and s.prefill_tokens == 0
              and s.others == 0 and prev is not None and prev.wave == s.wave)
        if ok:
            steady.append((s, s.t_end - prev.t_end))  # type: ignore[union-attr]
        else:
            excluded += 1
        prev = s
    return steady, excluded


def summarize(steps: list[Step], batch_size: int, num_spec_tokens: int | None,
              positions: int) -> TraceSummary:
    """A cell's numbers from its trace; raises :class:`CellFailure` when they would not mean
    what the row says: no steady-state step, or drafted tokens per draft off the row's K
    (``num_spec_tokens``; ``None`` skips the K check)."""
    steady, excluded = steady_steps(steps, batch_size)
    if not steady:
        raise CellFailure(f"no steady-state step: no step ran exactly batch_size={batch_size} decoding "
                          f"requests ({excluded} steps excluded); raise output_len or max_num_batched_tokens")
    n_req_steps = sum(s.decoding for s, _ in steady)
    delivered = sum(sum(s.delivered.values()) for s, _ in steady)
    generated = sum(sum(s.generated) for s, _ in steady)
    durations = [t for _, t in steady]
    drafts = sum(1 for s, _ in steady for d in s.drafted if d > 0)
    draft_tokens = sum(sum(s.drafted) for s, _ in steady)
    drafted_per_draft = draft_tokens / drafts if drafts else 0.0
    if num_spec_tokens is not None:
        k = num_spec_tokens
        if (k == 0 and draft_tokens) or (k > 0 and abs(drafted_per_draft - k) > K_TOLERANCE * k):
            raise CellFailure(f"K not verified: steady steps drafted {drafted_per_draft:.3f} tokens per draft "
                              f"({draft_tokens} tokens in {drafts} drafts), the row says K={k}")
        if k > 0 and drafts < n_req_steps:
            raise CellFailure(f"K not verified: {n_req_steps - drafts} of {n_req_steps} steady request-steps "
                              f"had no draft, the row says K={k}")
    # Per-position acceptance is the draft's: a request's finishing step is left out (vLLM stops
    # generating at max_tokens, so its later positions were never verified).
    accepted_per_pos = [0] * positions
    pos_drafts = 0
    accepted = 0
    for s, _ in steady:
        finished = s.finished or (False,) * len(s.drafted)
        for d, g, done in zip(s.drafted, s.generated, finished):
            if d > 0:
                a = max(0, min(d, g - 1))
                accepted += a
                if done:
                    continue
                pos_drafts += 1
                for i in range(min(a, positions)):
                    accepted_per_pos[i] += 1
    # Per request: its steady time and delivered tokens -> its TPOT.
    req_time: dict[str, float] = {}
    req_tokens: dict[str, int] = {}
    for s, t in steady:
        for rid, d in s.delivered.items():
            req_time[rid] = req_time.get(rid, 0.0) + t
            req_tokens[rid] = req_tokens.get(rid, 0) + d
    tpots = [req_time[r] / req_tokens[r] for r in req_time if req_tokens[r] > 0]
    samples_al, samples_itl = [], []
    for w in sorted({s.wave for s, _ in steady}):
        ws = [(s, t) for s, t in steady if s.wave == w]
        samples_al.append(sum(sum(s.delivered.values()) for s, _ in ws) / sum(s.decoding for s, _ in ws))
        samples_itl.append(sum(t for _, t in ws) / len(ws))
    itl = sum(durations) / len(durations)
    return TraceSummary(
        acceptance_length=delivered / n_req_steps,
        acceptance_per_pos=tuple(c / pos_drafts if pos_drafts else 0.0 for c in accepted_per_pos),
        itl_s=itl, itl_p50_s=_percentile(durations, 0.5), itl_p90_s=_percentile(durations, 0.9),
        itl_p99_s=_percentile(durations, 0.99),
        tpot_s=sum(t * s.decoding for s, t in steady) / delivered if delivered else math.nan,
        tpot_p50_s=_percentile(tpots, 0.5), tpot_p90_s=_percentile(tpots, 0.9),
        tpot_p99_s=_percentile(tpots, 0.99),
        num_drafts=drafts, num_draft_tokens=draft_tokens, num_accepted_tokens=accepted,
        drafted_per_draft=drafted_per_draft, steady_steps=len(steady), excluded_steps=excluded,
        delivered_tokens=delivered, generated_tokens=generated,
        sample_acceptance_length=tuple(samples_al), sample_itl_s=tuple(samples_itl),
    )
