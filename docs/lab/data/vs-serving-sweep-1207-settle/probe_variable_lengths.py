"""Probe: vanilla and one fixed-K server at BS 16 with VARIABLE output lengths, so that vanilla's
requests desynchronise too (with every request 128 tokens, vanilla's 16 stay in lockstep and
prefill together once a cycle, while speculative requests drift apart and each arrival's prefill
lands in a decode step). Same client shape as the bench (W x 16 requests, the first wave guidellm's
warm-up), output tokens ~ N(128, 32) clipped to [64, 192] (guidellm's synthetic data, its fixed
seed: the same lengths on both servers). Run under the engine lock:

    flock /tmp/vllm.lock python probe_variable_lengths.py OUT [K] [REPEATS] [WAVES]

Uses benchmarks/bench_vs_serving_sweep.py's server machinery from BENCH_ROOT (a checkout or a
``git archive`` snapshot; default: the checkout this file lies in, found by walking up to the
bench). STOP_BY (epoch s): no run starts that would end after it (the longest run so far is the
estimate). The servers run in their own sessions: their pids are in OUT/servers.json while they
live, so a watchdog can kill their groups if this process is killed without its ``finally``.

Dry check without engines: PROBE_DRY=PORT points both variants at a server already on PORT
(``guidellm mock-server --port PORT --model toy``) and starts nothing.
"""
import importlib.util
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

BENCH = Path("benchmarks") / "bench_vs_serving_sweep.py"


def bench_root() -> Path:
    """BENCH_ROOT, else the nearest directory above this file holding the bench (the first launch
    indexed parents[4] eagerly, an IndexError when this file was copied to /tmp)."""
    if "BENCH_ROOT" in os.environ:
        root = Path(os.environ["BENCH_ROOT"]).resolve()
    else:
        up = Path(__file__).resolve().parents
        root = next((p for p in up if (p / BENCH).is_file()), Path("/nonexistent"))
    if not (root / BENCH).is_file():
        sys.exit(f"BENCH_ROOT: {root} has no {BENCH} (set BENCH_ROOT to a checkout)")
    return root


root = bench_root()
spec_ = importlib.util.spec_from_file_location("bench", root / BENCH)
b = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(b)
if len(sys.argv) < 2:
    sys.exit(__doc__)
out = Path(sys.argv[1]).resolve()
k = int(sys.argv[2]) if len(sys.argv) > 2 else 2
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 2
waves = int(sys.argv[4]) if len(sys.argv) > 4 else 4
stop_by = float(os.environ.get("STOP_BY", "0"))  # epoch s: no run starts that would end after it
dry = int(os.environ.get("PROBE_DRY", "0"))
(out / "logs").mkdir(parents=True, exist_ok=True)
(out / "guidellm").mkdir(exist_ok=True)
spec = tomllib.loads((root / "sweeps" / "toy-dense-cpu.toml").read_text())
spec["sweep"]["batch_sizes"] = [16]
e = spec["engine"]
if dry:
    servers = [SimpleNamespace(name=n, port=dry, stop=lambda: None) for n in ("vanilla", f"fixed-{k}")]
else:
    table = b.fixed_table(k, e["model"], e.get("draft_model", ""), e["method"], 16)
    servers = [b.make_server("vanilla", None, spec, 8121, out),
               b.make_server(f"fixed-{k}", table, spec, 8122, out)]
tok = str((root / e["model"]).resolve())
data = "kind=synthetic_text,prompt_tokens=32,output_tokens=128,output_tokens_stdev=32," \
       "output_tokens_min=64,output_tokens_max=192"
rows = []
print(f"root {root}; out {out}; K {k}, {repeats} repeats, {waves} waves; load {os.getloadavg()[0]:.2f}"
      + (f"; DRY against :{dry}" if dry else ""), flush=True)
try:
    t0 = time.time()
    if not dry:
        for s in servers:  # pids first, so a watchdog finds servers still starting
            s.start()
        (out / "servers.json").write_text(json.dumps({s.name: s.proc.pid for s in servers}))
        for s in servers:
            s.wait_ready()
            print(f"server {s.name} ready on :{s.port} after {s.start_s:.0f} s", flush=True)
    print(f"started in {time.time() - t0:.0f} s", flush=True)
    longest = 0.0
    for r in range(repeats):
        for s in (servers if r % 2 == 0 else servers[::-1]):
            if stop_by and time.time() + longest > stop_by:
                print(f"r{r} {s.name}: not started (stop-by)", flush=True)
                continue
            path = out / "guidellm" / f"probe-{s.name}-r{r}.json"
            argv = ["taskset", "-c", "1", str(b.GUIDELLM), "run",
                    "--backend", json.dumps({"kind": "openai_http", "target": f"http://127.0.0.1:{s.port}",
                                             "model": "toy", "request_format": "/v1/completions",
                                             "extras": {"body": {"temperature": 0.0}}}),
                    "--profile", json.dumps(b.client_profile([16], 1.0 / waves)),
                    "--constraint", json.dumps({"kind": "min_requests", "count": [waves * 16]}),
                    "--data", data, "--tokenizer", f"kind=huggingface_auto,model={tok}",
                    "--output", f"kind=json,path={path}", "--disable-console-interactive"]
            t1, load1 = time.time(), os.getloadavg()[0]
            with path.with_suffix(".log").open("w") as log:
                env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
                rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=root, env=env).returncode
            longest = max(longest, time.time() - t1)
            p = b.read_guidellm(path)[0] if rc == 0 else None
            rows.append({"variant": s.name, "repeat": r, "rc": rc,
                         "start_utc": time.strftime("%H:%M:%S", time.gmtime(t1)),
                         "wall_s": round(time.time() - t1, 1), "tok_s": p.output_tok_s if p else None,
                         "load_start": load1, "load_end": os.getloadavg()[0]})
            print(json.dumps(rows[-1]), flush=True)
            (out / "probe.json").write_text(json.dumps(rows, indent=1))
finally:
    for s in servers:
        s.stop()
    if not dry:
        (out / "servers.json").unlink(missing_ok=True)
    print(f"servers stopped {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
