"""The replay's chain fit, posterior draws and fixed-K replay as they were before they were vectorized
(``dsdprof/measure/vllm/replay.py`` at 0b9fb75..c7fcfd6, docstrings cut): pure-Python loops over
positions, one fit at a time. ``tests/measure/test_replay_vectorized.py`` holds the vectorized code to
these within float tolerance."""

from __future__ import annotations

import numpy as np

from dsdprof.measure.vllm.replay import (
    FIT_ROWS,
    IMPUTATION_SEED,
    IMPUTATIONS,
    UNKNOWN,
    Replayed,
    RequestMatches,
)


def _fit_rows(n: int, fit_rows: int | None) -> np.ndarray:
    if fit_rows is None or fit_rows >= n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, fit_rows).astype(int)) if n else np.zeros(0, dtype=int)

def _emissions(x: np.ndarray, depth: np.ndarray, e: np.ndarray) -> np.ndarray:
    rate = np.moveaxis(e[:, np.maximum(depth, 1) - 1], 0, -1)
    return np.where((x == 1)[..., None], rate, np.where((x == 0)[..., None], 1.0 - rate, 1.0))


def _forward_backward(b: np.ndarray, pi: np.ndarray, a: np.ndarray):
    r, t, _ = b.shape
    alpha = np.empty((r, t, 2))
    c = np.empty((r, t))
    f = pi[None, :] * b[:, 0]
    for s in range(t):
        if s:
            f = (alpha[:, s - 1] @ a) * b[:, s]
        c[:, s] = f.sum(axis=1)
        alpha[:, s] = f / c[:, s, None]
    beta = np.ones((r, t, 2))
    xi = np.zeros((2, 2))
    for s in range(t - 2, -1, -1):
        nb = b[:, s + 1] * beta[:, s + 1] / c[:, s + 1, None]
        beta[:, s] = nb @ a.T
        xi += a * (alpha[:, s].T @ nb)
    gamma = alpha * beta
    gamma /= gamma.sum(axis=2, keepdims=True)
    return gamma, xi, float(np.log(c).sum()), alpha


def _em(x: np.ndarray, depth: np.ndarray, kmax: int, by_depth: bool, iterations: int, start: tuple):
    pi, a, e = (np.array(v, dtype=float) for v in start)
    known = x >= 0
    d1 = np.clip(depth, 1, kmax) - 1
    hit = [(x == 1) & (d1 == j) for j in range(kmax)]
    seen = [known & (d1 == j) for j in range(kmax)]
    last = ll = -np.inf
    for _ in range(iterations):
        gamma, xi, ll, _ = _forward_backward(_emissions(x, depth, e), pi, a)
        pi = gamma[:, 0].mean(axis=0)
        a = xi / xi.sum(axis=1, keepdims=True)
        h1 = np.array([gamma[hit[j]].sum(axis=0) for j in range(kmax)]).T  # [state, depth]
        w = np.array([gamma[seen[j]].sum(axis=0) for j in range(kmax)]).T
        if not by_depth:
            h1, w = h1.sum(axis=1, keepdims=True), w.sum(axis=1, keepdims=True)
        e = np.clip(np.where(w > 0, h1 / np.maximum(w, 1e-12), e), 1e-6, 1 - 1e-6) * np.ones((2, kmax))
        if ll - last < 1e-8 * abs(ll):
            break
        last = ll
    return pi, a, e, _forward_backward(_emissions(x, depth, e), pi, a)[2]


def _init(x: np.ndarray, kmax: int) -> tuple:
    known = x >= 0
    m0 = float((x[known] == 1).mean()) if known.any() else 0.5
    return ([0.5, 0.5], [[0.95, 0.05], [0.05, 0.95]],
            np.clip([[m0 + 0.15] * kmax, [m0 - 0.15] * kmax], 0.02, 0.98))


def _select(x: np.ndarray, depth: np.ndarray, kmax: int, iterations: int, one: tuple,
            by: tuple | None) -> tuple:
    pi, a, e, ll = _em(x, depth, kmax, False, iterations, one)
    pd, ad, ed, lld = _em(x, depth, kmax, True, iterations, by if by is not None else (pi, a, e))
    chosen = (pd, ad, ed) if lld - ll > 2 * (kmax - 1) else (pi, a, e)
    return chosen, (pi, a, e), (pd, ad, ed)


def sample_matches(x: np.ndarray, depth: np.ndarray, chain: tuple, rng: np.random.Generator) -> np.ndarray:
    pi, a, e = chain
    kmax = e.shape[1]
    _, _, _, alpha = _forward_backward(_emissions(x, depth, e), pi, a)
    r, t = x.shape
    state = np.empty((r, t), dtype=int)
    p = alpha[:, -1]
    for s in range(t - 1, -1, -1):
        if s < t - 1:
            p = alpha[:, s] * a[:, state[:, s + 1]].T
            p /= p.sum(axis=1, keepdims=True)
        state[:, s] = rng.random(r) > p[:, 0]
    e = np.where(e >= 1 - 1e-6, 1.0, np.where(e <= 1e-6, 0.0, e)).astype(np.float32)  # clipped 0s, 1s: exact
    obs = e[state, np.clip(depth, 1, kmax) - 1]  # the rate at the observed depth
    m = e[state]  # [r, t, depth]: unknown positions keep the state's rates
    for seen, cond in ((x == 1, _given_match), (x == 0, _given_reject)):
        if seen.any():
            m[seen] = cond(m[seen], obs[seen][:, None])
    return m


def _given_match(rate: np.ndarray, obs: np.ndarray) -> np.ndarray:
    return np.where(obs > 0, np.minimum(rate, obs) / np.maximum(obs, 1e-30), rate > 0)


def _given_reject(rate: np.ndarray, obs: np.ndarray) -> np.ndarray:
    return np.where(obs < 1, np.maximum(rate - obs, 0) / np.maximum(1 - obs, 1e-30), 0)


def replay_one_k(m: np.ndarray, lengths: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    r, width, _ = m.shape
    steps = np.zeros(r)
    tokens = np.zeros(r)
    f = np.zeros((r, width + k + 2))  # probability that a step starts at position t
    f[:, 1] = 1.0
    for t in range(1, int(lengths.max()) if r else 1):
        live = f[:, t] * (t < lengths)
        if not live.any():
            continue
        steps += live
        run = live.copy()
        for i in range(k):
            qi = m[:, t + i, i] if t + i < width else np.zeros(r)
            stop = run * (1.0 - qi)  # i accepted, position t + i rejected: i + 1 tokens
            f[:, t + i + 1] += stop
            tokens += stop * (i + 1)
            run = run * qi
        f[:, t + k + 1] += run
        tokens += run * (k + 1)
    return tokens, steps


def _replay_all(x, depth, chain, lengths, active, imputations) -> tuple[dict, dict]:
    rng = np.random.default_rng(IMPUTATION_SEED)
    tokens = {k: np.zeros(len(x)) for k in active}
    steps = {k: np.zeros(len(x)) for k in active}
    for _ in range(imputations):  # one draw in memory at a time
        m = sample_matches(x, depth, chain, rng)
        for k in active:
            tk, sk = replay_one_k(m, lengths, k)
            tokens[k] += tk
            steps[k] += sk
    return tokens, steps


def replay_acceptance(reqs: list[RequestMatches], ks: tuple[int, ...], block: dict[int, int],
                      imputations: int = IMPUTATIONS, jackknife: bool = True,
                      fit_rows: int | None = FIT_ROWS) -> Replayed:
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
    chain, one, by = _select(x[rows], depth[rows], kfit, 100, _init(x[rows], kfit), None)
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
        tk, sk = tokens[k], steps[k]
        al[k] = float(tk.sum() / sk.sum()) if sk.sum() > 0 else float("nan")
        plain[k] = {b: float(tk[blocks == b].sum() / sk[blocks == b].sum()) for b in ids
                    if sk[blocks == b].sum() > 0}
    by_block = plain
    if jackknife and len(ids) >= 2 and active:
        by_block = _jackknife(x, depth, rows, blocks, ids, (one, by), kfit, lengths, active, imputations, al)
        by_block.update({k: plain[k] for k in ks if k <= 0})
    model = (np.round(chain[2], 3).tolist(), np.round(chain[1][[0, 1], [1, 0]], 4).tolist())
    return Replayed(al, by_block, model, unknown / decode if decode else 0.0, plain)


def _jackknife(x, depth, rows, blocks, ids, starts, kfit, lengths, active, imputations, al) -> dict:
    left: dict[int, dict[int, float]] = {k: {} for k in active}  # K -> block -> AL without it
    for b in ids:
        keep = rows[blocks[rows] != b]
        chain = _select(x[keep], depth[keep], kfit, 100, *starts)[0]
        tokens, steps = _replay_all(x, depth, chain, lengths, active, imputations)
        for k in active:
            sk = steps[k][blocks != b].sum()
            if sk > 0:
                left[k][b] = float(tokens[k][blocks != b].sum() / sk)
    out = {}
    for k in active:
        vals = left[k]
        mean = sum(vals.values()) / len(vals) if vals else 0.0
        out[k] = {b: al[k] + (len(vals) - 1) * (mean - v) for b, v in vals.items()}
    return out
