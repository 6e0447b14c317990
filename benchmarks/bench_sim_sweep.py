"""How fast an analytic-engine (``sim``) sweep writes its rows.

A 10,000-cell sim sweep (1,000 batch sizes x K 0..8 + vanilla) through ``run_sweep`` with the
batched writer dsdprof uses for the sim engine, then the same sweep's first cells with one Parquet
file per cell (the writer's default, used for real engines), then a resume of the finished sweep.

    python benchmarks/bench_sim_sweep.py [--cells-per-file-sample 500]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd

from dsdprof.config.spec import parse_spec
from dsdprof.measure import runner as sweep_mod
from dsdprof.measure.runner import run_sweep


def spec(batch_sizes: list[int]):
    return parse_spec({
        "engine": {"name": "sim", "model": "Llama-3.1-8B", "draft_model": "EAGLE3-Llama-3.1-8B",
                   "method": "eagle3", "dtype": "bfloat16", "max_model_len": 4096},
        "sweep": {"batch_sizes": batch_sizes, "num_spec_tokens": list(range(9)), "waves": 20,
                  "output_len": 256},
        "workload": {"input_len": 896},
        "sim": {"hardware": "H200 SXM", "acceptance_alpha": 0.8},
    })


def timed(label: str, fn) -> float:
    t0 = time.perf_counter()
    summary = fn()
    dt = time.perf_counter() - t0
    print(f"{label:<44} {summary.total:>6} cells  {dt:6.2f} s  {summary.total / dt:8.0f} cells/s  "
          f"(ok {summary.ok}, failed {summary.failed}, skipped {summary.skipped})")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells-per-file-sample", type=int, default=500,
                    help="cells to time with one file per cell (a full 10,000 takes minutes)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dsdprof-bench-"))
    try:
        big = spec(list(range(1, 1001)))  # 1000 x (9 K + vanilla) = 10,000 cells
        out = root / "batched"
        timed(f"batched writer (flush every {sweep_mod.SIM_FLUSH_ROWS} rows)", lambda: run_sweep(big, out))
        files = len(list(out.glob("part-*.parquet")))
        rows = pd.read_parquet(out)
        assert len(rows) == 10_000 and rows.cell_id.is_unique
        print(f"{'':<44} {files} part files, pandas reads {len(rows)} rows, one per cell")
        timed("resume of the finished sweep", lambda: run_sweep(big, out, resume=True))

        n_bs = max(1, args.cells_per_file_sample // 10)
        small = spec(list(range(1, n_bs + 1)))
        saved = sweep_mod.SIM_FLUSH_ROWS, sweep_mod.SIM_FLUSH_INTERVAL_S
        sweep_mod.SIM_FLUSH_ROWS, sweep_mod.SIM_FLUSH_INTERVAL_S = 1, None
        try:
            timed("one file per cell (fsync + rename each)", lambda: run_sweep(small, root / "per-cell"))
        finally:
            sweep_mod.SIM_FLUSH_ROWS, sweep_mod.SIM_FLUSH_INTERVAL_S = saved
        timed("batched writer, same cells", lambda: run_sweep(small, root / "batched-small"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
