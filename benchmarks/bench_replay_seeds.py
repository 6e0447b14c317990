"""Is the paired design's replayed AL unbiased across seeds, and how wide is its error?

Simulated paired runs with correlated acceptance held out from the replay's model
(:mod:`tests.replay_sets`: a three-state hidden chain along each request's positions, lag-1 of a
fixed K=4 server's accepted drafts 0 to ~0.45, one rate at every depth or rates falling by depth):
per case and seed, AL(K) replayed from the mixed-K run (:func:`dsdprof.measure.vllm.replay.
replay_acceptance`, point only) against a server held at K over the same requests. Per case and K:
the mean error, its standard error over the seeds, the 95th percentile of |error| and the largest,
how often the per-depth model was chosen, and the mean correlation over seeds of the errors at two
Ks (a run's Ks share its requests: their errors move together).

With ``--oracle`` the same per case for the *oracle*: the replay given the simulation's own
three-state chain (its rates and switch probability, nothing fitted; 16 state paths per request
drawn from its posterior), the best the data allow, and for the fitted replay minus the oracle on
the same seeds (the fit's own error, most of the seeds' shared noise taken out).

    python benchmarks/bench_replay_seeds.py [--seeds 20] [--cases iid,sticky-depth] [--waves 16]
        [--batch-size 8] [--length 300] [--fit-rows 0] [--oracle]   # fit-rows 0: every request
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))

from dsdprof.measure.vllm.replay import replay_ks  # noqa: E402
from dsdprof.measure.vllm.replay_chain import _given_match, _given_reject  # noqa: E402
from tests.replay_sets import CASES, KS, SYNTHETIC, Case, paired_run, replay_errors  # noqa: E402


def _paths(x: np.ndarray, depth: np.ndarray, chain: tuple, rng: np.random.Generator, n: int) -> list:
    """``n`` imputations (time-major match probabilities, as the replay's) given state paths drawn
    from the posterior of an S-state chain (pi [S], a [S, S], e [S, depth])."""
    pi, a, e = chain
    r, t = x.shape
    d1 = np.clip(depth, 1, e.shape[1]) - 1
    rate = e[:, d1]
    b = np.where(x == 1, rate, np.where(x == 0, 1 - rate, 1.0))  # [S, r, t]
    al = np.empty((t, r, len(pi)))
    f = pi[None] * b[:, :, 0].T
    for s in range(t):
        if s:
            f = (al[s - 1] @ a) * b[:, :, s].T
        al[s] = f / f.sum(1, keepdims=True)
    out = []
    e32 = e.astype(np.float32)
    for _ in range(n):
        state = np.empty((t, r), dtype=int)
        p = al[-1]
        for s in range(t - 1, -1, -1):
            if s < t - 1:
                p = al[s] * a[:, state[s + 1]].T
                p = p / p.sum(1, keepdims=True)
            state[s] = (rng.random(r)[:, None] > np.cumsum(p, 1)[:, :-1]).sum(1)
        m, obs = e32[state.T], e32[state.T, d1][..., None]
        seen = (x == 1)[..., None], (x == 0)[..., None]
        m = np.where(seen[0], _given_match(m, obs), np.where(seen[1], _given_reject(m, obs), m))
        out.append(np.ascontiguousarray(m.transpose(1, 2, 0)))
    return out


def oracle_errors(case: Case, seeds, waves: int, batch_size: int, length: int, paths: int = 16) -> np.ndarray:
    """Errors [seed, K 1..4] of the replay given the simulation's own chain (nothing fitted)."""
    kmax = max(KS)
    if case.depth_rates:
        chain = (np.ones(1), np.ones((1, 1)), np.array([case.depth_rates[:kmax]]))
    else:
        a = np.full((3, 3), (1 - case.stay) / 2)
        np.fill_diagonal(a, case.stay)
        e = np.array([[r * case.decay ** j for j in range(kmax)] for r in case.rates])
        chain = (np.full(3, 1 / 3), a, e)
    errs = []
    for seed in seeds:
        run = paired_run(case, seed, waves, batch_size, length)
        width = max(max(len(r.x), r.length) for r in run.reqs) + kmax + 1
        x = np.full((len(run.reqs), width), -1, dtype=np.int8)
        depth = np.zeros_like(x)
        for i, r in enumerate(run.reqs):
            x[i, :len(r.x)], depth[i, :len(r.x)] = r.x, r.depth
        lengths = np.array([r.length for r in run.reqs], dtype=float)
        tok, stp = np.zeros(kmax), np.zeros(kmax)
        for m in _paths(x, depth, chain, np.random.default_rng(seed), paths):
            tk, sk = replay_ks(m, lengths, KS[1:])
            tok, stp = tok + tk.sum(1), stp + sk.sum(1)
        errs.append([tok[i] / stp[i] / run.truth[k] - 1 for i, k in enumerate(KS[1:])])
    return np.array(errs)


def _stats(e: np.ndarray) -> dict:
    return {"mean": e.mean(0), "se": e.std(0, ddof=1) / np.sqrt(len(e)),
            "p95": np.quantile(abs(e), 0.95, axis=0), "max": abs(e).max(0), "n": len(e),
            "corr": float(np.mean(np.corrcoef(e.T)[np.triu_indices(e.shape[1], 1)]))}


def run_case(case, seeds: range, waves: int, batch_size: int, length: int, fit_rows: int,
             oracle: bool = False) -> dict:
    e, lags, by_depth = replay_errors(case, seeds, waves, batch_size, length, fit_rows or None)
    out = {"": _stats(e) | {"lag1": float(np.mean(lags)), "by_depth": by_depth}}
    if oracle:
        o = oracle_errors(case, seeds, waves, batch_size, length)
        out["oracle"] = _stats(o) | {"lag1": out[""]["lag1"], "by_depth": 0}
        out["fit-orc"] = _stats(e - o) | {"lag1": out[""]["lag1"], "by_depth": by_depth}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--cases", default=",".join(c.name for c in CASES))
    ap.add_argument("--waves", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--length", type=int, default=300)
    ap.add_argument("--fit-rows", type=int, default=0, help="fit the chain on at most this many requests")
    ap.add_argument("--oracle", action="store_true", help="also the replay given the truth's chain")
    args = ap.parse_args(argv)
    by_name = {c.name: c for c in (*CASES, SYNTHETIC)}
    fit = f"at most {args.fit_rows} requests" if args.fit_rows else "every request"
    print(f"{args.waves} waves x BS {args.batch_size} x {args.length} tokens, seeds {args.seed}-"
          f"{args.seed + args.seeds - 1}, chain fitted on {fit}")
    print(f"{'case':<13} {'lag1':>5} {'K':>2} {'mean':>7} {'se':>6} {'p95|e|':>7} {'max':>6} "
          f"{'depth':>5} {'corr':>4} {'s':>4}")
    for name in args.cases.split(","):
        t0 = time.perf_counter()
        rows = run_case(by_name[name], range(args.seed, args.seed + args.seeds), args.waves, args.batch_size,
                        args.length, args.fit_rows, args.oracle)
        for what, r in rows.items():
            first = {"name": f"{name} {what}".strip(), "lag": f"{r['lag1']:.2f}",
                     "depth": f"{r['by_depth']}/{r['n']}", "corr": f"{r['corr']:.2f}",
                     "s": f"{time.perf_counter() - t0:.0f}"}
            for i, k in enumerate(KS[1:]):
                c = first if i == 0 else dict.fromkeys(first, "")
                print(f"{c['name']:<13} {c['lag']:>5} {k:>2} {r['mean'][i]:>+7.3%} {r['se'][i]:>6.3%} "
                      f"{r['p95'][i]:>7.3%} {r['max'][i]:>6.3%} {c['depth']:>5} {c['corr']:>4} {c['s']:>4}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
