"""Torch-only proxy of one speculative-decoding verify step on a GPU (random weights, no vLLM).

    python3 benchmarks/gpu_step_times.py --out DIR            # on a CUDA machine (~2-4 min on an H200)
    python3 benchmarks/gpu_step_times.py --out DIR --tiny --device cpu   # logic check, seconds
    python3 benchmarks/gpu_step_times.py --out DIR --breakdown  # where the time goes (~30 s on an H200)

For every (BS, K) with BS in 1..128 and K in 0..7 it times ONE target forward pass over
T = BS * (K + 1) tokens (each sequence verifies K drafts + 1 token) for two stacks:

* dense: Llama-3.1-8B shape (hidden 4096, 32 layers, 32 q / 8 kv heads of 128, SwiGLU 14336,
  vocab 128256), bf16.
* moe: Qwen3-30B-A3B shape (hidden 2048, 48 layers, 32 q / 4 kv heads of 128, 128 experts, top-8,
  expert FFN 768, vocab 151936), bf16. Routing is uniform random: for each layer and each point a
  table of top-8 experts per token is drawn (top-8 of uniform noise), so the experts touched are
  those of independent tokens (the sim's routing_correlation = 0). The router GEMM and softmax
  still run (their weights gather the top-8 probabilities). Each touched expert runs only on its
  tokens: ``torch._grouped_mm`` over tokens sorted by expert (experts with no token form empty
  groups, so their weights are not read -- the fused-MoE access pattern); a per-expert loop
  (``index_select`` + two GEMMs + ``index_add_``) is timed at a few points as a cross-check, and
  is the fallback if grouped_mm is missing. The mean number of distinct experts per layer is
  recorded (and E(1 - (1 - k/E)^T), the sim's formula).

Per layer: RMSNorm, fused QKV GEMM, write of the T new K/V rows into a preallocated cache,
attention of each sequence's K+1 queries over its own context+K+1 keys (torch SDPA, GQA done by
folding the q heads of one kv head into the query axis so the KV cache is read once per kv head),
O projection + residual, RMSNorm, SwiGLU MLP (or MoE) + residual; then a final RMSNorm and the LM
head over all T tokens.

Simplified (say so when quoting): no causal mask among the K+1 query tokens (each attends to the
whole context + all K+1 new keys: < 1 % of attention FLOPs at context 512, same KV bytes); no
RoPE, no Qwen3 q/k-norm, no embedding lookup (inputs are random hidden states), no sampling or
rejection; a contiguous (not paged) KV cache; every sequence has the same context length
(``--context``, default 512); no scheduler, input preparation or drafter. It is a torch proxy of the
kernels' bytes and FLOPs, not vLLM's kernels (no paged / FlashInfer attention, no fused MoE Triton
kernel, no vLLM CUDA graphs).

Timing: each point is captured in a torch.cuda.CUDAGraph (falls back to eager, recorded per row,
if capture fails) and replayed ``--reps`` times back to back after ``--warmup`` replays; CUDA
events between replays give per-step device times; the median is reported (min/max too). An
eager figure (``--eager-reps``, same method, includes Python launch cost) is recorded beside it.
The script also records torch / CUDA / GPU name and two peaks: read bandwidth (x.sum over a
4 GiB fp32 buffer) and an 8192^3 bf16 matmul (both median and best of 10 after warm-up).

Outputs (files directly in --out): dense.csv, moe.csv, meta.json; rows are appended and flushed
as they are measured, so a run killed at its time limit still leaves what it measured. A time
budget (--budget-s) stops each stack's grid early (priority points first) and says so in meta.json.

--breakdown instead times, at 4 points per stack, the full forward and three variants (no attention
block, no FFN/MoE block, only the weight GEMMs with the same shapes -- for the MoE, the router and
the two grouped GEMMs over a fixed token buffer), and profiles one eager forward of the full and
GEMM-only variants (torch.profiler: kernel count, summed kernel time, top kernels) into
breakdown.json.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime

import torch
import torch.nn.functional as F

T0 = time.time()
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
KS = tuple(range(8))
PRIORITY_BS = (1, 4, 16, 64, 128)
PRIORITY_K = (0, 1, 3, 7)

DENSE = dict(name="Llama-3.1-8B-shape", hidden=4096, layers=32, nq=32, nkv=8, hd=128,
             inter=14336, vocab=128256)
MOE = dict(name="Qwen3-30B-A3B-shape", hidden=2048, layers=48, nq=32, nkv=4, hd=128, experts=128, topk=8,
           inter=768, vocab=151936)
TINY_DENSE = dict(name="tiny-dense", hidden=64, layers=2, nq=4, nkv=2, hd=16, inter=128, vocab=256)
TINY_MOE = dict(name="tiny-moe", hidden=64, layers=2, nq=4, nkv=2, hd=16, experts=16, topk=4,
                inter=32, vocab=256)


def log(*a: object) -> None:
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# --------------------------------------------------------------------------- timing
class Timer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def times_ms(self, run, warmup: int, reps: int) -> list[float]:
        """Per-call milliseconds of ``run`` called ``reps`` times back to back."""
        for _ in range(warmup):
            run()
        self.sync()
        if not self.cuda:
            out = []
            for _ in range(reps):
                t = time.perf_counter()
                run()
                out.append((time.perf_counter() - t) * 1e3)
            return out
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
        ev[0].record()
        for i in range(reps):
            run()
            ev[i + 1].record()
        ev[-1].synchronize()
        return [ev[i].elapsed_time(ev[i + 1]) for i in range(reps)]


def summary(ts: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts)}


def graphed(fn, device: torch.device):
    """(replay callable, graph) for ``fn`` captured in a CUDA graph; raises if capture fails."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay, g


# --------------------------------------------------------------------------- model pieces
def rand_w(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, shape[-1] ** -0.5)


class Stack:
    """Weights + KV cache of one stack; ``forward(x, B, t)`` is one verify step of T = B*t tokens."""

    def __init__(self, cfg: dict, device: torch.device, dtype: torch.dtype, max_b: int, max_t: int,
                 context: int) -> None:
        self.cfg, self.device, self.dtype, self.context = cfg, device, dtype, context
        h, nq, nkv, hd = cfg["hidden"], cfg["nq"], cfg["nkv"], cfg["hd"]
        self.moe = "experts" in cfg
        self.layers = []
        for _ in range(cfg["layers"]):
            L = {"ln1": torch.ones(h, device=device, dtype=dtype),
                 "ln2": torch.ones(h, device=device, dtype=dtype),
                 "qkv": rand_w(((nq + 2 * nkv) * hd, h), device, dtype),
                 "o": rand_w((h, nq * hd), device, dtype),
                 "kc": torch.zeros(max_b, nkv, context + max_t, hd, device=device, dtype=dtype),
                 "vc": torch.zeros(max_b, nkv, context + max_t, hd, device=device, dtype=dtype)}
            L["kc"].normal_()
            L["vc"].normal_()
            if self.moe:
                E, inter = cfg["experts"], cfg["inter"]
                L["router"] = rand_w((E, h), device, dtype)
                # per expert [gate; up], row-major (out, in)
                L["gu"] = rand_w((E, 2 * inter, h), device, dtype)
                L["down"] = rand_w((E, h, inter), device, dtype)
            else:
                L["gu"] = rand_w((2 * cfg["inter"], h), device, dtype)
                L["down"] = rand_w((h, cfg["inter"]), device, dtype)
            self.layers.append(L)
        self.ln_f = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = rand_w((cfg["vocab"], h), device, dtype)
        self.route = None  # moe: (layers, T, topk) long, set per point
        self.loop_plan = None  # moe loop impl: per layer [(token_idx, slot_idx)] per touched expert
        self.impl = "grouped"
        self.variant = "full"  # breakdown: full | no_attn | no_ffn | gemm_only
        self.offs = None  # moe: (layers, E) int32 cumulative token counts of the current routing
        self.xs_buf = None  # moe gemm_only: (T*topk, hidden) stand-in for the gathered tokens

    def weight_bytes(self) -> int:
        n = self.lm_head.numel() + self.ln_f.numel()
        for L in self.layers:
            n += sum(v.numel() for k, v in L.items() if k not in ("kc", "vc"))
        return n * self.lm_head.element_size()

    # ---- attention: fold the g = nq/nkv query heads of a kv head into the query axis
    def attention(self, L: dict, h: torch.Tensor, B: int, t: int) -> torch.Tensor:
        c = self.cfg
        nq, nkv, hd = c["nq"], c["nkv"], c["hd"]
        g = nq // nkv
        qkv = F.linear(h, L["qkv"])
        q, k, v = qkv.split([nq * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(B, t, nkv, g, hd).permute(0, 2, 3, 1, 4).reshape(B, nkv, g * t, hd)
        C = self.context
        kc, vc = L["kc"][:B, :, : C + t], L["vc"][:B, :, : C + t]
        kc[:, :, C:].copy_(k.view(B, t, nkv, hd).transpose(1, 2))
        vc[:, :, C:].copy_(v.view(B, t, nkv, hd).transpose(1, 2))
        o = F.scaled_dot_product_attention(q, kc, vc)  # (B, nkv, g*t, hd), no mask (see docstring)
        o = o.view(B, nkv, g, t, hd).permute(0, 3, 1, 2, 4).reshape(B * t, nq * hd)
        return F.linear(o, L["o"])

    def mlp(self, L: dict, h: torch.Tensor) -> torch.Tensor:
        gu = F.linear(h, L["gu"])
        i = gu.shape[-1] // 2
        return F.linear(F.silu(gu[:, :i]) * gu[:, i:], L["down"])

    def moe_weights(self, L: dict, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h, L["router"]).float()
        w = torch.softmax(logits, dim=-1).gather(1, idx)
        return (w / w.sum(-1, keepdim=True)).to(h.dtype)  # Qwen3 norm_topk_prob

    def moe_grouped(self, L: dict, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        E, k, inter = self.cfg["experts"], self.cfg["topk"], self.cfg["inter"]
        w = self.moe_weights(L, h, idx).reshape(-1)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tok = torch.div(order, k, rounding_mode="floor")
        counts = torch.zeros(E, device=h.device, dtype=torch.int32).index_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        xs = h.index_select(0, tok)
        gu = torch._grouped_mm(xs, L["gu"].transpose(-2, -1), offs=offs)
        a = F.silu(gu[:, :inter]) * gu[:, inter:]
        y = torch._grouped_mm(a, L["down"].transpose(-2, -1), offs=offs)
        y = y * w.index_select(0, order).unsqueeze(1)
        return torch.zeros_like(h).index_add_(0, tok, y)

    def moe_loop(self, L: dict, h: torch.Tensor, idx: torch.Tensor, plan: list) -> torch.Tensor:
        inter = self.cfg["inter"]
        w = self.moe_weights(L, h, idx).reshape(-1)
        out = torch.zeros_like(h)
        for e, tok, slot in plan:
            gu = F.linear(h.index_select(0, tok), L["gu"][e])
            y = F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], L["down"][e])
            out.index_add_(0, tok, y * w.index_select(0, slot).unsqueeze(1))
        return out

    def gemm_only(self, L: dict, x: torch.Tensor, li: int) -> torch.Tensor:
        """Breakdown variant: only the layer's weight GEMMs (same shapes), nothing else."""
        c = self.cfg
        a = F.linear(F.linear(x, L["qkv"])[:, : c["nq"] * c["hd"]], L["o"])
        if not self.moe:
            gu = F.linear(a, L["gu"])
            return F.linear(gu[:, : c["inter"]], L["down"])
        F.linear(a, L["router"])
        gu = torch._grouped_mm(self.xs_buf, L["gu"].transpose(-2, -1), offs=self.offs[li])
        torch._grouped_mm(gu[:, : c["inter"]], L["down"].transpose(-2, -1), offs=self.offs[li])
        return a

    def forward(self, x: torch.Tensor, B: int, t: int) -> torch.Tensor:
        h_dim = self.cfg["hidden"]
        v = self.variant
        for li, L in enumerate(self.layers):
            if v == "gemm_only":
                x = self.gemm_only(L, x, li)
                continue
            h = F.rms_norm(x, (h_dim,), L["ln1"], 1e-6)
            if v != "no_attn":
                x = x + self.attention(L, h, B, t)
            h = F.rms_norm(x, (h_dim,), L["ln2"], 1e-6)
            if v == "no_ffn":
                pass
            elif not self.moe:
                x = x + self.mlp(L, h)
            elif self.impl == "grouped":
                x = x + self.moe_grouped(L, h, self.route[li])
            else:
                x = x + self.moe_loop(L, h, self.route[li], self.loop_plan[li])
        return F.linear(F.rms_norm(x, (h_dim,), self.ln_f, 1e-6), self.lm_head)

    def set_route(self, T: int, gen: torch.Generator) -> float:
        """Draw uniform top-k routing for T tokens in every layer; returns mean distinct experts/layer."""
        E, k, nl = self.cfg["experts"], self.cfg["topk"], self.cfg["layers"]
        noise = torch.rand(nl, T, E, generator=gen, device="cpu")
        self.route = noise.topk(k, dim=-1).indices.to(self.device)
        counts = torch.zeros(nl, E).scatter_add_(1, self.route.cpu().reshape(nl, -1),
                                                  torch.ones(nl, T * k))
        self.loop_plan = None
        self.offs = torch.cumsum(counts, dim=1).to(torch.int32).to(self.device)
        self.xs_buf = torch.randn(T * k, self.cfg["hidden"], device=self.device, dtype=self.dtype)
        return float((counts > 0).sum(dim=1).float().mean())

    def build_loop_plan(self) -> None:
        flat_all = self.route.cpu().reshape(self.cfg["layers"], -1)
        k = self.cfg["topk"]
        plan = []
        for li in range(flat_all.shape[0]):
            flat = flat_all[li]
            layer = []
            for e in torch.unique(flat).tolist():
                slot = torch.nonzero(flat == e).flatten()
                layer.append((e, (slot // k).to(self.device), slot.to(self.device)))
            plan.append(layer)
        self.loop_plan = plan


# --------------------------------------------------------------------------- peaks
def peaks(device: torch.device, timer: Timer, buffer_gib: float, n: int) -> dict:
    out = {}
    x = torch.ones(int(buffer_gib * 2**30) // 4, device=device, dtype=torch.float32)
    ts = timer.times_ms(x.sum, 3, 10)
    nbytes = x.numel() * 4
    out.update(read_bw_bytes=nbytes, read_bw_tbs_median=nbytes / (statistics.median(ts) / 1e3) / 1e12,
               read_bw_tbs_best=nbytes / (min(ts) / 1e3) / 1e12)
    y = torch.empty_like(x)
    ts = timer.times_ms(functools.partial(y.copy_, x), 3, 10)
    out.update(copy_bw_tbs_median=2 * nbytes / (statistics.median(ts) / 1e3) / 1e12)
    del x, y
    dt = torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=torch.float32).to(dt)
    b = torch.randn(n, n, device=device, dtype=torch.float32).to(dt)
    ts = timer.times_ms(functools.partial(torch.matmul, a, b), 3, 10)
    out.update(matmul_n=n, matmul_dtype="bfloat16",
               matmul_tflops_median=2 * n**3 / (statistics.median(ts) / 1e3) / 1e12,
               matmul_tflops_best=2 * n**3 / (min(ts) / 1e3) / 1e12)
    del a, b
    return out


# --------------------------------------------------------------------------- grid
def grid(batch_sizes, ks) -> list[tuple[int, int]]:
    pts = [(b, k) for b in batch_sizes for k in ks]
    return sorted(pts, key=lambda p: (not (p[0] in PRIORITY_BS and p[1] in PRIORITY_K), p[0], p[1]))


def measure_point(stack: Stack, B: int, t: int, args, timer: Timer, state: dict) -> dict:
    """Graph (if allowed) and eager timings of one forward at (B, t)."""
    dev = stack.device
    x = torch.randn(B * t, stack.cfg["hidden"], device=dev, dtype=stack.dtype)
    fn = functools.partial(stack.forward, x, B, t)
    row: dict = {}
    if args.eager_reps > 0 or not state["graph_ok"]:
        row["eager_median_ms"] = statistics.median(timer.times_ms(fn, 1, max(args.eager_reps, 3)))
    if state["graph_ok"]:
        try:
            replay, g = graphed(fn, dev)
            row.update(summary(timer.times_ms(replay, args.warmup, args.reps)), graph=True)
            del g
        except Exception as err:  # noqa: BLE001 - record and fall back to eager
            state["graph_ok"] = False
            state["graph_error"] = f"{type(err).__name__}: {err}"[:500]
            log(f"  CUDA graph capture failed ({state['graph_error']}); eager from here on")
            torch.cuda.synchronize()
    if "median_ms" not in row:
        ts = timer.times_ms(fn, args.warmup, args.reps)
        row.update(summary(ts), graph=False)
    del x
    return row


def run_stack(kind: str, cfg: dict, args, device: torch.device, timer: Timer, deadline: float,
              meta: dict) -> None:
    dtype = torch.bfloat16  # also on CPU (--tiny): torch._grouped_mm is bf16-only
    bss = [b for b in BATCH_SIZES if b <= args.max_bs]
    ks = [k for k in KS if k <= args.max_k]
    t_setup = time.time()
    stack = Stack(cfg, device, dtype, max(bss), max(ks) + 1, args.context)
    timer.sync()
    info = {"config": cfg, "weight_gb": stack.weight_bytes() / 1e9,
            "setup_s": round(time.time() - t_setup, 2),
            "layers_measured": cfg["layers"], "layer_scaling": "none (all layers measured)",
            "context": args.context, "dtype": str(dtype)}
    log(f"{kind}: {cfg['name']} weights {info['weight_gb']:.2f} GB, setup {info['setup_s']} s")
    state = {"graph_ok": device.type == "cuda" and not args.no_graph, "graph_error": None}
    path = os.path.join(args.out, f"{kind}.csv")
    cols = ["stack", "batch_size", "k", "tokens", "context", "median_ms", "min_ms", "max_ms", "graph",
            "eager_median_ms", "reps", "impl", "distinct_experts", "expected_distinct_experts"]
    gen = torch.Generator().manual_seed(1234)
    if kind == "moe":
        # correctness of the grouped path against the per-expert loop (one layer's MoE at T = 16)
        try:
            stack.set_route(16, gen)
            h = torch.randn(16, cfg["hidden"], device=device, dtype=dtype)
            stack.build_loop_plan()
            a = stack.moe_grouped(stack.layers[0], h, stack.route[0]).float()
            b = stack.moe_loop(stack.layers[0], h, stack.route[0], stack.loop_plan[0]).float()
            info["grouped_vs_loop_max_rel_err"] = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
            log(f"  grouped_mm vs loop: max rel err {info['grouped_vs_loop_max_rel_err']:.2e}")
        except Exception as err:  # noqa: BLE001
            info["grouped_error"] = f"{type(err).__name__}: {err}"[:500]
            stack.impl = "loop"
            log(f"  grouped_mm unusable ({info['grouped_error']}); per-expert loop")
    pts = grid(bss, ks)
    done, skipped = 0, []
    loop_points = {(1, 0), (8, 0), (64, 0),
                   (128, 3)} if stack.impl == "grouped" and args.loop_check else set()
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        fh.flush()
        for B, k in pts:
            if time.time() > deadline:
                skipped.append((B, k))
                continue
            t = k + 1
            T = B * t
            base = {"stack": cfg["name"], "batch_size": B, "k": k, "tokens": T, "context": args.context,
                    "reps": args.reps}
            impls = [stack.impl]
            if kind == "moe":
                base["distinct_experts"] = round(stack.set_route(T, gen), 3)
                E, kk = cfg["experts"], cfg["topk"]
                base["expected_distinct_experts"] = round(E * (1 - (1 - kk / E) ** T), 3)
                if (B, k) in loop_points:
                    impls.append("loop")
            for impl in impls:
                if impl == "loop":
                    stack.build_loop_plan()
                prev, stack.impl = stack.impl, impl
                row = measure_point(stack, B, t, args, timer, state)
                stack.impl = prev
                row.update(base, impl=impl if kind == "moe" else "")
                w.writerow({c: row.get(c, "") for c in cols})
                fh.flush()
                log(f"  {kind} BS {B:3d} K {k} T {T:4d} {impl if kind == 'moe' else ''}: "
                    f"{row['median_ms']:.3f} ms (graph={row['graph']}, eager "
                    f"{row.get('eager_median_ms', float('nan')):.3f})"
                    + (f", experts {base['distinct_experts']:.1f}" if kind == "moe" else ""))
            done += 1
            stack.loop_plan = None
            if device.type == "cuda" and done % 8 == 0:
                torch.cuda.empty_cache()
    info.update(points_done=done, points_skipped=[list(p) for p in skipped], graph_error=state["graph_error"],
                graph_used=state["graph_ok"], impl=stack.impl, wall_s=round(time.time() - t_setup, 1))
    if skipped:
        log(f"{kind}: time budget reached, {len(skipped)} points skipped")
    meta[kind] = info
    del stack
    if device.type == "cuda":
        torch.cuda.empty_cache()


def kernel_profile(fn) -> dict:
    """Kernels of one eager call under torch.profiler: count, summed device time, top kernels."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by: dict[str, list[float]] = {}
    for e in evs:
        by.setdefault(e.name[:90], []).append(e.time_range.elapsed_us())
    top = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:6]
    return {"kernels": len(evs), "kernel_sum_ms": sum(sum(v) for v in by.values()) / 1e3,
            "top": [{"name": n, "count": len(v), "ms": round(sum(v) / 1e3, 4)} for n, v in top]}


def breakdown(args, device: torch.device, timer: Timer, meta: dict) -> None:
    """Graph time of variants (full, no attention, no FFN/MoE, weight GEMMs only) at a few points,
    plus kernel counts / summed kernel time of the eager full and GEMM-only forwards."""
    points = {"dense": [(1, 0), (16, 0), (64, 3), (128, 7)], "moe": [(1, 0), (4, 1), (16, 3), (128, 7)]}
    rows = []
    gen = torch.Generator().manual_seed(99)
    for kind in [s.strip() for s in args.stacks.split(",") if s.strip()]:
        cfg = (TINY_DENSE if args.tiny else DENSE) if kind == "dense" else (TINY_MOE if args.tiny else MOE)
        stack = Stack(cfg, device, torch.bfloat16, 128, 8, args.context)
        for B, k in points[kind]:
            if time.time() > T0 + args.budget_s:
                log("breakdown: time budget reached")
                break
            t = k + 1
            if stack.moe:
                stack.set_route(B * t, gen)
            x = torch.randn(B * t, cfg["hidden"], device=device, dtype=torch.bfloat16)
            for variant in ("full", "no_attn", "no_ffn", "gemm_only"):
                stack.variant = variant
                fn = functools.partial(stack.forward, x, B, t)
                row = {"stack": kind, "batch_size": B, "k": k, "tokens": B * t, "variant": variant}
                try:
                    if device.type == "cuda":
                        replay, g = graphed(fn, device)
                        row.update(summary(timer.times_ms(replay, args.warmup, args.reps)))
                        del g, replay
                        if variant in ("full", "gemm_only"):
                            row.update(kernel_profile(fn))
                    else:
                        row.update(summary(timer.times_ms(fn, 1, 3)))
                except Exception as err:  # noqa: BLE001
                    row["error"] = f"{type(err).__name__}: {err}"[:300]
                rows.append(row)
                log(f"  breakdown {kind} BS {B} K {k} {variant}: {row.get('median_ms', float('nan')):.3f} ms"
                    + (f", {row['kernels']} kernels summing {row['kernel_sum_ms']:.3f} ms"
                       if "kernels" in row else "")
                    + (f" ERROR {row['error']}" if "error" in row else ""))
            stack.variant = "full"
        del stack
        if device.type == "cuda":
            torch.cuda.empty_cache()
    meta["breakdown"] = rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--eager-reps", type=int, default=5, help="0 = no eager figure when graphs work")
    ap.add_argument("--max-bs", type=int, default=128)
    ap.add_argument("--max-k", type=int, default=7)
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="stop measuring new points after this (dense gets 45%%)")
    ap.add_argument("--stacks", default="dense,moe")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--no-loop-check", dest="loop_check", action="store_false")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU logic check)")
    ap.add_argument("--peak-gib", type=float, default=4.0)
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--breakdown", action="store_true",
                    help="only time variants (no attention / no FFN / GEMMs only) at a few points; writes "
                    "breakdown.json")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    device = torch.device(args.device)
    timer = Timer(device)
    torch.manual_seed(0)
    meta: dict = {"script": "benchmarks/gpu_step_times.py", "argv": sys.argv[1:],
                  "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
                  "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                  "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        meta.update(gpu=torch.cuda.get_device_name(0), sm_count=p.multi_processor_count,
                    memory_gb=p.total_memory / 1e9, capability=list(torch.cuda.get_device_capability(0)))
    log("device", meta.get("gpu", device), "torch", torch.__version__)
    mpath = os.path.join(args.out, "meta.json")

    def dump() -> None:
        with open(mpath, "w") as fh:
            json.dump(meta, fh, indent=2, default=str)

    if args.breakdown:
        meta["script_mode"] = "breakdown"
        breakdown(args, device, timer, meta)
        meta["total_s"] = round(time.time() - T0, 1)
        with open(os.path.join(args.out, "breakdown.json"), "w") as fh:
            json.dump(meta, fh, indent=2, default=str)
        log("done in", meta["total_s"], "s")
        return
    n = 256 if args.tiny else args.matmul_n
    meta["peaks"] = peaks(device, timer, 0.01 if args.tiny else args.peak_gib, n)
    pk = meta["peaks"]
    log(f"peaks: read {pk['read_bw_tbs_median']:.3f} TB/s (best {pk['read_bw_tbs_best']:.3f}), copy "
        f"{pk['copy_bw_tbs_median']:.3f}, bf16 matmul n={n} {pk['matmul_tflops_median']:.1f} TFLOP/s "
        f"(best {pk['matmul_tflops_best']:.1f})")
    dump()
    stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
    start = time.time()
    for kind in stacks:
        cfg = (TINY_DENSE if args.tiny else DENSE) if kind == "dense" else (TINY_MOE if args.tiny else MOE)
        share = 0.45 if (kind == "dense" and "moe" in stacks) else 1.0
        deadline = start + args.budget_s * share if kind == "dense" else T0 + args.budget_s
        try:
            run_stack(kind, cfg, args, device, timer, deadline, meta)
        except Exception as err:  # noqa: BLE001 - keep the other stack
            meta[kind] = {"error": f"{type(err).__name__}: {err}"[:1000]}
            log(f"{kind} FAILED: {meta[kind]['error']}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
        dump()
    meta["total_s"] = round(time.time() - T0, 1)
    dump()
    log("done in", meta["total_s"], "s")


if __name__ == "__main__":
    main()
