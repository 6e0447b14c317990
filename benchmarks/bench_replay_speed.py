"""CPU of the paired design's replay, vectorized, against the pure-Python loops it replaced.

The replay (:func:`dsdprof.measure.vllm.replay.replay_acceptance`) and the loops it had until
2026-12-06 (``tests/measure/replay_reference.py``: one fit at a time, a Python step per position)
on the same simulated paired runs (:mod:`tests.replay_sets`, ``long-depth``: stretches, rates
falling by depth), alternated in one process: CPU seconds of each, their ratio, and the largest
relative difference of the ALs (0 when the arithmetic is the same). Groups: the tests' size
(16 waves x BS 8 x 300 tokens, K 0-4, jackknife over 16 blocks), a BS-64 group (10 waves x 256
tokens, jackknife over 10 blocks) and a BS-256 group (25 waves x 256 tokens, K 0-7, no jackknife).

    python benchmarks/bench_replay_speed.py [--groups tests,bs64,bs256] [--repeats 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

from dsdprof.measure.vllm.replay import replay_acceptance  # noqa: E402
from tests.measure import replay_reference  # noqa: E402
from tests.replay_sets import CASES, paired_run  # noqa: E402

GROUPS = {  # name: (waves, batch size, tokens, Ks, jackknife)
    "tests": (16, 8, 300, (0, 1, 2, 3, 4), True),
    "bs64": (10, 64, 256, (0, 1, 2, 3, 4), True),
    "bs256": (25, 256, 256, tuple(range(8)), False),
}


def _cpu(fn, *args, **kw):
    t0 = time.process_time()
    out = fn(*args, **kw)
    return time.process_time() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", default=",".join(GROUPS))
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    case = {c.name: c for c in CASES}["long-depth"]
    print(f"{'group':<6} {'requests':>8} {'loops CPU-s':>11} {'vectorized':>10} {'ratio':>6} "
          f"{'max rel AL diff':>15}")
    for name in args.groups.split(","):
        waves, bs, length, ks, jk = GROUPS[name]
        for rep in range(args.repeats):
            run = paired_run(case, rep, waves, bs, length, ks)
            block = {w: w for w in range(waves)}
            old_s, old = _cpu(replay_reference.replay_acceptance, run.reqs, ks, block, jackknife=jk)
            new_s, new = _cpu(replay_acceptance, run.reqs, ks, block, jackknife=jk)
            diff = max(abs(new.by_block[k][b] / old.by_block[k][b] - 1) for k in ks for b in old.by_block[k])
            diff = max(diff, max(abs(new.acceptance_length[k] / old.acceptance_length[k] - 1) for k in ks))
            print(f"{name:<6} {waves * bs:>8} {old_s:>11.1f} {new_s:>10.1f} {old_s / new_s:>5.1f}x "
                  f"{diff:>15.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
