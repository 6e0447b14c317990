"""Measured torch-proxy verify steps on an H200 (benchmarks/gpu_step_times.py) vs the analytic engine.

    python benchmarks/gpu_vs_sim.py [docs/lab/data/gpu-h200]

CPU only, light (numpy/pandas/scipy). What is compared, per (BS, K), context 512, bf16, TP 1:

* measured: median CUDA-graph replay time of ONE target forward over T = BS*(K+1) tokens (no
  drafter, no scheduler) of a Llama-3.1-8B-shaped dense stack and a Qwen3-30B-A3B-shaped MoE stack
  with uniform random top-8 routing.
* sim kernel: the step model's target-verify terms (dense + experts + attention roofline at
  routing_correlation 0, all-reduces and the per-layer / per-MoE-layer / per-token latency terms;
  dsdprof.measure.sim.model.step_time with no draft, speculative = 0) without the fixed step
  overhead -- the like-for-like figure for a proxy that has no engine around it.
* sim ITL: the same plus the profile's step_overhead_s (the fitted prior; not the per-draft-step
  overhead, since no drafter runs): what the sim reports for a vanilla engine step
  at T tokens. For K = 0 this equals SimEngine.measure(vanilla cell).itl_s (checked below). The
  sim's DSD cells would add K draft forward passes and the draft/DSD overheads: those are NOT
  compared (the proxy runs no drafter).

Hardware: catalog "H200 SXM" (datasheet peaks 4.8 TB/s, 989 TFLOP/s, the fitted priors of
dsdprof/measure/sim/hardware.py), and the probe-hardware profile measured on the same machine
(achieved peaks, efficiency 1.0) if h200-probe.toml is present. Then a fit of the step model's
efficiencies to the proxy (the machinery of ``dsdprof calibrate``), and, as a labelled derivation,
goodput-optimal K per BS from the measured step times with a stated acceptance curve.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from dsdprof.config.spec import parse_spec
from dsdprof.measure.engine import Cell
from dsdprof.measure.sim.calibrate import CalibrationTarget, design, predict
from dsdprof.measure.sim.catalog import MODELS
from dsdprof.measure.sim.engine import SimEngine
from dsdprof.measure.sim.fit import fit
from dsdprof.measure.sim.hardware import resolve_hardware
from dsdprof.measure.sim.model import NO_DRAFT, HwArrays, arch_features, distinct_experts, step_time

CONTEXT = 512
# per-position acceptance, sweeps/sim-llama8b-eagle3-h100.toml
ACC = [0.76, 0.60, 0.43, 0.29, 0.24, 0.14, 0.08]
DRAFT_STEP_MS = 0.2  # stated per-draft-forward cost for the "with draft cost" derivation
SUB_BS, SUB_K = (1, 4, 16, 64, 128), (0, 1, 3, 7)
STACKS = {"dense": "Llama-3.1-8B", "moe": "Qwen3-30B-A3B"}


def verify_ms(hw_name: str, model: str, b: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kernel ms, ITL ms) of a target-only step at T = b*(k+1) tokens."""
    hw = resolve_hardware(hw_name)
    st = step_time(HwArrays.of(hw, "bf16"), arch_features(MODELS[model], "bfloat16", 1), NO_DRAFT,
                   b.astype(float), k.astype(float), CONTEXT, 0.0, 0.0)
    # step_time's overhead also counts K * draft_step_overhead_s; the proxy runs no drafter, so only
    # the per-step overhead is added (at K = 0 this is exactly the vanilla ITL, checked below)
    kernel = np.asarray(st.kernel_s) * 1e3
    return kernel, kernel + hw.efficiency.step_overhead_s * 1e3


def check_engine(model: str, hw_name: str, b: int, itl_ms: float) -> float:
    """SimEngine's vanilla ITL at (b, K=0) minus ours (should be 0)."""
    e = SimEngine(parse_spec({
        "engine": {"name": "sim", "model": model, "method": "eagle3", "dtype": "bfloat16",
                   "max_model_len": 4096},
        "sweep": {"batch_sizes": [b], "num_spec_tokens": [0, 1]},
        "sim": {"hardware": hw_name, "context_len": CONTEXT, "acceptance_per_pos": ACC}}))
    return e.measure(Cell(0, b, "vanilla", 0)).itl_s * 1e3 - itl_ms


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - meas) / meas) * 100)


def compare(kind: str, df: pd.DataFrame, profiles: dict[str, str]) -> pd.DataFrame:
    model = STACKS[kind]
    b, k = df["batch_size"].to_numpy(), df["k"].to_numpy()
    out = df[["batch_size", "k", "tokens", "median_ms"]].copy()
    for label, hw in profiles.items():
        kern, itl = verify_ms(hw, model, b, k)
        out[f"{label}_kernel_ms"], out[f"{label}_itl_ms"] = kern, itl
        i = int(np.argmin(b + 1000 * k))
        if label == "H200":
            diff = check_engine(model, hw, int(b[i]), itl[i])
            print(f"  check: SimEngine vanilla ITL at BS {b[i]} minus ours = {diff:.2e} ms")
    return out


def fit_to_proxy(kind: str, df: pd.DataFrame, hw_name: str) -> None:
    """Fit e_bw, e_c and the step overhead of the step model to the proxy's step times."""
    ct = CalibrationTarget(resolve_hardware(hw_name), MODELS[STACKS[kind]], None, "bfloat16", 1, CONTEXT, 0.0)
    b, k = df["batch_size"].to_numpy(float), df["k"].to_numpy(float)
    d = design(ct, b, k, np.zeros_like(b))
    d = replace(d, k=np.zeros_like(d.k))  # no drafter: the per-draft-step overhead does not apply
    y = df["median_ms"].to_numpy() / 1e3
    r = fit(d, y, ct.hardware.efficiency)
    e = r.efficiency
    print(f"  fitted to the proxy on {hw_name}: bandwidth eff {e.bandwidth:.3f}, "
          f"compute eff {e.compute:.3f}, "
          f"fixed {e.step_overhead_s * 1e3:.3f} ms/step; MAPE after fit {mape(predict(d, e), y):.1f}%"
          + (f"; not identifiable: {sorted(r.not_identifiable)}" if set(r.not_identifiable) - {
              'draft_step_overhead_s', 'dsd_overhead_s'} else ""))


def knee(df: pd.DataFrame) -> None:
    """Marginal ms per extra token along fixed-BS rows (K growing)."""
    for bs in (16, 32, 64, 128):
        r = df[df.batch_size == bs].sort_values("k")
        t, m = r["tokens"].to_numpy(), r["median_ms"].to_numpy()
        slopes = np.diff(m) / np.diff(t) * 1e3
        print(f"  BS {bs:3d}: T {[int(x) for x in t]}\n          ms {[round(float(x), 2) for x in m]}\n"
              f"          us/extra token {[round(float(x), 1) for x in slopes]}")


def al(k: int) -> float:
    return 1.0 + sum(ACC[:k])


def derive_k(df: pd.DataFrame, draft_ms: float) -> dict[int, tuple[int, float]]:
    """BS -> (K*, goodput gain over K=0) from measured step times, AL(K) from ACC, + K*draft_ms."""
    res = {}
    for bs, r in df.groupby("batch_size"):
        r = r.set_index("k")["median_ms"]
        g = {k: al(k) / (r[k] + k * draft_ms) for k in r.index}
        best = max(g, key=g.get)
        res[int(bs)] = (int(best), g[best] / g[0])
        if draft_ms == 0.0:
            gains = " ".join(f"{g[k] / g[0]:.2f}" for k in sorted(g))
            print(f"    BS {int(bs):3d} goodput / goodput(K=0), K=0..7: " + gains)
    return res


def sim_k(model: str, hw_name: str) -> dict[int, int]:
    """The sim's own K* per BS (EAGLE-3 draft terms and all overheads included) for the same ACC."""
    bss = [1, 2, 4, 8, 16, 32, 64, 128]
    e = SimEngine(parse_spec({
        "engine": {"name": "sim", "model": model, "method": "eagle3", "dtype": "bfloat16",
                   "max_model_len": 4096},
        "sweep": {"batch_sizes": bss, "num_spec_tokens": list(range(8))},
        "sim": {"hardware": hw_name, "context_len": CONTEXT, "acceptance_per_pos": ACC}}))
    out = {}
    for b in bss:
        g = {k: (lambda m: m.acceptance_length / m.itl_s)(e.measure(Cell(0, b, "dsd", k))) for k in range(8)}
        out[b] = max(g, key=g.get)
    return out


# MoE shape: the catalog MoEs on H200 (dense Llama for reference), each on the fewest GPUs it fits
SHAPE_BS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
SHAPE_CASES = [  # (label, model, tp, dtype, method)
    ("Llama-3.1-8B (dense)", "Llama-3.1-8B", 1, "bfloat16", "eagle3"),
    ("Mixtral-8x7B (E8 k2)", "Mixtral-8x7B", 1, "bfloat16", "eagle3"),
    ("gpt-oss-20b (E32 k4)", "gpt-oss-20b", 1, "auto", "eagle3"),
    ("Qwen3-30B-A3B (E128 k8)", "Qwen3-30B-A3B", 1, "bfloat16", "eagle3"),
    ("gpt-oss-120b (E128 k4)", "gpt-oss-120b", 1, "auto", "eagle3"),
    ("Qwen3-235B-A22B TP4 (E128 k8)", "Qwen3-235B-A22B", 4, "bfloat16", "eagle3"),
    ("DeepSeek-V3 TP8 FP8 (E256 k8)", "DeepSeek-V3", 8, "auto", "mtp"),
]
SHAPE_ACC = {"EAGLE-3 sweep (AL(3) 2.79)": {"acceptance_per_pos": ACC},
             "alpha 0.55 (AL(3) 2.02)": {"acceptance_alpha": 0.55}}


def shape_k(model: str, tp: int, dtype: str, method: str, acc: dict) -> list[int]:
    """The sim's K* per SHAPE_BS (H200 SXM priors, all overheads; 0 where it does not fit)."""
    e = SimEngine(parse_spec({
        "engine": {"name": "sim", "model": model, "method": method, "dtype": dtype, "max_model_len": 4096,
                   "tensor_parallel_size": tp},
        "sweep": {"batch_sizes": SHAPE_BS, "num_spec_tokens": list(range(8))},
        "sim": {"hardware": "H200 SXM", "context_len": CONTEXT, **acc}}))
    out = []
    for b in SHAPE_BS:
        g = {k: (lambda m: m.acceptance_length / m.itl_s)(e.measure(Cell(0, b, "dsd", k))) for k in range(8)}
        out.append(max(g, key=g.get))
    return out


def moe_shape(moe: pd.DataFrame, png: str | None) -> None:
    """K* per BS: the sim on every catalog MoE beside the K* derived from the measured proxy."""
    print("\n=== MoE shape: sim K* per BS (H200 SXM priors) at two acceptance curves")
    print(f"  {'BS':31s}" + "".join(f"{b:4d}" for b in SHAPE_BS))
    ks = {}
    for acc_label, acc in SHAPE_ACC.items():
        print(f"  acceptance: {acc_label}")
        for label, model, tp, dtype, method in SHAPE_CASES:
            ks[label, acc_label] = shape_k(model, tp, dtype, method, acc)
            print(f"  {label:31s}" + "".join(f"{k:4d}" for k in ks[label, acc_label]))
    proxy = derive_k(moe, DRAFT_STEP_MS)
    row = "".join(f"{proxy[b][0]:4d}" for b in SHAPE_BS if b in proxy)
    print(f"  {'proxy Qwen3-shape (measured)':31s}" + row)
    if not png:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    arch = MODELS[STACKS["moe"]]
    for k, mk in ((0, "o"), (3, "s"), (7, "^")):
        r = moe[moe.k == k].sort_values("batch_size")
        b = r.batch_size.to_numpy()
        ax1.plot(b, r.median_ms, mk, color=f"C{k % 10}", label=f"measured proxy, K={k}")
        kern, _ = verify_ms("H200 SXM", STACKS["moe"], b, np.full_like(b, k))
        ax1.plot(b, kern, "-", color=f"C{k % 10}", alpha=0.7, label=f"sim kernel terms, K={k}")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("batch size (verify tokens T = BS·(K+1))")
    ax1.set_ylabel("target verify step, ms")
    ax1.set_title(f"{arch.name} shape on one H200: measured torch proxy vs sim")
    ax1.legend(fontsize=7)
    acc_label = next(iter(SHAPE_ACC))
    bs = [b for b in SHAPE_BS if b in proxy]
    ax2.plot(bs, [proxy[b][0] for b in bs], "ko--", lw=2, label="measured proxy, Qwen3 shape (0.2 ms/draft)")
    for i, (label, *_rest) in enumerate(SHAPE_CASES):
        jitter = 0.06 * (i - 3)  # keep overlapping curves apart
        ax2.plot(SHAPE_BS, np.array(ks[label, acc_label]) + jitter, "-", marker=".", label=f"sim: {label}")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("batch size")
    ax2.set_ylabel("goodput-optimal K")
    ax2.set_title(f"K* by batch size, acceptance {acc_label}")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"  wrote {png}")


def breakdown(root: Path) -> None:
    """Variants timed by gpu_step_times.py --breakdown: where a step's time goes."""
    import json

    p = root / "breakdown.json"
    if not p.is_file():
        return
    rows = json.loads(p.read_text())["breakdown"]
    print("\n=== breakdown (CUDA-graph ms; kernels / summed kernel ms from one profiled eager forward)")
    for kind in ("dense", "moe"):
        arch = MODELS[STACKS[kind]]
        stack = pd.DataFrame([r for r in rows if r["stack"] == kind])
        for (b, k), g in stack.groupby(["batch_size", "k"], sort=False):
            v = g.set_index("variant")
            T = b * (k + 1)
            # weight bytes the GEMM-only variant streams: dense part + touched experts (uniform routing)
            d = float(distinct_experts(arch.num_experts, arch.experts_per_token, T)) if arch.is_moe else 0.0
            wbytes = 2 * (arch.dense_params() + arch.moe_layers * d * arch.expert_params())
            routed = arch.moe_layers * arch.experts_per_token * arch.expert_params()
            flops = 2 * T * (arch.dense_params() + routed)
            gm = v.loc["gemm_only", "median_ms"]
            print(f"  {kind} BS {b} K {k} (T {T}): full {v.loc['full', 'median_ms']:.2f}, no attention "
                  f"{v.loc['no_attn', 'median_ms']:.2f}, no FFN/MoE {v.loc['no_ffn', 'median_ms']:.2f}, "
                  "GEMMs only "
                  f"{gm:.2f} ms ({wbytes / gm / 1e9:.2f} TB/s, {flops / gm / 1e9:.0f} TFLOP/s); kernels "
                  f"{int(v.loc['full', 'kernels'])} (sum {v.loc['full', 'kernel_sum_ms']:.2f} ms) "
                  "vs GEMM-only "
                  f"{int(v.loc['gemm_only', 'kernels'])}")


def main() -> None:
    args = sys.argv[1:]
    png = None
    if "--plot" in args:
        i = args.index("--plot")
        png = args[i + 1]
        args = args[:i] + args[i + 2:]
    root = Path(args[0] if args else "docs/lab/data/gpu-h200")
    profiles = {"H200": "H200 SXM"}
    # probe: the first probe-hardware (efficiency 1.0); probe2: after the probe measured decode-shaped
    # efficiencies, FP8 and L2 (h200-probe-v2.toml)
    for label, name in (("probe", "h200-probe.toml"), ("probe2", "h200-probe-v2.toml")):
        probe = root / name
        if probe.is_file():
            profiles[label] = str(probe)
            h = resolve_hardware(str(probe))
            print(f"{label} profile ({name}): {h.name}, {h.memory_bandwidth_tbs:.3f} TB/s, "
                  f"{h.bf16_tflops:.1f} bf16 TFLOP/s, "
                  f"efficiency {h.efficiency.bandwidth:.3f}/{h.efficiency.compute:.3f}")
    for kind in ("dense", "moe"):
        path = root / f"{kind}.csv"
        if not path.is_file():
            continue
        raw = pd.read_csv(path)
        df = raw[raw["impl"].astype(str) != "loop"] if "impl" in raw else raw
        df = df.sort_values(["batch_size", "k"]).reset_index(drop=True)
        print(f"\n=== {kind}: {STACKS[kind]} shape, {len(df)} points, context {CONTEXT}")
        c = compare(kind, df, profiles)
        for label in profiles:
            for part in ("kernel", "itl"):
                col = c[f"{label}_{part}_ms"].to_numpy()
                sub = c.batch_size.isin(SUB_BS) & c.k.isin(SUB_K)
                bias = float(np.mean((col - c.median_ms) / c.median_ms) * 100)
                print(f"  {label:5s} {part:6s}: MAPE {mape(col, c.median_ms.to_numpy()):5.1f}% "
                      f"(subset {mape(col[sub], c.median_ms[sub].to_numpy()):5.1f}%), "
                      f"mean signed {bias:+.1f}%")
        sub = c[c.batch_size.isin(SUB_BS) & c.k.isin(SUB_K)]
        cols = ["batch_size", "k", "tokens", "median_ms"]
        cols += [f"{lb}_{p}_ms" for lb in profiles for p in ("kernel", "itl")]
        t = sub[cols].copy()
        for lb in profiles:
            t[f"err_{lb}_itl_%"] = (sub[f"{lb}_itl_ms"] - sub.median_ms) / sub.median_ms * 100
        print(t.round(2).to_string(index=False))
        for hw in profiles.values():
            fit_to_proxy(kind, df, hw)
        if kind == "dense":
            print("  knee (marginal cost per token):")
            knee(df)
        else:
            e = raw.drop_duplicates(["batch_size", "k"]).sort_values("tokens")
            print("  T, distinct experts (measured mean/layer, formula), step ms:")
            for tk, g in e.groupby("tokens"):
                print(f"    T {tk:5d}: experts {g.distinct_experts.mean():6.1f} (formula "
                      f"{float(distinct_experts(128, 8, tk)):6.1f}), "
                      f"ms {', '.join(f'{x:.2f}' for x in g.median_ms)}"
                      f"  [BS {', '.join(str(x) for x in g.batch_size)}]")
            loop = raw[raw["impl"] == "loop"]
            for _, r in loop.iterrows():
                gr = df[(df.batch_size == r.batch_size) & (df.k == r.k)].median_ms.iloc[0]
                print(f"    per-expert loop cross-check BS {r.batch_size} K {r.k}: loop {r.median_ms:.2f} ms "
                      f"vs grouped {gr:.2f} ms")
        for draft in (0.0, DRAFT_STEP_MS):
            ks = derive_k(df, draft)
            print(f"  DERIVED K* (AL from {ACC}, draft cost {draft} ms/draft step): "
                  + ", ".join(f"BS {b}: K={kk} ({gain:.2f}x)" for b, (kk, gain) in ks.items()))
        own = sim_k(STACKS[kind], "H200 SXM")
        print(f"  sim's own K* (H200 SXM priors, EAGLE-3 draft + overheads, same AL): {own}")
        if kind == "moe":
            moe_shape(df, png)
    breakdown(root)


if __name__ == "__main__":
    main()
