"""BS 16 settled: guidellm at several waves (its warm-up excluded) against the step trace, per server.

Reads the raw guidellm reports of the settling run (``GDIR``, default /tmp/h1s7/settle/guidellm;
not committed: ~2 MB each), results.json beside this script (``RES``) and the sweep's rows
(``RUN``, the vanilla engine's step). Per guidellm run (one server, one repeat), BS 16:

* ``tok/s``: guidellm's headline (output_tokens_per_second, total), over its measured window
  (after the warm-up wave); ``own``: the same window recounted from SSE chunk times (each request's
  128 tokens spread evenly over its chunks, not over guidellm's text-bearing iterations, which the
  toy model's empty tokens shift): a check on guidellm's own figure.
* for the requests wholly inside the window: client AL = 127 / decode steps (chunks - 3: the first
  token, finish and usage chunks), the client's decode step = (last chunk - first chunk) / steps,
  TTFT to the first chunk, and the mean request latency.

Then per variant over the repeats: the speedup over its group's vanilla in the same repeat (mean,
90 % t interval), and the chain against the sweep: sweep goodput ratio x (client AL / sweep AL) x
step factor = client decode ratio, where the step factor = (sweep step_K / sweep step_vanilla) /
(client step_K / client step_vanilla): 1 where the server steps as the sweep's engine did.
"""
import json
import os
import statistics as st
import sys
from pathlib import Path

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
GDIR = Path(os.environ.get("GDIR", "/tmp/h1s7/settle/guidellm"))
RES = Path(os.environ.get("RES", HERE / "results.json"))
RUN = Path(os.environ.get("RUN", HERE / "dsdprof-run"))
BS = int(os.environ.get("BS", "16"))
T90 = {2: 6.314, 3: 2.920, 4: 2.353, 5: 2.132, 6: 2.015}
res = json.loads(RES.read_text())
cells = {(c["batch_size"], c["k"]): c for c in res["tables"]["dsdprof"]["cells"]}
van_step = pq.read_table(next(RUN.glob(f"*-vanilla-bs{BS}-k0-r0.parquet")), columns=["itl_s"]).column(0)[0].as_py()


def k_of(variant: str) -> int | None:
    if variant.startswith("fixed-"):
        return int(variant.removeprefix("fixed-"))
    if variant.startswith("table-"):
        t = res["tables"][variant.removeprefix("table-")]
        return next(int(r[2]) for r in t["ranges"] if r[0] <= BS <= r[1])
    return None


def ci(xs: list[float]) -> str:
    m = st.fmean(xs)
    if len(xs) < 2:
        return f"{m:.3f}"
    h = T90.get(len(xs), 1.9) * st.stdev(xs) / len(xs) ** 0.5
    return f"{m:.3f} [{m - h:.3f}, {m + h:.3f}]"


def bench(path: Path) -> dict:
    doc = json.loads(path.read_text())
    b = next(x for x in doc["benchmarks"] if x["config"]["strategy"]["streams"] == BS)
    sm = b["scheduler_metrics"]
    w0, w1 = sm["measure_start_time"], sm["measure_end_time"]
    tok, inside, first = 0.0, [], []
    for status in ("successful", "incomplete"):
        for r in b["requests"][status]:
            t = r["info"]["timings"]
            n = (r.get("output_metrics") or {}).get("text_tokens") or 0
            a, z = t.get("first_request_iteration"), t.get("last_request_iteration")
            if not n or a is None or z is None:
                continue
            if z <= a:
                tok += n * (w0 <= z <= w1)
            else:  # tokens spread evenly over the request's chunks: the part inside the window
                tok += n * max(0.0, min(z, w1) - max(a, w0)) / (z - a)
            row = dict(steps=t["request_iterations"] - 3, dec=z - a, ttft=a - t["request_start"],
                       lat=(t["request_end"] or z) - t["request_start"], start=t["request_start"])
            if status == "successful" and t["request_start"] >= w0 and t["request_end"] <= w1:
                inside.append(row)
            if status == "successful":
                first.append(row)
    first = sorted(first, key=lambda x: x["start"])[:BS]  # the first wave: started together, one prefill
    return dict(tot=b["metrics"]["output_tokens_per_second"]["total"]["mean"], own=tok / (w1 - w0),
                window=w1 - w0, warm=b["warmup_duration"], n=len(inside),
                al=127 * len(inside) / sum(x["steps"] for x in inside),
                step=sum(x["dec"] for x in inside) / sum(x["steps"] for x in inside),
                step1=sum(x["dec"] for x in first) / sum(x["steps"] for x in first),
                ttft=st.fmean(x["ttft"] for x in inside), lat=st.fmean(x["lat"] for x in inside))


runs: dict[tuple[int, str, int], dict] = {}
for p in sorted(GDIR.glob("baseline-g*-r*.json")):
    _, g, *v, r = p.stem.split("-")
    runs[(int(g[1:]), "-".join(v), int(r[1:]))] = bench(p)
print(f"BS {BS}: sweep vanilla step {van_step:.4f} s; per run: guidellm tok/s (own recount), window s "
      "(warm-up s), requests inside, client AL, client step s (first wave's), TTFT s, latency s")
for (g, v, r), b in sorted(runs.items()):
    print(f"  g{g} {v:14s} r{r}  {b['tot']:6.1f} ({b['own']:6.1f})  {b['window']:5.1f} ({b['warm']:4.1f})  "
          f"{b['n']:3d}  {b['al']:5.3f}  {b['step']:.4f} ({b['step1']:.4f})  {b['ttft']:5.2f}  {b['lat']:5.2f}")
print("\nper variant (its group's vanilla, same repeat): speedup by guidellm, by the sweep, and the chain")
print("  variant      K  guidellm x vanilla [90 %]   sweep   xAL    xstep [90 %]          = decode  AL_c/AL_s")
for g, v in sorted({(g, v) for g, v, _ in runs}):
    k = k_of(v)
    if k is None:
        continue
    reps = sorted(r for gg, vv, r in runs if (gg, vv) == (g, v) and (g, "vanilla", r) in runs)
    if not reps:
        continue
    c = cells.get((BS, k))
    sp = [runs[(g, v, r)]["tot"] / runs[(g, "vanilla", r)]["tot"] for r in reps]
    if c is None:  # a K the sweep did not measure
        print(f"  g{g} {v:13s} {k}  {ci(sp):26s} (no sweep cell)")
        continue
    step_f = [(c["itl_s"] / van_step) / (runs[(g, v, r)]["step"] / runs[(g, "vanilla", r)]["step"]) for r in reps]
    al = st.fmean(runs[(g, v, r)]["al"] for r in reps)
    sweep = c["acceptance_length"] / c["itl_s"] * van_step
    dec = st.fmean(runs[(g, v, r)]["al"] / runs[(g, v, r)]["step"] * runs[(g, "vanilla", r)]["step"] for r in reps)
    print(f"  g{g} {v:13s} {k}  {ci(sp):26s} {sweep:6.3f}  {al / c['acceptance_length']:5.3f}  {ci(step_f):22s}"
          f" {dec:6.3f}  {al:.3f}/{c['acceptance_length']:.3f}")
if "-v" in sys.argv:
    print(json.dumps({f"{g}-{v}-{r}": b for (g, v, r), b in runs.items()}, indent=0))
