"""Measure this machine's (or its GPU's) memory bandwidth and matmul throughput with torch.

Peaks (each the best of ``repeats`` timed samples; a sample is ``inner`` back-to-back calls between
two synchronizes, divided by ``inner``, so launch and sync latency do not count):

* bandwidth: full reads of a large buffer (``x.sum()``: bytes / s), the access pattern of weight
  streaming in decode; a copy (read + write, 2 · bytes / s) is reported too.
* matmul: n×n×n GEMMs in ``dtype``: 2 n³ / s. On a GPU with FP8 tensor cores (compute capability
  ≥ 8.9) also an FP8 GEMM (``torch._scaled_mm``) for ``fp8_tflops``; where that fails, 0 with the
  reason in the metadata (the sim then runs FP8 GEMMs at the bf16 rate).
* L2 size (GPU) from the device properties, as ``cache_mb``.

Efficiencies, measured on decode-shaped work against those peaks:

* bandwidth: a GEMV (one token × a weight matrix of about half the buffer) -- what a decode step's
  weight-bound GEMMs achieve, divided by the read peak;
* compute: a verify-sized GEMM (1024 tokens × 4096 × 14336 on a GPU, 256 × 1024 × 4096 on a CPU),
  divided by the square-GEMM peak.

A peak is the best rate any of these shapes reached, so both efficiencies are at most 1. The fixed
overheads keep their priors until ``dsdprof calibrate`` fits them. torch is imported lazily.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dsdprof.errors import InputError
from dsdprof.measure.sim.hardware import Efficiency, Hardware


@dataclass(frozen=True)
class ProbeResult:
    hardware: Hardware
    meta: dict[str, Any]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _best_seconds(fn: Callable[[], Any], sync: Callable[[], None], repeats: int, inner: int = 1) -> float:
    """Best over ``repeats`` samples of the mean time of ``inner`` back-to-back calls."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def _fp8_tflops(torch: Any, n: int, repeats: int, inner: int) -> tuple[float, str]:
    """FP8 (e4m3) n×n×n GEMM rate via ``torch._scaled_mm``; (0, reason) where unsupported."""
    if torch.cuda.get_device_capability(0) < (8, 9):
        return 0.0, "no FP8 tensor cores (compute capability < 8.9)"
    try:
        a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
        one = torch.ones((), device="cuda")
        mm = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        s = _best_seconds(mm, torch.cuda.synchronize, repeats, inner)
        return 2 * n**3 / s / 1e12, "torch._scaled_mm e4m3"
    except Exception as exc:  # noqa: BLE001 -- any failure means: no usable FP8 path here
        first = str(exc).splitlines()[0][:160] if str(exc) else ""
        return 0.0, f"torch._scaled_mm failed: {type(exc).__name__}: {first}"


_NEEDS_TORCH = "probe-hardware needs torch (pip install 'dsdprof[cpu]' or torch)"


def probe(device: str = "auto", dtype: str | None = None, buffer_mb: int | None = None,
          matmul_n: int | None = None, repeats: int = 5) -> ProbeResult:
    """Run the two micro-benchmarks; returns a :class:`Hardware` (efficiency 1.0) and details."""
    try:
        import torch
    except ImportError:
        raise InputError("torch", None, _NEEDS_TORCH) from None
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise InputError("--device", device, "must be auto, cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device", device, "no CUDA device visible to torch")
    gpu = device == "cuda"
    dtype = dtype or ("bfloat16" if gpu else "float32")
    tdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(dtype)
    if tdtype is None:
        raise InputError("--dtype", dtype, "must be bfloat16, float16 or float32")
    if repeats < 1:
        raise InputError("--repeats", repeats, "must be >= 1")
    buffer_mb = buffer_mb or (4096 if gpu else 1024)
    matmul_n = matmul_n or (8192 if gpu else 2048)
    sync = torch.cuda.synchronize if gpu else (lambda: None)

    inner = 10 if gpu else 1
    n_elem = buffer_mb * 2**20 // 4
    x = torch.ones(n_elem, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    nbytes = x.numel() * 4
    read_s = _best_seconds(lambda: x.sum(), sync, repeats, inner)
    copy_s = _best_seconds(lambda: y.copy_(x), sync, repeats, inner)
    x = y = None  # free the buffers (the lambdas above have run)
    a = torch.randn(matmul_n, matmul_n, device=device).to(tdtype)
    b = torch.randn(matmul_n, matmul_n, device=device).to(tdtype)
    mm_s = _best_seconds(lambda: a @ b, sync, repeats, inner)
    a = b = None
    square_tflops = 2 * matmul_n**3 / mm_s / 1e12
    sum_read_tbs, copy_tbs = nbytes / read_s / 1e12, 2 * nbytes / copy_s / 1e12

    # decode-shaped work: a GEMV over ~half the buffer, and a verify-sized GEMM
    elem = torch.finfo(tdtype).bits // 8
    gemv_k = 8192 if gpu else 2048
    gemv_n = max(16, (buffer_mb * 2**20 // 2) // (gemv_k * elem))
    w = torch.randn(gemv_k, gemv_n, device=device).to(tdtype)
    v = torch.randn(1, gemv_k, device=device).to(tdtype)
    gemv_tbs = gemv_k * gemv_n * elem / _best_seconds(lambda: v @ w, sync, repeats, inner) / 1e12
    w = v = None
    m, k, n = (1024, 4096, 14336) if gpu else (256, 1024, 4096)
    xa = torch.randn(m, k, device=device).to(tdtype)
    wb = torch.randn(k, n, device=device).to(tdtype)
    verify_tflops = 2 * m * k * n / _best_seconds(lambda: xa @ wb, sync, repeats, inner) / 1e12
    xa = wb = None
    # a peak is the best rate achieved by any of the shapes, so each efficiency is <= 1
    read_tbs, tflops = max(sum_read_tbs, gemv_tbs), max(square_tflops, verify_tflops)
    eff = Efficiency(bandwidth=gemv_tbs / read_tbs, compute=verify_tflops / tflops)

    fp8, fp8_note = (_fp8_tflops(torch, matmul_n, repeats, inner) if gpu and dtype == "bfloat16"
                     else (0.0, "not probed (GPU bfloat16 runs only)"))
    if gpu:
        props = torch.cuda.get_device_properties(0)
        name, memory_gb = torch.cuda.get_device_name(0), props.total_memory / 1e9
        cache_mb = getattr(props, "L2_cache_size", 0) / 2**20
    else:
        name = _cpu_name()
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
        cache_mb = 0.0
    hw = Hardware(name=name, bf16_tflops=tflops, memory_bandwidth_tbs=read_tbs, memory_gb=memory_gb,
                  fp8_tflops=fp8, fp32_tflops=tflops if dtype == "float32" else 0.0, cache_mb=cache_mb,
                  tile_m=64 if gpu else 1, interconnect_gbs=0.0, efficiency=eff)
    meta = {"source": "dsdprof probe-hardware", "device": device, "matmul_dtype": dtype,
            "matmul_n": matmul_n, "matmul_tflops": round(square_tflops, 4), "buffer_mb": buffer_mb,
            "read_bandwidth_tbs": round(sum_read_tbs, 5), "copy_bandwidth_tbs": round(copy_tbs, 5),
            "gemv_bandwidth_tbs": round(gemv_tbs, 5), "gemv_shape": f"1x{gemv_k}x{gemv_n}",
            "verify_gemm_tflops": round(verify_tflops, 4), "verify_gemm_shape": f"{m}x{k}x{n}",
            "fp8_tflops": round(fp8, 4), "fp8_note": fp8_note,
            "torch_version": torch.__version__, "threads": torch.get_num_threads(), "repeats": repeats,
            "inner_calls": inner,
            "note": "peaks are achieved figures; efficiencies are decode-shaped GEMMs against them; "
                    "overheads are priors until calibrated"}
    return ProbeResult(hw, meta)
