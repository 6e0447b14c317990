"""Search toy-MoE designs with the analytic engine for the largest predicted rise-then-fall of K*.

    python benchmarks/moe_cpu_design.py --hardware cpu-calibrated.toml [--top 20]

``--hardware``: a profile from ``dsdprof probe-hardware`` / ``dsdprof calibrate`` (docs/lab/moe-cpu.md
used one calibrated on docs/lab/data/toy-moe-experts-cpu.parquet). For every design (target
layers, experts, top-k, expert FFN, dense first layer or not, conditional acceptance alpha) it
writes the toy's config.json pair (no weights) under --scratch, predicts BS x K with the sim
engine and scores the rise: the largest m such that for some b1 < b2 and k1 < k2, k1 beats k2 by
m at b1 and k2 beats k1 by m at b2 (the pairwise test of ``analyze``'s moe-like label, without
noise); the fall is the same test for a later, larger batch size and a smaller K.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from types import SimpleNamespace

BS = [1, 2, 4, 8, 16]
KS = [0, 1, 2, 3, 4]
TOK = SimpleNamespace(bos_token_id=0, eos_token_id=1, pad_token_id=2)


def config_dir(scratch: Path, L: int, E: int, k: int, F: int, dense_first: bool) -> Path:
    from dsdprof.measure.toy_models import _hf_config, toy_config

    d = scratch / f"L{L}E{E}k{k}F{F}d{int(dense_first)}"
    if not (d / "draft" / "config.json").exists():
        cfg = toy_config("moe", num_layers=L, num_experts=E, experts_per_token=k, moe_intermediate=F,
                         dense_first=dense_first)
        for name, n in (("target", L), ("draft", 1)):
            _hf_config(cfg, n, TOK).save_pretrained(str(d / name))
    return d


def goodput(hardware: str, d: Path, alpha: float) -> dict[tuple[int, int], float]:
    from dsdprof.config.spec import SweepSpec
    from dsdprof.formats.measurements import MODE_DSD
    from dsdprof.measure.engine import Cell
    from dsdprof.measure.sim.engine import SimEngine

    spec = SweepSpec.model_validate({
        "engine": {"name": "sim", "model": str(d / "target/config.json"),
                   "draft_model": str(d / "draft/config.json"),
                   "method": "draft_model", "dtype": "float32", "max_model_len": 512},
        "sweep": {"batch_sizes": BS, "num_spec_tokens": KS, "waves": 10, "output_len": 32},
        "workload": {"dataset": "synthetic", "input_len": 32},
        "sim": {"hardware": hardware, "acceptance_conditional": [alpha] * 4}})
    eng = SimEngine(spec)
    return {(b, k): eng.measure(Cell(0, b, MODE_DSD, k)).tokens_per_s_per_user for b in BS for k in KS}


def pairwise(g: dict[tuple[int, int], float], rising: bool, after: int = 0) -> tuple[float, tuple]:
    best, arg = 0.0, ()
    for i, b1 in enumerate(BS):
        for b2 in BS[i + 1:]:
            if b1 < after:
                continue
            for lo, hi in itertools.combinations(KS, 2):
                k1, k2 = (lo, hi) if rising else (hi, lo)
                m = min(g[(b1, k1)] / g[(b1, k2)], g[(b2, k2)] / g[(b2, k1)]) - 1
                if m > best:
                    best, arg = m, (b1, k1, b2, k2)
    return best, arg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", required=True)
    ap.add_argument("--scratch", default="/tmp/dsdprof-moe-design")
    ap.add_argument("--max-gb", type=float, default=2.6, help="largest fp32 expert total")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    rows = []
    for L, E, k, F, df, alpha in itertools.product([4, 6, 8], [16, 32, 64], [2, 4, 8], [512, 1024, 2048],
                                                   [False, True], [0.6, 0.7, 0.8]):
        gb = (L - int(df)) * E * 3 * 512 * F * 4 / 1e9
        if k > E // 2 or gb > a.max_gb:
            continue
        g = goodput(a.hardware, config_dir(Path(a.scratch), L, E, k, F, df), alpha)
        rise, rarg = pairwise(g, True)
        fall, farg = pairwise(g, False, after=rarg[2] if rarg else 0)
        kstar = [max(KS, key=lambda x: g[(b, x)]) for b in BS]
        rows.append((rise, fall, f"L{L} E{E} top-{k} F{F} dense_first={df} alpha={alpha} {gb:.2f} GB",
                     kstar, rarg, farg))
    rows.sort(key=lambda r: -r[0])
    for rise, fall, name, kstar, rarg, farg in rows[:a.top]:
        print(f"rise {rise * 100:4.1f}% fall {fall * 100:4.1f}%  {name}  K*={kstar}  rise at {rarg} "
              f"fall at {farg}")


if __name__ == "__main__":
    main()
