"""Do analyze's 90 % intervals cover the truth, and how often is a batch size decided wrongly?

Synthetic paired-design sweeps with a known truth (:mod:`tests.coverage_sets`: every K of a batch
size inside the same waves, timed on its pure steps, acceptance pooled by draft position as v6
rows are), one scenario per noise structure:

* ``drift``: 5 % per-wave drift shared by every K of the wave, 4 % independent step noise;
* ``ar1``: 5 % step noise with lag-1 correlation 0.6 within a wave (3 % drift);
* ``outliers``: 1 % of steps 3x slow (3 % step noise, 3 % drift);
* ``all``: the three at once, 2 repeats x 10 waves.

Per scenario: the share of ratio-to-best intervals (every batch size, every K) and of margin
intervals (chosen K vs runner-up) that hold the truth, the median half-width, the share of batch
sizes decided, and the wrong decisions (decided, K not the truth's): the largest share of datasets
in which one batch size was decided wrongly, and the share with any batch size wrong.

    python benchmarks/bench_coverage.py [--datasets 200] [--scenarios drift,ar1]
    PYTHONPATH=/tmp/old python benchmarks/bench_coverage.py   # another dsdprof (e.g. git archive HEAD~1)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tests.coverage_sets import BATCH_SIZES, BOUNDARY_BATCH_SIZES, KS, SCENARIOS, dataset, score, truth_goodput, truth_k  # noqa: E402


def run(scenario, datasets: int, seed0: int = 0, batch_sizes=BATCH_SIZES, acceptance: str = "auto") -> dict:
    from dsdprof.decide.analysis import analyze

    goodput = truth_goodput(scenario, batch_sizes, KS)
    tot = {"covered": 0, "intervals": 0, "margin_covered": 0, "margins": 0, "decided": 0, "batch_sizes": 0}
    wrong_by_bs = {b: 0 for b in batch_sizes}
    any_wrong, widths = 0, []
    for i in range(datasets):
        res = analyze(dataset(scenario, seed0 + i, batch_sizes, KS), acceptance=acceptance)
        s = score(res, goodput)
        for key in tot:
            tot[key] += s[key]
        for b in s["wrong_bs"]:
            wrong_by_bs[b] += 1
        any_wrong += bool(s["wrong_bs"])
        c = res.cells
        widths.extend(((c.ratio_high - c.ratio_low) / 2)[c.ratio_to_best < 1.0].dropna().tolist())
    worst = max(wrong_by_bs, key=lambda b: wrong_by_bs[b])
    return {"coverage": tot["covered"] / tot["intervals"], "margin_coverage": tot["margin_covered"] / max(1, tot["margins"]),
            "half_width": float(np.median(widths)) if widths else float("nan"),
            "decided": tot["decided"] / tot["batch_sizes"], "worst_bs": worst,
            "wrong_worst_bs": wrong_by_bs[worst] / datasets, "wrong_any": any_wrong / datasets, "datasets": datasets}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--acceptance", default="auto")
    ap.add_argument("--batch-sizes", default="grid,boundary",
                    help="grid (1-256, powers of 2) and/or boundary (a K within 0.5 %% of the tolerance)")
    args = ap.parse_args(argv)
    import dsdprof

    print(f"dsdprof from {Path(dsdprof.__file__).parent}; {args.datasets} datasets per scenario")
    for which in args.batch_sizes.split(","):
        bs = {"grid": BATCH_SIZES, "boundary": BOUNDARY_BATCH_SIZES}[which]
        print(f"{which}: truth K* " + " ".join(f"{b}:{k}" for b, k in truth_k(truth_goodput(SCENARIOS[0], bs)).items()))
        print(f"{'scenario':<9} {'ratio cov':>9} {'margin cov':>10} {'half-w':>7} {'decided':>7} "
              f"{'wrong/BS':>12} {'any wrong':>9} {'s':>5}")
        for sc in SCENARIOS:
            if sc.name not in args.scenarios.split(","):
                continue
            t0 = time.perf_counter()
            r = run(sc, args.datasets, args.seed, bs, acceptance=args.acceptance)
            print(f"{sc.name:<9} {r['coverage']:>9.1%} {r['margin_coverage']:>10.1%} {r['half_width']:>7.2%} "
                  f"{r['decided']:>7.0%} {r['wrong_worst_bs']:>6.1%} BS{r['worst_bs']:<3} {r['wrong_any']:>9.1%} "
                  f"{time.perf_counter() - t0:>5.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
