"""BS 16 (and BS 4): guidellm's per-request timings against the step trace, per variant.

Reads the raw guidellm reports of the 02:05-03:08 UTC head-to-head (``GDIR``, default
/tmp/h1s6/h2h/guidellm; not committed: 475 kB each) and results.json beside this script.
Per benchmark: the headline (guidellm's output_tokens_per_second, 'total' = successful + the
tokens of requests cut at the end), the duration, and for the successful requests, from SSE chunk
times (not guidellm's text-bearing 'token' iterations: the toy model emits tokens that decode to
no text, so guidellm's TTFT starts late and its ITL ends early): TTFT to the first chunk, decode
steps = chunks - 3 (first token, finish and usage chunks), client AL = 127 / steps, client step
time = (last chunk - first chunk) / steps, and the completion spread (last end - first end).
"""
import json, os, statistics as st, sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GDIR = Path(os.environ.get("GDIR", "/tmp/h1s6/h2h/guidellm"))
res = json.loads(Path(os.environ.get("RES", HERE / "results.json")).read_text())
# usage: bs16_client_vs_steps.py [-v]; session 5: GDIR=/tmp/h1/h2h/guidellm
#   RES=../vs-serving-sweep-1206-h2h/results.json RUN=../vs-serving-sweep-1206-h2h/dsdprof-run
cells = {(c["batch_size"], c["k"]): c for c in res["tables"]["dsdprof"]["cells"]}
table_k = {pt["batch_size"]: pt["k"] for pt in res["tables"]["dsdprof"]["points"]}
RUN = Path(os.environ.get("RUN", HERE / "dsdprof-run"))  # the sweep's rows: the vanilla engine's itl_s
import pyarrow.parquet as pq
sweep_vanilla = {bs: pq.read_table(next(RUN.glob(f"*-vanilla-bs{bs}-k0-r0.parquet")), columns=["itl_s"])
                 .column(0)[0].as_py() for bs in (4, 16)}
print("sweep vanilla itl_s", sweep_vanilla, "table K", table_k)
K = {"vanilla": None, "fixed-0": 0, "fixed-1": 1, "fixed-2": 2, "fixed-3": 3, "fixed-4": 4, "table-dsdprof": None}


def bench(path, bi):
    b = json.loads(path.read_text())["benchmarks"][bi]
    otps = b["metrics"]["output_tokens_per_second"]
    ok = b["requests"]["successful"]
    rows = []
    for r in ok:
        t = r["info"]["timings"]
        steps = t["request_iterations"] - 3
        rows.append(dict(ttft=t["first_request_iteration"] - t["request_start"],
                         dec=t["last_request_iteration"] - t["first_request_iteration"], steps=steps,
                         start=t["request_start"] - b["start_time"], end=t["request_end"] - b["start_time"],
                         g_itl=r["inter_token_latency_ms"] / 1e3, g_ttft=r["time_to_first_token_ms"] / 1e3))
    inc = b["requests"]["incomplete"]
    inc_tok = sum((r.get("output_metrics") or {}).get("text_tokens") or 0 for r in inc)
    ends = sorted(x["end"] for x in rows)
    return dict(
        tot=otps["total"]["mean"], succ=otps["successful"]["mean"], dur=b["duration"], n=len(rows),
        inc_n=len(inc), inc_tok=inc_tok,
        ttft=st.mean(x["ttft"] for x in rows), g_ttft=st.mean(x["g_ttft"] for x in rows),
        g_itl=st.mean(x["g_itl"] for x in rows),
        steps=st.mean(x["steps"] for x in rows), steps_max=max(x["steps"] for x in rows),
        al=127 * len(rows) / sum(x["steps"] for x in rows),
        step_s=sum(x["dec"] for x in rows) / sum(x["steps"] for x in rows),
        lat=st.mean(x["ttft"] + x["dec"] for x in rows), spread=ends[-1] - ends[0],
        step_first=min(rows, key=lambda x: x["end"])["dec"] / min(rows, key=lambda x: x["end"])["steps"],
        start_spread=max(x["start"] for x in rows))


out = {}
for p in sorted(GDIR.glob("baseline-g*-r*.json")):
    _, g, *v, r = p.stem.split("-")
    v = "-".join(v)
    for bi, bs in ((1, 4), (2, 16)):
        out.setdefault((bs, v), []).append((int(g[1:]), int(r[1:]), bench(p, bi)))

F = ["step_first", "tot", "succ", "dur", "inc_tok", "ttft", "g_ttft", "g_itl", "steps", "steps_max", "al", "step_s", "lat",
     "spread", "start_spread"]
for bs in (4, 16):
    print(f"BS {bs}: mean over repeats (vanilla: its group's); sweep = the step trace's cell")
    print(f"{'variant':14s} " + " ".join(f"{f:>8s}" for f in F) + "  sweep_AL sweep_step_s")
    for v in K:
        for g in (0, 1):
            rs = [b for gg, _, b in out.get((bs, v), []) if gg == g]
            if not rs:
                continue
            m = {f: st.mean(b[f] for b in rs) for f in F}
            c = cells.get((bs, K[v])) if K[v] is not None else None
            sw = f"  {c['acceptance_length']:.3f} {c['itl_s']:.4f}" if c else ""
            print(f"{v + '/g' + str(g):14s} " + " ".join(f"{m[f]:8.3f}" for f in F) + sw)
    print()
if "-v" in sys.argv:
    for (bs, v), rs in sorted(out.items()):
        for g, r, b in rs:
            print(bs, v, g, r, " ".join(f"{f}={b[f]:.3f}" for f in F))

# the chain: sweep goodput ratio x client/sweep AL x sweep/client step-time ratio = client decode ratio;
# x TTFT dilution = per-request ratio (mean latency); x completion spread = successful tok/s ratio
# (guidellm's duration ends at the 16th completion); x cut-off requests' tokens = guidellm's headline
VAN = {}
for bs in (4, 16):
    print(f"BS {bs} factors (vanilla: same group's; sweep vanilla = the vanilla engine's cell)")
    print("variant        sweep   xAL  xstep(steady,interf)   =dec  xTTFT  =req  xspread  =succ  xincompl  =guidellm (headline ratio)")
    sv = 1 / sweep_vanilla[bs]
    for v in K:
        if v == "vanilla":
            continue
        for g in (0, 1):
            rs = [b for gg, _, b in out.get((bs, v), []) if gg == g]
            vs = [b for gg, _, b in out.get((bs, "vanilla"), []) if gg == g]
            if not rs:
                continue
            m = {f: st.mean(b[f] for b in rs) for f in F}
            mv = {f: st.mean(b[f] for b in vs) for f in F}
            k = K[v] if K[v] is not None else table_k[bs]
            c = cells[(bs, k)]
            sweep = c["acceptance_length"] / c["itl_s"] / (1 / sweep_vanilla[bs])
            f_al = m["al"] / c["acceptance_length"]
            f_step = (c["itl_s"] / sweep_vanilla[bs]) / (m["step_s"] / mv["step_s"])
            f_steady = (c["itl_s"] / sweep_vanilla[bs]) / (m["step_first"] / mv["step_s"])
            dec = m["al"] / m["step_s"] * mv["step_s"]
            req = mv["lat"] / m["lat"]
            succ = st.mean(b["succ"] for b in rs) / st.mean(b["succ"] for b in vs)
            head = st.mean(b["tot"] for b in rs) / st.mean(b["tot"] for b in vs)
            print(f"{v + '/g' + str(g):14s} {sweep:5.3f} {f_al:5.3f} {f_step:5.3f} ({f_steady:5.3f},{f_step / f_steady:5.3f})"
                  f" {dec:5.3f} {req / dec:6.3f} {req:5.3f} {succ / req:7.3f} {succ:6.3f} {head / succ:8.3f}  {head:5.3f}")
    print()
