"""Time vLLM's CPU fused-MoE kernel (``cpu_fused_moe``, fp32, the ``vec`` ISA) on one toy expert
shape as the tokens in a step grow: where loading experts stops paying and compute takes over.

    python benchmarks/moe_cpu_kernel.py --hidden 512 --expert-ffn 1024 --experts 32 --top-k 8 \
        --layers 7 --tokens 1,2,4,8,16,32,48,80

One OMP thread (what vLLM's CPU worker gets on a 2-core machine: it reserves one core). Tokens are
routed uniformly at random; each layer has its own weights, so the experts are not cache-resident
between layers. Prints per layer: distinct experts, ms, and the marginal ms per added token.
Kernel source: csrc/cpu/cpu_fused_moe.cpp (experts with no token are skipped).
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--expert-ffn", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--layers", type=int, default=7)
    ap.add_argument("--tokens", default="1,2,4,8,16,32,48,80")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    a = ap.parse_args()
    import torch
    from vllm import _custom_ops as ops

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    h, f, e, k = a.hidden, a.expert_ffn, a.experts, a.top_k
    layers = [(ops.cpu_prepack_moe_weight(torch.randn(e, 2 * f, h) * 0.02, "vec"),
               ops.cpu_prepack_moe_weight(torch.randn(e, h, f) * 0.02, "vec")) for _ in range(a.layers)]
    mb = 3 * h * f * 4 / 1e6
    print(f"expert {mb:.2f} MB fp32, {e} experts x {a.layers} layers ({e * a.layers * mb / 1e3:.2f} GB), "
          f"top-{k}, {a.threads} thread(s)")

    def run(t: int) -> float:
        x = torch.randn(t, h)
        out = torch.empty_like(x)
        ids = torch.stack([torch.randperm(e)[:k] for _ in range(t)]).to(torch.int32)
        w = torch.full((t, k), 1.0 / k)
        t0 = time.perf_counter()
        for w13, w2 in layers:
            ops.cpu_fused_moe(out, x, w13, w2, None, None, w, ids, "silu", "vec")
        dt = time.perf_counter() - t0
        return dt, len(torch.unique(ids))

    prev = None
    print(f"{'tokens':>6} {'distinct':>8} {'tok/expert':>10} {'ms/layer':>9} {'marginal ms/token':>18}")
    for t in [int(x) for x in a.tokens.split(",")]:
        run(t)
        samples = [run(t) for _ in range(a.repeats)]
        best = min(s[0] for s in samples) / a.layers * 1e3
        dist = sum(s[1] for s in samples) / len(samples)
        marg = "" if prev is None else f"{(best - prev[1]) / (t - prev[0]):.3f}"
        print(f"{t:6d} {dist:8.1f} {t * k / dist:10.2f} {best:9.3f} {marg:>18}")
        prev = (t, best)


if __name__ == "__main__":
    main()
