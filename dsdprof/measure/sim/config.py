"""The ``[sim]`` section of a sweep spec, validated (unknown keys rejected), and its resolution
into a :class:`SimSetup` (hardware, architectures, acceptance) that the engine evaluates.

```toml
[engine]
name = "sim"
model = "Llama-3.1-8B"          # catalog name or path to a HF config.json (or its directory)
draft_model = "EAGLE3-Llama-3.1-8B"   # optional: derived from method when omitted
method = "eagle3"               # draft_model | eagle | eagle3 | mtp | ngram | suffix
dtype = "bfloat16"              # auto = the model's native storage
tensor_parallel_size = 1

[sim]
hardware = "H100 SXM"           # catalog name or a profile TOML (probe-hardware / calibrate)
context_len = 1024              # default: workload.input_len + sweep.output_len / 2
routing_correlation = 0.0       # rho in n_eff = B * (K+1)^(1-rho); 0 = uniform routing
acceptance_alpha = 0.8          # or acceptance_per_pos / acceptance_conditional / acceptance_from
# Stated inputs (left out: the default, and the band covers the other values; docs/sim.md):
kv_cache_dtype = "auto"         # auto | bfloat16 | float16 | float32 | fp8 | fp8_e4m3 | fp8_e5m2
serving_engine = "vllm"         # vllm | sglang | tensorrt-llm
engine_version = "0.11.1"       # with serving_engine: the MLA kernel era
fp8_gemm = "deep_gemm"          # deep_gemm | cutlass | marlin (FP8 weights only)
attention_backend = "FLASH_ATTN"  # a VLLM_ATTENTION_BACKEND name (H20 and MLA models only)
# bandwidth_efficiency, compute_efficiency, step_overhead_s, draft_step_overhead_s,
# dsd_overhead_s, layer_overhead_s, moe_layer_overhead_s, expert_overhead_s, mla_layer_overhead_s,
# token_overhead_s override the hardware profile's values.
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dsdprof.config.sim import SIM_METHODS, SimConfig, parse_sim_config
from dsdprof.errors import InputError
from dsdprof.measure.sim import acceptance as acc
from dsdprof.measure.sim.arch import ModelArch
from dsdprof.measure.sim.catalog import derived_draft, resolve_model, shadow_notices
from dsdprof.measure.sim.dtypes import resolve_dtype
from dsdprof.measure.sim.hardware import HARDWARE, Hardware, resolve_hardware, with_efficiency
from dsdprof.measure.sim.inputs import Scenario, Stated, StatedInputs, resolve_inputs
from dsdprof.measure.sim.model import HwArrays


@dataclass(frozen=True)
class SimSetup:
    """Everything the engine needs, resolved and checked."""

    hardware: Hardware
    target: ModelArch
    draft: ModelArch | None
    method: str
    dtype: str
    tensor_parallel_size: int
    context_len: int
    routing_correlation: float
    acceptance: np.ndarray  # unconditional p_1..p_Kmax
    acceptance_source: str
    check_memory: bool
    kv_cache_dtype: str = "auto"  # the nominal scenario's
    stated: Stated = Stated()
    inputs: StatedInputs | None = None  # None: the catalog's defaults, nothing resolved
    base_hardware: Hardware | None = None  # before the nominal scenario (the band applies others to it)

    @property
    def compute_dtype(self) -> str:
        c = resolve_dtype(self.target, self.dtype).compute
        return self.inputs.nominal.compute_dtype(c) if self.inputs else c

    def assumption_note(self) -> str:
        """``; assumed ...``: the inputs the spec left out (the band covers their plausible values)."""
        assumed = self.inputs.assumed if self.inputs else ()
        return ("; assumed (state them in [sim] to narrow the band): "
                + "; ".join(a.text() for a in assumed)) if assumed else ""

    def arrays(self, scenario: Scenario | None = None) -> HwArrays:
        """The step model's hardware side under ``scenario`` (default: the nominal one)."""
        if self.inputs is None or self.base_hardware is None:
            return HwArrays.of(self.hardware, self.compute_dtype)
        sc = scenario or self.inputs.nominal
        return sc.arrays(self.base_hardware, self.stated, resolve_dtype(self.target, self.dtype).compute)


def _acceptance(cfg: SimConfig, k_max: int) -> tuple[np.ndarray, str]:
    if k_max == 0:
        return np.zeros(0), "none (K = 0 only)"
    if cfg.acceptance_alpha is not None:
        return acc.geometric(cfg.acceptance_alpha, k_max), f"geometric alpha={cfg.acceptance_alpha}"
    if cfg.acceptance_per_pos is not None:
        p = acc.check_unconditional(cfg.acceptance_per_pos, "sim.acceptance_per_pos")
        return acc.extend(p, k_max), f"per-position {cfg.acceptance_per_pos}"
    if cfg.acceptance_conditional is not None:
        a = np.asarray(cfg.acceptance_conditional, dtype=float)
        if np.any(a < 0) or np.any(a > 1) or not np.all(np.isfinite(a)):
            raise InputError("sim.acceptance_conditional", cfg.acceptance_conditional,
                             "rates must lie in [0, 1]")
        return acc.extend(acc.from_conditional(list(a)), k_max), f"conditional {cfg.acceptance_conditional}"
    if cfg.acceptance_from is not None:
        p = acc.from_measurements(cfg.acceptance_from)
        return acc.extend(p, k_max), f"measured {cfg.acceptance_from}"
    raise InputError("sim", None, "needs an acceptance source for K > 0: acceptance_alpha, "
                                  "acceptance_per_pos, acceptance_conditional or acceptance_from")


def _check_context_sweep(spec: Any, cfg: SimConfig) -> None:
    """A context sweep sets each cell's context: ``[sim] context_len`` would contradict it, and
    its longest request must fit ``max_model_len``."""
    contexts = getattr(spec.sweep, "context_lens", None)
    if not contexts:
        return
    if cfg.context_len is not None:
        raise InputError("sim.context_len", cfg.context_len,
                         "a context sweep sets each cell's context ([sweep] context_lens): leave it out")
    need = max(contexts) + spec.sweep.output_len + spec.max_k + 1
    if need > spec.engine.max_model_len:
        raise InputError("engine.max_model_len", spec.engine.max_model_len,
                         f"must be >= max context_lens + output_len + max K + 1 = {need}")


def resolve(spec: Any) -> SimSetup:
    """Build a :class:`SimSetup` from a validated :class:`dsdprof.config.spec.SweepSpec`."""
    eng = spec.engine
    if eng.name != "sim":
        raise InputError("engine.name", eng.name, "SimEngine needs engine.name = 'sim'")
    cfg = parse_sim_config(spec.sim)
    if eng.method not in SIM_METHODS:
        raise InputError("engine.method", eng.method, f"sim models {', '.join(SIM_METHODS)}")
    target = resolve_model(eng.model, "engine.model")
    if eng.draft_model:
        if eng.method in ("ngram", "suffix"):
            raise InputError("engine.draft_model", eng.draft_model,
                             f"method {eng.method!r} uses no draft model")
        draft: ModelArch | None = resolve_model(eng.draft_model, "engine.draft_model")
    else:
        draft = derived_draft(target, eng.method)
        if draft is None and eng.method == "draft_model":
            raise InputError("engine.draft_model", None,
                             "method 'draft_model' needs a draft (catalog name or config.json)")
    storage = resolve_dtype(target, eng.dtype)  # validates the dtype name
    base = resolve_hardware(cfg.hardware)
    catalog = HARDWARE.get(base.name) is base  # a profile's overheads were measured on its own engine
    hw = with_efficiency(
        base, bandwidth=cfg.bandwidth_efficiency, compute=cfg.compute_efficiency,
        step_overhead_s=cfg.step_overhead_s, draft_step_overhead_s=cfg.draft_step_overhead_s,
        dsd_overhead_s=cfg.dsd_overhead_s, layer_overhead_s=cfg.layer_overhead_s,
        moe_layer_overhead_s=cfg.moe_layer_overhead_s, expert_overhead_s=cfg.expert_overhead_s,
        mla_layer_overhead_s=cfg.mla_layer_overhead_s, token_overhead_s=cfg.token_overhead_s)
    context = cfg.context_len or spec.workload.input_len + spec.sweep.output_len // 2
    if context > eng.max_model_len:
        raise InputError("sim.context_len", context, f"exceeds engine.max_model_len={eng.max_model_len}")
    _check_context_sweep(spec, cfg)
    p, source = _acceptance(cfg, spec.max_k)
    stated = Stated(cfg.serving_engine, cfg.engine_version, cfg.kv_cache_dtype, cfg.fp8_gemm,
                    cfg.attention_backend, step_overhead_given=cfg.step_overhead_s is not None or not catalog,
                    mla_given=cfg.mla_layer_overhead_s is not None or not catalog)
    inputs = resolve_inputs(stated, hw, target, eng.dtype, storage.compute)
    nominal = inputs.nominal
    return SimSetup(nominal.hardware(hw, stated), target, draft, eng.method, eng.dtype,
                    eng.tensor_parallel_size, int(context), cfg.routing_correlation, p, source,
                    cfg.check_memory, nominal.kv_cache_dtype, stated, inputs, hw)


def model_notices(spec: Any) -> list[str]:
    """:func:`~dsdprof.measure.sim.catalog.shadow_notices` of the spec's model and draft model."""
    engine = spec.engine
    return shadow_notices((("engine.model", engine.model), ("engine.draft_model", engine.draft_model)))
