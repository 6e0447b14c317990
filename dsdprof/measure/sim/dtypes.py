"""Engine dtypes and weight storage: bytes per weight (float dtypes, online quantization, a
checkpoint's ``quantization_config``) and the precision GEMMs run at."""

from __future__ import annotations

from dataclasses import dataclass

from dsdprof.errors import InputError
from dsdprof.measure.sim.arch import ModelArch

FLOAT_DTYPES: dict[str, float] = {  # engine dtype -> bytes per unquantized weight
    "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "half": 2.0,
    "float32": 4.0, "fp32": 4.0, "float": 4.0,
}
# online quantization of an unquantized model: (linear bytes or None = 16-bit, expert bytes or
# None = linear, GEMM precision); LM head, embedding and router stay 16-bit (vLLM quantizes
# LinearBase and fused-MoE layers only)
ONLINE_QUANT: dict[str, tuple[float | None, float | None, str]] = {
    "fp8": (1.0, None, "fp8"), "float8": (1.0, None, "fp8"), "int8": (1.0, None, "bf16"),
    "int4": (0.5, None, "bf16"), "mxfp4": (None, 4.25 / 8, "bf16"),
}
DTYPES = (*FLOAT_DTYPES, *ONLINE_QUANT)
# KV-cache dtype ([sim] kv_cache_dtype, vLLM's --kv-cache-dtype names) -> bytes per element;
# "auto" = the GEMM precision's default (4 for fp32 engines, else 2)


@dataclass(frozen=True)
class Storage:
    """Bytes per weight by class, GEMM precision and KV-cache bytes per element."""

    linear: float  # attention, dense FFN, shared experts, extra params
    expert: float  # routed experts
    head: float  # LM head, embedding table, MoE router
    compute: str  # bf16 | fp8 | int8 | fp4 | fp32
    kv: float


def resolve_dtype(arch: ModelArch, dtype: str) -> Storage:
    """The weight storage an engine ``dtype`` gives ``arch``.

    * ``auto``: the checkpoint's own storage (FP8 DeepSeek-V3, MXFP4 gpt-oss experts, whatever a
      config.json's ``quantization_config`` says, else its ``torch_dtype``).
    * a float dtype (bfloat16, float16, float32): unquantized models are stored in it; a quantized
      checkpoint keeps its quantized weights (as vLLM loads it) and the dtype applies to the rest.
      float32 on a quantized checkpoint is an InputError (vLLM's quantized kernels are 16-bit).
    * ``fp8``, ``int8``, ``int4``, ``mxfp4``: online quantization of the linear (or expert) layers.

    KV cache: 4 bytes per element for fp32 GEMMs, else 2.
    """
    native_head = arch.head_weight_bytes if arch.head_weight_bytes is not None else (
        2.0 if arch.quantization else arch.weight_bytes)
    expert = arch.expert_weight_bytes if arch.expert_weight_bytes is not None else arch.weight_bytes
    if dtype == "auto":
        lin, exp, head, comp = arch.weight_bytes, expert, native_head, arch.compute_dtype
    elif dtype in FLOAT_DTYPES:
        b = FLOAT_DTYPES[dtype]
        if arch.quantization and b == 4.0:
            raise InputError("engine.dtype", dtype, f"{arch.name} is a quantized checkpoint "
                             f"({arch.quantization}); its kernels run in 16 bit: "
                             "use auto, bfloat16 or float16")
        if arch.quantization:
            lin, exp, head, comp = arch.weight_bytes, expert, native_head, arch.compute_dtype
        else:
            lin = exp = head = b
            comp = "fp32" if b == 4.0 else "bf16"
    elif dtype in ONLINE_QUANT:
        q_lin, q_exp, comp = ONLINE_QUANT[dtype]
        lin = q_lin if q_lin is not None else 2.0
        exp = q_exp if q_exp is not None else lin
        head = 2.0
    else:
        raise InputError("engine.dtype", dtype, f"sim knows auto, {', '.join(DTYPES)}")
    return Storage(lin, exp, head, comp, 4.0 if comp == "fp32" else 2.0)
