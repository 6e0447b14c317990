"""The ``[sim]`` section of a sweep spec (analytic engine settings), validated: unknown keys are
rejected by name. ``SweepSpec.sim`` is a :class:`SimConfig`, validated once when the spec is
parsed. Resolving it into hardware, architectures and acceptance is
:mod:`dsdprof.measure.sim.config`'s job; this module only says what the keys are.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from dsdprof.errors import InputError

# vLLM's --kv-cache-dtype names -> bytes per element (None: the model's own storage).
KV_CACHE_DTYPES: dict[str, float | None] = {
    "auto": None, "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "half": 2.0,
    "float32": 4.0, "fp32": 4.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_ds_mla": 1.0,
}
SIM_METHODS = ("draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix")
# The inputs that swing a prediction (dsdprof.measure.sim.inputs): stated, they set it; left out, the
# band widens to their plausible values. Names as vLLM spells them (VLLM_ATTENTION_BACKEND values).
ServingEngine = Literal["vllm", "sglang", "tensorrt-llm"]
Fp8Gemm = Literal["deep_gemm", "cutlass", "marlin"]  # block FP8 (DeepGEMM), per-tensor scaled_mm, W8A16
AttentionBackend = Literal["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN",
                           "FLASHMLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "TRITON_MLA"]
SERVING_ENGINES: tuple[str, ...] = get_args(ServingEngine)
FP8_GEMMS: tuple[str, ...] = get_args(Fp8Gemm)
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
MLA_BACKENDS = tuple(b for b in ATTENTION_BACKENDS if b.endswith("MLA"))
_ACCEPTANCE_KEYS = ("acceptance_alpha", "acceptance_per_pos", "acceptance_conditional", "acceptance_from")


class SimConfig(BaseModel):
    """``[sim]`` keys. Exactly one acceptance source is needed when the sweep has K > 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hardware: str = Field(description="catalog name (H100 SXM, H200 SXM, B200, ...) or profile TOML path")
    context_len: int | None = Field(None, ge=1, description="KV positions per sequence during decode")
    routing_correlation: float = Field(0.0, ge=0.0, lt=1.0)
    acceptance_alpha: float | None = Field(None, gt=0.0, le=1.0)
    acceptance_per_pos: list[float] | None = Field(None, min_length=1)
    acceptance_conditional: list[float] | None = Field(None, min_length=1)
    acceptance_from: str | None = None
    bandwidth_efficiency: float | None = Field(None, gt=0.0, le=100.0)
    compute_efficiency: float | None = Field(None, gt=0.0, le=100.0)
    step_overhead_s: float | None = Field(None, ge=0.0)
    draft_step_overhead_s: float | None = Field(None, ge=0.0)
    dsd_overhead_s: float | None = Field(None, ge=0.0)
    layer_overhead_s: float | None = Field(None, ge=0.0)
    moe_layer_overhead_s: float | None = Field(None, ge=0.0)
    expert_overhead_s: float | None = Field(None, ge=0.0)
    mla_layer_overhead_s: float | None = Field(None, ge=0.0)
    token_overhead_s: float | None = Field(None, ge=0.0)
    kv_cache_dtype: str | None = Field(None, description="KV-cache element type (vLLM --kv-cache-dtype "
                                                         "names); not stated: auto, the band covers fp8")
    serving_engine: ServingEngine | None = Field(
        None, description="the engine that will serve; not stated: vLLM, the band covers the others")
    engine_version: str | None = Field(None, pattern=r"^\d+\.\d+(\.\d+)?",
                                       description="its release (with serving_engine): the MLA kernel era")
    fp8_gemm: Fp8Gemm | None = Field(
        None, description="FP8 GEMM path; not stated: deep_gemm, the band covers the others")
    attention_backend: AttentionBackend | None = Field(
        None, description="a VLLM_ATTENTION_BACKEND name; not stated: the default, the band covers others")
    check_memory: bool = Field(True, description="predict OOM cells as failed rows")

    @field_validator("kv_cache_dtype", mode="before")
    @classmethod
    def _kv_dtype(cls, v: Any) -> Any:
        if v is not None and (not isinstance(v, str) or v not in KV_CACHE_DTYPES):
            raise ValueError(f"must be one of {', '.join(KV_CACHE_DTYPES)}")
        return v

    @field_validator("engine_version")
    @classmethod
    def _version_needs_engine(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("serving_engine") is None:
            raise ValueError("needs serving_engine (vllm, sglang or tensorrt-llm)")
        return v

    @model_validator(mode="after")
    def _one_acceptance(self) -> SimConfig:
        given = [k for k in _ACCEPTANCE_KEYS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one acceptance source, not {given}")
        return self


def parse_sim_config(data: SimConfig | None) -> SimConfig:
    """``spec.sim`` (validated once, in the spec), or the InputError of a spec without one."""
    if data is None:
        raise InputError("sim", None, "engine.name = 'sim' needs a [sim] section (at least hardware)")
    return data


def sim_error(e: Any, data: Any, prefix: tuple[Any, ...] = ()) -> InputError:
    """The one-line error of a ``[sim]`` validation error ``e`` (pydantic's error dict, ``loc``
    relative to the section after ``prefix``); ``data``: the section as given."""
    loc = ".".join(str(p) for p in e["loc"][len(prefix):])
    field = f"sim.{loc}" if loc else "sim"
    if e["type"] == "extra_forbidden":
        return InputError(field, e.get("input"), "unknown key")
    if loc or not isinstance(data, dict):
        value = e.get("input")
    else:
        value = {k: data.get(k) for k in _ACCEPTANCE_KEYS if k in data}
    return InputError(field, value, e["msg"].removeprefix("Value error, "))
