"""Hardware for the analytic engine: a catalog of accelerators and a profile TOML file format.

Peak figures are dense (no sparsity) datasheet numbers from ``../shared/reference.md``; where the
reference lists nothing (FP8 peaks, interconnect) the figure is the vendor datasheet's and marked
``# datasheet`` below. Efficiency factors and overheads are priors (the same for every GPU), not
fits: ``dsdprof calibrate`` replaces them with values fitted to a measured sweep.

Profile file (``schema = "dsdprof.hwprofile/v1"``)::

    schema = "dsdprof.hwprofile/v1"
    [hardware]      # Hardware fields (peaks)
    [efficiency]    # Efficiency fields (achieved fraction of peak, fixed overheads)
    [meta]          # free-form provenance: how it was measured / fitted, fit error
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dsdprof.errors import InputError, did_you_mean
from dsdprof.formats.versions import HWPROFILE_SCHEMA
from dsdprof.io.atomic import write_bytes_atomic

PROFILE_SCHEMA = HWPROFILE_SCHEMA
# The bounds a profile file's values must meet (pydantic reads them off the dataclass fields below).
_STRICT = ConfigDict(extra="forbid", frozen=True)
_Positive = Annotated[float, Field(gt=0)]
_Ratio = Annotated[float, Field(gt=0, le=100.0)]  # an efficiency (the fit bounds it to 100 too)
_Seconds = Annotated[float, Field(ge=0)]
_Peak = Annotated[float, Field(ge=0)]  # 0 = none
_Tile = Annotated[int, Field(ge=1)]


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of peak and fixed costs (seconds).

    step time = sum_terms max(bytes / (BW * bandwidth), flops / (F * compute))
                + all-reduces + layers * layer_overhead_s + MoE layers * moe_layer_overhead_s
                + experts loaded * expert_overhead_s
                + step_overhead_s + K * draft_step_overhead_s + [speculative] * dsd_overhead_s

    Defaults: the priors fitted on the published points of ``benchmarks/fidelity_points.toml``
    (``tests/measure/sim/test_sim_fidelity.py`` fails if they drift from a refit); what determines
    each, and why ``compute`` stays a prior and the MLA term is 0 but on H20: docs/sim.md ("Priors").
    """

    __pydantic_config__ = _STRICT  # a profile's [efficiency] is validated against these fields

    bandwidth: _Ratio = 0.825  # fitted, shared; catalog GPUs with points carry their own (below)
    compute: _Ratio = 0.70  # prior: H200 8192^3 bf16 790 of 989 TFLOP/s = 0.80 at best; decode GEMMs less
    step_overhead_s: _Seconds = 1.207e-3  # fitted (vLLM points): scheduler, sampling, input prep per step
    # fitted (EAGLE: vLLM K sweep, vLLM V1 EAGLE-1): per draft forward pass
    draft_step_overhead_s: _Seconds = 0.699e-3
    dsd_overhead_s: _Seconds = 0.885e-3  # fitted (EAGLE): drafter bookkeeping paid even at K=0
    layer_overhead_s: _Seconds = 40.0e-6  # fitted: per decoder layer per forward pass (unfused small kernels)
    moe_layer_overhead_s: _Seconds = 25.8e-6  # fitted: per MoE layer per forward (router, top-k, permute)
    expert_overhead_s: _Seconds = 0.0  # fitted 0: per distinct expert per MoE layer (latency-bound GEMM)
    # per MLA layer per forward: 0 on current (FlashMLA-class) kernels; H20 carries the fitted value of the
    # older kernels (fidelity.legacy_mla, _LEGACY_MLA_S)
    mla_layer_overhead_s: _Seconds = 0.0
    token_overhead_s: _Seconds = 0.506e-6  # fitted: per token per layer per 4096 hidden units (elementwise)


@dataclass(frozen=True)
class Hardware:
    """Peaks of one accelerator (one device; tensor parallelism multiplies devices)."""

    __pydantic_config__ = _STRICT  # a profile's [hardware] is validated against these fields

    name: str
    bf16_tflops: _Positive
    memory_bandwidth_tbs: _Positive
    memory_gb: _Positive
    fp8_tflops: _Peak = 0.0  # 0 = no FP8 tensor cores: FP8 GEMMs run at the bf16 rate
    fp32_tflops: _Peak = 0.0  # 0 = half the bf16 rate (TF32 tensor cores)
    cache_mb: _Peak = 0.0
    interconnect_gbs: _Peak = 0.0  # per direction, per device (NVLink / IF / PCIe)
    allreduce_latency_s: _Seconds = 13.2e-6  # fitted: per TP all-reduce (2 per layer), independent of TP
    tile_m: _Tile = 64  # largest GEMM row tile: large token counts are padded to a multiple of it
    min_tile_m: _Tile = 16  # smallest row tile a decode GEMM uses (see dsdprof.measure.sim.model.padded)
    fp4_tflops: _Peak = 0.0  # 0 = no FP4 tensor cores: W4A4 GEMMs run at the fp8 (else bf16) rate
    # achieved FP8 GEMM efficiency relative to bf16's (the compute efficiency is a bf16 figure):
    # 1.0 for probed profiles (their fp8_tflops is measured); catalog Hopper entries _FP8_HOPPER
    fp8_compute_ratio: Annotated[float, Field(gt=0, le=1.0)] = 1.0
    efficiency: Efficiency = field(default_factory=Efficiency)  # a profile's own [efficiency] section

    def peak_flops(self, compute_dtype: str) -> float:
        """FLOP/s for ``bf16`` | ``fp8`` | ``int8`` | ``fp4`` | ``fp32`` GEMMs.

        ``int8`` runs at the FP8 rate (equal on Hopper/Ada/Blackwell datasheets; hardware without
        FP8, e.g. A100, is credited the bf16 rate: conservative). ``fp4`` falls back to FP8, then bf16.
        The FP8 rate is the datasheet's times ``fp8_compute_ratio`` (FP8 GEMMs reach a smaller share
        of their datasheet peak than bf16 ones; see ``_FP8_HOPPER``).
        """
        if compute_dtype == "fp4" and self.fp4_tflops > 0:
            return self.fp4_tflops * 1e12
        if compute_dtype in ("fp8", "int8", "fp4") and self.fp8_tflops > 0:
            return self.fp8_tflops * 1e12 * self.fp8_compute_ratio
        if compute_dtype == "fp32":
            return (self.fp32_tflops or self.bf16_tflops / 2) * 1e12
        return self.bf16_tflops * 1e12

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.memory_bandwidth_tbs * 1e12


# Per-GPU priors (docs/sim.md, "Priors"). Peaks: datasheets (reference.md, else marked). The fixed costs
# are shared by all GPUs (Efficiency() defaults, allreduce_latency_s); the bandwidth efficiency is
# fitted per GPU where benchmarks/fidelity_points.toml has points (tests/support/fidelity.py), the
# shared value elsewhere; MI325X takes MI300X's (PRIOR_FROM); PCIe cards pay 3x the NVLink all-reduce
# latency (assumed, no point at TP > 1 over PCIe).
PRIOR_FROM = {"MI325X": "MI300X"}  # GPUs without points that take another catalog GPU's fitted efficiency
# The step overhead the fit finds for an engine with an overlap scheduler (SGLang >= 0.4, TensorRT-LLM;
# docs/sim.md, "Engine term"); the catalog's step overhead is vLLM's.
OVERLAP_STEP_OVERHEAD_S = 0.0
_NVL: float = Hardware.allreduce_latency_s
_FIT = Efficiency()
_LEGACY_MLA_S = 413.9e-6  # fitted: per MLA layer on pre-FlashMLA kernels (SGLang 0.4.1; MLA on H20)


def _bw(e_bw: float) -> Efficiency:
    """The shared fitted priors with this GPU's fitted bandwidth efficiency."""
    return replace(_FIT, bandwidth=e_bw)


_PCIE_GBS, _PCIE_AR = 32.0, 3 * _NVL  # PCIe cards: link GB/s, all-reduce latency (3x NVLink, assumed)
# FP8 compute path on Hopper (H100, H200, H20): DeepGEMM's 1550 of 1979 dense FP8 TFLOP/s on an H800
# against bf16's 790 of 989 (docs/sim.md, "FP8 compute path"). Other GPUs keep 1.0.
_FP8_HOPPER = round((1550 / 1979) / (790 / 989), 3)  # 0.980
HARDWARE: dict[str, Hardware] = {h.name: h for h in (
    # datasheet fp8, NVLink 900 GB/s bidir; bandwidth efficiency fitted on 22 H100 points (3.13 TB/s)
    Hardware("H100 SXM", 989, 3.35, 80, fp8_tflops=1979, fp8_compute_ratio=_FP8_HOPPER, cache_mb=50,
             interconnect_gbs=450, efficiency=_bw(0.934)),
    # fitted on 10 H200 points (3.88 TB/s; the torch proxy of docs/lab/gpu-h200.md measured its weight GEMMs
    # at 3.76 TB/s = 0.78, independently)
    Hardware("H200 SXM", 989, 4.8, 141, fp8_tflops=1979, fp8_compute_ratio=_FP8_HOPPER, cache_mb=50,
             interconnect_gbs=450, efficiency=_bw(0.809)),
    Hardware("B200", 2250, 8.0, 180, fp8_tflops=4500, cache_mb=126, interconnect_gbs=900,
             fp4_tflops=9000),  # datasheet fp8 / fp4 (dense = half the sparse figure), NVLink5
    # datasheet (not in reference.md; docs/sim.md, "H20 profile"); its MLA decode kernels are the
    # untuned kind: it keeps the fitted MLA term (fidelity.legacy_mla), which current kernels do not pay
    Hardware("H20", 148, 4.0, 96, fp8_tflops=296, fp8_compute_ratio=_FP8_HOPPER, cache_mb=60,
             interconnect_gbs=450,
             efficiency=replace(_bw(0.826), mla_layer_overhead_s=_LEGACY_MLA_S)),  # 1 point (DeepSeek-V3.2)
    Hardware("A100 80GB SXM", 312, 2.039, 80, cache_mb=40, interconnect_gbs=300,
             efficiency=_bw(0.786)),  # fitted on 3 points (vLLM nightly)
    # datasheet (not in reference.md): A100 40GB SXM 312 bf16 TFLOP/s dense, 1.555 TB/s HBM2, 40 MB L2
    Hardware("A100 40GB SXM", 312, 1.555, 40, cache_mb=40, interconnect_gbs=300,
             efficiency=_bw(0.879)),  # 1 point (vLLM 0.23, Llama-3.1-8B BS 1)
    Hardware("L40S", 362, 0.864, 48, fp8_tflops=733, interconnect_gbs=_PCIE_GBS,
             allreduce_latency_s=_PCIE_AR),  # datasheet fp8
    # datasheet: 7 IF links x 64 GB/s; bandwidth efficiency fitted on 16 points (vLLM 0.11.1 RC on
    # ROCm 7, Llama-3.1-70B/405B FP8 TP 8, BS 1-128): 3.88 TB/s
    Hardware("MI300X", 1307, 5.3, 192, fp8_tflops=2615, cache_mb=256, interconnect_gbs=448,
             efficiency=_bw(0.732)),
    # no point; same CDNA3 die and ROCm stack as MI300X with faster HBM3E: MI300X's fitted efficiency
    Hardware("MI325X", 1307, 6.0, 256, fp8_tflops=2615, cache_mb=256, interconnect_gbs=448,
             efficiency=_bw(0.732)),
    Hardware("RTX 4090", 165, 1.008, 24, fp8_tflops=330, cache_mb=72, interconnect_gbs=_PCIE_GBS,
             allreduce_latency_s=_PCIE_AR),  # FP32-accumulate rates
)}
_ALIASES = {"h100": "H100 SXM", "h100sxm": "H100 SXM", "h200": "H200 SXM", "h200sxm": "H200 SXM",
            "b200": "B200", "h20": "H20", "a100": "A100 80GB SXM", "a10080g": "A100 80GB SXM",
            "a10080gb": "A100 80GB SXM",
            "a10080gbsxm": "A100 80GB SXM",
            "a10040g": "A100 40GB SXM", "a10040gb": "A100 40GB SXM", "a10040gbsxm": "A100 40GB SXM",
            "l40s": "L40S", "mi300x": "MI300X", "mi325x": "MI325X",
            "rtx4090": "RTX 4090", "4090": "RTX 4090"}


def alnum_key(name: str) -> str:
    """``name`` lower-cased, letters and digits only: how catalog and engine names are matched."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


class _ProfileIn(BaseModel):
    model_config = _STRICT
    schema_: str = Field(PROFILE_SCHEMA, alias="schema")
    hardware: Hardware
    efficiency: Efficiency = Field(default_factory=Efficiency)
    meta: dict[str, Any] = Field(default_factory=dict)


def _parse_profile(text: str, name: str, field: str) -> Hardware:
    """Validate profile TOML text (schema, keys, bounds); InputError naming ``name:section.key``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InputError(field, name, f"not valid TOML ({err})") from None
    try:
        prof = _ProfileIn.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(x) for x in e["loc"])
        unknown = e["type"] in ("extra_forbidden", "unexpected_keyword_argument")  # a model's, a dataclass's
        raise InputError(f"{name}:{loc}", e.get("input"), "unknown key" if unknown else e["msg"]) from None
    if prof.schema_ != PROFILE_SCHEMA:
        raise InputError(f"{name}:schema", prof.schema_, f"expected {PROFILE_SCHEMA!r}")
    if "efficiency" in data["hardware"]:  # a field of Hardware, but its own section in the file
        raise InputError(f"{name}:hardware.efficiency", data["hardware"]["efficiency"], "unknown key")
    return replace(prof.hardware, efficiency=prof.efficiency)


def load_profile(path: str | Path, field: str = "sim.hardware") -> Hardware:
    """Read a profile TOML into :class:`Hardware` (efficiency included). InputError on bad input."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise InputError(field, str(path), "not a catalog hardware name and no such profile file; "
                         f"{did_you_mean(str(path), HARDWARE)}catalog: {', '.join(HARDWARE)}")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(field, str(p), f"not readable as TOML ({err})") from None
    return _parse_profile(text, p.name, field)


def resolve_hardware(name_or_path: str, field: str = "sim.hardware") -> Hardware:
    """Catalog name (case/space-insensitive, e.g. ``"h100"``, ``"MI300X"``) or a profile TOML path."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise InputError(field, name_or_path, "must be a hardware name or a profile .toml path")
    k = alnum_key(name_or_path)
    for name in HARDWARE:
        if alnum_key(name) == k:
            return HARDWARE[name]
    if k in _ALIASES:
        return HARDWARE[_ALIASES[k]]
    return load_profile(name_or_path, field)


def with_efficiency(hw: Hardware, **overrides: float | None) -> Hardware:
    """``hw`` with the given efficiency fields replaced (None values ignored)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(hw, efficiency=replace(hw.efficiency, **given)) if given else hw


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return '"nan"'
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    s = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    return f'"{s}"'


def profile_toml(hw: Hardware, meta: dict[str, Any] | None = None) -> str:
    """Serialise ``hw`` (and free-form ``meta`` of scalars/lists) as a profile TOML document."""
    d = asdict(hw)
    eff = d.pop("efficiency")
    lines = [f"schema = {_toml_value(PROFILE_SCHEMA)}", "", "[hardware]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in d.items()]
    lines += ["", "[efficiency]"] + [f"{k} = {_toml_value(v)}" for k, v in eff.items()]
    if meta:
        lines += ["", "[meta]"] + [f"{k} = {_toml_value(v)}" for k, v in meta.items() if v is not None]
    return "\n".join(lines) + "\n"


def write_profile(path: str | Path, hw: Hardware, meta: dict[str, Any] | None = None,
                  force: bool = False) -> Path:
    """Write a profile TOML atomically; returns the path.

    Refuses to overwrite unless ``force``. The document is validated with the loader's own rules
    (bounds, schema) and must read back as ``hw`` *before* it replaces anything: an invalid profile
    (say a compute efficiency of 850) raises InputError and leaves an existing file untouched.
    """
    p = Path(path)
    if p.exists() and not force:
        raise InputError("--out", str(p), "exists; pass --force to replace it")
    text = profile_toml(hw, meta)
    if _parse_profile(text, p.name, "--out") != hw:
        raise InputError("--out", str(p), "the profile does not read back as written; not replaced")

    def reads_back(tmp: Path) -> None:  # what is on disk, before the rename
        if load_profile(tmp, "--out") != hw:
            raise InputError("--out", str(p), "the written profile does not read back; not replaced")

    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(p, text.encode("utf-8"), reads_back)
    except OSError as err:
        raise InputError("--out", str(p), f"cannot write ({err.strerror or err})") from None
    return p
