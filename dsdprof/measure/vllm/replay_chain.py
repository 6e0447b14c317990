"""The replay's two-state hidden chain along a request's output positions: EM fits, several at
once (a cell's jackknife refits), and match probabilities from state paths drawn from the posterior.

Arrays are time-major, ``[position, request]``: each step of the forward and backward recursions
is a handful of numpy operations over a contiguous row of every request of every fit stacked
together (the scaled forward-backward of a 2-state chain written out per state), not a Python
loop per fit. A :class:`Stack` holds the requests of ``fits`` fits, each request with its fit's
index; a fit's parameters are ``pi[f]`` (start probabilities, [2]), ``a[f]`` (transitions, [2, 2])
and ``e[f]`` (match rate per state and depth, [2, kmax]). Pure functions over plain values.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

Chain = tuple[np.ndarray, np.ndarray, np.ndarray]  # (pi [2], a [2, 2], e [2, kmax]) of one fit
Fits = tuple[np.ndarray, np.ndarray, np.ndarray]  # (pi [F, 2], a [F, 2, 2], e [F, 2, kmax])


@dataclass(frozen=True)
class Stack:
    """Requests of ``fits`` fits, time-major: ``x[t, r]`` 1 (matched), 0 (rejected) or < 0
    (unknown), ``d1[t, r]`` the depth - 1 it was seen at (clipped to 0 .. kmax - 1), ``fit[r]``."""

    x: np.ndarray
    d1: np.ndarray
    fit: np.ndarray
    fits: int
    kmax: int

    @staticmethod
    def of(x: np.ndarray, depth: np.ndarray, rows: list[np.ndarray], kmax: int) -> Stack:
        """Fit ``f`` over the requests ``rows[f]`` of ``x`` / ``depth`` ([request, position])."""
        idx = np.concatenate(rows) if rows else np.zeros(0, dtype=int)
        fit = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
        d1 = np.clip(depth[idx], 1, kmax) - 1
        return Stack(np.ascontiguousarray(x[idx].T), np.ascontiguousarray(d1.T), fit, len(rows), kmax)

    def only(self, keep: np.ndarray) -> Stack:
        """The requests of the fits where ``keep[f]``, those fits renumbered 0 .."""
        if keep.all():
            return self
        rows = keep[self.fit]
        renum = np.cumsum(keep) - 1
        return Stack(self.x[:, rows], self.d1[:, rows], renum[self.fit[rows]], int(keep.sum()), self.kmax)

    @cached_property
    def cell(self) -> np.ndarray:
        """[t, r]: each position's (fit, depth) cell, ``fit * kmax + d1``."""
        return (self.fit[None, :] * self.kmax + self.d1).astype(np.intp)

    @cached_property
    def seen(self) -> tuple[np.ndarray, np.ndarray]:
        """(known, matched) [t, r] as 1.0 / 0.0 weights."""
        return (self.x >= 0).astype(float), (self.x == 1).astype(float)

    @cached_property
    def lookup(self) -> np.ndarray:
        """[t, r]: where each position's state-0 likelihood sits in :func:`_emissions`' table."""
        return ((2 * self.cell - self.d1) * 3 + np.clip(self.x, -1, 1) + 1).astype(np.intp)


def _emissions(s: Stack, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(b0, b1) [t, r]: likelihood of each position's observation in state 0 / 1 (1 when unknown);
    ``e[fit, state, j - 1]``: match rate of a draft at depth ``j``. A table [fit, state, depth,
    (unknown, rejected, matched)] looked up per position."""
    table = np.stack([np.ones_like(e), 1.0 - e, e], axis=-1).reshape(-1)
    return np.take(table, s.lookup), np.take(table, s.lookup + 3 * s.kmax)


def _split(a: np.ndarray) -> tuple[np.ndarray, ...]:
    """a00, a01, a10, a11 of per-request transitions [r, 2, 2], contiguous."""
    return tuple(np.ascontiguousarray(a[:, i, j]) for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))


def _forward(b0: np.ndarray, b1: np.ndarray, pi: np.ndarray, a: np.ndarray):
    """Scaled forward pass: (filtered state-0 and state-1 probabilities [t, r], scale ``c`` [t, r]);
    ``pi`` [r, 2] and ``a`` [r, 2, 2] per request."""
    t, r = b0.shape
    al0, al1, c = np.empty((t, r)), np.empty((t, r)), np.empty((t, r))
    a00, a01, a10, a11 = _split(a)
    f0, f1 = pi[:, 0] * b0[0], pi[:, 1] * b1[0]
    u = np.empty(r)
    for s in range(t):
        if s:
            p, q = al0[s - 1], al1[s - 1]
            np.multiply(p, a00, out=f0)
            f0 += np.multiply(q, a10, out=u)
            f0 *= b0[s]
            np.multiply(p, a01, out=f1)
            f1 += np.multiply(q, a11, out=u)
            f1 *= b1[s]
        np.add(f0, f1, out=c[s])
        np.divide(f0, c[s], out=al0[s])
        np.divide(f1, c[s], out=al1[s])
    return al0, al1, c


def posterior(s: Stack, fits: Fits):
    """Forward-backward of every fit of the stack under its ``fits``: (posterior state-0 and
    state-1 probabilities [t, r], expected transitions per fit [F, 2, 2], log-likelihood per fit)."""
    pi, a, e = fits
    b0, b1 = _emissions(s, e)
    ar = a[s.fit]
    al0, al1, c = _forward(b0, b1, pi[s.fit], ar)
    t, r = b0.shape
    be0, be1 = np.ones((t, r)), np.ones((t, r))
    n0, n1 = np.zeros((t, r)), np.zeros((t, r))  # n[k]: b[k + 1] beta[k + 1] / c[k + 1]
    a00, a01, a10, a11 = _split(ar)
    u = np.empty(r)
    for k in range(t - 2, -1, -1):
        np.multiply(b0[k + 1], be0[k + 1], out=n0[k])
        n0[k] /= c[k + 1]
        np.multiply(b1[k + 1], be1[k + 1], out=n1[k])
        n1[k] /= c[k + 1]
        np.multiply(n0[k], a00, out=be0[k])
        be0[k] += np.multiply(n1[k], a01, out=u)
        np.multiply(n0[k], a10, out=be1[k])
        be1[k] += np.multiply(n1[k], a11, out=u)
    g0, g1 = al0 * be0, al1 * be1
    norm = g0 + g1
    pair = [np.einsum("tr,tr->r", p, q) for p in (al0, al1) for q in (n0, n1)]  # per request
    xi = np.stack([np.bincount(s.fit, v, s.fits) for v in pair], axis=1).reshape(-1, 2, 2) * a
    return g0 / norm, g1 / norm, xi, _loglik(s, c)


def _loglik(s: Stack, c: np.ndarray) -> np.ndarray:
    """Log-likelihood per fit from the forward pass's scales: the log of products of 32 scales at
    a time (each scale is at least 1e-6, the clipped rates), summed (a log per position cost as
    much as the rest of the forward-backward)."""
    per = sum(np.log(np.prod(c[i:i + 32], axis=0)) for i in range(0, len(c), 32))
    return np.bincount(s.fit, np.zeros(len(s.fit)) + per, s.fits)


def em(s: Stack, by_depth: bool, iterations: int, start: Fits) -> tuple[Fits, np.ndarray]:
    """EM of every fit of the stack from ``start``; ``by_depth``: a match rate per state and depth,
    else one per state. Each fit stops when its log-likelihood gains less than 1e-8 of itself.
    Returns ((pi, a, e) [F, ...], log-likelihood per fit)."""
    pi, a, e = (np.array(v, dtype=float) for v in start)
    kmax = s.kmax
    count = np.bincount(s.fit, minlength=s.fits)
    last = np.full(s.fits, -np.inf)
    live = np.ones(s.fits, dtype=bool)
    sub: Stack | None = None
    for _ in range(iterations):
        if not live.any():
            break
        if sub is None or sub.fits != int(live.sum()):
            sub = s.only(live)
        n = sub.fits
        g0, g1, xi, ll = posterior(sub, (pi[live], a[live], e[live]))
        known, hit = sub.seen
        cell = sub.cell.reshape(-1)
        h1, w = (np.stack([np.bincount(cell, (g * m).reshape(-1), n * kmax).reshape(n, kmax)
                           for g in (g0, g1)], axis=1) for m in (hit, known))
        if not by_depth:
            h1, w = h1.sum(axis=2, keepdims=True), w.sum(axis=2, keepdims=True)
        pi[live] = np.stack([np.bincount(sub.fit, g[0], n) for g in (g0, g1)], axis=1) / count[live][:, None]
        a[live] = xi / xi.sum(axis=2, keepdims=True)
        rate = np.where(w > 0, h1 / np.maximum(w, 1e-12), e[live])
        e[live] = np.clip(rate, 1e-6, 1 - 1e-6) * np.ones((2, kmax))
        done = ll - last[live] < 1e-8 * np.abs(ll)
        last[live] = ll
        live[np.flatnonzero(live)[done]] = False
    b0, b1 = _emissions(s, e)
    return (pi, a, e), _loglik(s, _forward(b0, b1, pi[s.fit], a[s.fit])[2])


def select(s: Stack, iterations: int, one: Fits, by: Fits | None) -> tuple[Fits, Fits, Fits]:
    """(chosen chains, the one-rate fits, the per-depth fits) of every fit of the stack: EM of one
    rate per state from ``one``, of a rate per state and depth from ``by`` (None: from the one-rate
    fit), the latter kept where AIC prefers it: 2 (kmax - 1) more rates (an EAGLE/MTP head drafts
    deeper positions from its own hidden states; vLLM's synthetic acceptance fixes a rate per
    depth). Not BIC: with rates that fall by depth, its log(n) penalty kept one rate per state in 8
    of 12 simulated synthetic runs of 640 requests x 32 tokens (fitted on 256 of them), AL(1) -0.63 %
    and AL(4) +0.88 % on average; AIC: -0.11 % and +0.07 % (docs/lab/synthetic-truth.md). Two
    states that fit alike are independent acceptance; rates 0 and 1 are a Markov-1 chain on the
    match itself."""
    fit1, ll = em(s, False, iterations, one)
    fitd, lld = em(s, True, iterations, by if by is not None else fit1)
    pick = lld - ll > 2 * (s.kmax - 1)
    chosen = tuple(np.where(pick.reshape((-1,) + (1,) * (u.ndim - 1)), d, u) for u, d in zip(fit1, fitd))
    return (chosen[0], chosen[1], chosen[2]), fit1, fitd


def match_probabilities(s: Stack, chain: Chain, u: np.ndarray) -> np.ndarray:
    """``m[t, j - 1, i * r + req]``: the probability that a draft at depth ``j`` matches at position
    ``t`` given a state path per request drawn from the chain's posterior with the uniforms
    ``u[i, t' , req]`` (draw ``i``; position ``t`` uses ``u[i, T - 1 - t]``, drawn backward from the
    filtered states) and what was observed there. ``s``: one fit. Given the path, positions are
    independent: a draft at depth j matches when the position's uniform is below the state's rate
    ``e_j``, so an unknown position matches with ``e_j``, one seen matched at depth d with
    ``min(e_j, e_d) / e_d`` and one seen rejected with ``max(e_j - e_d, 0) / (1 - e_d)``. (The path is
    drawn; the position's uniform is not, its expectation is taken: the same mean, less noise.) With
    one rate per state a known position is the same at every depth."""
    pi, a, e = chain
    r = s.x.shape[1]
    b0, b1 = _emissions(s, e[None])
    al0, al1, _ = _forward(b0, b1, np.broadcast_to(pi, (r, 2)), np.broadcast_to(a, (r, 2, 2)))
    t, draws = al0.shape[0], len(u)
    state = np.empty((draws, t, r), dtype=np.intp)
    p0 = np.broadcast_to(al0[-1], (draws, r))
    for k in range(t - 1, -1, -1):
        if k < t - 1:
            nxt = state[:, k + 1]
            w0 = al0[k] * a[0][nxt]
            p0 = w0 / (w0 + al1[k] * a[1][nxt])
        state[:, k] = u[:, t - 1 - k] > p0
    e32 = np.where(e >= 1 - 1e-6, 1.0, np.where(e <= 1e-6, 0.0, e)).astype(np.float32)  # clipped: exact 0, 1
    kmax = e.shape[1]
    m = np.ascontiguousarray(e32[state].transpose(1, 3, 0, 2))  # [draw, t, r, depth] -> [t, depth, draw, r]
    obs = e32.reshape(-1)[state * kmax + s.d1[None]].transpose(1, 0, 2)[:, None]  # [t, 1, draw, r]
    x = s.x[:, None, None, :]
    m = np.where(x == 1, _given_match(m, obs), np.where(x == 0, _given_reject(m, obs), m))
    return m.reshape(t, kmax, draws * r)


def _given_match(rate: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """P(u < rate | u < obs) for a uniform u (obs 0: u is 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(obs > 0, np.minimum(rate, obs) / np.maximum(obs, 1e-30), rate > 0)


def _given_reject(rate: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """P(u < rate | u >= obs) for a uniform u (obs 1: u is 1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(obs < 1, np.maximum(rate - obs, 0) / np.maximum(1 - obs, 1e-30), 0)
