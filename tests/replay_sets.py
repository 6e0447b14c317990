"""Correlated acceptance with a known truth for the paired design's replay (issue 45 part 2).

Held out from the replay's own model (:mod:`dsdprof.measure.vllm.replay` fits a *two*-state chain):
each request's output positions follow a **three**-state hidden chain (easy, middling, hard
stretches), staying in its state with probability ``stay`` per position and otherwise moving to
one of the two others at random (``stay`` = 1/3: the states are independent from position to
position). A position ``s`` draws one uniform ``u(s)``; a draft at depth ``j`` (1 = first of its
step) matches there when ``u(s) < rate(state(s)) * decay ** (j - 1)`` (``decay`` 1: one rate at
every depth, as an n-gram or draft model under greedy decoding; < 1: rates falling by depth, as an
EAGLE/MTP head).

A **paired run** steps each wave's ``batch_size`` requests together through the K sequence of
the sweep (:func:`dsdprof.measure.vllm.worker.k_sequence`, ``PAIRED_HOLD`` steps per K): a step
at position ``t`` with K drafts accepts the run of matches from ``t`` up to K and makes one more
token (the last step untrimmed, as vLLM counts it; the request ends at its length). The
**truth** is a server held at K over the same requests:
:func:`replay` (the package's :func:`~dsdprof.measure.vllm.replay.replay_ks` at one K) over the true
match of every position and depth (0 or 1), tokens / steps summed over the requests. Nothing here is
a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsdprof.measure.vllm.replay import RequestMatches, replay_ks, request_matches
from dsdprof.measure.vllm.replay_chain import Chain, Stack, match_probabilities

KS = (0, 1, 2, 3, 4)


def replay(m: np.ndarray, lengths: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(expected tokens, expected steps) per request of a server held at ``k``, over request-major
    match probabilities ``m[request, position, depth - 1]``: the replay's ``replay_ks`` at one K."""
    tokens, steps = replay_ks(np.ascontiguousarray(np.transpose(m, (1, 2, 0))), lengths, (k,))
    return tokens[0], steps[0]


def sample_matches(x: np.ndarray, depth: np.ndarray, chain: Chain, rng: np.random.Generator) -> np.ndarray:
    """One imputation of the replay, request-major: ``m[r, s, j - 1]``, the probability that a draft
    at depth ``j`` matches at position ``s`` given a state path per request drawn from the chain's
    posterior (:func:`~dsdprof.measure.vllm.replay_chain.match_probabilities` over one fit of every
    request)."""
    kmax = chain[2].shape[1]
    stack = Stack.of(x, depth, [np.arange(len(x))], kmax)
    m = match_probabilities(stack, chain, rng.random((1, x.shape[1], len(x))))
    return np.ascontiguousarray(m.transpose(2, 0, 1))


@dataclass(frozen=True)
class Case:
    name: str
    stay: float  # probability that a position keeps the state of the one before it
    decay: float = 1.0  # match rate at depth j: rate x decay ** (j - 1)
    rates: tuple[float, float, float] = (0.95, 0.75, 0.4)  # easy, middling, hard
    depth_rates: tuple[float, ...] = ()  # else: one state, these conditional rates by depth (vLLM's
    # synthetic sampler: a draft at depth j accepted with rates[j] / rates[j - 1] given depth j - 1)


# lag-1 correlation of consecutive steps' accepted drafts at a fixed K=4 from 0 to ~0.45
# vLLM's synthetic sampler at the lab's rates (docs/lab/synthetic-truth.md: 0.8, 0.6, 0.45, 0.3 of
# reaching depth 1-4): independent steps, one rate per depth
SYNTHETIC = Case("synthetic", stay=1.0, depth_rates=(0.8, 0.75, 0.75, 0.3 / 0.45))

CASES = (
    Case("iid", stay=1 / 3),
    Case("iid-depth", stay=1 / 3, decay=0.85),
    Case("mild", stay=0.9),
    Case("mild-depth", stay=0.9, decay=0.85),
    Case("long", stay=0.97),
    Case("long-depth", stay=0.97, decay=0.85),
    Case("sticky", stay=0.99),
    Case("sticky-depth", stay=0.99, decay=0.85),
)


@dataclass(frozen=True)
class Run:
    """One simulated paired run: the requests' observed match sequences and the truth per K."""

    reqs: list[RequestMatches]
    truth: dict[int, float]  # AL of a server held at K over the same requests
    lag1: float  # lag-1 correlation of a fixed K=4 server's accepted drafts per request


def _text(case: Case, rng: np.random.Generator, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(rate per request and position, u per request and position)."""
    state = np.empty((n, length), dtype=int)
    state[:, 0] = rng.integers(0, 3, n)
    moves = rng.random((n, length)) >= case.stay
    shift = rng.integers(1, 3, (n, length))
    for s in range(1, length):
        state[:, s] = np.where(moves[:, s], (state[:, s - 1] + shift[:, s]) % 3, state[:, s - 1])
    return np.asarray(case.rates)[state], rng.random((n, length))


def _lag1(match: np.ndarray, length: int, k: int = 4) -> float:
    """Lag-1 correlation of a fixed-K server's accepted drafts, over its steps of every request."""
    xs, ys = [], []
    k = min(k, match.shape[2])
    for row in match:
        t, acc = 1, []
        while t < length:
            a = 0
            while a < k and t + a < length and row[t + a, a]:
                a += 1
            acc.append(a)
            t += a + 1
        xs.extend(acc[:-1])
        ys.extend(acc[1:])
    return float(np.corrcoef(xs, ys)[0, 1]) if len(xs) > 2 and np.std(xs) > 0 else 0.0


def paired_run(case: Case, seed: int, waves: int = 16, batch_size: int = 8, length: int = 300,
               ks: tuple[int, ...] = KS) -> Run:
    from dsdprof.measure.vllm.worker import PAIRED_HOLD, k_sequence

    rng = np.random.default_rng((seed, 4545))
    kmax = max(ks)
    n = waves * batch_size
    rate, u = _text(case, rng, n, length + kmax + 2)
    depth_rate = rate[..., None] * case.decay ** np.arange(kmax)  # [request, position, depth - 1]
    if case.depth_rates:
        depth_rate = np.broadcast_to(np.asarray(case.depth_rates[:kmax]), depth_rate.shape)
    match = u[..., None] < depth_rate
    records: list[tuple[str, tuple[int, int, int]]] = []
    wave_of: dict[str, int] = {}
    for w in range(waves):
        seq = k_sequence(ks, w, PAIRED_HOLD)
        rows = np.arange(w * batch_size, (w + 1) * batch_size)
        pos, step = np.ones(batch_size, dtype=int), 0
        while (pos < length).any():
            k = seq[step % len(seq)]
            step += 1
            for i in np.flatnonzero(pos < length):
                r, t, a = rows[i], pos[i], 0
                while a < k and match[r, t + a, a]:
                    a += 1
                records.append((f"{w}-{i}", (k, a, a + 1)))  # untrimmed, as the trace counts it
                wave_of[f"{w}-{i}"] = w
                pos[i] += a + 1
    reqs = request_matches(records, {rid: length for rid in wave_of}, wave_of)
    lengths = np.full(n, float(length))
    order = [int(r.split("-")[0]) * batch_size + int(r.split("-")[1]) for r in wave_of]
    m = match[order].astype(float)
    truth = {}
    for k in ks:
        if k <= 0:
            truth[k] = 1.0
            continue
        tokens, steps = replay(m, lengths, k)
        truth[k] = float(tokens.sum() / steps.sum())
    return Run(reqs, truth, _lag1(match[:, :, :], length))


def replay_errors(case: Case, seeds, waves: int = 16, batch_size: int = 8, length: int = 300,
                  fit_rows: int | None = None) -> tuple[np.ndarray, list[float], int]:
    """(errors [seed, K 1..4] of the replayed AL against the truth, lag-1 per seed, seeds whose
    chain took a rate per depth)."""
    from dsdprof.measure.vllm.replay import replay_acceptance

    errs, lags, by_depth = [], [], 0
    for seed in seeds:
        run = paired_run(case, seed, waves, batch_size, length)
        rep = replay_acceptance(run.reqs, KS, {w: w for w in range(waves)}, jackknife=False,
                                fit_rows=fit_rows)
        errs.append([rep.acceptance_length[k] / run.truth[k] - 1.0 for k in KS[1:]])
        lags.append(run.lag1)
        by_depth += bool(np.ptp(np.array(rep.model[0]), axis=1).max() > 1e-9)
    return np.array(errs), lags, by_depth
