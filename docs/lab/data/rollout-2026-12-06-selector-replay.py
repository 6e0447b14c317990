"""Open-loop replay of the adaptive plugin's selector on a recorded rollout run (issue 48 part 2).

Feeds a fresh AdaptiveKSelector, on the table the run served, every pure decode step the adaptive
engine recorded (rows in time order: batch size, K drafted, seconds), with acceptance counts drawn
at the profile (the engine log's live acceptance was within 2 % of it), and prints after each row
the K per profiled batch size and the selector's step-time estimates at batch size 1.

    python docs/lab/data/rollout-2026-12-06-selector-replay.py \
        docs/lab/data/rollout-2026-12-06-a.parquet tables/toy-dense-cpu.json
"""

import json
import random
import sys

import pandas as pd

from dsdprof.serve.adaptive import AdaptiveKSelector

ACCEPT = [0.88, 0.77, 0.66, 0.59]  # P(>= j accepted), the engine log's live estimate


def main(rows: str, table_path: str) -> None:
    sel = AdaptiveKSelector(json.load(open(table_path)), max_k=4)
    rng = random.Random(0)
    d = pd.read_parquet(rows)
    d = d[(d["variant"] == "adaptive") & (d["status"] == "ok")].sort_values("created_at")
    for _, r in d.iterrows():
        t = [0.0, *r["step_t_s"]]
        for i, (dec, bs, k, pre) in enumerate(zip(r["step_decoding"], r["step_batch_size"],
                                                  r["step_drafted"], r["step_prefill_tokens"])):
            kk = int(round(k))
            pure = pre == 0 and dec == bs and dec > 0 and abs(k - kk) < 1e-6
            sel.observe_step(int(bs), kk if pure else None, t[i + 1] - t[i] if pure else None)
            if kk > 0 and dec > 0:
                alive, accepted, prev = int(dec), [], 1.0
                for p in ACCEPT[:kk]:
                    alive = sum(1 for _ in range(alive) if rng.random() < p / prev)
                    accepted.append(alive)
                    prev = p
                sel.observe(int(dec), accepted, None, int(dec))
        est = {k: round(sel.step_time(1, k) * 1000) for k in range(5)}
        print(r["created_at"][11:19], r["kind"], f"{r['rate_per_s']:g}", "K", sel.ks, "BS-1 ms", est)


if __name__ == "__main__":
    main(*sys.argv[1:3])
