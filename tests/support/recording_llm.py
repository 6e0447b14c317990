"""A stand-in for ``vllm.LLM`` in :class:`~dsdprof.measure.vllm.worker.CellRun` that records the
sampling parameters of every wave it is asked to generate (orchestration tests, no measurement)."""

from __future__ import annotations


class RecordingLLM:
    def __init__(self):
        self.params = []  # per wave: the SamplingParams of its requests

    def reset_prefix_cache(self):
        pass

    def get_metrics(self):
        return []

    def generate(self, prompts, params, use_tqdm=False):
        self.params.append(list(params))
        return []
