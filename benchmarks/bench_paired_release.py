"""A paired sweep's wall time and engine time, one code tree against another, side by side.

Issue 45 part 3: the replay and jackknife of a paired group used to run inside the DSD engine's
worker after its last step, both engines alive and idle; since e8e01d0 they run beside the next
unit's waves and after the engines are released (e8e01d0 alone does not run: it carried half of
cff4b2e; time a1d87f6 or later). This runs ``dsdprof sweep`` of one spec once per
code tree (``--tree LABEL=PATH``: a ``git worktree`` of each commit, put first on ``PYTHONPATH``;
same venv, same working directory, back to back), and for each reports

* the sweep's wall time (the command, engine starts included),
* engine seconds: each engine process's life (spawned by the sweep, polled every 0.2 s), summed,
  and the span while any engine is alive,
* when the last row was written against when the last engine exited.

Run it under the vLLM lock (it starts engines)::

    flock /tmp/vllm.lock .venv/bin/python benchmarks/bench_paired_release.py \\
        --spec runs/vs-sweep-1206/spec.toml --out runs/release-bench \\
        --tree before=/tmp/wt-before --tree after=/tmp/wt-after
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def engine_env(tree: Path) -> dict[str, str]:
    """The issue-43 bench's engine environment (1 GiB CPU KV cache, no hub), ``tree``'s dsdprof, and
    engines started in turn (``DSDPROF_PRESTART_ENGINES=0``: trees before cff4b2e cannot start them
    side by side, so only the change timed differs)."""
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "DSDPROF_PRESTART_ENGINES": os.environ.get("DSDPROF_PRESTART_ENGINES", "0"),
            "PYTHONSAFEPATH": "1",  # no working directory on sys.path (this one's dsdprof): PYTHONPATH's
            "PYTHONPATH": str(tree) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH")
                                       else "")}


def _engines(proc: psutil.Process) -> list[psutil.Process]:
    """The sweep's engine workers: its children spawned by multiprocessing (not the resource tracker)."""
    out = []
    for c in proc.children():
        try:
            cmd = " ".join(c.cmdline())
        except psutil.Error:
            continue
        if "spawn_main" in cmd and "resource_tracker" not in cmd:
            out.append(c)
    return out


def run_one(label: str, tree: Path, spec: Path, out: Path) -> dict[str, float | str]:
    run = out / f"run-{label}"
    log = out / f"sweep-{label}.log"
    env = engine_env(tree)
    check = subprocess.run([sys.executable, "-c", "import dsdprof; print(dsdprof.__file__)"], env=env,
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert check.startswith(str(tree)), f"{label}: dsdprof imported from {check}, not {tree}"
    life: dict[int, list[float]] = {}  # engine pid -> [start, last seen]
    t0 = time.time()
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "dsdprof.cli", "sweep", str(spec), "--out", str(run)],
                                stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        ps = psutil.Process(proc.pid)
        while proc.poll() is None:
            now = time.time()
            try:
                for e in _engines(ps):
                    life.setdefault(e.pid, [e.create_time(), now])[1] = now
            except psutil.Error:
                pass
            time.sleep(0.2)
    t1 = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{label}: sweep exited {proc.returncode}, see {log}")
    parts = sorted(run.glob("part-*.parquet"))
    last_row = max(p.stat().st_mtime for p in parts)
    spans = list(life.values())
    return {"label": label, "tree": str(tree), "dsdprof": check, "rows": len(parts), "t0": t0,
            "wall_s": t1 - t0, "engines": len(spans),
            "engine_s_sum": sum(b - a for a, b in spans),
            "engine_span_s": max(b for _, b in spans) - min(a for a, _ in spans) if spans else 0.0,
            "first_engine_s": min(a for a, _ in spans) - t0 if spans else float("nan"),
            "engines_gone_s": max(b for _, b in spans) - t0 if spans else float("nan"),
            "last_row_s": last_row - t0, "load_start": os.getloadavg()[0]}


def table(results: list[dict[str, float | str]]) -> str:
    keys = [("wall_s", "sweep wall, s"), ("engine_span_s", "engines alive (span), s"),
            ("engine_s_sum", "engine-seconds (summed over engines)"),
            ("first_engine_s", "first engine spawned at, s"), ("engines_gone_s", "last engine gone at, s"),
            ("last_row_s", "last row written at, s")]
    lines = [f"{'':38}" + "".join(f"{str(r['label']):>12}" for r in results)
             + ("       ratio" if len(results) == 2 else "")]
    for k, name in keys:
        vals = [float(r[k]) for r in results]
        ratio = f"{vals[1] / vals[0]:12.3f}" if len(vals) == 2 and vals[0] else ""
        lines.append(f"{name:38}" + "".join(f"{v:12.1f}" for v in vals) + ratio)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tree", action="append", required=True, help="LABEL=PATH of a code tree (repeat)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    for item in a.tree:
        label, path = item.split("=", 1)
        results.append(run_one(label, Path(path).resolve(), a.spec.resolve(), a.out.resolve()))
        (a.out / "results.json").write_text(json.dumps(results, indent=1))
        print(f"{label}: {results[-1]}", flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
