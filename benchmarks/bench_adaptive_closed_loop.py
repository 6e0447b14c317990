"""AdaptiveKSelector in a closed loop (tests/support/simulate.py): how fast it reaches the best fixed K
(vanilla included) on wrong tables, and how fast it leaves and comes back after an acceptance shift.

    python benchmarks/bench_adaptive_closed_loop.py [--seeds N]

Scenarios (batch sizes 1-16, K 0-4, chain acceptance 0.8 per position profiled):

* **far**: the table's step times are from another pair (15/21/25 ms at K 0/2/4 at BS 1), the
  engine's are 33/88/140 ms (the issue's numbers); acceptance as profiled, or lower (0.55, 0.45,
  0.4, 0.35). Vanilla is the best fixed choice at every batch size; the table says K 3-4.
* **2x**: the speculative part of every step (ITL(K) - ITL(0)) is 2x (or 0.5x) the table's.
* **recovery**: a correct table; acceptance drops to 0.3 / 0.1 per position, then returns.
* **load** (issue 31): a correct table; every K runs 1.5x (or 0.67x) for 2000 steps, then as
  before: K changes (non-probe steps) under the load against the same seeds on a quiet machine.

Per batch size: *reach* = steps until every later (non-probe) step serves a K within 2 % of the
best fixed K; goodput of the Ks served in steps 2000-4000 against the best fixed K and against the
static table's K; for recovery, drafts until K is within 2 % of the best after the drop (leave)
and after the return (back). Median [min, max] over seeds. ``--before`` adds the selector as it
was before issue 18 (acceptance only; seed 0), run through the same loops.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from dsdprof.serve.adaptive import AdaptiveKSelector  # noqa: E402
from tests.support.simulate import (  # noqa: E402
    Phase,
    best_fixed,
    chain_al,
    first_within,
    reach_step,
    served_goodput,
    simulate,
    synthetic_table,
)

SIZES = (1, 2, 4, 8, 16)
P0 = (0.8,) * 4
LOW = (0.55, 0.45, 0.4, 0.35)


def _by_bs(v0: float, v2: float, v4: float) -> dict[int, dict[int, float]]:
    row = {0: v0, 1: (v0 + v2) / 2, 2: v2, 3: (v2 + v4) / 2, 4: v4}
    return {b: {k: t * (1 + 0.03 * (b - 1) * (1 + k) / 5) for k, t in row.items()} for b in SIZES}


FAR_TABLE = _by_bs(0.015, 0.021, 0.025)
FAR_TRUE = _by_bs(0.033, 0.088, 0.140)
SPEC = _by_bs(0.030, 0.036, 0.040)


BEFORE = "bb4498c"  # the selector before issue 18 (acceptance only), for --before


class _Before:
    """The pre-issue-18 selector behind the simulator's interface (no step times, no exploration)."""

    def __init__(self, table: dict) -> None:
        import subprocess
        import types

        src = subprocess.run(["git", "show", f"{BEFORE}:dsdprof/adaptive.py"], capture_output=True, text=True,
                             check=True).stdout
        # the modules it imported moved in the restructure (dsdprof.schema, dsdprof.table ->
        # dsdprof.formats.ktable)
        src = src.replace("from dsdprof.schema import", "from dsdprof.formats.ktable import").replace(
            "from dsdprof.table import", "from dsdprof.formats.ktable import")
        mod = types.ModuleType("adaptive_before")
        exec(compile(src, "adaptive_before.py", "exec"), mod.__dict__)
        self.sel = mod.AdaptiveKSelector(table)

    def explore(self, max_batch_size):
        return None

    def select(self, b):
        return self.sel.select(b)

    def observe_step(self, *args):
        return False

    def observe(self, n, accepted, drafted=None, batch_size=None):
        return self.sel.observe(n, accepted, drafted)


def _spread(xs: list) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "never"
    return f"{statistics.median(xs):g} [{min(xs):g}, {max(xs):g}]"


def reach(name: str, table: dict, true: dict, accept, seeds: int, steps: int = 4000,
          before: bool = False) -> None:
    print(f"\n{name}")
    print(f"{'BS':>3} {'best':>4} {'table K':>7} {'static/best':>11} {'reach (steps)':>22} "
          f"{'adaptive/best (2k-4k)':>26}"
          + (f" {'before/best (2k-4k)':>20}" if before else ""))
    for b in SIZES:
        k_best, g_best = best_fixed(accept, true[b])
        k_table = next(p["k"] for p in table["points"] if p["batch_size"] == b)
        static = chain_al(accept, k_table) / true[b][k_table] / g_best
        reaches, ratios = [], []
        for seed in range(seeds):
            sel = AdaptiveKSelector(table)
            res = simulate(sel, b, [Phase(steps, accept)], true[b], seed=seed)
            reaches.append(reach_step(res, accept, true[b], 0, steps))
            ratios.append(round(served_goodput(res, accept, true[b], steps // 2, steps) / g_best, 4))
        line = f"{b:>3} {k_best:>4} {k_table:>7} {static:>11.3f} {_spread(reaches):>22} {_spread(ratios):>26}"
        if before:
            res = simulate(_Before(table), b, [Phase(steps, accept)], true[b], seed=0)
            line += f" {served_goodput(res, accept, true[b], steps // 2, steps) / g_best:>20.4f}"
        print(line)


def recovery(seeds: int, before: bool = False) -> None:
    table = synthetic_table(SPEC, P0)
    print("\nrecovery (correct table; 2000 steps profiled, 4000 at the drop, 20000 back): drafts until "
          "within 2 % of best")
    print(f"{'BS':>3} {'drop to':>7} {'K best':>6} {'leave (drafts)':>22} {'back (drafts)':>22} "
          f"{'back (steps)':>22}")
    for b in (1, 4, 16):
        for low in (0.3, 0.1):
            shifted = (low,) * 4
            leave, back, back_steps = [], [], []
            for seed in range(seeds):
                sel = AdaptiveKSelector(table)
                res = simulate(sel, b, [Phase(2000, P0), Phase(4000, shifted), Phase(20000, P0)],
                               SPEC[b], seed=seed)
                _, s1, s2 = res.phase_start
                leave.append(first_within(res, shifted, SPEC[b], s1, s2))
                back.append(first_within(res, P0, SPEC[b], s2, len(res.ks)))
                back_steps.append(reach_step(res, P0, SPEC[b], s2, len(res.ks)))
            line = (f"{b:>3} {low:>7} {best_fixed(shifted, SPEC[b])[0]:>6} {_spread(leave):>22} "
                    f"{_spread(back):>22} {_spread(back_steps):>22}")
            if before:
                res = simulate(_Before(table), b,
                               [Phase(2000, P0), Phase(4000, shifted), Phase(20000, P0)], SPEC[b])
                _, s1, s2 = res.phase_start
                line += (f"   before: leave {first_within(res, shifted, SPEC[b], s1, s2)}, "
                         f"back {first_within(res, P0, SPEC[b], s2, len(res.ks))} drafts")
            print(line)


def load(seeds: int) -> None:
    table = synthetic_table(SPEC, P0)
    print("\nload (correct table; 1000 steps, every K x slow for 2000, 2000 back): K changes, "
          "median [min, max]")
    print(f"{'BS':>3} {'quiet':>14} {'1.5x':>14} {'0.67x':>14}")
    for b in SIZES:
        cols = []
        for slow in (1.0, 1.5, 0.67):
            moved = []
            for seed in range(seeds):
                res = simulate(AdaptiveKSelector(table), b, [Phase(1000, P0), Phase(2000, P0, slow=slow),
                                                             Phase(2000, P0)], SPEC[b], seed=seed)
                served = [k for k, probe in zip(res.ks, res.probe) if not probe]
                moved.append(sum(x != y for x, y in zip(served, served[1:])))
            cols.append(_spread(moved))
        print(f"{b:>3} {cols[0]:>14} {cols[1]:>14} {cols[2]:>14}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--before", action="store_true",
                    help=f"also run the selector of commit {BEFORE} (needs git)")
    args = ap.parse_args(argv)
    far, before = synthetic_table(FAR_TABLE, P0), args.before
    reach("far: table 15/21/25 ms, engine 33/88/140 ms, acceptance as profiled", far, FAR_TRUE, P0,
          args.seeds, before=before)
    reach("far: the same, acceptance lower (0.55, 0.45, 0.4, 0.35)", far, FAR_TRUE, LOW, args.seeds,
          before=before)
    spec = synthetic_table(SPEC, P0)
    for factor in (2.0, 0.5):
        true = {b: {k: r[0] + factor * (t - r[0]) for k, t in r.items()} for b, r in SPEC.items()}
        reach(f"{factor:g}x: speculative step time {factor:g}x the table's", spec, true, P0, args.seeds,
              before=before)
    recovery(args.seeds, before)
    load(args.seeds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
