"""Paired design vs cell by cell, side by side in one run on one vLLM engine (same engine time).

For each batch size (the order of the two designs alternates between batch sizes, so machine
drift hits both alike): the **cells** design measures every K in waves of its own (``--cell-waves``
each, K order of a Williams row), the **paired** design runs every K inside the same
``--paired-waves`` waves (default: number of Ks x cell waves, the same engine time), K switched per
step (:mod:`dsdprof.plugins.vllm_profiling`). Both use the DSD engine only (no vanilla baseline:
the decision is between Ks). Prints, per design, the engine seconds, the median half-width of the
90 % interval of goodput relative to the best K, and which batch sizes are decided; then, per
(batch size, K), the paired rows' step time and AL against the cells' (the switching effect),
with 90 % intervals from resampling each side's waves.

    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/bench_paired.py --spec sweeps/toy-dense-cpu.toml \\
        --batch-sizes 1,4,16 --cell-waves 4 --out measured/paired-bench
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dsdprof.config.spec import load_spec
from dsdprof.decide.analysis import analyze
from dsdprof.formats.measurements import MODE_DSD
from dsdprof.io.store import provenance_dict
from dsdprof.measure.engine import Cell, balanced_order
from dsdprof.measure.runner import measurement_row

ROOT = Path(__file__).resolve().parents[1]


def _spec(path: Path, batch_sizes, waves: int, design: str):
    spec = load_spec(path)
    sweep = spec.sweep.model_copy(update={"batch_sizes": batch_sizes, "waves": waves, "design": design})
    return spec.model_copy(update={"sweep": sweep})


def _ratio_ci(a: np.ndarray, b: np.ndarray, rng, n: int = 2000) -> tuple[float, float, float]:
    """mean(a) / mean(b) with a 90 % interval, each side's waves resampled on its own."""
    ra = a[(rng.random((n, a.size)) * a.size).astype(int)].mean(axis=1)
    rb = b[(rng.random((n, b.size)) * b.size).astype(int)].mean(axis=1)
    lo, hi = np.quantile(ra / rb, [0.05, 0.95])
    return float(a.mean() / b.mean()), float(lo), float(hi)


def summary(name: str, df: pd.DataFrame) -> dict:
    res = analyze(df)
    c = res.cells
    others = c[c["ratio_to_best"] < 1.0]
    half = ((others["ratio_high"] - others["ratio_low"]) / 2).median()
    opt = res.optimal
    out = {"design": name, "engine_s": float(df["wall_s"].sum()), "median_half_width": float(half),
           "decided": f"{int(opt['decided'].sum())} of {len(opt)}",
           "k": ", ".join(f"{int(b)}:{int(k)}{'' if d else '?'}"
                          for b, k, d in zip(opt.batch_size, opt.k, opt.decided)),
           "shape": res.shape}
    print(f"\n{name}: engine {out['engine_s']:.0f} s, median half-width of goodput / best K {half:.2%}, "
          f"decided {out['decided']} (K* per BS, ? = undecided: {out['k']}), shape {res.shape}")
    for r in opt.itertuples():
        print(f"  BS {r.batch_size}: K={r.k} margin {r.margin:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] vs "
              f"K={r.runner_up}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "sweeps" / "toy-dense-cpu.toml")
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--cell-waves", type=int, default=4)
    ap.add_argument("--paired-waves", type=int, default=0, help="default: number of Ks x cell waves")
    ap.add_argument("--out", type=Path, default=None,
                    help="write <out>-cells.parquet and <out>-paired.parquet")
    ap.add_argument("--report", type=Path, default=None,
                    help="only report on <report>-{cells,paired}.parquet")
    args = ap.parse_args(argv)
    if args.report is not None:
        frames = {d: pd.read_parquet(f"{args.report}-{d}.parquet") for d in ("cells", "paired")}
        report(frames, sorted(set(frames["paired"]["batch_size"])),
               sorted(set(frames["paired"]["num_spec_tokens"])))
        return 0
    from dsdprof.measure.vllm.engine import VllmEngine

    bs = [int(b) for b in args.batch_sizes.split(",")]
    cells_spec = _spec(args.spec, bs, args.cell_waves, "cells")
    ks = list(cells_spec.sweep.num_spec_tokens)
    paired_spec = _spec(args.spec, bs, args.paired_waves or len(ks) * args.cell_waves, "paired")
    engine = VllmEngine(paired_spec, out_dir=None, concurrent_engines=1)
    engine._mode = MODE_DSD
    engine.paired_vanilla = False  # DSD engine only: no vanilla baseline in this comparison
    t0 = time.perf_counter()
    engine.pool.get(MODE_DSD)
    print(f"engine start {time.perf_counter() - t0:.0f} s", flush=True)
    prov = provenance_dict(engine.provenance())
    rows: dict[str, list[dict]] = {"cells": [], "paired": []}
    try:
        for i, b in enumerate(bs):
            for design in (("cells", "paired") if i % 2 == 0 else ("paired", "cells")):
                engine.spec = cells_spec if design == "cells" else paired_spec
                t = time.perf_counter()
                order = [ks[j] for j in balanced_order(len(ks), i)]
                for k in order:
                    cell = Cell(0, b, MODE_DSD, k, group=tuple(ks) if design == "paired" else ())
                    rows[design].append(measurement_row(cell, engine.measure(cell), prov))
                print(f"BS {b} {design}: {time.perf_counter() - t:.0f} s", flush=True)
                _write(args.out, rows)  # after every block: a run cut short keeps what it measured
    finally:
        engine.close()
    frames = {d: pd.DataFrame(r) for d, r in rows.items()}
    report(frames, bs, ks)
    return 0


def _write(out, rows) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    for d, r in rows.items():
        if r:
            pd.DataFrame(r).to_parquet(f"{out}-{d}.parquet")


def report(frames: dict, bs, ks) -> None:
    """The comparison, from the two designs' rows (also: ``--report OUT`` on written files)."""
    bs = [b for b in bs if (frames["paired"]["batch_size"] == b).any()
          and (frames["cells"]["batch_size"] == b).any()]
    frames = {d: df[df["batch_size"].isin(bs)] for d, df in frames.items()}
    summary("cells", frames["cells"])
    summary("paired", frames["paired"])
    print("\nswitching K per step vs a fixed-K cell (paired / cells, 90 % interval):")
    print("| BS | K | step time | AL | pure steps (paired) | steady steps (cells) |")
    print("|---:|---:|---|---|---:|---:|")
    rng = np.random.default_rng(0)
    for b in bs:
        for k in ks:
            p = frames["paired"].query("batch_size == @b and num_spec_tokens == @k").iloc[0]
            c = frames["cells"].query("batch_size == @b and num_spec_tokens == @k").iloc[0]
            itl = _ratio_ci(np.asarray(p.sample_itl_s), np.asarray(c.sample_itl_s), rng)
            al = _ratio_ci(np.asarray(p.sample_acceptance_length),
                           np.asarray(c.sample_acceptance_length), rng)
            print(f"| {b} | {k} | {itl[0]:.3f} [{itl[1]:.3f}, {itl[2]:.3f}] | {al[0]:.3f} "
                  f"[{al[1]:.3f}, {al[2]:.3f}] | {int(p.steady_steps)} | {int(c.steady_steps)} |")


if __name__ == "__main__":
    sys.exit(main())
