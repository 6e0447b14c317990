"""Acceptance as a server at a fixed K sees it, replayed from a paired (mixed-K) trace.

In the paired design every K of a batch size runs inside the same waves, K switched per step.
Averaging ``1 + min(a, K)`` over the mixed run's steps (:func:`dsdprof.measure.vllm.trace.pool_acceptance`)
weighs each stretch of a request's output by the *mix's* steps in it. A server held at K spends
its own share of steps in each stretch: many in a hard stretch (short steps), few in an easy one,
so its AL is the token-weighted *harmonic* mean of the local AL. When acceptance comes in easy and
hard stretches along a request, pooling overstates large Ks against small ones (3 % on
AL(4)/AL(1) at a step-to-step correlation of 0.08, 7-8 % at 0.22).

Under greedy decoding a chain drafter proposes output position ``s`` of a request from the
accepted prefix, so whether the draft matches there, ``d(s)``, is a property of the position.
Each request's ``d`` is rebuilt from its steps in order (:func:`request_matches`): a step at
position ``t`` that verified ``k`` drafts and accepted ``a`` gives ``d(t..t+a-1) = 1`` and
``d(t+a) = 0`` when ``a < k``; its last token (the bonus after a full acceptance, the token of a
step that drafted nothing) is the target's own and says nothing about ``d`` there; the next step
starts at ``t + a + 1``. Unknown positions are imputed from a two-state hidden chain along the
position (easy and hard stretches; a match rate per state, or per state and depth when that fits
better, by AIC) fitted to the cell's known positions by EM (:mod:`.replay_chain`): ``IMPUTATIONS``
draws of the whole sequence from its posterior (:func:`.replay_chain.match_probabilities`: a state
path drawn per request, so that positions of one stretch stay correlated; given the path each
position's match probability, not a drawn match). Each fixed K is then replayed over every request
and draw (:func:`replay_ks`): a step at ``t`` accepts the run of matches from ``t`` (the draft at
``t + i`` at depth ``i + 1``), up to K, and the request ends at its output length, the last step
untrimmed as vLLM counts it;
``AL(K) = tokens / steps`` summed over requests and draws. Per wave block (bootstrap sample) the
same over that block's requests.

Assumptions: whether a draft matches depends on its position and its depth in the step's chain,
not on K (as for pooling by position), and a position seen at one depth is carried to another by
one uniform draw per position (a draft at depth j matches when the draw is below the rate at j).
With one rate per state (n-gram and draft-model drafters under greedy decoding) a known position
is known at every depth; an EAGLE/MTP head that drafts deeper positions from its own hidden
states gets a rate per depth. Pure functions over plain values: testable without vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsdprof.measure.vllm.replay_chain import Chain, Fits, Stack, match_probabilities, select

UNKNOWN = -1
IMPUTATIONS = 8  # imputations of the unknown positions averaged per cell
IMPUTATION_SEED = 20261203  # fixed: the same trace gives the same rows


@dataclass(frozen=True)
class RequestMatches:
    """One request: ``x[s]`` = 1 (draft matched at output position s), 0 (rejected) or UNKNOWN."""

    wave: int
    x: np.ndarray  # int8, positions 0 .. end - 1 (0: the prefill's token)
    length: int  # output tokens the request was delivered (the replay ends there)
    depth: np.ndarray | None = None  # int8: where a known position sat in its step's chain (1 = first)


# the requests the chain is fitted on (spread over the cell's); None fits every request. 1024 since
# 2026-12-06's fourth pass (256 before, which read sticky-depth 0.01-0.03 % lower at 512 requests):
# every request of a group up to 1024; without a cap the jackknife of a BS-256 x 25-wave group
# stacks 25 refits of ~6,100 requests each and ran out of memory at 6 GB (docs/lab/precision-replay.md)
FIT_ROWS: int | None = 1024


def request_matches(records: list[tuple[str, tuple[int, int, int]]], delivered: dict[str, int],
                    waves: dict[str, int]) -> list[RequestMatches]:
    """Per request, its match sequence from its decode steps in order. ``records``: (request id,
    (drafted, accepted, generated)) in step order; ``delivered``: the request's delivered output
    tokens (its length); ``waves``: the request's wave."""
    by_req: dict[str, list[tuple[int, int, int]]] = {}
    for rid, rec in records:
        by_req.setdefault(rid, []).append(rec)
    out = []
    for rid, recs in by_req.items():
        end = 1 + sum(g for _, _, g in recs)
        x = np.full(end, UNKNOWN, dtype=np.int8)
        depth = np.zeros(end, dtype=np.int8)
        t = 1  # position 0: the prefill's token
        for d, a, g in recs:
            a = max(0, min(a, d, g - 1))
            x[t:t + a] = 1
            depth[t:t + a + (a < d)] = np.arange(1, a + 1 + (a < d))
            if a < d:
                x[t + a] = 0
            t += g
        out.append(RequestMatches(waves.get(rid, 0), x, max(1, min(end, delivered.get(rid, end))), depth))
    return out


def _init(x: np.ndarray, kmax: int) -> Fits:
    """EM's start (one fit): even states, rare switches, rates 0.15 either side of the known match share."""
    known = x >= 0
    m0 = float((x[known] == 1).mean()) if known.any() else 0.5
    return (np.array([[0.5, 0.5]]), np.array([[[0.95, 0.05], [0.05, 0.95]]]),
            np.clip([[[m0 + 0.15] * kmax, [m0 - 0.15] * kmax]], 0.02, 0.98))


def _fit_rows(n: int, fit_rows: int | None) -> np.ndarray:
    """The requests of ``n`` the chain is fitted on: all, or at most ``fit_rows`` spread over them."""
    if fit_rows is None or fit_rows >= n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, fit_rows).astype(int)) if n else np.zeros(0, dtype=int)


def replay_ks(m: np.ndarray, lengths: np.ndarray, ks: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(expected tokens, expected steps) [K, request] of a server held at each K of ``ks`` (> 0)
    from position 1 to each request's length, over time-major match probabilities ``m[position,
    depth - 1, request]`` (padded past each length by at least ``max(ks)``): a step at ``t`` accepts
    the run of matches from ``t`` (the draft at ``t + i`` at depth ``i + 1``) up to K and makes one
    more token (bonus or correction). Positions are taken as independent given the data. Where a step
    starts is carried in a ring of ``max(ks) + 2`` positions."""
    width, depths, r = m.shape
    order = np.argsort(ks, kind="stable")
    kk = np.array(ks)[order]  # ascending: the Ks still drafting at depth i + 1 are a tail
    kmax = int(kk[-1])
    ring = kmax + 2
    f = np.zeros((ring, len(ks), r))  # probability that a step starts at position t (t mod ring)
    f[1] = 1.0
    tail = [int(np.searchsorted(kk, i)) for i in range(kmax + 1)]  # first K >= i
    more = [(kk[tail[i]:] > i)[:, None] for i in range(kmax + 1)]  # 0 at K = i: K + 1 tokens, stop
    steps = np.zeros((len(ks), r))
    tokens = np.zeros((len(ks), r))
    run = np.zeros((len(ks), r))
    for t in range(1, int(lengths.max()) if r else 1):
        live = f[t % ring] * (t < lengths)
        f[t % ring] = 0.0
        if not live.any():
            continue
        steps += live
        run[:] = live
        for i in range(kmax + 1):
            lo = tail[i]
            qi = m[t + i, i] if t + i < width and i < min(kmax, depths) else np.zeros(r, dtype=m.dtype)
            q = qi * more[i]
            stop = run[lo:] * (1.0 - q)  # i accepted, position t + i rejected: i + 1 tokens
            f[(t + i + 1) % ring, lo:] += stop
            tokens[lo:] += stop * (i + 1)
            run[lo:] *= q
    back = np.empty_like(order)
    back[order] = np.arange(len(ks))
    tokens, steps = tokens[back], steps[back]
    return tokens, steps


@dataclass(frozen=True)
class Replayed:
    """AL of a server held at each K, over every request and per wave block."""

    acceptance_length: dict[int, float]
    by_block: dict[int, dict[int, float]]  # K -> block -> sample (jackknife-spread, see replay_acceptance)
    model: tuple  # the fitted chain: (match rate per state and depth, switch probability per state)
    unknown_share: float  # share of the requests' decode positions whose match was imputed
    plain_by_block: dict[int, dict[int, float]] | None = None  # K -> block -> AL of its requests, one fit


def _replay_all(x, depth, chain: Chain, lengths, active, imputations) -> tuple[np.ndarray, np.ndarray]:
    """(expected tokens, expected steps) [K of ``active``, request] over ``imputations`` draws of
    the chain's posterior, from the fixed seed (so that two chains see the same random numbers);
    as many draws at a time as fit in about 8 M match probabilities."""
    rng = np.random.default_rng(IMPUTATION_SEED)
    n, width = x.shape
    stack = Stack.of(x, depth, [np.arange(n)], chain[2].shape[1])
    tokens = np.zeros((len(active), n))
    steps = np.zeros((len(active), n))
    per = max(1, int(8e6 // max(1, n * width * chain[2].shape[1])))
    done = 0
    while done < imputations:
        draws = min(per, imputations - done)
        m = match_probabilities(stack, chain, rng.random((draws, width, n)))
        tk, sk = replay_ks(m, np.tile(lengths, draws), tuple(active))
        for i in range(draws):  # summed draw by draw, as one draw at a time did
            tokens += tk[:, i * n:(i + 1) * n]
            steps += sk[:, i * n:(i + 1) * n]
        done += draws
    return tokens, steps


def replay_acceptance(reqs: list[RequestMatches], ks: tuple[int, ...], block: dict[int, int],
                      imputations: int = IMPUTATIONS, jackknife: bool = True,
                      fit_rows: int | None = FIT_ROWS) -> Replayed:
    """AL(K) for every K of ``ks`` replayed over ``reqs`` (see the module docstring); per block of
    ``block`` (wave -> block; requests of other waves are left out).

    The chain is fitted once, over requests of every block, so its fitting noise is common to the
    blocks' ALs (``plain_by_block``) and missing from their spread: with short requests that
    spread understated the error 1.4-1.75 times (docs/lab/synthetic-truth.md). With ``jackknife``
    (and at least 2 blocks), a delete-a-block jackknife includes it: the chain is refitted without
    each block's requests (warm-started from the full fit; the same model choice by AIC; the
    refits run stacked, :mod:`.replay_chain`) and the AL replayed over the other blocks with the
    same random numbers; ``by_block`` are then the row's AL plus each block's pseudo-value
    deviation, ``AL + (n - 1) (mean_c AL_-c - AL_-b)``, whose standard error of the mean is the
    jackknife's and whose mean is the row's AL. The chain is fitted on at most ``fit_rows``
    requests spread over them (the default :data:`FIT_ROWS`, 1024: every request of most groups;
    None: every request), the refits on those of them outside the block."""
    reqs = [r for r in reqs if r.wave in block]
    kmax = max(max(ks), 0)
    width = max((max(len(r.x), r.length) for r in reqs), default=1) + kmax + 1
    x = np.full((len(reqs), width), UNKNOWN, dtype=np.int8)
    depth = np.zeros((len(reqs), width), dtype=np.int8)
    for i, r in enumerate(reqs):
        x[i, :len(r.x)] = r.x
        if r.depth is not None:
            depth[i, :len(r.depth)] = r.depth
    kfit = max(kmax, int(depth.max(initial=1)), 1)
    rows = _fit_rows(len(x), fit_rows)
    chosen, one, by = select(Stack.of(x, depth, [rows], kfit), 100, _init(x[rows], kfit), None)
    chain = (chosen[0][0], chosen[1][0], chosen[2][0])
    lengths = np.array([r.length for r in reqs], dtype=float)
    active = [k for k in ks if k > 0]
    tokens, steps = _replay_all(x, depth, chain, lengths, active, imputations)
    blocks = np.array([block[r.wave] for r in reqs])
    ids = [int(b) for b in np.unique(blocks)]
    decode = sum(max(0, len(r.x) - 1) for r in reqs)
    unknown = sum(int((r.x[1:] == UNKNOWN).sum()) for r in reqs)
    al: dict[int, float] = {}
    plain: dict[int, dict[int, float]] = {}
    for k in ks:
        if k <= 0:
            al[k], plain[k] = 1.0, {b: 1.0 for b in ids}
            continue
        tk, sk = tokens[active.index(k)], steps[active.index(k)]
        al[k] = float(tk.sum() / sk.sum()) if sk.sum() > 0 else float("nan")
        plain[k] = {b: float(tk[blocks == b].sum() / sk[blocks == b].sum()) for b in ids
                    if sk[blocks == b].sum() > 0}
    by_block = plain
    if jackknife and len(ids) >= 2 and active:
        by_block = _jackknife(x, depth, rows, blocks, ids, (one, by), kfit, lengths, active, imputations, al)
        by_block.update({k: plain[k] for k in ks if k <= 0})
    model = (np.round(chain[2], 3).tolist(), np.round(chain[1][[0, 1], [1, 0]], 4).tolist())
    return Replayed(al, by_block, model, unknown / decode if decode else 0.0, plain)


def _jackknife(x, depth, rows, blocks, ids, starts: tuple[Fits, Fits], kfit, lengths, active, imputations,
               al) -> dict:
    """K -> block -> the row's AL plus the block's jackknife pseudo-value deviation
    (:func:`replay_acceptance`): the refits without each block stacked, warm-started from the
    full fit's one-rate and per-depth chains."""
    left: dict[int, dict[int, float]] = {k: {} for k in active}  # K -> block -> AL without it
    one, by = (_repeat(fit, len(ids)) for fit in starts)
    chains = select(Stack.of(x, depth, [rows[blocks[rows] != b] for b in ids], kfit), 100, one, by)[0]
    for i, b in enumerate(ids):
        tokens, steps = _replay_all(x, depth, (chains[0][i], chains[1][i], chains[2][i]), lengths, active,
                                    imputations)
        for j, k in enumerate(active):
            sk = steps[j][blocks != b].sum()
            if sk > 0:
                left[k][b] = float(tokens[j][blocks != b].sum() / sk)
    out = {}
    for k in active:
        vals = left[k]
        mean = sum(vals.values()) / len(vals) if vals else 0.0
        out[k] = {b: al[k] + (len(vals) - 1) * (mean - v) for b, v in vals.items()}
    return out


def _repeat(fit: Fits, n: int) -> Fits:
    """One fit's parameters as the start of ``n`` fits."""
    return (np.repeat(fit[0], n, axis=0), np.repeat(fit[1], n, axis=0), np.repeat(fit[2], n, axis=0))


def matches_from_steps(steps) -> list[RequestMatches]:
    """:func:`request_matches` from trace records (:class:`~dsdprof.measure.vllm.trace.Step`, in
    trace order): every decoding request-step of the measured waves, steady or not."""
    records: list[tuple[str, tuple[int, int, int]]] = []
    delivered: dict[str, int] = {}
    waves: dict[str, int] = {}
    for s in steps:
        if s.wave < 0:
            continue
        for rid, n in s.delivered.items():
            delivered[rid] = delivered.get(rid, 0) + n
            waves.setdefault(rid, s.wave)
        if not s.ids:
            continue
        for rid, d, a, g in zip(s.ids, s.drafted, s.accepted_counts(), s.generated):
            records.append((rid, (d, a, g)))
            waves.setdefault(rid, s.wave)
    return request_matches(records, delivered, waves)


def with_replay(by_k: dict, steps, block: dict[int, int], positions: int) -> dict:
    """``by_k`` (K -> :class:`~dsdprof.measure.vllm.trace.TraceSummary`, samples per block) with
    each K's acceptance replayed as a server held at K (:func:`replay_acceptance`) over the
    requests of the blocked waves of ``steps``: ``acceptance_length``, its samples, ``tpot_s`` and
    ``acceptance_per_pos`` (position j: AL(j) - AL(j - 1) of servers held at j and j - 1, so that
    ``1 + sum_{j <= K}`` of it is AL(K), as analyze's chain prediction reads it)."""
    from dataclasses import replace

    ks = tuple(sorted(set(by_k) | set(range(positions + 1))))
    rep = replay_acceptance(matches_from_steps(steps), ks, block)
    al = rep.acceptance_length
    per_pos = tuple(max(0.0, al[j] - al[j - 1]) for j in range(1, positions + 1))
    out = {}
    for k, t in by_k.items():
        samples = tuple(rep.by_block[k].get(b, al[k]) for b in t.sample_waves)
        out[k] = replace(t, acceptance_length=al[k], sample_acceptance_length=samples,
                         acceptance_per_pos=per_pos, tpot_s=t.itl_s / al[k])
    return out
