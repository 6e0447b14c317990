"""The head-to-head at varied output lengths, read per batch size: guidellm against the step trace.

    python client_vs_steps.py OUT            # OUT: the bench's --out (results.json, guidellm/, dsdprof-run/)

The probe's reading (../vs-serving-sweep-1207-probe/probe_analysis.py) for every batch size, server
and group. Per guidellm run (one server, one repeat, one batch size): guidellm's headline tok/s
(output_tokens_per_second, total, over its window after the warm-up wave); for the requests wholly
inside the window: client AL = sum(tokens - 1) / sum(decode chunks) (chunks - 3: first token, finish,
usage), decode step = sum(last chunk - first chunk) / sum(decode chunks), TTFT. Each speculative
server is paired with its group's vanilla in the same repeat: the guidellm ratio (mean, 90 % t
interval over repeats), and the chain sweep goodput ratio x (client AL / sweep AL) x step factor,
the step factor = (sweep step_K / sweep step_vanilla) / (client step_K / client step_vanilla):
1 where the server steps as the sweep's engine did. The lengths each pair got are compared (guidellm's
fixed seed should give both the same multiset).
"""
import json
import re
import statistics as st
import sys
from pathlib import Path

import pyarrow.parquet as pq

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/lead8/h2h")
T90 = {2: 6.314, 3: 2.920, 4: 2.353, 5: 2.132, 6: 2.015}
res = json.loads((OUT / "results.json").read_text())
cells = {(c["batch_size"], c["k"]): c for c in res["tables"]["dsdprof"]["cells"]}


def van_step(bs: int) -> float:
    files = sorted((OUT / "dsdprof-run").rglob(f"*-vanilla-bs{bs}-k0-r0.parquet"))
    vals = [v for f in files for v in pq.read_table(f, columns=["itl_s"]).column(0).to_pylist()]
    return st.median(vals)


def k_of(variant: str, bs: int) -> int | None:
    if variant.startswith("fixed-"):
        return int(variant.removeprefix("fixed-"))
    if variant.startswith("table-"):
        t = res["tables"][variant.removeprefix("table-")]
        return next(int(r[2]) for r in t["ranges"] if r[0] <= bs <= r[1])
    return None


def ci(xs: list[float]) -> str:
    m = st.fmean(xs)
    if len(xs) < 2:
        return f"{m:.3f}"
    h = T90.get(len(xs), 1.9) * st.stdev(xs) / len(xs) ** 0.5
    return f"{m:.3f} [{m - h:.3f}, {m + h:.3f}]"


def per_bench(b: dict, bs: int) -> dict:
    sm = b["scheduler_metrics"]
    w0, w1 = sm["measure_start_time"], sm["measure_end_time"]
    inside, done, lengths = [], [], []
    for status in ("successful", "incomplete"):
        for r in b["requests"][status]:
            t = r["info"]["timings"]
            lengths.append(json.loads(r["request_args"])["body"]["max_tokens"])
            n = (r.get("output_metrics") or {}).get("text_tokens") or 0
            a, z = t.get("first_request_iteration"), t.get("last_request_iteration")
            if status != "successful" or not n or a is None or z is None or z <= a:
                continue
            row = dict(n=n, steps=t["request_iterations"] - 3, dec=z - a, ttft=a - t["request_start"],
                       start=t["request_start"])
            done.append(row)
            if t["request_start"] >= w0 and t["request_end"] <= w1:
                inside.append(row)
    done.sort(key=lambda x: x["start"])
    g = inside or done[bs:]

    def step(rows: list[dict]) -> float:
        return sum(x["dec"] for x in rows) / sum(x["steps"] for x in rows)

    return dict(tot=b["metrics"]["output_tokens_per_second"]["total"]["mean"], n=len(inside),
                lengths=sorted(lengths), al=sum(x["n"] - 1 for x in g) / sum(x["steps"] for x in g),
                step=step(g), ttft=st.fmean(x["ttft"] for x in g))


runs: dict[tuple[int, int, str, int], dict] = {}  # (bs, group, variant, repeat)
for p in sorted((OUT / "guidellm").glob("baseline-g*-*-r*.json")):
    m = re.fullmatch(r"baseline-g(\d+)-(.+)-r(\d+)", p.stem)
    if not m:
        continue
    for b in json.loads(p.read_text())["benchmarks"]:
        bs = b["config"]["strategy"]["streams"]
        runs[(bs, int(m[1]), m[2], int(m[3]))] = per_bench(b, bs)

for bs in sorted({k[0] for k in runs}):
    vs = van_step(bs)
    print(f"\nBS {bs} (sweep vanilla step {vs:.4f} s); over the group's vanilla, paired by repeat, 90 % t:")
    print("  variant (K)      guidellm               sweep  x client AL/sweep AL  x step factor"
          "          lengths")
    for (b, g, v, _r) in sorted({(b, g, v, 0) for b, g, v, _ in runs if b == bs and v != "vanilla"}):
        k = k_of(v, bs)
        reps = sorted(r for bb, gg, vv, r in runs if (bb, gg, vv) == (bs, g, v) and (bs, g, "vanilla", r) in runs)
        if k is None or not reps or (bs, k) not in cells:
            continue
        c = cells[(bs, k)]
        x = [runs[(bs, g, v, r)] for r in reps]
        z = [runs[(bs, g, "vanilla", r)] for r in reps]
        sp = [a["tot"] / y["tot"] for a, y in zip(x, z, strict=True)]
        sf = [(c["itl_s"] / vs) / (a["step"] / y["step"]) for a, y in zip(x, z, strict=True)]
        al = st.fmean(a["al"] for a in x) / c["acceptance_length"]
        sweep = c["acceptance_length"] / c["itl_s"] * vs
        same = all(a["lengths"] == y["lengths"] for a, y in zip(x, z, strict=True))
        print(f"  g{g} {v:14s} ({k}) {ci(sp):24s} {sweep:.3f}  x {al:.3f}  x {ci(sf):24s} "
              f"{'same' if same else 'DIFFER'}")
    for g in sorted({gg for bb, gg, vv, _ in runs if bb == bs and vv == "vanilla"}):
        z = [runs[(bs, g, "vanilla", r)] for r in range(9) if (bs, g, "vanilla", r) in runs]
        tok = ", ".join(f"{y['tot']:.1f}" for y in z)
        rel = ", ".join(f"{y['step'] / vs:.3f}" for y in z)
        ttft = ", ".join(f"{y['ttft']:.2f}" for y in z)
        print(f"  g{g} vanilla: tok/s {tok}; client step / sweep's {rel}; TTFT {ttft} s")
