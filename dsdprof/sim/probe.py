"""Measure this machine's (or its GPU's) memory bandwidth and matmul throughput with torch.

* bandwidth: best of ``repeats`` timed full reads of a large buffer (``x.sum()``: bytes / s), the
  access pattern of weight streaming in decode; a copy (read + write, 2 · bytes / s) is reported too.
* matmul: best of ``repeats`` n×n×n GEMMs in ``dtype``: 2 n³ / s.

The profile stores these as peaks with efficiency 1.0 (they are achieved figures); the fixed
overheads keep their priors until ``dsdprof calibrate`` fits them. torch is imported lazily.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dsdprof.errors import InputError
from dsdprof.sim.hardware import Efficiency, Hardware


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


def _best_seconds(fn: Callable[[], Any], sync: Callable[[], None], repeats: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def probe(device: str = "auto", dtype: Optional[str] = None, buffer_mb: Optional[int] = None,
          matmul_n: Optional[int] = None, repeats: int = 5) -> ProbeResult:
    """Run the two micro-benchmarks; returns a :class:`Hardware` (efficiency 1.0) and details."""
    try:
        import torch
    except ImportError:
        raise InputError("torch", None, "probe-hardware needs torch (pip install 'dsdprof[cpu]' or torch)") from None
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

    n_elem = buffer_mb * 2**20 // 4
    x = torch.ones(n_elem, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    nbytes = x.numel() * 4
    read_s = _best_seconds(lambda: x.sum(), sync, repeats)
    copy_s = _best_seconds(lambda: y.copy_(x), sync, repeats)
    del x, y
    a = torch.randn(matmul_n, matmul_n, device=device).to(tdtype)
    b = torch.randn(matmul_n, matmul_n, device=device).to(tdtype)
    mm_s = _best_seconds(lambda: a @ b, sync, repeats)
    tflops = 2 * matmul_n**3 / mm_s / 1e12

    if gpu:
        props = torch.cuda.get_device_properties(0)
        name, memory_gb = torch.cuda.get_device_name(0), props.total_memory / 1e9
    else:
        name = _cpu_name()
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    read_tbs = nbytes / read_s / 1e12
    hw = Hardware(name=name, bf16_tflops=tflops, memory_bandwidth_tbs=read_tbs, memory_gb=memory_gb,
                  fp32_tflops=tflops if dtype == "float32" else 0.0, tile_m=64 if gpu else 1,
                  interconnect_gbs=0.0, efficiency=Efficiency(bandwidth=1.0, compute=1.0))
    meta = {"source": "dsdprof probe-hardware", "device": device, "matmul_dtype": dtype,
            "matmul_n": matmul_n, "matmul_tflops": round(tflops, 4), "buffer_mb": buffer_mb,
            "read_bandwidth_tbs": round(read_tbs, 5), "copy_bandwidth_tbs": round(2 * nbytes / copy_s / 1e12, 5),
            "torch_version": torch.__version__, "threads": torch.get_num_threads(), "repeats": repeats,
            "note": "peaks are achieved figures (efficiency 1.0); overheads are priors until calibrated"}
    return ProbeResult(hw, meta)
