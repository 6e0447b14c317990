"""Probe: vanilla and one fixed-K server at BS 16 with VARIABLE output lengths, so that vanilla's
requests desynchronise too (with every request 128 tokens, vanilla's 16 stay in lockstep and
prefill together once a cycle, while speculative requests drift apart and each arrival's prefill
lands in a decode step). Same client shape as the bench (W x 16 requests, the first wave guidellm's
warm-up), output tokens ~ N(128, 32) clipped to [64, 192] (guidellm's synthetic data, its fixed
seed: the same lengths on both servers). Run under the engine lock:

    flock /tmp/vllm.lock python probe_variable_lengths.py OUT [K] [REPEATS] [WAVES]

Uses benchmarks/bench_vs_serving_sweep.py's server machinery (BENCH_ROOT: its checkout).
"""
import importlib.util
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

root = Path(os.environ["BENCH_ROOT"]) if "BENCH_ROOT" in os.environ else Path(__file__).resolve().parents[4]
spec_ = importlib.util.spec_from_file_location("bench", root / "benchmarks" / "bench_vs_serving_sweep.py")
b = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(b)
out = Path(sys.argv[1]).resolve()
k = int(sys.argv[2]) if len(sys.argv) > 2 else 2
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 2
waves = int(sys.argv[4]) if len(sys.argv) > 4 else 4
stop_by = float(os.environ.get("STOP_BY", "0"))  # epoch s: no run starts that would end after it
(out / "logs").mkdir(parents=True, exist_ok=True)
(out / "guidellm").mkdir(exist_ok=True)
spec = tomllib.loads((root / "sweeps" / "toy-dense-cpu.toml").read_text())
spec["sweep"]["batch_sizes"] = [16]
e = spec["engine"]
servers = [b.make_server("vanilla", None, spec, 8121, out),
           b.make_server(f"fixed-{k}", b.fixed_table(k, e["model"], e.get("draft_model", ""), e["method"], 16),
                         spec, 8122, out)]
tok = str((root / e["model"]).resolve())
data = "kind=synthetic_text,prompt_tokens=32,output_tokens=128,output_tokens_stdev=32," \
       "output_tokens_min=64,output_tokens_max=192"
rows = []
try:
    t0 = time.time()
    b.start_all(servers, at_once=2)
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
            t1 = time.time()
            with path.with_suffix(".log").open("w") as log:
                rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=root,
                                    env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}).returncode
            longest = max(longest, time.time() - t1)
            p = b.read_guidellm(path)[0] if rc == 0 else None
            rows.append({"variant": s.name, "repeat": r, "rc": rc, "wall_s": time.time() - t1,
                         "tok_s": p.output_tok_s if p else None, "load": os.getloadavg()[0]})
            print(json.dumps(rows[-1]), flush=True)
            (out / "probe.json").write_text(json.dumps(rows, indent=1))
finally:
    for s in servers:
        s.stop()
