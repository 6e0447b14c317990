"""Replay every ordered pair of the 2026-12-06 rollouts A-G (and the 2026-12-03 pairs) from each
other, as `dsdprof replay RUN TABLE --fit OTHER --runs 150` does, and count where the band holds
the measured mean makespan (docs/lab/rollout-2026-12-06.md, "Evening runs F and G").

    python docs/lab/data/rollout-2026-12-06-pairs.py        # from the repository root, ~10 min
"""

import itertools
import json
import math

import pandas as pd

from dsdprof.report.rollout import fit_step_model, repeat_spread, replay_check, replay_summary

D = "docs/lab/data/"
T1206 = json.loads(open("tests/data/toy-dense-cpu-2026-12-06.json").read())
T1129 = json.loads(open("tests/data/toy-dense-cpu-2026-11-29.json").read())
GROUPS = [
    (T1206, {x: f"{D}rollout-2026-12-06-{x.lower()}.parquet" for x in "ABCDEFG"}, None),
    (T1129, {n: f"{D}rollout-{n}.parquet" for n in ("fit-2026-12-03-0946", "heldout-2026-12-03",
                                                   "fit-2026-12-03-1259", "heldout-2026-12-03-1348",
                                                   "fit-2026-12-03-1614", "heldout-2026-12-03-1619")},
     [(1, 0), (0, 1), (3, 2), (2, 3), (5, 4), (4, 5)]),
]
held = total = good_dirs = dirs = 0
for table, paths, order in GROUPS:
    runs = {n: pd.read_parquet(p) for n, p in paths.items()}
    models = {n: fit_step_model(d, table) for n, d in runs.items()}
    spreads = {n: repeat_spread(d) for n, d in runs.items()}
    names = list(runs)
    pairs = itertools.permutations(names, 2) if order is None else [(names[a], names[b]) for a, b in order]
    for x, y in pairs:
        chk = replay_check(runs[x], table, 150, model=models[y], fit_spread=spreads[y])
        s = replay_summary(chk.rows, chk.band_half, chk.band_on)
        h = int(s["in_band"].sum())
        held, total, dirs = held + h, total + len(s), dirs + 1
        good_dirs += h >= 0.8 * len(s)
        z = [math.log(m / p) / chk.band_half for m, p in zip(s["measured_s"], s[chk.band_on + "_s"])]
        print(f"{x} <- {y}: band on {chk.band_on}, vanilla fit {chk.vanilla_fit_err:+.1%}, "
              f"holds {h}/{len(s)}; "
              "fit % " + " ".join(f"{e * 100:+.0f}" for e in s["fit_err"])
              + "; fitcal % " + " ".join(f"{e * 100:+.0f}" for e in s["fitcal_err"])
              + "; in band units " + " ".join(f"{v:+.2f}" for v in z), flush=True)
print(f"variants held {held}/{total}; directions >= 80 %: {good_dirs}/{dirs}")
