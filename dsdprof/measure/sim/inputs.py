"""The inputs that swing a prediction, stated or assumed: serving engine and version (kernel era),
KV-cache dtype, FP8 GEMM path and attention backend (``[sim]`` keys, vLLM-style names).

A stated input sets the prediction. An input left out is *assumed*: the prediction takes its
default (vLLM, current kernels, ``auto`` KV, DeepGEMM's block FP8, FlashAttention) and the band
(:mod:`dsdprof.measure.sim.band`) widens to every plausible value of it
(:attr:`StatedInputs.scenarios`). Only inputs that move this setup are listed: the kernel era
only for MLA models, the FP8 path only for FP8 GEMMs, the attention backend only on GPUs where it
changes the decode attention (:data:`dsdprof.measure.sim.context.FULL_TILE_GPUS`). What each input
does to the step model, with its sources: docs/sim.md ("Stated inputs").
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace

from dsdprof.config.sim import ATTENTION_BACKENDS, FP8_GEMMS, MLA_BACKENDS, SERVING_ENGINES
from dsdprof.measure.sim.arch import ModelArch
from dsdprof.measure.sim.context import ATTENTION_TILE_ROWS, FULL_TILE_GPUS
from dsdprof.measure.sim.hardware import (
    _FP8_HOPPER,
    _LEGACY_MLA_S,
    OVERLAP_STEP_OVERHEAD_S,
    Hardware,
    alnum_key,
)
from dsdprof.measure.sim.model import HwArrays

__all__ = ["ATTENTION_BACKENDS", "FP8_GEMMS", "SERVING_ENGINES", "Assumption", "Scenario", "Stated",
           "StatedInputs", "engine_family", "kv_cache_dtype_of", "legacy_mla", "overlaps_cpu",
           "resolve_inputs", "LEGACY_MLA_S", "CUTLASS_FP8_RATIO"]

LEGACY_MLA_S = _LEGACY_MLA_S
# per-tensor FP8 scaled_mm (CUTLASS / cuBLASLt) on Hopper, relative to bf16's share of peak: this
# project's torch._scaled_mm probe on an H200 (docs/lab/gpu-h200.md); DeepGEMM's block FP8 is the
# catalog's 0.980 (hardware._FP8_HOPPER)
CUTLASS_FP8_RATIO = 0.907
LEGACY_MLA_GPUS = ("H20",)
_MODERN_MLA = {"sglang": (0, 4, 3), "vllm": (0, 7, 3)}  # first releases with FlashMLA-class MLA decode


def overlaps_cpu(engine: str) -> bool:
    """SGLang or TensorRT-LLM (free text, e.g. ``SGLang 0.4.1.post2``): an overlap scheduler hides
    the CPU step work (docs/sim.md)."""
    e = alnum_key(engine)
    return "sglang" in e or "tensorrtllm" in e or "trtllm" in e


def engine_family(engine: str) -> str:
    """``overlap`` (SGLang, TensorRT-LLM) or ``vllm`` (every other engine: the fit gives them vLLM's
    step overhead)."""
    return "overlap" if overlaps_cpu(engine) else "vllm"


def legacy_mla(engine: str, hardware: str) -> bool:
    """True where the MLA decode of ``engine`` (free text with a version) on ``hardware`` predates
    FlashMLA-class kernels: H20, SGLang < 0.4.3, vLLM < 0.7.3. FlashMLA
    (https://github.com/deepseek-ai/FlashMLA, Feb 2025) and DeepGEMM replaced the Triton MLA and
    block-FP8 kernels (vLLM #13747, SGLang 0.4.3); sglang#4204 said MLA on H20 was not yet tuned."""
    if hardware in LEGACY_MLA_GPUS:
        return True
    e = engine.lower()
    for name, first in _MODERN_MLA.items():
        m = re.search(name + r"\D*(\d+)\.(\d+)(?:\.(\d+))?", e)
        if m:
            return tuple(int(x or 0) for x in m.groups()) < first
    return False


def kv_cache_dtype_of(engine: str, dtype: str, kv_cache_dtype: str) -> str:
    """The KV-cache format an engine uses: ``kv_cache_dtype`` unless it is ``auto`` on a
    TensorRT-LLM FP8 checkpoint, which stores FP8 KV (its ``KvCacheConfig(dtype="auto")`` follows the
    checkpoint's ``kv_cache_quant_algo``, and Model Optimizer's PTQ quantizes KV to FP8 by default;
    vLLM and SGLang keep the model dtype under ``auto``)."""
    trt = "tensorrtllm" in alnum_key(engine) or "trtllm" in engine.lower()
    return "fp8" if (trt and kv_cache_dtype == "auto" and dtype in ("fp8", "float8")) else kv_cache_dtype


@dataclass(frozen=True)
class Stated:
    """What a user stated (None: not stated). ``step_overhead_given`` / ``mla_given``: the spec sets
    ``step_overhead_s`` / ``mla_layer_overhead_s`` itself (or a measured profile does), which
    overrides what the engine and its era would give."""

    serving_engine: str | None = None
    engine_version: str | None = None
    kv_cache_dtype: str | None = None
    fp8_gemm: str | None = None
    attention_backend: str | None = None
    step_overhead_given: bool = False
    mla_given: bool = False


@dataclass(frozen=True)
class Scenario:
    """One value of every swinging input: what a prediction is evaluated under."""

    serving_engine: str  # vllm | sglang | tensorrt-llm
    legacy_mla: bool  # pre-FlashMLA MLA kernels (or H20's)
    kv_cache_dtype: str
    fp8_gemm: str  # deep_gemm | cutlass | marlin
    full_tile: bool  # decode attention computes a whole first query tile (FA3 on H20)

    @property
    def family(self) -> str:
        return engine_family(self.serving_engine)

    def hardware(self, hw: Hardware, stated: Stated) -> Hardware:
        """``hw`` with this scenario's step overhead, MLA term and FP8 GEMM rate (overrides the spec
        gives stay: ``stated.step_overhead_given`` / ``mla_given``)."""
        e = hw.efficiency
        if not stated.step_overhead_given and self.family == "overlap":
            e = replace(e, step_overhead_s=OVERLAP_STEP_OVERHEAD_S)
        if not stated.mla_given:
            e = replace(e, mla_layer_overhead_s=LEGACY_MLA_S if self.legacy_mla else 0.0)
        ratio = hw.fp8_compute_ratio
        if self.fp8_gemm == "cutlass":
            ratio = ratio * CUTLASS_FP8_RATIO / _FP8_HOPPER if ratio < 1.0 else CUTLASS_FP8_RATIO
        return replace(hw, efficiency=e, fp8_compute_ratio=min(ratio, 1.0))

    def compute_dtype(self, compute_dtype: str) -> str:
        """Marlin runs FP8 weights through bf16 tensor cores (W8A16)."""
        return "bf16" if (self.fp8_gemm == "marlin" and compute_dtype == "fp8") else compute_dtype

    def arrays(self, hw: Hardware, stated: Stated, compute_dtype: str) -> HwArrays:
        """The step model's hardware side under this scenario (``hw``: before any scenario)."""
        h = self.hardware(hw, stated)
        rows = float(ATTENTION_TILE_ROWS) if (self.full_tile and hw.tile_m > 1) else 1.0
        return replace(HwArrays.of(h, self.compute_dtype(compute_dtype)), attention_min_rows=rows)


@dataclass(frozen=True)
class Assumption:
    """One swinging input: the value the prediction used, whether the spec stated it, and the values
    the band covers (the value alone when stated)."""

    key: str
    value: str
    stated: bool
    plausible: tuple[str, ...]

    def text(self) -> str:
        if self.stated:
            return f"{self.key} {self.value} (stated)"
        others = [v for v in self.plausible if v != self.value]
        return f"{self.key} {self.value}" + (f" (band covers {', '.join(others)})" if others else "")


@dataclass(frozen=True)
class StatedInputs:
    """The nominal scenario (what the point prediction uses), the assumptions behind it, and every
    scenario the band covers (nominal first)."""

    nominal: Scenario
    assumptions: tuple[Assumption, ...]
    scenarios: tuple[Scenario, ...]
    families: tuple[str, ...]  # engine families the band covers

    @property
    def assumed(self) -> tuple[Assumption, ...]:
        return tuple(a for a in self.assumptions if not a.stated)


def _era(stated: Stated, hw: Hardware) -> tuple[bool, bool]:
    """(legacy MLA, stated?) from the attention backend or engine and version; H20 by default."""
    if stated.attention_backend in MLA_BACKENDS:
        return stated.attention_backend == "TRITON_MLA", True
    if stated.serving_engine and stated.engine_version:
        return legacy_mla(f"{stated.serving_engine} {stated.engine_version}", hw.name), True
    if stated.mla_given:
        return hw.efficiency.mla_layer_overhead_s > 0, True
    return hw.name in LEGACY_MLA_GPUS, False


def resolve_inputs(stated: Stated, hw: Hardware, target: ModelArch, dtype: str,
                   compute_dtype: str) -> StatedInputs:
    """Nominal values, assumptions and the scenarios the band covers, for one setup."""
    rows: list[tuple[str, str, bool, tuple[str, ...]]] = []
    engines: tuple[str, ...]
    if stated.serving_engine or stated.step_overhead_given:
        engine = stated.serving_engine or "vllm"
        engines = (engine,)
        shown = stated.serving_engine or "as step_overhead_s gives"
        rows.append(("serving_engine", shown, True, (shown,)))
    else:
        engine, engines = "vllm", ("vllm", "sglang")  # sglang stands for both overlap engines
        rows.append(("serving_engine", "vllm", False, ("vllm", "sglang", "tensorrt-llm")))
    legacy, era_stated = _era(stated, hw)
    eras = (legacy,) if era_stated else (legacy, not legacy)
    if target.mla is not None:
        name = lambda x: "pre-FlashMLA" if x else "FlashMLA-class"  # noqa: E731
        rows.append(("MLA kernels (engine_version)", name(legacy), era_stated, tuple(map(name, eras))))
    else:
        eras = (legacy,)
    weights = dtype if compute_dtype != "fp8" else "fp8"
    kv = kv_cache_dtype_of(engine, weights, stated.kv_cache_dtype or "auto")
    kvs = (kv,) if stated.kv_cache_dtype is not None else tuple(dict.fromkeys((kv, "auto", "fp8")))
    rows.append(("kv_cache_dtype", kv, stated.kv_cache_dtype is not None, kvs))
    gemm = stated.fp8_gemm or "deep_gemm"
    gemms: tuple[str, ...] = (gemm,) if stated.fp8_gemm else FP8_GEMMS
    if compute_dtype == "fp8":
        rows.append(("fp8_gemm", gemm, stated.fp8_gemm is not None, gemms))
    else:
        gemms = (gemm,)
    full = hw.name in FULL_TILE_GPUS and target.mla is None
    tiles: tuple[bool, ...] = (full,)
    if hw.name in FULL_TILE_GPUS and target.mla is None:
        backend = stated.attention_backend or "FLASH_ATTN"
        full = backend == "FLASH_ATTN"
        tiles = (full,) if stated.attention_backend else (True, False)
        rows.append(("attention_backend", backend, stated.attention_backend is not None,
                     (backend,) if stated.attention_backend else ("FLASH_ATTN", "FLASHINFER")))
    nominal = Scenario(engine, legacy, kv, gemm, full)
    combos = [Scenario(*c) for c in itertools.product(engines, eras, kvs, gemms, tiles)]
    scenarios = (nominal, *[s for s in combos if s != nominal])
    families = tuple(dict.fromkeys(s.family for s in scenarios))
    return StatedInputs(nominal, tuple(Assumption(*r) for r in rows), scenarios, families)
