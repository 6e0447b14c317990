"""The variable-length probe, read: vanilla against fixed-K at BS 16 by guidellm, and each server's
decode step from its SSE chunk times.

    python probe_analysis.py [GDIR] [GLOB]

GDIR: the probe's guidellm reports (default /tmp/h4s7/probe/guidellm; not committed, ~2 MB each),
GLOB: which (default ``probe-*-r*.json``; ``baseline-g0-*-r*.json`` reads the settle run's group 0,
fixed lengths, the same way). The sweep's figures (K's step and AL against vanilla's step, BS 16)
come from the settle run's results.json and step rows (../vs-serving-sweep-1207-settle/).

Per run (one server, one repeat): guidellm's headline tok/s (output_tokens_per_second, total, over
its window after the warm-up wave) and the same window recounted from the chunk times (each request's
tokens spread evenly over its chunks); for the requests wholly inside the window: client AL =
sum(tokens - 1) / sum(decode chunks) (chunks - 3: first token, finish, usage), the decode step =
sum(last chunk - first chunk) / sum(decode chunks), TTFT, latency; the first wave's step (the first 16
requests, started together) and the later requests' step (all completed requests after them).
The lengths each server got (max_tokens, completed and cut-off requests alike) are compared across a
repeat's pair: guidellm's fixed seed should give both the same multiset.

Then per repeat the pair fixed-K / vanilla, and over the repeats the mean with a 90 % t interval
(2 repeats: t = 6.31, one degree of freedom; the interval is wide and said so), the step factor
(sweep step ratio K/vanilla over the client's: 1 = the server steps as the sweep's engine did) and
the chain sweep speedup x AL ratio x step factor = the client's decode speedup.
"""
import json
import re
import statistics as st
import sys
from pathlib import Path

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
SETTLE = HERE.parent / "vs-serving-sweep-1207-settle"
GDIR = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/h4s7/probe/guidellm")
GLOB = sys.argv[2] if len(sys.argv) > 2 else "probe-*-r*.json"
BS = 16
T90 = {2: 6.314, 3: 2.920, 4: 2.353, 5: 2.132, 6: 2.015}
res = json.loads((SETTLE / "results.json").read_text())
cells = {(c["batch_size"], c["k"]): c for c in res["tables"]["dsdprof"]["cells"]}
run_dir = SETTLE / "dsdprof-run"
van_rows = pq.read_table(next(run_dir.glob(f"*-vanilla-bs{BS}-k0-r0.parquet")), columns=["itl_s"])
van_step = van_rows.column(0)[0].as_py()


def ci(xs: list[float]) -> str:
    m = st.fmean(xs)
    if len(xs) < 2:
        return f"{m:.3f}"
    h = T90.get(len(xs), 1.9) * st.stdev(xs) / len(xs) ** 0.5
    return f"{m:.3f} [{m - h:.3f}, {m + h:.3f}]"


def per_run(path: Path) -> dict:
    b = json.loads(path.read_text())["benchmarks"][0]
    sm = b["scheduler_metrics"]
    w0, w1 = sm["measure_start_time"], sm["measure_end_time"]
    tok, inside, done, lengths = 0.0, [], [], []
    for status in ("successful", "incomplete"):
        for r in b["requests"][status]:
            t = r["info"]["timings"]
            lengths.append(json.loads(r["request_args"])["body"]["max_tokens"])
            n = (r.get("output_metrics") or {}).get("text_tokens") or 0
            a, z = t.get("first_request_iteration"), t.get("last_request_iteration")
            if not n or a is None or z is None:
                continue
            if z <= a:
                tok += n * (w0 <= z <= w1)
            else:  # tokens spread evenly over the request's chunks: the part inside the window
                tok += n * max(0.0, min(z, w1) - max(a, w0)) / (z - a)
            if status != "successful":
                continue
            row = dict(n=n, steps=t["request_iterations"] - 3, dec=z - a, ttft=a - t["request_start"],
                       lat=t["request_end"] - t["request_start"], start=t["request_start"])
            done.append(row)
            if t["request_start"] >= w0 and t["request_end"] <= w1:
                inside.append(row)
    done.sort(key=lambda x: x["start"])

    def step(g: list[dict]) -> float:
        return sum(x["dec"] for x in g) / sum(x["steps"] for x in g)

    return dict(tot=b["metrics"]["output_tokens_per_second"]["total"]["mean"], own=tok / (w1 - w0),
                window=w1 - w0, warm=b["warmup_duration"], n=len(inside),
                len_in=st.fmean(x["n"] for x in inside), lengths=sorted(lengths),
                al=sum(x["n"] - 1 for x in inside) / sum(x["steps"] for x in inside), step=step(inside),
                step1=step(done[:BS]), step2=step(done[BS:]), ttft=st.fmean(x["ttft"] for x in inside),
                ttft1=st.fmean(x["ttft"] for x in done[:BS]), lat=st.fmean(x["lat"] for x in inside))


runs: dict[tuple[str, int], dict] = {}
for p in sorted(GDIR.glob(GLOB)):
    m = re.fullmatch(r"(?:probe|baseline-g\d+)-(.+)-r(\d+)", p.stem)
    if m:
        runs[(m[1], int(m[2]))] = per_run(p)
if not runs:
    sys.exit(f"no guidellm report {GLOB} in {GDIR}")
print(f"{GDIR.name}/{GLOB}, BS {BS}; sweep vanilla step {van_step:.4f} s")
print("per run: guidellm tok/s (own recount), window s (warm-up s), requests inside (their mean length),")
print("client AL, decode step s: inside / first wave / later (later/first), TTFT s (first wave's), latency s")
for (v, r), x in sorted(runs.items()):
    print(f"  {v:8s} r{r}  {x['tot']:5.1f} ({x['own']:5.1f})  {x['window']:5.1f} ({x['warm']:4.1f})  "
          f"{x['n']:2d} ({x['len_in']:5.1f})  {x['al']:5.3f}  {x['step']:.4f} / {x['step1']:.4f} / "
          f"{x['step2']:.4f} ({x['step2'] / x['step1']:.3f})  {x['ttft']:4.2f} ({x['ttft1']:4.2f})  "
          f"{x['lat']:5.2f}")
for v in sorted({v for v, _ in runs} - {"vanilla"}):
    k = int(v.removeprefix("fixed-"))
    reps = sorted(r for vv, r in runs if vv == v and ("vanilla", r) in runs)
    if not reps:
        continue
    c = cells[(BS, k)]
    print(f"\n{v} / vanilla, paired by repeat ({len(reps)}; 90 % t interval):")
    for r in reps:
        a, z = runs[(v, r)], runs[("vanilla", r)]
        same = "same" if a["lengths"] == z["lengths"] else \
            f"DIFFER ({len(a['lengths'])} vs {len(z['lengths'])})"
        print(f"  r{r}: guidellm {a['tot'] / z['tot']:.3f}, own {a['own'] / z['own']:.3f}; lengths {same}, "
              f"mean max_tokens {st.fmean(a['lengths']):.1f}")
    sp = [runs[(v, r)]["tot"] / runs[("vanilla", r)]["tot"] for r in reps]
    own = [runs[(v, r)]["own"] / runs[("vanilla", r)]["own"] for r in reps]
    sf = [(c["itl_s"] / van_step) / (runs[(v, r)]["step"] / runs[("vanilla", r)]["step"]) for r in reps]
    al = st.fmean(runs[(v, r)]["al"] for r in reps)
    sweep = c["acceptance_length"] / c["itl_s"] * van_step
    dec = st.fmean(runs[(v, r)]["al"] / runs[(v, r)]["step"] * runs[("vanilla", r)]["step"] for r in reps)
    lf = {vv: st.fmean(runs[(vv, r)]["step2"] / runs[(vv, r)]["step1"] for r in reps)
          for vv in (v, "vanilla")}
    rel_k = ", ".join(f"{runs[(v, r)]['step'] / c['itl_s']:.3f}" for r in reps)
    rel_v = ", ".join(f"{runs[('vanilla', r)]['step'] / van_step:.3f}" for r in reps)
    sfs = ", ".join(f"{x:.3f}" for x in sf)
    print(f"  step factor per repeat {sfs}; sweep steps: {v} {c['itl_s']:.4f} s,"
          f" vanilla {van_step:.4f} s; client steady step / sweep's: {v} {rel_k}, vanilla {rel_v}")
    print(f"  guidellm x vanilla {ci(sp)}; own recount {ci(own)}")
    c_al = c["acceptance_length"]
    print(f"  sweep {sweep:.3f} x AL {al / c_al:.3f} ({al:.3f}/{c_al:.3f})"
          f" x step factor {ci(sf)} = decode {dec:.3f}")
    print(f"  later/first step: {v} {lf[v]:.3f}, vanilla {lf['vanilla']:.3f}")
