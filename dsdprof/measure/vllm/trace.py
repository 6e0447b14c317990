"""The step trace: what vLLM's engine core did in each step of a cell, and the cell's numbers from it.

dsdprof's scheduler subclass (:mod:`dsdprof.plugins.vllm_profiling`) appends one record
(:class:`Step`, keys: :mod:`dsdprof.formats.trace`) per engine step to the cell's trace file when
vLLM's ``update_from_output`` for that step returns. A cell's numbers come only from
**steady-state steps** (:func:`steady_steps`): steps of a measured wave in which exactly
``batch_size`` requests decode, none prefills, none is stale, nothing outside the wave shares the
step, and the previous record belongs to the same wave. Over them, with ``n_s`` decoding requests,
``t_s`` seconds and ``g_s`` tokens generated (untrimmed) in step ``s``::

    acceptance_length = sum(g_s) / sum(n_s)        tokens the target produced per request per step
    itl_s             = mean(t_s)                  seconds per engine step
    tpot_s            = sum(t_s * n_s) / sum(g_s)  request-seconds per produced token

Every steady request-step must have drafted exactly the row's K. What each record counts, why the
estimate is unbiased at any output length and how async scheduling is handled: docs/measurement.md
("The step trace and steady-state steps"). Pure functions over plain values: testable without vLLM.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from pathlib import Path

from dsdprof.formats.trace import Step, decode_line
from dsdprof.measure.engine import StepStats
from dsdprof.measure.vllm.replay import with_replay

SETTLE = 1  # paired design: pure steps of a K after a switch that are not timed (the first one)


class CellFailure(RuntimeError):
    """The trace shows the cell did not measure what its row says (no steady step, wrong K)."""


@dataclass(frozen=True)
class TraceSummary(StepStats):
    """A cell's steady-state steps summarised (the headline fields are :class:`StepStats`)."""

    drafted_per_draft: float
    steady_steps: int
    excluded_steps: int
    delivered_tokens: int
    generated_tokens: int
    sample_acceptance_length: tuple[float, ...]  # one per measured wave with steady steps
    sample_itl_s: tuple[float, ...]
    # Over every step of the measured waves (not only steady ones): for the cross-checks.
    all_delivered_tokens: int = 0
    all_drafts: int = 0
    all_draft_tokens: int = 0
    all_accepted_tokens: int = 0
    sample_waves: tuple[int, ...] = ()  # the measured wave each sample came from (paired: wave blocks)
    # Paired design: the K's own steps' tokens per request-step (acceptance_length is then the group's
    # pooled estimate, :func:`pool_acceptance`), and that check's failure ("" = passed or not paired).
    acceptance_length_own: float = math.nan
    acceptance_check: str = ""


def read_trace(path: str | Path) -> list[Step]:
    """All step records in a trace file (missing file: no steps)."""
    p = Path(path)
    if not p.is_file():
        return []
    return [step for line in p.read_text().splitlines() for step in decode_line(line)]


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
              and s.others == 0 and s.stale == 0 and prev is not None and prev.wave == s.wave)
        if ok and prev is not None:  # (ok says prev is not None; for the type checker)
            steady.append((s, s.t_end - prev.t_end))
        else:
            excluded += 1
        prev = s
    return steady, excluded


def check_k(steady: list[tuple[Step, float]], k: int, up_to: bool = False) -> None:
    """Every steady request-step drafted exactly ``k`` tokens (``up_to``: at most ``k``, a drafter
    that proposes 0..K tokens, e.g. n-gram), else :class:`CellFailure`."""
    counts = Counter(d for s, _ in steady for d in s.drafted)
    wrong = sum(n for d, n in counts.items() if (d > k if up_to else d != k))
    if wrong:
        total = sum(counts.values())
        shown = ", ".join(f"{n} drafted {d}" for d, n in sorted(counts.items()))
        raise CellFailure(f"K not verified: {wrong} of {total} steady request-steps did not draft "
                          f"{'at most ' if up_to else ''}K={k} ({shown})")


def _per_request_tpot(steady: list[tuple[Step, float]]) -> list[float]:
    req_time: dict[str, float] = {}
    req_tokens: dict[str, int] = {}
    for s, t in steady:
        pairs: Iterable[tuple[str, int]]
        if s.ids:
            pairs = zip(s.ids, s.generated)
        else:  # older traces: delivered tokens per request
            pairs = s.delivered.items()
        for rid, g in pairs:
            req_time[rid] = req_time.get(rid, 0.0) + t
            req_tokens[rid] = req_tokens.get(rid, 0) + g
    return [req_time[r] / req_tokens[r] for r in req_time if req_tokens[r] > 0]


def summarize(steps: list[Step], batch_size: int, num_spec_tokens: int | None,
              positions: int, up_to: bool = False) -> TraceSummary:
    """A cell's numbers from its trace; raises :class:`CellFailure` when they would not mean
    what the row says: no steady-state step, or a steady request-step that did not draft the
    row's K (``num_spec_tokens``; ``None`` skips the K check; ``up_to``: drafted at most K, the
    steps with short or empty drafts counted like any other)."""
    steady, excluded = steady_steps(steps, batch_size)
    if not steady:
        raise CellFailure(f"no steady-state step: no step ran exactly batch_size={batch_size} decoding "
                          f"requests ({excluded} steps excluded); raise output_len or max_num_batched_tokens")
    if num_spec_tokens is not None:
        check_k(steady, num_spec_tokens, up_to)
    return _summary(steady, steady, excluded, [s for s in steps if s.wave >= 0], positions)


def _summary(steady: list[tuple[Step, float]], timed: list[tuple[Step, float]], excluded: int,
             measured: list[Step], positions: int) -> TraceSummary:
    """Numbers over ``steady`` steps (tokens, acceptance) and ``timed`` steps (durations); the
    cross-check totals over every ``measured`` step."""
    n_req_steps = sum(s.decoding for s, _ in steady)
    generated = sum(sum(s.generated) for s, _ in steady)
    durations = [t for _, t in timed]
    drafts = sum(1 for s, _ in steady for d in s.drafted if d > 0)
    draft_tokens = sum(sum(s.drafted) for s, _ in steady)
    accepted_per_pos = [0] * positions
    drafted_per_pos = [0] * positions
    accepted = 0
    for s, _ in steady:
        for d, a in zip(s.drafted, s.accepted_counts()):
            if d > 0:
                accepted += a
                for i in range(min(a, positions)):
                    accepted_per_pos[i] += 1
                for i in range(min(d, positions)):
                    drafted_per_pos[i] += 1
    samples_al, samples_itl, timed_waves = [], [], {s.wave for s, _ in timed}
    for w in sorted({s.wave for s, _ in steady} & timed_waves):
        ws = [(s, t) for s, t in steady if s.wave == w]
        wt = [t for s, t in timed if s.wave == w]
        samples_al.append(sum(sum(s.generated) for s, _ in ws) / sum(s.decoding for s, _ in ws))
        samples_itl.append(sum(wt) / len(wt))
    tpots, itl, al = _per_request_tpot(timed), sum(durations) / len(durations), generated / n_req_steps
    return TraceSummary(
        acceptance_length=al,
        acceptance_per_pos=tuple(a / d if d else 0.0 for a, d in zip(accepted_per_pos, drafted_per_pos)),
        itl_s=itl, itl_p50_s=_percentile(durations, 0.5),
        itl_p90_s=_percentile(durations, 0.9), itl_p99_s=_percentile(durations, 0.99),
        tpot_s=itl / al, tpot_p50_s=_percentile(tpots, 0.5), tpot_p90_s=_percentile(tpots, 0.9),
        tpot_p99_s=_percentile(tpots, 0.99),
        num_drafts=drafts, num_draft_tokens=draft_tokens, num_accepted_tokens=accepted,
        drafted_per_draft=draft_tokens / drafts if drafts else 0.0, steady_steps=len(timed),
        excluded_steps=excluded, delivered_tokens=sum(sum(s.delivered.values()) for s, _ in steady),
        generated_tokens=generated,
        sample_acceptance_length=tuple(samples_al), sample_itl_s=tuple(samples_itl),
        all_delivered_tokens=sum(sum(s.delivered.values()) for s in measured),
        all_drafts=sum(1 for s in measured for d in s.drafted if d > 0),
        all_draft_tokens=sum(sum(s.drafted) for s in measured),
        all_accepted_tokens=sum(sum(s.accepted_counts()) for s in measured),
        sample_waves=tuple(sorted({s.wave for s, _ in steady} & timed_waves)),
    )


def summarize_paired(steps: list[Step], batch_size: int, ks: tuple[int, ...], positions: int,
                     acceptance: str = "replay", settle: int = SETTLE) -> dict[int, TraceSummary]:
    """Paired design: every K of ``ks`` ran inside the same waves (a K per step). Per K: tokens
    and acceptance from every steady step that verified K; step time from its **settled** steps
    (pure -- verified K and proposed K -- and preceded by ``settle`` pure steps of that K). Samples
    are **blocks** of consecutive waves (:func:`pure_blocks`), so sample ``i`` of every K is the
    same stretch of waves. Raises :class:`CellFailure` when a K has no settled step at all.
    **Arms** (``ks`` holding a value < 0, validate's steps design) are keyed by ``Step.arm``
    instead of the K drafted, and never pooled. ``acceptance``: ``"replay"`` (a server held at K,
    :mod:`dsdprof.measure.vllm.replay`, after the ``acceptance`` check of :func:`pool_acceptance`),
    ``"pooled"`` or ``"own"``. Why each rule: docs/measurement.md (the paired design's "What a step
    did" and "Rows")."""
    steady, excluded = steady_steps(steps, batch_size)
    by_k: dict[int, list[tuple[Step, float]]] = {k: [] for k in ks}
    pure: dict[int, list[tuple[Step, float]]] = {k: [] for k in ks}
    verified = _verified_arms(steps) if min(ks) < 0 else None
    run = _pure_runs(steps, verified)
    odd = 0
    for s, t in steady:
        k, n = run[id(s)]
        if k not in by_k:
            odd += 1
            continue
        by_k[k].append((s, t))
        if n > settle:
            pure[k].append((s, t))
    block = pure_blocks({k: {s.wave for s, _ in pure[k]} for k in ks}, {s.wave for s, _ in steady})
    if not block:
        counts = ", ".join(f"K={k}: {len(pure[k])}" for k in ks)
        raise CellFailure(f"paired design: a K never ran a settled pure step ({counts}; {odd} steady "
                          f"steps drafted no K of the group); raise output_len, or design = \"cells\" for "
                          f"a drafter that proposes fewer than K (n-gram, suffix)")
    measured = [s for s in steps if s.wave >= 0]
    out, kept_by_k = {}, {}
    for k in ks:
        kept = [(replace(s, wave=block[s.wave]), t) for s, t in by_k[k] if s.wave in block]
        timed = [(replace(s, wave=block[s.wave]), t) for s, t in pure[k] if s.wave in block]
        out[k] = _summary(kept, timed, excluded + len(steady) - len(timed), measured, positions)
        kept_by_k[k] = kept
    if verified is not None or acceptance == "own":
        return out
    pooled = pool_acceptance(out, kept_by_k)
    if acceptance == "pooled":
        return pooled
    return with_replay(pooled, [s for s in measured if s.wave in block], block, positions)


def pool_acceptance(by_k: dict[int, TraceSummary],
                    kept_by_k: dict[int, list[tuple[Step, float]]]) -> dict[int, TraceSummary]:
    """Paired design: each K's acceptance length from **every** steady step of the group, pooled
    by draft position: ``acceptance_length(K) = 1 + sum_{j <= K} P(a >= j)``, ``P(a >= j)`` from
    every request-step that drafted at least ``j`` (position ``j`` is drafted the same way whatever
    K is). Per block (sample) the same from that block's steps. It weighs each stretch of a
    request by the *mix's* steps in it, not a fixed-K server's (:mod:`dsdprof.measure.vllm.replay`
    removes that). The K's own steps' value is kept (``acceptance_length_own``) and checked against
    the pooled one, both weighed by the mix's steps: ``acceptance_check`` says when they differ by
    more than 4 standard errors of the K's own mean (over its request-steps) and 2 % (then
    acceptance did depend on K; measured on real traces: docs/measurement.md)."""
    kept = [x for steps in kept_by_k.values() for x in steps]
    blocks = sorted({s.wave for s, _ in kept})
    positions = max((d for s, _ in kept for d in s.drafted), default=0)
    acc = {b: [0] * positions for b in blocks}
    dr = {b: [0] * positions for b in blocks}
    for s, _ in kept:
        for d, a in zip(s.drafted, s.accepted_counts()):
            for j in range(d):
                dr[s.wave][j] += 1
                acc[s.wave][j] += j < a
    tot_acc = [sum(acc[b][j] for b in blocks) for j in range(positions)]
    tot_dr = [sum(dr[b][j] for b in blocks) for j in range(positions)]

    def length(a: list[int], d: list[int], k: int) -> float:
        return 1.0 + sum(a[j] / d[j] for j in range(k) if d[j])

    out = {}
    for k, t in by_k.items():
        al = length(tot_acc, tot_dr, k)
        samples = tuple(length(acc[b], dr[b], k) for b in t.sample_waves)
        own = [g for s, _ in kept_by_k[k] for g in s.generated]
        check = ""
        if len(own) >= 2:
            mean = sum(own) / len(own)
            se = math.sqrt(sum((g - mean) ** 2 for g in own) / (len(own) - 1) / len(own))
            diff = t.acceptance_length - al
            if abs(diff) > max(4 * se, 0.02 * al):
                check = (f"acceptance: K={k}'s own steps made {t.acceptance_length:.3f} tokens per "
                         "request-step, "
                         f"the group's pooled estimate {al:.3f} ({diff / al:+.1%}; 4 se = {4 * se / al:.1%})")
        out[k] = replace(t, acceptance_length=al, sample_acceptance_length=samples,
                         acceptance_per_pos=tuple(tot_acc[j] / tot_dr[j] if tot_dr[j] else 0.0
                                                  for j in range(positions)),
                         tpot_s=t.itl_s / al, acceptance_length_own=t.acceptance_length,
                         acceptance_check=check)
    return out


def _pure_runs(steps: list[Step], verified: dict[int, int | None] | None) -> dict[int, tuple]:
    """id(step) -> (the K, or arm, whose drafts it verified (None: mixed), how many pure steps of
    that K in a row end with it (0: not pure)). Arms (``verified`` given): a step verified the
    arm of the record before it and is pure when it was scheduled under that arm too."""
    out: dict[int, tuple] = {}
    prev: Step | None = None
    for s in steps:
        if verified is not None:
            k, now = verified.get(id(s)), s.arm
        else:
            kinds = set(s.drafted)
            k, now = (kinds.pop() if len(kinds) == 1 else None), s.k_next
        before = out.get(id(prev), (None, 0)) if prev is not None and prev.wave == s.wave else (None, 0)
        n = (before[1] + 1 if before[0] == k else 1) if now == k and k is not None else 0
        out[id(s)] = (k, n)
        prev = s
    return out


def _verified_arms(steps: list[Step]) -> dict[int, int | None]:
    """id(step) -> the arm of the record before it in the same wave (the step whose drafts it verified)."""
    out: dict[int, int | None] = {}
    prev: Step | None = None
    for s in steps:
        out[id(s)] = prev.arm if prev is not None and prev.wave == s.wave else None
        prev = s
    return out


def pure_blocks(pure_waves: dict[int, set[int]],
                waves_seen: AbstractSet[int] = frozenset()) -> dict[int, int]:
    """Wave -> its block, named by the block's first wave: consecutive waves (of ``pure_waves``
    and ``waves_seen``) grouped until every K has a pure step in the block (the waves after the
    last complete block join it). Empty when some K has no pure step at all."""
    if not pure_waves or not all(pure_waves.values()):
        return {}
    waves = sorted(set().union(*pure_waves.values(), waves_seen))
    block: dict[int, int] = {}
    n, seen = 0, set()
    for w in waves:
        block[w] = n
        seen |= {k for k, ws in pure_waves.items() if w in ws}
        if len(seen) == len(pure_waves):
            n, seen = n + 1, set()
    for w in waves:  # an incomplete tail joins the last complete block
        if block[w] == n:
            block[w] = n - 1
    first: dict[int, int] = {}
    for w in waves:
        first.setdefault(block[w], w)
    return {w: first[b] for w, b in block.items()}
