"""Issue 18 side by side (docs/measured.md): read a ``dsdprof validate --adaptive`` run directory and print,
per batch size, tokens/s per user of every variant with the regrets and their 90 % intervals, using
dsdprof's own comparison and bootstrap (dsdprof.report.compare), plus the K the adaptive plugin served
per measured wave (from its step traces).

    PYTHONPATH=. python benchmarks/issue18_side_by_side.py runs/v18-a [--repeat R]

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
        oracle_rows = van if r.tops_vanilla > r.tops_best_fixed else fixed[fixed.num_spec_tokens == r.best_fixed_k]
        oracle = "vanilla" if r.tops_vanilla > r.tops_best_fixed else f"K={int(r.best_fixed_k)}"
        (dlo, dhi), (alo, ahi) = regret_intervals(b, oracle_rows, [dsd, ada])
        ((vlo, vhi),) = regret_intervals(b, dsd, [ada])
        print(f"BS {b}: vanilla {r.tops_vanilla:.2f}  " + "  ".join(f"K={k} {tops[k]:.2f}" for k in ks)
              + f"  static {r.tops_dsd:.2f} (K {int(r.dsd_k)}, ran {r.dsd_k_observed:.2f})"
              + f"  adaptive {r.tops_adaptive:.2f} (ran {r.adaptive_k_observed:.2f})  [repeats {int(r.repeats)}]")
        print(f"   vs best fixed K={int(r.best_fixed_k)}: static {_fmt(r.regret, r.regret_lo, r.regret_hi)}"
              f"  adaptive {_fmt(r.adaptive_regret, r.adaptive_regret_lo, r.adaptive_regret_hi)}")
        print(f"   vs best of fixed+vanilla ({oracle}): static {_fmt(r.regret_vs_oracle, dlo, dhi)}"
              f"  adaptive {_fmt(1 - r.tops_adaptive / max(r.tops_best_fixed, r.tops_vanilla), alo, ahi)}")
        print(f"   adaptive vs static: {_fmt(1 - r.tops_adaptive / r.tops_dsd, vlo, vhi)}")


def adaptive_ks(out: Path) -> None:
    """Per adaptive cell and measured wave: steps and request-drafts served at each K (the trace's drafted)."""
    for path in sorted((out / "_traces").glob("adaptive-*.jsonl"), key=lambda p: p.stat().st_mtime):
        waves = collections.defaultdict(list)
        for line in path.read_text().splitlines():
            for rec in json.loads(line) if line.startswith("[") else [json.loads(line)]:
                waves[rec["wave"]].append(rec)
        parts = []
        for w, recs in sorted(waves.items()):
            steps = collections.Counter(max(r["drafted"]) for r in recs if r["drafted"])
            first = [max(r["drafted"]) for r in recs if r["drafted"]][:3]
            parts.append(f"w{w}: " + ",".join(f"K{k}x{n}" for k, n in sorted(steps.items())) + f" (first {first})")
        print(path.stem, " | ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--repeat", type=int)
    a = ap.parse_args()
    df = pd.read_parquet(a.out)
    if a.repeat is not None:
        df = df[df.repeat == a.repeat]
    table(df)
    adaptive_ks(a.out)


if __name__ == "__main__":
    main()
