"""The sections of a sweep spec (:mod:`dsdprof.config.spec`): ``[engine]``, ``[sweep]`` and ``[workload]``
as pydantic models, with the limits and the keys dsdprof reserves."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from dsdprof.formats.ktable import LAST_RANGE_END

# vLLM speculative methods that need a draft model; anything vLLM accepts may be passed.
DRAFT_MODEL_METHODS = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator")

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
# vLLM bench dataset names that are not dsdprof's.
VLLM_DATASET_NAMES = {"random": "synthetic", "sonnet": None, "burstgpt": None, "hf": None, "custom": None,
                      "prefix_repetition": None, "random-mm": None, "random-rerank": None}


def _sorted_distinct(v: list[int], lo: int, hi: int, label: str, plural: str) -> list[int]:
    """``v`` sorted, once each, every value in ``lo..hi``; else the ValueError naming it (``label``)."""
    for x in v:
        if not lo <= x <= hi:
            raise ValueError(f"{label.format(x)} must be in {lo}..{hi}")
    if len(set(v)) != len(v):
        raise ValueError(f"duplicate {plural}")
    return sorted(v)


def _without_unset(model: Any, data: dict[str, Any], name: str) -> dict[str, Any]:
    """``data`` (a model's dump) without ``name`` when the model leaves it None: an optional key added
    later then dumps (and hashes) a spec without it as before."""
    if getattr(model, name) is None:
        data.pop(name, None)
    return data


def _not_reserved(key: str, reserved: Collection[str], instead: str) -> None:
    """A key dsdprof sets itself is refused, naming what sets it (``instead``)."""
    if key in reserved:
        raise ValueError(f"{key!r} is set by dsdprof ({instead}); it cannot be overridden")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSpec(_Strict):
    name: Literal["vllm", "sim"] = "vllm"
    model: str = Field(description="target model: HF id or local path (sim: catalog name or config.json)")
    draft_model: str | None = Field(None, description="draft model for draft-model/EAGLE methods")
    method: str = Field("draft_model", description="vLLM speculative method")
    dtype: str = "auto"
    max_model_len: int = Field(2048, ge=16)
    tensor_parallel_size: int = Field(1, ge=1)
    extra: dict[str, JsonValue] = Field(default_factory=dict,
                                        description="passed to the engine (vllm.LLM kwargs)")
    speculative_extra: dict[str, JsonValue] = Field(
        default_factory=dict, description="merged into vLLM's speculative_config")
    dsd_mode: Literal["auto", "dsd", "fixed"] = Field(
        "auto", description="auto: one DSD engine for all K, falling back to one engine per K "
                            "only when vLLM rejects the DSD schedule")
    synthetic_acceptance_rates: list[Any] | None = Field(
        None, description="vLLM's synthetic rejection sampler (rejection_sample_method = 'synthetic'): "
                          "rate i = P(the first i+1 drafts of a step are all accepted), one per draft "
                          "position "
                          "up to the largest K, non-increasing; acceptance is then configured, not measured, "
                          "and the run is labelled so (step-time physics alone)")
    start_timeout_s: float = Field(1800.0, gt=0, le=86400, description="seconds an engine may take to start")
    cell_timeout_s: float = Field(3600.0, gt=0, le=86400, description="seconds one cell may take")

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        """Unset ``synthetic_acceptance_rates`` is left out: a spec without it dumps (and hashes) as
        before."""
        return _without_unset(self, handler(self), "synthetic_acceptance_rates")

    @field_validator("extra")
    @classmethod
    def _extra_keys(cls, v: dict[str, JsonValue]) -> dict[str, JsonValue]:
        for key in v:
            _not_reserved(key, RESERVED_LLM_KEYS, "use the [engine]/[sweep] keys")
            if key.startswith("dsdprof_"):
                raise ValueError(f"{key!r}: dsdprof's timeouts are [engine] start_timeout_s / cell_timeout_s")
        return v

    @field_validator("speculative_extra")
    @classmethod
    def _speculative_keys(cls, v: dict[str, JsonValue]) -> dict[str, JsonValue]:
        for key in v:
            _not_reserved(key, RESERVED_SPECULATIVE_KEYS,
                          "[engine] method/draft_model, [sweep] num_spec_tokens")
            if key in SYNTHETIC_SPECULATIVE_KEYS or (key == "rejection_sample_method" and v[key]
                                                     == "synthetic"):
                raise ValueError(f"{key!r}: use engine.synthetic_acceptance_rates (the run is then labelled "
                                 "synthetic)")
        return v

    @field_validator("synthetic_acceptance_rates")
    @classmethod
    def _synthetic_rates(cls, v: list[Any] | None) -> list[float] | None:
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
    def _draft_needed(self) -> EngineSpec:
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
    waves: StrictInt = Field(20, ge=1, le=MAX_WAVES,
                             description="waves of exactly batch_size concurrent requests per cell")
    output_len: StrictInt = Field(64, ge=2, le=MAX_OUTPUT_LEN,
                                  description="output tokens per request (ignore_eos)")
    warmup: StrictInt = Field(1, ge=0, le=MAX_WAVES,
                              description="unmeasured warm-up waves before each cell (short: each request "
                                          "at most 16 output tokens; a paired group: 2 steps a K)")
    repeats: StrictInt = Field(1, ge=1, le=MAX_REPEATS,
                               description="repeat the whole grid, interleaved, for medians")
    design: Literal["paired", "cells"] = Field(
        "paired",
        description="paired: in DSD mode every K of a batch size runs inside the same waves, switched "
                    "per step (vLLM engines); cells: one cell per (batch size, K), waves of its own")
    consistency_tolerance: float = Field(
        0.25, gt=0, allow_inf_nan=False,
        description="BS 1: flag cells whose AL/ITL differs from the rate of vLLM's request timestamps by "
                    "more")
    context_lens: list[StrictInt] | None = Field(
        None, description="contexts (prompt tokens) at which decode is measured, one grid per context; "
                          "unset: the single workload.input_len (and nothing about the run changes)")

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        """Unset ``context_lens`` is left out, so a spec without it dumps (and hashes) as before."""
        return _without_unset(self, handler(self), "context_lens")

    @field_validator("context_lens")
    @classmethod
    def _contexts(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("must not be empty (leave it out to measure at workload.input_len)")
        if len(v) > MAX_CONTEXTS:
            raise ValueError(f"{len(v)} contexts; at most {MAX_CONTEXTS}")
        return _sorted_distinct(v, 1, MAX_CONTEXT_LEN, "context {}", "contexts")

    @field_validator("batch_sizes", "num_spec_tokens")
    @classmethod
    def _grid_axis(cls, v: list[int], info: ValidationInfo) -> list[int]:
        if not v:
            raise ValueError("must not be empty")
        if info.field_name == "batch_sizes":
            return _sorted_distinct(v, 1, MAX_SWEEP_BATCH_SIZE, "batch size {}", "batch sizes")
        return _sorted_distinct(v, 0, MAX_SPEC_TOKENS, "K={}", "K values")

    @model_validator(mode="after")
    def _fits(self) -> SweepGrid:
        cells = len(self.batch_sizes) * (len(self.num_spec_tokens)
                                         + 1) * self.repeats * len(self.context_lens or [0])
        if cells > MAX_CELLS:
            raise ValueError(f"{cells} cells (batch sizes x (K values + vanilla) x repeats"
                             f"{' x contexts' if self.context_lens else ''}); at most {MAX_CELLS}")
        tokens = (self.waves
                  + self.warmup) * max(self.batch_sizes) * self.output_len * (max(self.num_spec_tokens) + 1)
        if tokens > INT64_MAX // 4:
            raise ValueError(f"(waves + warmup) x batch size x output_len x (K + 1) = {tokens} overflows "
                             "a cell's int64 token counters")
        return self


class WorkloadSpec(_Strict):
    dataset: str = Field("synthetic", description="synthetic | sharegpt | path to .jsonl/.json")
    input_len: StrictInt = Field(128, ge=1, le=1 << 24,
                                 description="prompt tokens (synthetic) / truncation (datasets)")
    temperature: float = Field(0.0, ge=0, le=100.0, allow_inf_nan=False)
    seed: StrictInt = Field(0, ge=-INT64_MAX - 1, le=INT64_MAX)
    num_prompts: StrictInt = Field(256, ge=1, le=10**7,
                                   description="size of the fixed prompt pool shared by all cells")
    output_lens: Literal["fixed", "dataset"] = Field(
        "fixed", description="fixed: every request generates [sweep] output_len tokens; dataset: each "
                             "prompt's "
                             "reference reply length (ShareGPT/JSONL), capped at output_len")

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        if (v in ("synthetic", "sharegpt") or v.endswith((".jsonl", ".json")) or "/" in v
                or Path(v).expanduser().is_file()):
            return v
        if v in VLLM_DATASET_NAMES:
            ours = VLLM_DATASET_NAMES[v]
            raise ValueError(f"is a `vllm bench` dataset name; dsdprof's are 'synthetic' (random prompts of "
                             f"input_len tokens{', as vllm bench random' if ours else ''}), 'sharegpt' or a "
                             f".jsonl/.json file")
        raise ValueError("must be 'synthetic', 'sharegpt' or a path to a .jsonl/.json file")
