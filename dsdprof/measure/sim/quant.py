"""Weight storage of a quantized HF checkpoint, read from its ``config.json`` ``quantization_config``.

The analytic engine needs bytes per weight (what a decode step streams) including the scales and
zero points that travel with the quantized values, and the GEMM precision (what the FLOP peak
is). Three classes of weights are kept apart:

* **linear**: attention, dense FFN, shared experts (the ``Linear`` layers quantizers target);
* **expert**: the routed MoE experts (quantized like ``linear`` unless a scheme singles them out);
* **head**: LM head, embedding table and MoE router. vLLM quantizes only ``LinearBase`` layers and
  fused MoE, so these stay 16-bit, except GPTQ's ``lm_head: true``.

Bytes per weight = value bits / 8 + (scale bytes + zero-point bytes) / group size, e.g.

===========================================  ============================================  ==========
``quantization_config``                      bytes per weight                              GEMM
===========================================  ============================================  ==========
fp8 (``weight_block_size`` [128, 128])       1 + 4 / 16384 (fp32 scale per block)          fp8
fbgemm_fp8, modelopt FP8, CT float 8 bit     1 (per-tensor / per-channel scale: ~0)        fp8 (A8)
CT / AWQ / GPTQ int4, group 128              0.5 + (2 + 0.5) / 128 (fp16 scale + zero)     bf16 (A16)
CT int4 symmetric, group 128                 0.5 + 2 / 128 (no zero point)                 bf16
NVFP4 (modelopt, CT ``nvfp4-pack``)          0.5 + 1 / 16 (fp8 scale per 16)               fp4 (A4)
MXFP4 (gpt-oss; experts only)                0.5 + 1 / 32 (e8m0 scale per 32)              bf16
bitsandbytes nf4 (double quant)              0.5 + 4 / 64  (0.5 + 1/64 + 4/16384)          bf16
===========================================  ============================================  ==========

CT = compressed-tensors (``config_groups`` of ``weights`` / ``input_activations`` schemes, as
llm-compressor writes them); modelopt = NVIDIA ModelOpt (``quant_algo`` FP8 / NVFP4 /
W4A16_NVFP4 / W4A8_AWQ / MIXED_PRECISION with ``quantized_layers``). A method the engine does not
model is an InputError naming it, never a silent 2 bytes per weight.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass
from typing import Any

from dsdprof.errors import InputError

KNOWN_METHODS = ("fp8", "fbgemm_fp8", "compressed-tensors", "modelopt", "modelopt_fp4", "awq", "gptq",
                 "mxfp4", "bitsandbytes")


@dataclass(frozen=True)
class Quantization:
    """Bytes per weight of each class and the GEMM precision (bf16 | fp8 | int8 | fp4)."""

    label: str  # e.g. "awq int4 g128", written into provenance and messages
    linear_bytes: float
    expert_bytes: float
    compute: str
    head_bytes: float = 2.0


@dataclass(frozen=True)
class _Scheme:
    """One weight scheme: value bits, scale bytes per group, group size, GEMM precision."""

    bits: float
    group: float  # weights per scale (math.inf = per tensor)
    scale_bytes: float
    zero_bytes: float
    compute: str
    label: str

    @property
    def bytes(self) -> float:
        if not math.isfinite(self.group):
            return self.bits / 8
        return self.bits / 8 + (self.scale_bytes + self.zero_bytes) / self.group


class _Reader:
    """Typed access to the quantization_config dict; errors name ``<field>:quantization_config.<key>``."""

    def __init__(self, data: Any, field: str, prefix: str = "quantization_config") -> None:
        if not isinstance(data, dict):
            raise InputError(f"{field}:{prefix}", data, "must be an object")
        self.data, self.field, self.prefix = data, field, prefix

    def where(self, key: str) -> str:
        return f"{self.field}:{self.prefix}.{key}"

    def int(self, key: str, default: int | None = None, minimum: int = 1, allow: tuple = ()) -> int | None:
        v = self.data.get(key, default)
        if v is None or v in allow:
            return v
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum or v > 2**31:
            raise InputError(self.where(key), v, f"must be an integer >= {minimum}")
        return v

    def str(self, key: str, default: str = "") -> str:
        v = self.data.get(key, default)
        if v is None:
            return default
        if not isinstance(v, str):
            raise InputError(self.where(key), v, "must be a string")
        return v

    def strings(self, *keys: builtins.str) -> list[builtins.str]:
        out: list[builtins.str] = []
        for key in keys:
            v = self.data.get(key)
            if v is None:
                continue
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise InputError(self.where(key), v, "must be a list of strings")
            out += v
        return out

    def sub(self, key: builtins.str) -> _Reader | None:
        v = self.data.get(key)
        return None if v is None else _Reader(v, self.field, f"{self.prefix}.{key}")


def _group(r: _Reader, key: str = "group_size") -> float:
    g = r.int(key, None, minimum=1, allow=(-1, 0))
    return math.inf if g in (None, -1, 0) else float(g)


def _int_scheme(bits: int, group: float, zero: bool, compute: str, name: str) -> _Scheme:
    """Integer weights with fp16 scales (and packed zero points) per group."""
    g = "" if not math.isfinite(group) else f" g{int(group)}"
    return _Scheme(bits, group, 2.0, bits / 8 if zero else 0.0, compute, f"{name} int{bits}{g}")


def _fp8(r: _Reader, name: str) -> _Scheme:
    block = r.data.get("weight_block_size")
    if block is None:
        return _Scheme(8, math.inf, 0.0, 0.0, "fp8", name)
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise InputError(r.where("weight_block_size"), block, "must be two positive integers")
    return _Scheme(8, float(block[0] * block[1]), 4.0, 0.0, "fp8", f"{name} block {block[0]}x{block[1]}")


def _ct_weights(w: _Reader, acts: _Reader | None, fmt: str) -> _Scheme:
    """A compressed-tensors ``weights`` scheme (+ ``input_activations`` for the GEMM precision)."""
    bits = w.int("num_bits")
    if bits is None:
        raise InputError(w.where("num_bits"), None, "missing (the weights' bit width)")
    kind = w.str("type", "int")
    if kind not in ("int", "float"):
        raise InputError(w.where("type"), kind, "must be 'int' or 'float'")
    strategy = w.str("strategy", "tensor")
    if strategy in ("group", "tensor_group"):
        group = _group(w)
    elif strategy == "block":
        block = w.data.get("block_structure")
        if (not isinstance(block, list) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise InputError(w.where("block_structure"), block, "must be two positive integers")
        group = float(block[0] * block[1])
    elif strategy in ("tensor", "channel"):
        group = math.inf  # one scale per tensor / per output row: negligible bytes
    else:
        raise InputError(w.where("strategy"), strategy,
                         "must be tensor, channel, group, tensor_group or block")
    a_bits = acts.int("num_bits") if acts is not None else None
    a_kind = acts.str("type", "int") if acts is not None else ""
    if a_bits is None or a_bits >= 16:
        compute = "bf16"  # weight-only (W4A16 / W8A16): dequantised into 16-bit GEMMs
    elif a_bits <= 4:
        compute = "fp4"
    else:
        compute = "fp8" if a_kind == "float" else "int8"
    if kind == "float" and bits == 4:  # NVFP4 (group 16, fp8 scales) / MXFP4 (group 32, e8m0)
        scale = 1.0
    elif strategy == "block":
        scale = 4.0
    else:
        scale = 2.0
    zero = 0.0 if w.data.get("symmetric", True) else bits / 8
    a = f"a{a_bits}" if a_bits else "a16"
    g = f" g{int(group)}" if math.isfinite(group) else f" {strategy}"
    return _Scheme(bits, group, scale, zero, compute, f"compressed-tensors {fmt or kind} w{bits}{a}{g}")


def _compressed_tensors(r: _Reader) -> tuple[_Scheme, _Scheme | None]:
    """(scheme for Linear layers, scheme singled out for experts or None)."""
    groups = r.sub("config_groups")
    if groups is None or not groups.data:
        raise InputError(r.where("config_groups"), r.data.get("config_groups"), "needs at least one group")
    fmt = r.str("format")
    linear: _Scheme | None = None
    expert: _Scheme | None = None
    for name in groups.data:
        g = groups.sub(name)
        w = g.sub("weights") if g is not None else None
        if g is None or w is None:
            raise InputError(groups.where(name), groups.data[name], "needs a 'weights' scheme")
        scheme = _ct_weights(w, g.sub("input_activations"), fmt)
        targets = g.strings("targets") or ["Linear"]
        if any("expert" in t.lower() for t in targets) and not any(t == "Linear" for t in targets):
            expert = scheme
        else:
            linear = scheme
    if linear is None:
        raise InputError(r.where("config_groups"), list(groups.data), "no group targets Linear layers")
    return linear, expert


_MODELOPT = {  # quant_algo -> (bits, default group, scale bytes, GEMM)
    "FP8": (8, 0, 0.0, "fp8"), "FP8_PER_CHANNEL_PER_TOKEN": (8, 0, 0.0, "fp8"),
    "FP8_PB_WO": (8, 128 * 128, 4.0, "fp8"), "FP8_BLOCKWISE": (8, 128 * 128, 4.0, "fp8"),
    "NVFP4": (4, 16, 1.0, "fp4"), "W4A16_NVFP4": (4, 16, 1.0, "bf16"), "W4A8_NVFP4_FP8": (4, 16, 1.0, "fp8"),
    "W4A8_AWQ": (4, 128, 2.0, "fp8"), "MXFP8": (8, 32, 1.0, "fp8"),
}


def _modelopt_algo(r: _Reader, key: str = "quant_algo") -> _Scheme:
    algo = r.str(key).upper()
    if algo not in _MODELOPT:
        raise InputError(r.where(key), r.data.get(key),
                         f"sim models modelopt {', '.join(_MODELOPT)}, MIXED_PRECISION")
    bits, group, scale, compute = _MODELOPT[algo]
    g = float(r.int("group_size", group, minimum=1) or 0) if group else math.inf
    return _Scheme(bits, g, scale, 0.0, compute, f"modelopt {algo}")


def _modelopt(r: _Reader) -> tuple[_Scheme, _Scheme | None]:
    inner = r.sub("quantization") if isinstance(r.data.get("quantization"), dict) else None
    r = inner or r  # hf_quant_config.json nests the settings under "quantization"
    if r.str("quant_algo").upper() != "MIXED_PRECISION":
        return _modelopt_algo(r), None
    layers = r.sub("quantized_layers")
    if layers is None or not layers.data:
        raise InputError(r.where("quantized_layers"), None, "MIXED_PRECISION needs quantized_layers")
    by_class: dict[bool, dict[str, tuple[int, _Scheme]]] = {True: {}, False: {}}
    for name in layers.data:
        sub = layers.sub(name)
        if sub is None:
            raise InputError(layers.where(name), None, "must be an object")
        s = _modelopt_algo(sub)
        seen = by_class["expert" in name.lower()]
        seen[s.label] = (seen.get(s.label, (0, s))[0] + 1, s)
    pick = lambda d: max(d.values(), key=lambda t: t[0])[1] if d else None  # noqa: E731  most common
    linear = pick(by_class[False]) or _Scheme(16, math.inf, 0.0, 0.0, "bf16", "unquantized")
    return linear, pick(by_class[True])


def parse_quantization(cfg: Any, field: str = "engine.model") -> Quantization | None:
    """The :class:`Quantization` of a HF ``quantization_config`` (None when absent or empty)."""
    if cfg is None or cfg == {}:
        return None
    r = _Reader(cfg, field)
    method = r.str("quant_method").lower().replace("_", "-") if r.data.get("quant_method") is not None else ""
    known = {"compressed-tensors": "compressed-tensors", "modelopt-fp4": "modelopt",
             "fbgemm-fp8": "fbgemm_fp8"}
    method = known.get(method, method.replace("-", "_"))
    expert: _Scheme | None = None
    head = 2.0
    if method == "fp8":
        linear = _fp8(r, "fp8")
    elif method == "fbgemm_fp8":
        linear = _Scheme(8, math.inf, 0.0, 0.0, "fp8", "fbgemm_fp8")
    elif method == "compressed-tensors":
        linear, expert = _compressed_tensors(r)
    elif method == "modelopt":
        linear, expert = _modelopt(r)
    elif method == "awq":
        bits = r.int("bits", None) or r.int("w_bit", 4) or 4
        group = _group(r, "group_size" if "group_size" in r.data else "q_group_size")
        zero = r.data.get("zero_point", True) is not False
        linear = _int_scheme(bits, group, zero, "bf16", "awq")
    elif method == "gptq":
        bits = r.int("bits", 4) or 4
        linear = _int_scheme(bits, _group(r), True, "bf16", "gptq")  # qzeros are stored even when sym
        if r.data.get("lm_head") is True:
            head = linear.bytes
    elif method == "mxfp4":
        expert = _Scheme(4, 32.0, 1.0, 0.0, "bf16", "mxfp4")
        linear = _Scheme(16, math.inf, 0.0, 0.0, "bf16", "mxfp4 experts, 16-bit rest")
        return Quantization("mxfp4 (experts)", linear.bytes, expert.bytes, "bf16", head)
    elif method == "bitsandbytes":
        if r.data.get("load_in_4bit"):
            double = bool(r.data.get("bnb_4bit_use_double_quant"))
            # absmax per 64 (8-bit + fp32 per 256 blocks if double)
            scale = 1.0 + 4.0 / 256 if double else 4.0
            kind = r.str("bnb_4bit_quant_type", "fp4")
            linear = _Scheme(4, 64.0, scale, 0.0, "bf16", f"bitsandbytes {kind}")
        elif r.data.get("load_in_8bit"):
            linear = _Scheme(8, math.inf, 0.0, 0.0, "bf16", "bitsandbytes int8")
        else:
            raise InputError(r.where("load_in_4bit"), None, "bitsandbytes config loads neither 4 nor 8 bit")
    else:
        raise InputError(r.where("quant_method"), r.data.get("quant_method"),
                         f"the analytic engine models {', '.join(KNOWN_METHODS)}")
    e = expert or linear
    label = linear.label if expert is None else f"{linear.label}; experts {expert.label}"
    compute = linear.compute if linear.bits < 16 else e.compute
    return Quantization(label, linear.bytes, e.bytes, compute, head)
