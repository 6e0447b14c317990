"""Acceptance replayed as a fixed-K server, pooled by draft position, and each K's own steps.

Re-summarizes every paired group of a sweep run (``<run>/_traces/dsd-bs<B>-paired-r<R>.jsonl``)
three ways -- each K's tokens per request-step from the steps that verified that K (schema v4/v5),
pooled by draft position over every step of the group (v6, ``trace.pool_acceptance``), and replayed
as a server held at K over every request's match sequence (the default since 2026-12-03,
``measure/vllm/replay.py``) -- puts each into the run's rows (step times, vanilla rows and everything else unchanged) and runs dsdprof's
``analyze`` on both: per batch size the K*, whether it is decided, the runner-up margin, the median
90 % half-width of goodput vs the best K; and the same with acceptance held at its point (step time
alone: the floor pooling can reach).

    python benchmarks/bench_pooled_acceptance.py runs/toy-dense-cpu
    python benchmarks/bench_pooled_acceptance.py runs/moe-pooled --repeats 0   # only repeat 0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dsdprof.decide.analysis import analyze
from dsdprof.io.readers import read_measurements
from dsdprof.measure.vllm.trace import read_trace, summarize_paired


def rows_with(rows: pd.DataFrame, run: Path, how: str, repeats: set[int] | None) -> pd.DataFrame:
    """``rows`` with every paired DSD row's acceptance re-summarized: ``own``, ``pooled``, ``replay``
    or ``fixed`` (replayed point, every sample at the point: no acceptance noise)."""
    out = rows[rows["repeat"].isin(repeats)] if repeats is not None else rows
    out = out.copy()
    dsd = (out["mode"] == "dsd") & (out["design"] == "paired") & (out["status"] == "ok")
    for (b, r), g in out[dsd].groupby(["batch_size", "repeat"]):
        ks = tuple(sorted(int(k) for k in g["num_spec_tokens"]))
        steps = read_trace(run / "_traces" / f"dsd-bs{int(b)}-paired-r{int(r)}.jsonl")
        by_k = summarize_paired(steps, int(b), ks, max(ks), acceptance="replay" if how == "fixed" else how)
        for i, row in g.iterrows():
            t = by_k[int(row["num_spec_tokens"])]
            out.at[i, "acceptance_per_pos"] = list(t.acceptance_per_pos[:int(row["num_spec_tokens"])])
            samples = list(t.sample_acceptance_length)
            if how == "fixed":
                samples = [t.acceptance_length] * len(samples)
            out.at[i, "acceptance_length"] = t.acceptance_length
            out.at[i, "sample_acceptance_length"] = samples
            out.at[i, "sample_itl_s"] = list(t.sample_itl_s)
            out.at[i, "itl_s"] = t.itl_s
    return out


def summary(df: pd.DataFrame) -> dict:
    res = analyze(df)
    c = res.cells
    per_bs = {}
    for b, g in c.groupby("batch_size"):
        others = g[g["ratio_to_best"] < 1.0]
        per_bs[int(b)] = float(((others["ratio_high"] - others["ratio_low"]) / 2).median())
    opt = res.optimal
    return {"half": float(np.median(list(per_bs.values()))) if per_bs else float("nan"), "per_bs": per_bs,
            "opt": opt, "shape": res.shape, "used": res.acceptance}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a sweep run directory of the paired design (with _traces)")
    ap.add_argument("--repeats", help="only these repeats, e.g. 0 or 0,1 (default: all)")
    args = ap.parse_args(argv)
    rows = read_measurements(args.run)
    repeats = {int(x) for x in args.repeats.split(",")} if args.repeats else None
    print(f"{args.run}: {len(rows)} rows; half-width = median over the non-best Ks of a batch size of the "
          f"90 % half-width of goodput / best K; 'median' = median over batch sizes")
    results = {how: summary(rows_with(rows, args.run, how, repeats)) for how in ("own", "pooled", "replay", "fixed")}
    head = (f"{'acceptance':<10} {'analyze':<8} {'median':>7} {'decided':>8}  shape        "
            "per BS: K* (decided ?), half-width")
    print(head)
    for how, s in results.items():
        opt = s["opt"]
        cells = "  ".join(f"{int(r.batch_size)}:{int(r.k)}{'' if r.decided else '?'} {s['per_bs'][int(r.batch_size)]:.1%}"
                          for r in opt.itertuples())
        print(f"{how:<10} {s['used']:<8} {s['half']:>7.2%} {int(opt['decided'].sum()):>3} of {len(opt):<2}  {s['shape']:<12} {cells}")
    print("(own: each K's own steps, as v4/v5 rows; pooled: by draft position over the group (v6); replay: "
          "a server held at K, what dsdprof writes; fixed: replayed point with no acceptance noise, step time alone. analyze: 'chain' when "
          "analyze's default (acceptance auto) replaced each K's AL by the largest K's per-position chain)")
    for how in ("own", "pooled", "replay"):
        print(f"\n{how}: margins vs runner-up [90 %]")
        for r in results[how]["opt"].itertuples():
            print(f"  BS {int(r.batch_size):>3}: K={int(r.k)} {r.margin:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] vs K={r.runner_up}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
