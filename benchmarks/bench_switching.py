"""Does switching K every step change a K's step time or acceptance? Paired waves vs fixed-K waves,
interleaved round by round on one vLLM engine, so machine drift cancels in the comparison.

For each batch size, ``--rounds`` rounds; a round runs one paired group (every K inside the same
``--paired-waves`` waves, K switched per step as in ``design = "paired"``) and, right after it, one
fixed-K run per K (``--fixed-waves`` waves each, K held for the whole wave), the order of the Ks
and of group vs fixed rotated per round. The engine is warm, so no warm-up wave is run. Per
(batch size, K): the ratio paired / fixed of the step time (the paired row's pure steps against the
fixed run's steady steps) and of AL, geometric mean over rounds, with a 90 % interval from
resampling rounds (each round pairs a group with the fixed runs measured next to it).

    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/bench_switching.py --spec sweeps/toy-dense-cpu.toml \\
        --batch-sizes 1,4 --rounds 4 --out docs/lab/data/switching
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dsdprof.config.spec import load_spec
from dsdprof.formats.measurements import MODE_DSD
from dsdprof.io.store import provenance_dict
from dsdprof.measure.engine import Cell, balanced_order
from dsdprof.measure.runner import measurement_row

ROOT = Path(__file__).resolve().parents[1]


def _spec(spec, waves: int, design: str):
    sweep = spec.sweep.model_copy(update={"waves": waves, "warmup": 0, "design": design})
    return spec.model_copy(update={"sweep": sweep})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "sweeps" / "toy-dense-cpu.toml")
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--paired-waves", type=int, default=5)
    ap.add_argument("--fixed-waves", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write <out>.parquet (every row, with its round)")
    ap.add_argument("--report", type=Path, default=None, help="only report on <report>.parquet")
    args = ap.parse_args(argv)
    if args.report is not None:
        report(pd.read_parquet(f"{args.report}.parquet"))
        return 0
    from dsdprof.measure.vllm.engine import VllmEngine

    base = load_spec(args.spec)
    paired, fixed = _spec(base, args.paired_waves, "paired"), _spec(base, args.fixed_waves, "cells")
    ks = list(base.sweep.num_spec_tokens)
    engine = VllmEngine(paired, out_dir=None, concurrent_engines=1)
    engine._mode = MODE_DSD
    engine.paired_vanilla = False  # no vanilla waves: the comparison is between Ks
    t0 = time.perf_counter()
    engine.pool.get(MODE_DSD)
    print(f"engine start {time.perf_counter() - t0:.0f} s", flush=True)
    prov = provenance_dict(engine.provenance())
    rows: list[dict] = []
    try:
        for b in (int(x) for x in args.batch_sizes.split(",")):
            for r in range(args.rounds):
                t = time.perf_counter()
                blocks = ["paired", "fixed"] if r % 2 == 0 else ["fixed", "paired"]
                for block in blocks:
                    if block == "paired":
                        engine.spec = paired
                        runs = [Cell(r, b, MODE_DSD, k, group=tuple(ks)) for k in ks]
                    else:
                        engine.spec = fixed
                        runs = [Cell(r, b, MODE_DSD, ks[j]) for j in balanced_order(len(ks), r)]
                    for cell in runs:
                        row = measurement_row(cell, engine.measure(cell), prov)
                        rows.append({**row, "round": r, "block": block})
                print(f"BS {b} round {r}: {time.perf_counter() - t:.0f} s", flush=True)
                if args.out is not None:
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    pd.DataFrame(rows).to_parquet(f"{args.out}.parquet")
    finally:
        engine.close()
    report(pd.DataFrame(rows))
    return 0


def report(df: pd.DataFrame) -> None:
    """Per (batch size, K): paired / fixed step time and AL over the rounds, 90 % interval."""
    df = df[df["status"] == "ok"]
    rng = np.random.default_rng(0)
    print("switching K per step vs K held for whole waves "
          "(paired / fixed; geometric mean over rounds, 90 %):")
    print("| BS | K | step time | AL | rounds |")
    print("|---:|---:|---|---|---:|")
    for (b, k), g in df.groupby(["batch_size", "num_spec_tokens"]):
        p = g[g["block"] == "paired"].set_index("round")
        f = g[g["block"] == "fixed"].set_index("round")
        both = sorted(set(p.index) & set(f.index))
        if not both:
            continue
        out = []
        for col in ("itl_s", "acceptance_length"):
            lr = np.log(p.loc[both, col].to_numpy(float) / f.loc[both, col].to_numpy(float))
            boot = lr[(rng.random((4000, lr.size)) * lr.size).astype(int)].mean(axis=1)
            lo, hi = np.exp(np.quantile(boot, [0.05, 0.95]))
            out.append(f"{np.exp(lr.mean()):.3f} [{lo:.3f}, {hi:.3f}]")
        print(f"| {b} | {k} | {out[0]} | {out[1]} | {len(both)} |")


if __name__ == "__main__":
    sys.exit(main())
