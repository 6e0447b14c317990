"""Is the paired design's replayed AL unbiased across seeds, and how wide is its error?

Simulated paired runs with correlated acceptance held out from the replay's model
(:mod:`tests.replay_sets`: a three-state hidden chain along each request's positions, lag-1 of a
fixed K=4 server's accepted drafts 0 to ~0.45, one rate at every depth or rates falling by depth):
per case and seed, AL(K) replayed from the mixed-K run (:func:`dsdprof.measure.vllm.replay.
replay_acceptance`, point only) against a server held at K over the same requests. Per case and K:
the mean error, its standard error over the seeds, the 95th percentile of |error| and the largest,
how often the per-depth model was chosen, and the mean correlation over seeds of the errors at two
Ks (a run's Ks share its requests: their errors move together).

    python benchmarks/bench_replay_seeds.py [--seeds 20] [--cases iid,sticky-depth] [--waves 16]
        [--batch-size 8] [--length 300] [--fit-rows 0]   # 0: every request (the default)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tests.replay_sets import CASES, KS, replay_errors  # noqa: E402


def run_case(case, seeds: range, waves: int, batch_size: int, length: int, fit_rows: int) -> dict:
    e, lags, by_depth = replay_errors(case, seeds, waves, batch_size, length, fit_rows or None)
    return {"mean": e.mean(0), "se": e.std(0, ddof=1) / np.sqrt(len(e)),
            "p95": np.quantile(abs(e), 0.95, axis=0), "max": abs(e).max(0),
            "lag1": float(np.mean(lags)), "by_depth": by_depth, "n": len(e),
            "corr": float(np.mean(np.corrcoef(e.T)[np.triu_indices(e.shape[1], 1)]))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--cases", default=",".join(c.name for c in CASES))
    ap.add_argument("--waves", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--length", type=int, default=300)
    ap.add_argument("--fit-rows", type=int, default=0, help="fit the chain on at most this many requests")
    args = ap.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    fit = f"at most {args.fit_rows} requests" if args.fit_rows else "every request"
    print(f"{args.waves} waves x BS {args.batch_size} x {args.length} tokens, seeds {args.seed}-"
          f"{args.seed + args.seeds - 1}, chain fitted on {fit}")
    print(f"{'case':<13} {'lag1':>5} {'K':>2} {'mean':>7} {'se':>6} {'p95|e|':>7} {'max':>6} "
          f"{'depth':>5} {'corr':>4} {'s':>4}")
    for name in args.cases.split(","):
        t0 = time.perf_counter()
        r = run_case(by_name[name], range(args.seed, args.seed + args.seeds), args.waves, args.batch_size,
                     args.length, args.fit_rows)
        first = {"name": name, "lag": f"{r['lag1']:.2f}", "depth": f"{r['by_depth']}/{r['n']}",
                 "corr": f"{r['corr']:.2f}", "s": f"{time.perf_counter() - t0:.0f}"}
        for i, k in enumerate(KS[1:]):
            c = first if i == 0 else dict.fromkeys(first, "")
            print(f"{c['name']:<13} {c['lag']:>5} {k:>2} {r['mean'][i]:>+7.3%} {r['se'][i]:>6.3%} "
                  f"{r['p95'][i]:>7.3%} {r['max'][i]:>6.3%} {c['depth']:>5} {c['corr']:>4} {c['s']:>4}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
