"""A validate run side by side (docs/lab/notebook.md): read a ``dsdprof validate --adaptive`` run directory
and print, per batch size, tokens/s per user of every variant with the regrets and their 90 % intervals, using
dsdprof's own comparison and bootstrap (dsdprof.report.compare), plus the K the adaptive plugin served
per measured wave (from its step traces).

    PYTHONPATH=. python benchmarks/validate_side_by_side.py runs/v18-a [--repeat R] [--waves-from 4:4,16:2]

Regrets: vs the best fixed K (``regret``), vs the best of fixed K and vanilla (``oracle``), and adaptive
vs the static table (``vs static``); each is 1 - variant / reference, the interval from the paired
bootstrap over waves (``regret_intervals``). ``--repeat R`` restricts to one repeat (e.g. the repeat
after the plugin has moved).
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import pandas as pd

from dsdprof.report.compare import _clean, compare, regret_intervals


def _fmt(x: float, lo: float, hi: float) -> str:
    return f"{x * 100:+.1f} % [{lo * 100:+.0f}, {hi * 100:+.0f}]"


def table(df: pd.DataFrame) -> None:
    comp = compare(df)
    c = _clean(df)
    for _, r in comp.iterrows():
        b = int(r.batch_size)
        g = c[c.batch_size == b]
        fixed = g[g["mode"] == "fixed"]
        van, dsd, ada = (g[g["mode"] == m] for m in ("vanilla", "dsd", "adaptive"))
        if ada.empty:
            print(f"BS {b}: no adaptive row in this selection")
            continue
        ks = sorted(int(k) for k in fixed.num_spec_tokens.unique())
        tops = {k: fixed[fixed.num_spec_tokens == k].tops.median() for k in ks}
        best_fixed = fixed[fixed.num_spec_tokens == r.best_fixed_k]
        oracle_rows = van if r.tops_vanilla > r.tops_best_fixed else best_fixed
        oracle = "vanilla" if r.tops_vanilla > r.tops_best_fixed else f"K={int(r.best_fixed_k)}"
        (dlo, dhi), (alo, ahi) = regret_intervals(b, oracle_rows, [dsd, ada])
        ((vlo, vhi),) = regret_intervals(b, dsd, [ada])
        print(f"BS {b}: vanilla {r.tops_vanilla:.2f}  " + "  ".join(f"K={k} {tops[k]:.2f}" for k in ks)
              + f"  static {r.tops_dsd:.2f} (K {int(r.dsd_k)}, ran {r.dsd_k_observed:.2f})"
              + f"  adaptive {r.tops_adaptive:.2f} (ran {r.adaptive_k_observed:.2f})  [repeats "
              f"{int(r.repeats)}]")
        print(f"   vs best fixed K={int(r.best_fixed_k)}: static {_fmt(r.regret, r.regret_lo, r.regret_hi)}"
              f"  adaptive {_fmt(r.adaptive_regret, r.adaptive_regret_lo, r.adaptive_regret_hi)}")
        print(f"   vs best of fixed+vanilla ({oracle}): static {_fmt(r.regret_vs_oracle, dlo, dhi)}"
              f"  adaptive {_fmt(1 - r.tops_adaptive / max(r.tops_best_fixed, r.tops_vanilla), alo, ahi)}")
        print(f"   adaptive vs static: {_fmt(1 - r.tops_adaptive / r.tops_dsd, vlo, vhi)}")


def adaptive_ks(out: Path) -> None:
    """Per adaptive cell and measured wave: steps and request-drafts served at each K (the trace's drafted).
    Steps design (records carry ``arm``): only the steps that verified the plugin's own drafts (the
    record before them, same wave, ran arm -2), numbered among the plugin's own steps."""
    for path in sorted((out / "_traces").glob("adaptive-*.jsonl"), key=lambda p: p.stat().st_mtime):
        waves = collections.defaultdict(list)
        for line in path.read_text().splitlines():
            for rec in json.loads(line) if line.startswith("[") else [json.loads(line)]:
                waves[rec["wave"]].append(rec)
        parts, own_steps, first_move = [], 0, None
        for w, recs in sorted(waves.items()):
            if any("arm" in r for r in recs):
                recs = [r for p, r in zip(recs, recs[1:]) if p.get("arm") == -2]
            ks = [max(r["drafted"]) for r in recs if r["drafted"]]
            for k in ks:
                own_steps += 1
                if first_move is None and ks and k != ks[0] and w >= 0:
                    first_move = (w, own_steps, k)
            steps = collections.Counter(ks)
            parts.append(f"w{w}: " + ",".join(f"K{k}x{n}" for k, n in sorted(steps.items()))
                         + f" (first {ks[:3]})")
        print(path.stem, " | ".join(parts))
        if first_move is not None:
            print(f"   first K change in a measured wave: wave {first_move[0]}, own step {first_move[1]} -> "
                  f"K={first_move[2]}")


def kmix(out: Path, draws: int = 2000, seed: int = 0, waves_from: dict[int, int] | None = None) -> None:
    """Steps design only: every arm re-estimated with its tokens per request-step taken **per K from
    every arm's steps** (acceptance depends on the K verified, not on which arm chose it: the arms
    share the waves, their positions balanced), its step time still its own pure steps. Removes the
    step-to-step acceptance noise (1-5 tokens per request-step at BS 1) from same-K comparisons;
    intervals: 90 %, resampling waves (every arm of a wave together). ``waves_from``: batch size ->
    first measured wave kept (e.g. the waves after the plugin moved)."""
    import numpy as np

    from dsdprof.measure.vllm.trace import _verified_arms, read_trace, steady_steps

    names = {-2: "adaptive", -1: "static"}
    for path in sorted((out / "_traces").glob("*-steps-r*.jsonl")):
        b = int(path.stem.split("-bs")[1].split("-")[0])
        steps = read_trace(path)
        verified = _verified_arms(steps)
        steady, _ = steady_steps(steps, b)
        first = (waves_from or {}).get(b, 0)
        steady = [(s, dt) for s, dt in steady if s.wave >= first]
        waves = sorted({s.wave for s, _ in steady})
        arms = sorted({verified[id(s)] for s, _ in steady if verified[id(s)] is not None})
        ks = sorted({d for s, _ in steady for d in s.drafted})
        wi, ai, ki = ({w: i for i, w in enumerate(waves)}, {a: i for i, a in enumerate(arms)},
                      {k: i for i, k in enumerate(ks)})
        gen = np.zeros((len(waves), len(ks)))  # tokens generated per wave and K verified (all arms)
        req = np.zeros((len(waves), len(ks)))
        arm_req = np.zeros((len(waves), len(arms), len(ks)))  # request-steps per arm and K
        t = np.zeros((len(waves), len(arms)))  # pure step seconds and count per arm
        n = np.zeros((len(waves), len(arms)))
        for s, dt in steady:
            a = verified[id(s)]
            if a is None:
                continue
            w = wi[s.wave]
            for d, g in zip(s.drafted, s.generated):
                gen[w, ki[d]] += g
                req[w, ki[d]] += 1
                arm_req[w, ai[a], ki[d]] += 1
            if s.arm == a:
                t[w, ai[a]] += dt
                n[w, ai[a]] += 1
        rng = np.random.default_rng(seed)

        def goodput(idx, gen=gen, req=req, arm_req=arm_req, t=t, n=n):
            al_k = gen[idx].sum(0) / np.maximum(req[idx].sum(0), 1)
            ar = arm_req[idx].sum(0)
            al = (ar * al_k).sum(1) / np.maximum(ar.sum(1), 1)
            return al / (t[idx].sum(0) / np.maximum(n[idx].sum(0), 1))

        point = goodput(np.arange(len(waves)))
        boot = np.array([goodput(rng.integers(0, len(waves), len(waves))) for _ in range(draws)])
        fixed = [i for i, a in enumerate(arms) if a >= 0]
        best = max(fixed, key=lambda i: point[i])
        label = lambda a: names.get(a, f"K={a}")  # noqa: E731
        print(f"BS {b} (K-mix, {len(waves)} waves from wave {first}): "
              + "  ".join(f"{label(a)} {point[i]:.2f}" for i, a in enumerate(arms)))
        for x, ref in ((-1, best), (-2, best), (-2, ai.get(-1))):
            if x not in ai or ref is None:
                continue
            r = 1 - boot[:, ai[x]] / boot[:, ref]
            lo, hi = np.percentile(r, [5, 95])
            print(f"   {label(x)} vs {label(arms[ref])}: {(1 - point[ai[x]] / point[ref]) * 100:+.1f} % "
                  f"[{lo * 100:+.1f}, {hi * 100:+.1f}]")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--repeat", type=int)
    ap.add_argument("--waves-from", default="",
                    help="K-mix only: BS:first wave,... e.g. 4:4,16:2 (after the move)")
    a = ap.parse_args()
    df = pd.read_parquet(a.out)
    if a.repeat is not None:
        df = df[df.repeat == a.repeat]
    table(df)
    adaptive_ks(a.out)
    kmix(a.out, waves_from={int(b): int(w) for b, w in (x.split(":") for x in a.waves_from.split(",") if x)})


if __name__ == "__main__":
    main()
