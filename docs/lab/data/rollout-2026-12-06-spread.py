"""Why a rollout run's repeats spread: every rollout of each run in time order, split into prefill
(t = 0 to the end of the prefill step) and decode, and the run's pooled repeat spread
(``report.rollout.repeat_spread``) with all rollouts, without the run's first rollout, and without
repeat 0. Usage: python docs/lab/data/rollout-2026-12-06-spread.py RUN.parquet ..."""

import sys

import numpy as np
import pandas as pd

from dsdprof.report.rollout import repeat_spread


def parts(r) -> tuple[float, float, int, float]:
    t, pf = np.asarray(r.step_t_s), np.asarray(r.step_prefill_tokens)
    i = int(np.nonzero(pf > 0)[0].max())
    dt = np.diff(t)[i:]
    return float(t[i]), float(r.makespan_s - t[i]), len(dt), float(np.median(dt))


for path in sys.argv[1:]:
    d = pd.read_parquet(path)
    ro = d[(d.kind == "rollout") & (d.status == "ok")].sort_values("created_at")
    print(f"== {path}")
    for _, r in ro.iterrows():
        pre, dec, n, med = parts(r)
        print(f"  {r.created_at[11:19]} r{r['repeat']} {r.variant:9s} makespan {r.makespan_s:5.2f}  "
              f"prefill {pre:5.2f}  decode {dec:4.2f} ({n:2d} steps, median {med * 1e3:3.0f} ms)")
    pct = [repeat_spread(x).sd * 100 for x in (d, d.drop(index=ro.index[0]), d[d["repeat"] != 0])]
    print("  spread %: all {:.1f}, without the first rollout {:.1f}, without repeat 0 {:.1f}".format(*pct))
