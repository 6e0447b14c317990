"""AdaptiveKSelector's own cost, today's next to a git revision's, side by side in one process.

    python benchmarks/bench_selector_before.py --before REV

The selector modules of REV (``dsdprof/serve/{adaptive,stats,profile,runtime}.py``, from ``git
show``) are imported under other names beside today's. Both run the same recorded-shaped steps on
the committed frozen demo table (tests/data/toy-dense-cpu-2026-12-06.json, 5 batch sizes x K 0-4):

* **step**: ``observe_step()`` + ``observe()`` per engine step (20 % untimed mixed steps, K 2-4,
  acceptance drawn at the table's profile), no periodic rebuild: what the serving plugin calls on
  every step;
* **rebuild**: one ``rebuild()`` (every ``rebuild_every`` = 32 steps in serving) after 1,000 steps.

Blocks alternate between the two (order flipped each round); the report is the median over
rounds of the paired ratio today / REV, so a load that moves during the run moves both.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("profile", "runtime", "stats", "adaptive")


def before_selector(rev: str, tmp: str) -> type:
    """REV's AdaptiveKSelector, its dsdprof.serve imports pointed at REV's copies."""
    pkg = Path(tmp, "_before_serve")
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for mod in MODULES:
        text = subprocess.run(["git", "show", f"{rev}:dsdprof/serve/{mod}.py"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        (pkg / f"{mod}.py").write_text(text.replace("dsdprof.serve.", "_before_serve."))
    sys.path.insert(0, tmp)
    try:
        return importlib.import_module("_before_serve.adaptive").AdaptiveKSelector
    finally:
        sys.path.remove(tmp)


def workload(n: int, seed: int = 0) -> tuple[dict, list]:
    table = json.loads((ROOT / "tests/data/toy-dense-cpu-2026-12-06.json").read_text())
    itl = {(c["batch_size"], c["k"]): c["itl_s"] for c in table["cells"]}
    p0 = table["acceptance_per_pos"]  # drafts accepted as profiled: no shift, no extra rebuild
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        b, k = rng.choice([1, 2, 4, 8, 16]), rng.choice([2, 3, 4])
        mixed = rng.random() < 0.2
        accepted, alive, prev = [], b, 1.0
        for p in p0[:k]:
            alive = sum(rng.random() < p / prev for _ in range(alive))
            accepted.append(alive)
            prev = p
        steps.append((b, None if mixed else k, None if mixed else itl[(b, k)] * rng.lognormvariate(0, 0.1),
                      accepted))
    return table, steps


def per_step(cls: type, table: dict, steps: list) -> float:
    sel = cls(table, max_k=4, rebuild_every=10**9)
    observe_step, observe = sel.observe_step, sel.observe
    t0 = time.perf_counter_ns()
    for b, k, s, acc in steps:
        observe_step(b, k, s)
        observe(b, acc, None, b)
    return (time.perf_counter_ns() - t0) / len(steps)


def per_rebuild(cls: type, table: dict, steps: list, reps: int = 200) -> float:
    sel = cls(table, max_k=4, rebuild_every=10**9)
    for b, k, s, acc in steps[:1000]:
        sel.observe_step(b, k, s)
        sel.observe(b, acc, None, b)
    t0 = time.perf_counter_ns()
    for _ in range(reps):
        sel._itl.dirty.add(0)  # one batch size observed since the last rebuild, as in serving
        sel.rebuild()
    return (time.perf_counter_ns() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, metavar="REV", help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=21, help="paired blocks per measurement")
    ap.add_argument("--steps", type=int, default=4000, help="engine steps per block")
    args = ap.parse_args()
    from dsdprof.serve.adaptive import AdaptiveKSelector as Today

    table, steps = workload(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        before = before_selector(args.before, tmp)
        for name, fn in (("step", per_step), ("rebuild", per_rebuild)):
            got: dict[str, list[float]] = {"today": [], "before": []}
            for r in range(args.rounds):
                pair = (("today", Today), ("before", before))
                for who, cls in (pair if r % 2 else pair[::-1]):
                    got[who].append(fn(cls, table, steps))
            ratio = statistics.median(a / b for a, b in zip(got["today"], got["before"]))
            print(f"{name:8s} today {statistics.median(got['today']) / 1000:7.2f} us   "
                  f"{args.before} {statistics.median(got['before']) / 1000:7.2f} us   "
                  f"today / before {ratio:.3f} (median of {args.rounds} paired blocks)")


if __name__ == "__main__":
    main()
