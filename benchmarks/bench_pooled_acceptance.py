"""Acceptance replayed as a fixed-K server, pooled by draft position, and each K's own steps.

Re-summarizes every paired group of a sweep run (``<run>/_traces/dsd-bs<B>-paired-r<R>.jsonl``)
three ways -- each K's tokens per request-step from the steps that verified that K (schema v4/v5),
pooled by draft position over every step of the group (v6, ``trace.pool_acceptance``), and replayed
as a server held at K over every request's match sequence (the default since 2026-12-03,
``measure/vllm/replay.py``) -- puts each into the run's rows (step times, vanilla rows and everything else
unchanged) and runs dsdprof's ``analyze`` on both: per batch size the K*, whether it is decided, the runner-up
margin, the median 90 % half-width of goodput vs the best K; and the same with acceptance held at its point
(step time alone: the floor pooling can reach).

    python benchmarks/bench_pooled_acceptance.py runs/toy-dense-cpu
    python benchmarks/bench_pooled_acceptance.py runs/moe-pooled --repeats 0   # only repeat 0
    python benchmarks/bench_pooled_acceptance.py --synthetic   # replay and pooling vs a known truth

``--synthetic``: requests whose acceptance has easy and hard stretches along the output (a
two-state chain per request over positions, a uniform draw per position, a draft at depth j
matching below rate * decay^(j-1)), run through the paired K sequence (Ks 0-4, hold 4, a random
phase per request) and through each fixed K on the same text; per case the lag-1 correlation of a
fixed K=4 run's consecutive steps and the error of the replayed and the pooled AL(K) against the
fixed-K truth.
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


SYNTHETIC = [  # (easy rate, hard rate, switch per position, rate decay per depth)
    (0.7, 0.7, 0.0, 1.0), (0.9, 0.45, 0.08, 1.0), (0.95, 0.3, 0.02, 1.0), (0.98, 0.1, 0.03, 1.0),
    (0.9, 0.5, 0.15, 1.0), (0.95, 0.45, 0.06, 0.9)]


def synthetic(requests: int = 1000, out_len: int = 200, ks: tuple = (0, 1, 2, 3, 4), hold: int = 4) -> None:
    from dsdprof.measure.vllm.replay import replay_acceptance, request_matches

    def trajectory(accept, seq, phase):
        t, i, recs = 1, phase, []
        while t < out_len:
            k = seq[i % len(seq)]
            a = accept(t, k)
            recs.append((k, a, a + 1))
            t, i = t + a + 1, i + 1
        return recs

    seq = [k for k in ks for _ in range(hold)]
    print(f"{requests} requests x {out_len} tokens, Ks {ks}, hold {hold}; AL(K) error vs a fixed-K run "
          "of the same text")
    for easy, hard, switch, decay in SYNTHETIC:
        rng = np.random.default_rng(0)
        records, corr = [], []
        tokens, steps, pool = np.zeros(len(ks)), np.zeros(len(ks)), np.zeros((2, max(ks)))
        for r in range(requests):
            state = (np.cumsum(rng.random(out_len + 40) < switch) + (rng.random() < 0.5)) % 2
            rate, u = np.where(state == 0, easy, hard), rng.random(out_len + 40)

            def accept(t, k, rate=rate, u=u, decay=decay):
                a = 0
                while a < k and u[t + a] < rate[t + a] * decay ** a:
                    a += 1
                return a
            for k, a, g in trajectory(accept, seq, int(rng.integers(len(seq)))):
                records.append((f"r{r}", (k, a, g)))
                pool[0, :k] += 1
                pool[1, :a] += 1
            for i, k in enumerate(ks):
                fixed = trajectory(accept, [k], 0)
                tokens[i] += sum(g for *_, g in fixed)
                steps[i] += len(fixed)
                if k == max(ks):
                    corr.append(np.array([a for _, a, _ in fixed], dtype=float))
        reqs = request_matches(records, {f"r{r}": out_len for r in range(requests)},
                               {f"r{r}": 0 for r in range(requests)})
        rep = replay_acceptance(reqs, ks, {0: 0})
        lag = np.corrcoef(np.concatenate([c[:-1] for c in corr]), np.concatenate([c[1:] for c in corr]))[0, 1]
        cells = []
        for i, k in enumerate(ks):
            if k:
                truth = tokens[i] / steps[i]
                pooled = 1 + sum(pool[1, j] / pool[0, j] for j in range(k))
                cells.append(f"K={k} {rep.acceptance_length[k] / truth - 1:+.2%} / {pooled / truth - 1:+.2%}")
        print(f"easy {easy} hard {hard} switch {switch} decay {decay}: lag-1 {lag:.2f}; replay / pooled: "
              + ", ".join(cells))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, nargs="?",
                    help="a sweep run directory of the paired design (with _traces)")
    ap.add_argument("--repeats", help="only these repeats, e.g. 0 or 0,1 (default: all)")
    ap.add_argument("--synthetic", action="store_true", help="replay and pooling against a known truth")
    args = ap.parse_args(argv)
    if args.synthetic or args.run is None:
        synthetic()
        return 0
    rows = read_measurements(args.run)
    repeats = {int(x) for x in args.repeats.split(",")} if args.repeats else None
    print(f"{args.run}: {len(rows)} rows; half-width = median over the non-best Ks of a batch size of the "
          f"90 % half-width of goodput / best K; 'median' = median over batch sizes")
    results = {how: summary(rows_with(rows, args.run, how, repeats))
               for how in ("own", "pooled", "replay", "fixed")}
    head = (f"{'acceptance':<10} {'analyze':<8} {'median':>7} {'decided':>8}  shape        "
            "per BS: K* (decided ?), half-width")
    print(head)
    for how, s in results.items():
        opt = s["opt"]
        cells = "  ".join(f"{int(r.batch_size)}:{int(r.k)}{'' if r.decided else '?'} "
                          f"{s['per_bs'][int(r.batch_size)]:.1%}"
                          for r in opt.itertuples())
        print(f"{how:<10} {s['used']:<8} {s['half']:>7.2%} {int(opt['decided'].sum()):>3} of {len(opt):<2}  "
              f"{s['shape']:<12} {cells}")
    print("(own: each K's own steps, as v4/v5 rows; pooled: by draft position over the group (v6); replay: "
          "a server held at K, what dsdprof writes; fixed: replayed point with no acceptance noise, step "
          "time alone. analyze: 'chain' when "
          "analyze's default (acceptance auto) replaced each K's AL by the largest K's per-position chain)")
    for how in ("own", "pooled", "replay"):
        print(f"\n{how}: margins vs runner-up [90 %]")
        for r in results[how]["opt"].itertuples():
            print(f"  BS {int(r.batch_size):>3}: K={int(r.k)} {r.margin:.3f} [{r.ci_low:.3f}, "
                  f"{r.ci_high:.3f}] vs K={r.runner_up}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
