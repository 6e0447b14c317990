"""What ``dsdprof sweep --budget`` (small paired groups, a batch size stopped once settled) costs in
decisions against one fixed group of more waves, on fake machines with a known truth.

The fake machine is :mod:`tests.coverage_sets` (paired rows built step by step; the truth's K* per
batch size, 2 % tolerance). Two ways to spend ``cap`` = ``plain_waves`` x (batch sizes) group waves:

* **plain**: one paired group of ``plain_waves`` waves per batch size (``dsdprof sweep`` at
  ``--waves plain_waves``), analysed once;
* **budget**: groups of ``group_waves`` waves; after each pass ``analyze`` and the budget's status
  rule (:func:`dsdprof.jobs.budget_plan.batch_status`, min repeats 1 as in the paired design)
  freeze every settled batch size; the open ones get one more group while the cap allows (a group
  that does not fit ends the run, as the ledger does).

Per scenario over ``--datasets`` seeds: group waves spent (and vanilla's), the share of batch sizes
decided, wrong decisions (decided, not the truth's K), the mean and worst regret of the chosen K
against the truth's best goodput, the median ratio half-width. Vanilla has at least 2 waves a group
(as the sweep since a89b621). No engine; pinned to a core it takes minutes.

    taskset -c 1 nice -n 15 python benchmarks/bench_budget_coverage.py --datasets 40
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.append(str(Path(__file__).resolve().parents[1]))

import tests.coverage_sets as cs  # noqa: E402

cs.vanilla_waves = lambda sc, ks: max(2, math.ceil(sc.waves / len(ks)))  # the sweep's rule (a89b621)

SCENARIOS = {s.name: s for s in (*cs.SCENARIOS, *cs.VARIATIONS, *cs.GPU_LIKE)}


def _score(frame: pd.DataFrame, goodput: dict[int, dict[int, float]]) -> dict[str, float]:
    from dsdprof.decide.analysis import analyze

    res = analyze(frame, acceptance="auto")
    want = cs.truth_k(goodput)
    regrets, wrong, decided = [], 0, 0
    for o in res.optimal.itertuples():
        g = goodput[int(o.batch_size)]
        regrets.append(1.0 - g[int(o.k)] / max(g.values()))
        if o.decided:
            decided += 1
            wrong += int(o.k) != want[int(o.batch_size)]
    c = res.cells
    widths = ((c.ratio_high - c.ratio_low) / 2)[c.ratio_to_best < 1.0].dropna().tolist()
    return {"decided": decided, "wrong": wrong, "regret_mean": float(np.mean(regrets)),
            "regret_max": float(np.max(regrets)),
            "half_width": float(np.median(widths)) if widths else math.nan}


def budget_run(sc: cs.Scenario, seed: int, bss: tuple[int, ...], group_waves: int, cap: int,
               goodput: dict[int, dict[int, float]]) -> dict[str, float]:
    from dsdprof.decide.analysis import analyze
    from dsdprof.jobs.budget_plan import SETTLED, batch_status

    max_groups = cap // group_waves
    full = cs.dataset(replace(sc, waves=group_waves, repeats=max_groups), seed, bss, cs.KS)
    upto = {b: 0 for b in bss}  # the last repeat each batch size has run
    spent = group_waves * len(bss)  # pass 0: every batch size once
    while True:
        frame = full[[int(r) <= upto[int(b)] for b, r in zip(full["batch_size"], full["repeat"])]]
        opt = analyze(frame, acceptance="auto").optimal
        open_bs = [int(o["batch_size"]) for _, o in opt.iterrows()
                   if batch_status(o, 0.02, lambda k, b=int(o["batch_size"]): upto[b] + 1, 1) not in SETTLED]
        ran = False
        for b in open_bs:
            if spent + group_waves > cap or upto[b] + 1 >= max_groups:
                break
            upto[b] += 1
            spent += group_waves
            ran = True
        if not ran or spent + group_waves > cap:
            frame = full[[int(r) <= upto[int(b)] for b, r in zip(full["batch_size"], full["repeat"])]]
            break
    out = _score(frame, goodput)
    groups = sum(upto[b] + 1 for b in bss)
    out.update(waves=spent, vanilla_waves=groups * cs.vanilla_waves(replace(sc, waves=group_waves), cs.KS))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", type=int, default=40)
    ap.add_argument("--scenarios", default="all,drift,gpu5")
    ap.add_argument("--plain-waves", type=int, default=4)
    ap.add_argument("--group-waves", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    bss = cs.BATCH_SIZES
    cap = a.plain_waves * len(bss)
    print(f"fake machine: BS {bss[0]}-{bss[-1]} ({len(bss)}) x K {cs.KS[0]}-{cs.KS[-1]}, "
          f"{a.datasets} datasets; "
          f"plain {a.plain_waves} waves a BS vs --budget {cap}w in groups of {a.group_waves}")
    print(f"{'scenario':9s} {'method':7s} {'waves':>6s} {'van.w':>6s} {'decided':>8s} {'wrong':>6s} "
          f"{'regret mean':>11s} {'max':>6s} {'half-w':>7s}")
    for name in a.scenarios.split(","):
        sc = SCENARIOS[name]
        goodput = cs.truth_goodput(sc, bss, cs.KS)
        t0 = time.time()
        rows: dict[str, list[dict[str, float]]] = {"plain": [], "budget": []}
        for i in range(a.datasets):
            plain = replace(sc, waves=a.plain_waves, repeats=1)
            s = _score(cs.dataset(plain, a.seed + i, bss, cs.KS), goodput)
            s.update(waves=cap, vanilla_waves=len(bss) * cs.vanilla_waves(plain, cs.KS))
            rows["plain"].append(s)
            rows["budget"].append(budget_run(sc, a.seed + i, bss, a.group_waves, cap, goodput))
        for method, rs in rows.items():
            n_bs = len(bss) * len(rs)
            print(f"{name:9s} {method:7s} {np.mean([r['waves'] for r in rs]):6.1f} "
                  f"{np.mean([r['vanilla_waves'] for r in rs]):6.1f} "
                  f"{sum(r['decided'] for r in rs) / n_bs * 100:7.1f}% {sum(r['wrong'] for r in rs):6d} "
                  f"{np.mean([r['regret_mean'] for r in rs]) * 100:10.2f}% "
                  f"{np.max([r['regret_max'] for r in rs]) * 100:5.1f}% "
                  f"{np.nanmedian([r['half_width'] for r in rs]):7.3f}")
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
