"""Per-step cost of the adaptive vLLM scheduler (dsdprof.plugins.vllm_adaptive), next to a step.

    python benchmarks/bench_adaptive_overhead.py [--measured RUN_DIR_OR_PARQUET] [--steps N]

What the plugin adds to an engine step is Python in ``update_from_output``: aggregating the
step's per-request drafted/accepted counts per position, ``AdaptiveKSelector.observe``, every
``rebuild_every`` steps a re-derivation of K, and on a change a new dense lookup. This times
exactly that -- plus, since issue 18, the step's duration (``observe_step``) -- on fake step
outputs (no engine): the adaptive scheduler's ``update_from_output`` and
the plain tracing scheduler's, both over the same no-op stand-in for vLLM's own
``update_from_output``, interleaved step by step; the overhead is the difference. Steps draft the
table's largest K (7, the most positions to aggregate) at BS 1, 64 and 256, with acceptance
switching between two regimes (alpha 0.45 / 0.9 per position) so that K really moves and the
lookup is swapped now and then (max_num_seqs 256). Selector defaults (rebuild every 32 steps).

With ``--measured`` (a sweep directory or Parquet file, e.g. docs/measured/toy-dense-cpu.parquet)
the overhead is printed as a fraction of the BS-1 step time measured there (``itl_s`` of the
speculative rows at BS 1, K >= 1; the shortest one is the reference). Goals: < 1 % of a step,
and <= 50 us per step at 256 running requests.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace as NS

from dsdprof.serve.adaptive import AdaptiveKSelector
from dsdprof.formats.ktable import ranges_from_points

MAX_NUM_SEQS = 256
MAX_K = 7
PHASE_STEPS = 512
ALPHAS = (0.9, 0.45)


def v2_table() -> dict:
    """A 9-batch-size x 8-K grid (the same synthetic grid as bench_runtime)."""
    def itl(b, k):
        return 0.010 + 0.0005 * k + 0.00008 * b * (k + 1)

    sizes, ks, alpha = (1, 2, 4, 8, 16, 32, 64, 128, 256), range(0, MAX_K + 1), 0.8
    al = {k: sum(alpha**i for i in range(k + 1)) for k in ks}
    points = []
    for b in sizes:
        g = {k: al[k] / itl(b, k) for k in ks}
        points.append((b, min(k for k in ks if g[k] >= 0.98 * max(g.values()))))
    return {"schema": "dsdprof.ktable/v2", "num_speculative_tokens": MAX_K, "ranges": ranges_from_points(points),
            "cells": [{"batch_size": b, "k": k, "itl_s": itl(b, k), "acceptance_length": al[k]}
                      for b in sizes for k in ks],
            "acceptance_per_pos": [alpha**i for i in range(1, MAX_K + 1)]}


def schedulers():
    """(adaptive, tracing) scheduler classes over a no-op stand-in for vLLM's update_from_output."""
    from dsdprof.plugins.vllm_adaptive import _AdaptiveMixin
    from dsdprof.plugins.vllm_profiling import _DsdprofMixin

    class NoVllm:
        def update_from_output(self, scheduler_output, model_runner_output):
            return None

    class Adaptive(_AdaptiveMixin, _DsdprofMixin, NoVllm):
        pass

    class Tracing(_DsdprofMixin, NoVllm):
        pass

    return Adaptive, Tracing


def make(cls, table_path: str | None):
    s = cls.__new__(cls)
    s.num_spec_tokens = MAX_K
    s.dynamic_sd_lookup = [0] + [MAX_K] * MAX_NUM_SEQS
    s.running, s.waiting, s.requests = [], [], {}
    if table_path is None:
        s._dsdprof_init()
    else:
        from dsdprof.serve.settings import adaptive_additional_config

        s._adaptive_setup(adaptive_additional_config(table_path), environ={})
    return s


def fake_steps(batch_size: int, n: int, rng: random.Random) -> list[tuple[NS, NS]]:
    """n steps of batch_size requests drafting MAX_K, chain acceptance alternating by phase."""
    steps = []
    ids = [f"req-{i}" for i in range(batch_size)]
    for s in range(n):
        alpha = ALPHAS[(s // PHASE_STEPS) % 2]
        sampled = []
        for _ in ids:
            a = 0
            while a < MAX_K and rng.random() < alpha:
                a += 1
            sampled.append([1] * (a + 1))
        so = NS(scheduled_spec_decode_tokens={r: [-1] * MAX_K for r in ids},
                num_scheduled_tokens={r: 1 + MAX_K for r in ids}, total_num_scheduled_tokens=batch_size * (1 + MAX_K),
                num_spec_tokens_to_schedule=MAX_K, scheduled_new_reqs=[])
        mro = NS(sampled_token_ids=sampled, req_id_to_index={r: i for i, r in enumerate(ids)})
        steps.append((so, mro))
    return steps


def bench(batch_size: int, n: int, table_path: str) -> dict:
    Adaptive, Tracing = schedulers()
    adaptive, tracing = make(Adaptive, table_path), make(Tracing, None)
    steps = fake_steps(batch_size, n, random.Random(batch_size))
    clock = time.perf_counter_ns
    added, swaps = [], []
    for so, mro in steps:  # interleaved: a busy machine slows both alike
        t0 = clock()
        tracing.update_from_output(so, mro)
        t1 = clock()
        version = adaptive.dsdprof_selector.version
        adaptive.update_from_output(so, mro)
        t2 = clock()
        d = (t2 - t1) - (t1 - t0)
        added.append(d)
        if adaptive.dsdprof_selector.version != version:
            swaps.append(d)
    sel: AdaptiveKSelector = adaptive.dsdprof_selector
    rebuild = []
    for _ in range(200):  # a rebuild that changes nothing (the common case every rebuild_every steps)
        t0 = clock()
        sel.rebuild()
        rebuild.append(clock() - t0)
    added.sort()
    return {"bs": batch_size, "steps": n, "mean_us": statistics.fmean(added) / 1e3,
            "p50_us": added[len(added) // 2] / 1e3, "p99_us": added[int(len(added) * 0.99)] / 1e3,
            "max_us": added[-1] / 1e3, "swaps": len(swaps),
            "swap_us": statistics.fmean(swaps) / 1e3 if swaps else float("nan"),
            "rebuild_us": statistics.median(rebuild) / 1e3, "ks": sel.ks}


def measured_bs1_step(path: str) -> dict[int, float]:
    """K -> median itl_s of the ok speculative rows at BS 1 (K >= 1) of a sweep dir or Parquet."""
    from dsdprof.io.readers import read_measurements

    df = read_measurements(path)
    if "status" in df.columns:
        df = df[df["status"].astype(str) == "ok"]
    if "mode" in df.columns:
        df = df[df["mode"].astype(str) != "vanilla"]
    df = df[(df["batch_size"] == 1) & (df["num_spec_tokens"] >= 1)]
    return {int(k): float(g.median()) for k, g in df.groupby("num_spec_tokens")["itl_s"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured", metavar="RUN_DIR", help="sweep directory or Parquet with BS-1 itl_s")
    ap.add_argument("--steps", type=int, default=8192, help="fake steps per batch size (default 8192)")
    args = ap.parse_args(argv)
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        table_path = str(Path(tmp) / "table.json")
        Path(table_path).write_text(json.dumps(v2_table()))
        results = [bench(b, args.steps, table_path) for b in (1, 64, 256)]
    step_s = None
    if args.measured:
        per_k = measured_bs1_step(args.measured)
        if not per_k:
            print(f"error: --measured={args.measured!r}: no ok speculative row at batch size 1", file=sys.stderr)
            return 2
        print("BS-1 step (itl_s, median over repeats) measured in", args.measured)
        for k, t in per_k.items():
            print(f"  K={k}: {t * 1e3:8.2f} ms")
        step_s = min(per_k.values())
    print(f"\nadded per step by the adaptive scheduler (drafting K={MAX_K}; "
          f"acceptance alternating {ALPHAS} every {PHASE_STEPS} steps; max_num_seqs {MAX_NUM_SEQS})")
    head = f"{'BS':>4} {'mean us':>9} {'p50 us':>8} {'p99 us':>8} {'max us':>8} {'swaps':>6} {'swap-step us':>13} {'rebuild us':>11}"
    if step_s:
        head += f" {'mean/step':>10} {'swap/step':>10}"
    print(head)
    for r in results:
        line = (f"{r['bs']:>4} {r['mean_us']:>9.2f} {r['p50_us']:>8.2f} {r['p99_us']:>8.2f} {r['max_us']:>8.1f} "
                f"{r['swaps']:>6} {r['swap_us']:>13.1f} {r['rebuild_us']:>11.1f}")
        if step_s:
            line += f" {r['mean_us'] * 1e-6 / step_s:>10.4%} {r['swap_us'] * 1e-6 / step_s:>10.4%}"
        print(line)
    at256 = [r["mean_us"] for r in results if r["bs"] == 256][0]
    print(f"\nmean added per step at 256 running requests: {at256:.1f} us (goal <= 50 us: "
          f"{'met' if at256 <= 50 else 'NOT met'}; the selector's own share: benchmarks/bench_runtime.py)")
    if step_s:
        worst = max(r["mean_us"] for r in results) * 1e-6 / step_s
        print(f"\nmean overhead vs the shortest BS-1 step ({step_s * 1e3:.2f} ms): {worst:.4%} "
              f"(goal < 1 %: {'met' if worst < 0.01 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
