"""Cells/s of the analytic engine: a 10 hardware x 10 models x 9 BS x 8 K grid, vectorised, and
the per-cell path a sweep uses (SimEngine.measure) for comparison.

    python benchmarks/bench_sim.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from dsdprof.config.spec import parse_spec
from dsdprof.measure.engine import Cell
from dsdprof.measure.sim.acceptance import geometric
from dsdprof.measure.sim.catalog import MODELS, derived_draft
from dsdprof.measure.sim.hardware import HARDWARE
from tests.support.sim_grid import ModelCase, predict_grid

TARGETS = ["Llama-3.1-8B", "Llama-3.1-70B", "Qwen3-8B", "Qwen3-30B-A3B", "Qwen3-235B-A22B", "Mixtral-8x7B",
           "DeepSeek-V3", "gpt-oss-20b", "gpt-oss-120b", "Llama-3.2-1B"]
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
KS = [0, 1, 2, 3, 4, 5, 6, 7]


def grid_inputs():
    hws = list(HARDWARE.values())
    hws += [replace(hws[0], name="H100 SXM (slow host)",
                    efficiency=replace(hws[0].efficiency, step_overhead_s=2e-3)),
            replace(hws[1], name="H200 SXM (fp8 off)", fp8_tflops=0.0)]
    cases = [ModelCase(MODELS[t], derived_draft(MODELS[t], "eagle3"), tuple(geometric(0.75, 7)), "auto",
                       8 if t in ("DeepSeek-V3", "Qwen3-235B-A22B") else 1) for t in TARGETS]
    return hws, cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    hws, cases = grid_inputs()
    cells = len(hws) * len(cases) * len(BATCH_SIZES) * len(KS)
    predict_grid(hws, cases, BATCH_SIZES, KS)  # warm-up
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        res = predict_grid(hws, cases, BATCH_SIZES, KS)
    dt = (time.perf_counter() - t0) / args.repeats
    print(f"grid {len(hws)} hardware x {len(cases)} models x {len(BATCH_SIZES)} BS x {len(KS)} K "
          f"= {cells} cells")
    print(f"vectorised predict_grid (step time, AL, memory check, optimal K): {dt * 1e3:.2f} ms/grid, "
          f"{cells / dt:,.0f} cells/s")

    from dsdprof.measure.sim.engine import SimEngine

    spec = parse_spec({"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3"},
                       "sweep": {"batch_sizes": BATCH_SIZES, "num_spec_tokens": KS},
                       "sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.75}})
    eng = SimEngine(spec)
    plan = [Cell(0, b, "dsd", k) for b in BATCH_SIZES for k in KS]
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 0.5:
        for c in plan:
            eng.measure(c)
        n += len(plan)
    dt = time.perf_counter() - t0
    print(f"per-cell SimEngine.measure (the sweep path): {n / dt:,.0f} cells/s")
    print(f"sanity: optimal K for {cases[0].target.name} on {hws[0].name}: "
          f"{dict(zip(BATCH_SIZES, res.optimal_k[0, 0].tolist()))}")


if __name__ == "__main__":
    main()
