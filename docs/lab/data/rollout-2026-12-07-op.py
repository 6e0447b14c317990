"""A pair of the 2026-12-07 rollouts (O and P by default; docs/lab/rollout-2026-12-06.md, "Six repeats
per run", "Q and R", "S and T"): each run's
repeat spread (`report.rollout.repeat_spread`, the measure the report gates on) with its 90 %
interval (chi-square, its degrees of freedom), per variant, vanilla alone, and what is left after
each repeat's common effect (a two-way fit of log makespan, variant + repeat; shown, not gated on);
then both directions replayed from the other as `dsdprof replay RUN TABLE --fit OTHER --runs 200`.

    python docs/lab/data/rollout-2026-12-07-op.py             # O and P, from the repository root, ~1 min
    python docs/lab/data/rollout-2026-12-07-op.py qr 139f952  # Q and R (or st): the runs, the table's commit
"""

import itertools
import json
import subprocess
import sys

import numpy as np
import pandas as pd
from scipy.stats import chi2

from dsdprof.report.rollout import fit_step_model, repeat_spread, replay_check, replay_summary

D = "docs/lab/data/rollout-2026-12-07-"
PAIR, COMMIT = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("op", "a3c7768")
# the table the runs used: tables/toy-dense-cpu.json of that commit (O, P: a3c7768, K 4 / 3 / 1 at
# BS 1-5 / 6-11 / 12+; Q-T: 139f952, K 4 / 3 at BS 1-11 / 12+)
T = json.loads(subprocess.run(["git", "show", f"{COMMIT}:tables/toy-dense-cpu.json"], check=True,
                              capture_output=True, text=True).stdout)
runs = {x.upper(): pd.read_parquet(f"{D}{x}.parquet") for x in PAIR}
for n, d in runs.items():
    ro = d[(d.kind == "rollout") & (d.status == "ok")]
    t = np.log(ro.pivot_table(index="variant", columns="repeat", values="makespan_s"))
    res = t.sub(t.mean(axis=1), axis=0).sub(t.mean(axis=0), axis=1) + t.to_numpy().mean()
    dof = (t.shape[0] - 1) * (t.shape[1] - 1)
    rep = np.exp(t.mean(axis=0) - t.to_numpy().mean()) - 1
    sp = repeat_spread(d)
    lo, hi = (sp.sd * np.sqrt(sp.dof / chi2.ppf(q, sp.dof)) for q in (0.95, 0.05))
    print(f"{n}: {len(ro)} ok rollouts; spread {sp.sd:.2%} (dof {sp.dof}, 90 % interval {lo:.1%}-{hi:.1%}); "
          "per variant " + ", ".join(f"{v} {s:.1%}" for v, s in t.std(axis=1, ddof=1).items())
          + f"; repeat effects {' '.join(f'{x:+.1%}' for x in rep)}; two-way residual "
          f"{np.sqrt((res.to_numpy() ** 2).sum() / dof):.1%} (dof {dof})")
models = {n: fit_step_model(d, T) for n, d in runs.items()}
held = total = 0
for x, y in itertools.permutations(runs, 2):
    chk = replay_check(runs[x], T, 200, model=models[y], fit_spread=repeat_spread(runs[y]))
    s = replay_summary(chk.rows, chk.band_half, chk.band_on)
    held, total = held + int(s["in_band"].sum()), total + len(s)
    print(f"{x} <- {y}: band on {chk.band_on}, half {chk.band_half:.3f}, "
          f"vanilla fit {chk.vanilla_fit_err:+.1%}, holds {int(s['in_band'].sum())}/{len(s)}; fit % "
          + " ".join(f"{e * 100:+.1f}" for e in s["fit_err"])
          + "; fitcal % " + " ".join(f"{e * 100:+.1f}" for e in s["fitcal_err"])
          + "; band % " + " ".join(f"{(lo_ / m - 1) * 100:+.0f}/{(hi_ / m - 1) * 100:+.0f}"
                                   for lo_, hi_, m in zip(s["band_lo_s"], s["band_hi_s"], s["measured_s"])))
print(f"band holds {held}/{total} (variants: {', '.join(s['variant'])})")
