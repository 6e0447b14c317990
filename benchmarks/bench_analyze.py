"""How long ``analyze`` takes with bootstrap intervals (2,000 replicates, hierarchical over waves
and repeats) on a 7 x 6 grid (BS 1..64 x K 0..5, plus vanilla) with 3 repeats x 20 waves per cell.

    python benchmarks/bench_analyze.py [--repeats 3] [--waves 20] [--runs 5]

The rows are synthetic (a closed-form truth plus seeded noise, ``tests/synthetic.py``): this times
the analysis, it measures nothing about speculative decoding.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsdprof.decide.analysis import analyze  # noqa: E402
from tests.synthetic import noisy_rows, truth  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--waves", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    df = noisy_rows(truth("dense"), 0, repeats=args.repeats, waves=args.waves)
    analyze(df)  # warm imports and caches
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        res = analyze(df)
        times.append(time.perf_counter() - t0)
    print(f"{len(df)} rows ({df.batch_size.nunique()} BS x {df.num_spec_tokens.nunique()} K + vanilla, "
          f"{args.repeats} repeats x {args.waves} waves): analyze median "
          f"{statistics.median(times) * 1e3:.0f} ms, "
          f"min {min(times) * 1e3:.0f} ms over {args.runs} runs; shape {res.shape}")


if __name__ == "__main__":
    main()
