"""Do analyze's 90 % intervals cover the truth, and how often is a batch size decided wrongly?

Synthetic paired-design sweeps with a known truth (:mod:`tests.coverage_sets`: every K of a batch
size inside the same waves, timed on its pure steps, acceptance pooled by draft position as v6
rows are, a vanilla engine beside the group 6 % faster than K=0), one scenario per noise structure:

* ``drift``: 5 % per-wave drift shared by every K of the wave, 4 % independent step noise;
* ``ar1``: 5 % step noise with lag-1 correlation 0.6 within a wave (3 % drift);
* ``outliers``: 1 % of steps 3x slow (3 % step noise, 3 % drift);
* ``all``: the three at once, 2 repeats x 10 waves;

and held-out variations the method was not tuned on (``--scenarios heavy,t3,...``):
``heavy`` 2 % of steps 5x slow; ``t3`` Student-t(3) step noise; ``driftar`` drift an AR(1)
(0.8) across waves; ``waves10`` / ``waves40`` ``all`` with 10 / 40 waves of one repeat;
``hold4`` ``all`` timed as the sweep times now (hold 4, the first pure step of a hold untimed);
and GPU-like sets (issue 45, ``--scenarios gpu3,gpu5,gpu15,gpuhold4,out56,out56low``): 1-1.5 %
step noise, <= 1 % drift, 0.5 % of steps 3x or 5x slow, waves that are not a whole number of K
cycles (docs/decisions.md).

Per scenario: the share of intervals holding the truth -- ratio to the best (every batch size and
K), margin (chosen K vs runner-up), speedup over vanilla (chosen K), vanilla's gain over the best K
-- the median ratio half-width, the share of batch sizes decided, and the wrong decisions (decided,
K not the truth's): the largest share of datasets in which one batch size was decided wrongly, the
share with any batch size wrong, and vanilla flagged faster than every K where it is not.

    python benchmarks/bench_coverage.py [--datasets 200] [--scenarios drift,ar1] [--seed 1000]
    PYTHONPATH=/tmp/old python benchmarks/bench_coverage.py   # another dsdprof (git archive HEAD~1 dsdprof)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))

from tests.coverage_sets import (  # noqa: E402
    BATCH_SIZES,
    BOUNDARY_BATCH_SIZES,
    GPU_LIKE,
    KS,
    SCENARIOS,
    VARIATIONS,
    dataset,
    score,
    truth_goodput,
    truth_k,
    truth_vanilla,
)

KINDS = ("", "margin_", "speedup_", "vanilla_")


def run(scenario, datasets: int, seed0: int = 0, batch_sizes=BATCH_SIZES, acceptance: str = "auto") -> dict:
    from dsdprof.decide.analysis import analyze

    goodput = truth_goodput(scenario, batch_sizes, KS)
    vanilla = truth_vanilla(scenario, batch_sizes) if scenario.vanilla else None
    tot = {f"{n}{s}": 0 for n in KINDS for s in ("covered", "s")}
    tot.update(covered=0, intervals=0, decided=0, batch_sizes=0)
    wrong_by_bs = {b: 0 for b in batch_sizes}
    any_wrong, vanilla_wrong, widths = 0, 0, []
    for i in range(datasets):
        res = analyze(dataset(scenario, seed0 + i, batch_sizes, KS), acceptance=acceptance)
        s = score(res, goodput, vanilla=vanilla)
        for key in tot:
            tot[key] += s[key]
        for b in s["wrong_bs"]:
            wrong_by_bs[b] += 1
        any_wrong += bool(s["wrong_bs"])
        vanilla_wrong += len(s["vanilla_wrong"])
        c = res.cells
        widths.extend(((c.ratio_high - c.ratio_low) / 2)[c.ratio_to_best < 1.0].dropna().tolist())
    worst = max(wrong_by_bs, key=lambda b: wrong_by_bs[b])
    cov = {n or "ratio_": tot[f"{n}covered"] / max(1, tot[f"{n}s" if n else "intervals"]) for n in KINDS}
    return {"coverage": cov["ratio_"], "margin_coverage": cov["margin_"], "speedup_coverage": cov["speedup_"],
            "vanilla_coverage": cov["vanilla_"] if vanilla else float("nan"),
            "half_width": float(np.median(widths)) if widths else float("nan"),
            "decided": tot["decided"] / tot["batch_sizes"], "worst_bs": worst,
            "wrong_worst_bs": wrong_by_bs[worst] / datasets, "wrong_any": any_wrong / datasets,
            "vanilla_wrong": vanilla_wrong, "datasets": datasets}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS),
                    help="names from " + ", ".join(s.name for s in (*SCENARIOS, *VARIATIONS, *GPU_LIKE)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--acceptance", default="auto")
    ap.add_argument("--batch-sizes", default="grid,boundary",
                    help="grid (1-256, powers of 2) and/or boundary (a K within 0.5 %% of the tolerance)")
    args = ap.parse_args(argv)
    import dsdprof

    by_name = {s.name: s for s in (*SCENARIOS, *VARIATIONS, *GPU_LIKE)}
    print(f"dsdprof from {Path(dsdprof.__file__).parent}; {args.datasets} datasets per scenario, seeds "
          f"{args.seed}-{args.seed + args.datasets - 1}")
    for which in args.batch_sizes.split(","):
        bs = {"grid": BATCH_SIZES, "boundary": BOUNDARY_BATCH_SIZES}[which]
        truth = truth_k(truth_goodput(SCENARIOS[0], bs))
        print(f"{which}: truth K* " + " ".join(f"{b}:{k}" for b, k in truth.items()))
        print(f"{'scenario':<9} {'ratio':>6} {'margin':>6} {'speedup':>7} {'vanilla':>7} {'half-w':>6} "
              f"{'decided':>7} {'wrong/BS':>12} {'any':>5} {'v.wr':>4} {'s':>4}")
        for name in args.scenarios.split(","):
            t0 = time.perf_counter()
            r = run(by_name[name], args.datasets, args.seed, bs, acceptance=args.acceptance)
            print(f"{name:<9} {r['coverage']:>6.1%} {r['margin_coverage']:>6.1%} "
                  f"{r['speedup_coverage']:>7.1%} {r['vanilla_coverage']:>7.1%} {r['half_width']:>6.2%} "
                  f"{r['decided']:>7.0%} {r['wrong_worst_bs']:>6.1%} BS{r['worst_bs']:<3} "
                  f"{r['wrong_any']:>5.1%} {r['vanilla_wrong']:>4} {time.perf_counter() - t0:>4.0f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
