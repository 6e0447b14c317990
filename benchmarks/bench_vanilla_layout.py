"""Vanilla beside its paired group: the layout now against the one before, on a drifting fake machine.

The sweep loop and :class:`~dsdprof.measure.vllm.engine.VllmEngine` run over the fake engine workers
of ``tests/measure/test_paired_vanilla.py`` (no vLLM): one machine clock for both engines whose log
speed is a random walk (``walk`` a wave) plus a ``trend`` a wave, each wave with 1 % noise of its
own; Ks 0-2 at BS 1 and 4. Per (waves, repeats, walk, trend): the share of ``analyze``'s speedup
intervals (vanilla vs the chosen K) holding the truth, their median width / truth and the point's
mean and rms log error, for

* ``before``: ``ceil(waves / len(Ks))`` vanilla waves (one at fewer waves than Ks), block ``j`` of
  the group and vanilla wave ``j`` in turn, the group first in every other block;
* ``now``: :func:`dsdprof.measure.engine.unit_layout` (at least two vanilla waves, the unit a
  palindrome).

    python benchmarks/bench_vanilla_layout.py [--seeds 40] [--sets 3x2:0.02:0,3x1:0.02:0.02]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETS = ("12x2:0.02:0,3x2:0.02:0,3x1:0.02:0,3x2:0.02:0.02,3x1:0.02:0.02,2x2:0.02:0,1x2:0.02:0,"
        "5x2:0.02:0,5x2:0.02:0.02")


def layout_before(waves: int, group_size: int, rot: int = 0):
    from dsdprof.measure.engine import UnitLayout, wave_blocks

    blocks = wave_blocks(waves, max(1, math.ceil(waves / max(1, group_size))))
    spans: list[tuple[bool, int, int]] = []
    for j, r in enumerate(blocks):
        pair = [(True, r.start, r.stop), (False, j, j + 1)]
        spans += pair if (j + rot) % 2 == 0 else pair[::-1]
    return UnitLayout(tuple(blocks), tuple(range(len(blocks))), tuple(spans))


def one_set(waves: int, repeats: int, walk: float, trend: float, seeds: range) -> tuple[int, int, list, list]:
    from dsdprof.decide.analysis import analyze
    from dsdprof.measure.runner import run_sweep
    from tests.measure.test_paired_vanilla import AL, ITL, VANILLA_ITL, Machine, make_engine, read

    covered = known = 0
    widths, errors = [], []
    for seed in seeds:
        d = Path(tempfile.mkdtemp(prefix="vanilla-layout-"))
        spec, eng = make_engine(d, Machine(seed=seed, walk=walk, trend=trend), waves=waves, repeats=repeats)
        run_sweep(spec, d / "out", engine=eng)
        for p in analyze(read(d / "out"), replicates=1000).optimal.itertuples():
            truth = AL[p.k] / ITL[p.k] * VANILLA_ITL
            errors.append(math.log(p.speedup_vs_baseline / truth))
            if not math.isnan(p.speedup_low):
                known += 1
                covered += p.speedup_low <= truth <= p.speedup_high
                widths.append((p.speedup_high - p.speedup_low) / truth)
    return covered, known, widths, errors


def main(argv: list[str] | None = None) -> int:
    import dsdprof.measure.vllm.engine as vllm_engine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--sets", default=SETS, help="WAVESxREPEATS:WALK:TREND, comma-separated")
    a = ap.parse_args(argv)
    now = vllm_engine.unit_layout
    for item in a.sets.split(","):
        shape, walk, trend = item.split(":")
        waves, repeats = (int(x) for x in shape.split("x"))
        for name, layout in (("before", layout_before), ("now", now)):
            vllm_engine.unit_layout = layout  # what the engine's unit_requests calls
            cov, known, widths, errors = one_set(waves, repeats, float(walk), float(trend), range(a.seeds))
            e = np.array(errors)
            width = f"{np.median(widths):.3f}" if widths else "-"
            print(f"{waves:2d} waves x {repeats} repeats, walk {walk} trend {trend}, {name:6s}: "
                  f"covered {cov}/{known} of {e.size}, width {width}, error mean {e.mean():+.4f} "
                  f"rms {np.sqrt((e ** 2).mean()):.4f}", flush=True)
    vllm_engine.unit_layout = now
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
