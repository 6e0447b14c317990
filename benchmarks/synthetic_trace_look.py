"""A trace-level look at synthetic acceptance on the real engine (docs/lab/synthetic-truth.md).

Reads the step traces ``benchmarks/bench_synthetic_truth.py --trace-dir DIR`` kept (one JSON-lines
file per cell) and prints, per trace, what the cells design keeps and what it leaves out:

* the request-steps of steady steps (:func:`dsdprof.measure.vllm.trace.steady_steps`) by the K
  they drafted, the ``k_next`` the steps scheduled, and any whose tokens are not ``accepted + 1``;
* AL (tokens per request-step) over the steady steps against the truth, with the binomial
  standard error; the same over every decoding request-step of the measured waves that drafted K;
* the unconditional acceptance by draft position (P(a > j)) and the conditional one
  (P(a > j | a >= j)) against the rates, each with its z;
* AL by the step's place in its wave (fifths of the wave's steady steps) and by the request's
  row in the step (quarters), each with its z;
* the dispersion of the per-step mean over its requests (variance over the binomial model's: 1
  when the requests of a step draw independently) and the lag-1 correlation of a request's
  accepted count from one step to its next.

    .venv/bin/python benchmarks/synthetic_trace_look.py --bs 64 DIR/*.jsonl
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RATES = [0.8, 0.6, 0.45, 0.3]


def _z(x: float, truth: float, se: float) -> str:
    return f"{(x - truth) / se:+.2f}" if se > 0 else "-"


def look(path: Path, bs: int, rates: list[float]) -> list[str]:
    """The tables of one cells trace (see the module docstring)."""
    from collections import Counter

    from dsdprof.decide.truth import implied_acceptance_length, step_variance
    from dsdprof.measure.vllm.trace import read_trace, steady_steps

    steps = read_trace(path)
    steady, excluded = steady_steps(steps, bs)
    drafted = Counter(d for s, _ in steady for d in s.drafted)
    k = drafted.most_common(1)[0][0] if drafted else 0
    lines = [f"## {path.name}: {len(steady)} steady steps, {excluded} excluded; drafted {dict(drafted)}; "
             f"k_next {dict(Counter(s.k_next for s, _ in steady))}"]
    if not k:
        return lines + ["no drafting steady step"]
    bad = sum(g != a + 1 for s, _ in steady for a, g in zip(s.accepted_counts(), s.generated))
    truth = implied_acceptance_length(rates, k)
    sd = math.sqrt(step_variance(rates, k))
    a_all = np.array([a for s, _ in steady for a in s.accepted_counts()])
    g_all = np.array([g for s, _ in steady for g in s.generated])
    n = len(g_all)
    al = g_all.mean()
    lines.append(f"tokens != accepted + 1: {bad}; steady AL {al:.4f} (truth {truth:.4f}, "
                 f"{100 * (al / truth - 1):+.3f} %, z {_z(al, truth, sd / math.sqrt(n))}, n {n})")
    every = [(d, g) for s in steps if s.wave >= 0 for d, g in zip(s.drafted, s.generated) if d == k]
    ge = np.array([g for _, g in every], dtype=float)
    if len(ge):
        z = _z(ge.mean(), truth, sd / math.sqrt(len(ge)))
        lines.append(f"every decoding request-step drafting {k} of the measured waves: AL {ge.mean():.4f} "
                     f"({100 * (ge.mean() / truth - 1):+.3f} %, z {z}, n {len(ge)})")
    cond = [rates[0]] + [rates[j] / rates[j - 1] for j in range(1, k)]
    lines += ["| position | P(a > j) | rate | z | P(a > j given a >= j) | conditional | z |",
              "|---|---|---|---|---|---|---|"]
    for j in range(k):
        p = float((a_all > j).mean())
        se = math.sqrt(rates[j] * (1 - rates[j]) / n)
        m = int((a_all >= j).sum())
        q = float((a_all > j).sum() / m) if m else math.nan
        se_c = math.sqrt(cond[j] * (1 - cond[j]) / m) if m else 0.0
        lines.append(f"| {j + 1} | {p:.4f} | {rates[j]:.4f} | {_z(p, rates[j], se)} | {q:.4f} "
                     f"| {cond[j]:.4f} | {_z(q, cond[j], se_c)} |")
    by_wave: dict[int, list] = {}
    for s, _ in steady:
        by_wave.setdefault(s.wave, []).append(s)
    place: dict[int, list[int]] = {f: [] for f in range(5)}
    row: dict[int, list[int]] = {q: [] for q in range(4)}
    means, lag = [], []
    for ws in by_wave.values():
        prev: dict[str, int] = {}
        for i, s in enumerate(ws):
            place[min(4, 5 * i // len(ws))] += list(s.generated)
            for r, g in enumerate(s.generated):
                row[min(3, 4 * r // max(1, len(s.generated)))].append(g)
            means.append(float(np.mean(s.generated)))
            for rid, a in zip(s.ids, s.accepted_counts()):
                if rid in prev:
                    lag.append((prev[rid], a))
                prev[rid] = a
    lines += ["| part | AL | AL/true - 1 | z | request-steps |", "|---|---|---|---|---|"]
    for name, groups in (("wave fifth", place), ("row quarter", row)):
        for key, gs in groups.items():
            if gs:
                m = float(np.mean(gs))
                lines.append(f"| {name} {key + 1} | {m:.4f} | {100 * (m / truth - 1):+.3f} % | "
                             f"{_z(m, truth, sd / math.sqrt(len(gs)))} | {len(gs)} |")
    disp = float(np.var(means, ddof=1) / (sd ** 2 / bs)) if len(means) > 1 else math.nan
    corr = float(np.corrcoef(np.array(lag).T)[0, 1]) if len(lag) > 2 else math.nan
    lines.append(f"per-step mean's dispersion {disp:.3f} (SE {math.sqrt(2 / max(1, len(means) - 1)):.3f}); "
                 f"lag-1 correlation of a request's accepted count {corr:+.4f} "
                 f"(SE {1 / math.sqrt(max(1, len(lag))):.4f}, {len(lag)} pairs)")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", type=Path, nargs="+")
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=RATES)
    args = ap.parse_args()
    for p in args.traces:
        print("\n".join(look(p, args.bs, args.rates)))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
