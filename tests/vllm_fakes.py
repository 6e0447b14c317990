"""vLLM's real Scheduler / AsyncScheduler, driven in-process without a model (no engine, no GPU).

* :func:`vllm_config`: a VllmConfig for a tiny config-only model (no weights), optionally in
  dynamic-SD mode; a fake KV-cache config (:func:`make_scheduler`).
* :class:`FakeRunner`: stands in for the model runner and the rejection sampler with a known
  acceptance (a function of request, step and draft length), emits EOS at a chosen output
  position, proposes ``num_spec_tokens_to_schedule`` drafts after every sampled step.
* :func:`drive`: runs the scheduler in ``EngineCore``'s own call orders: ``sync`` (``step`` +
  ``post_step``), ``async`` (``step_with_batch_queue`` with a queue of 2 and the AsyncScheduler:
  ``schedule`` of step n+1 before ``update_from_output`` of step n) and ``sync_bq`` (the sync
  Scheduler with a batch queue of 2, as under pipeline parallelism).
"""

from __future__ import annotations

import functools
import json
import tempfile
from collections import defaultdict, deque
from pathlib import Path
from typing import Callable

EOS = 2


@functools.lru_cache(maxsize=None)
def vllm_config(max_k: int, max_num_seqs: int = 8, max_model_len: int = 1024, dsd: bool = True,
                num_blocks: int = 4096):
    """A VllmConfig (vLLM validates it) for a config-only llama; speculative when ``max_k`` > 0;
    ``num_blocks`` KV-cache blocks of 16 tokens."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig

    d = Path(tempfile.mkdtemp(prefix="dsdprof-fake-model-"))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 1, "vocab_size": 1000, "max_position_embeddings": 8192, "torch_dtype": "float32"}))
    mc = ModelConfig(model=str(d), skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len)
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=8192, max_model_len=max_model_len,
                         is_encoder_decoder=False)
    cc = CacheConfig(block_size=16, enable_prefix_caching=False)
    cc.num_gpu_blocks = num_blocks
    spec = None
    if max_k > 0:
        spec = SpeculativeConfig(method="ngram_gpu", num_speculative_tokens=max_k, prompt_lookup_max=3,
                                 prompt_lookup_min=1,
                                 num_speculative_tokens_per_batch_size=[[1, max_num_seqs, max_k]] if dsd else None)
    return VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, speculative_config=spec)


def make_scheduler(cls, config, log_stats: bool = True):
    """``cls`` (a vLLM Scheduler subclass) on ``config`` with a fake single-layer KV cache."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    blocks = config.cache_config.num_gpu_blocks
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    return cls(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
               block_size=16, log_stats=log_stats)


def make_request(req_id: str, prompt_len: int, max_tokens: int, extra: dict | None = None, eos: bool = True):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[EOS] if eos else None, extra_args=extra)
    prompt = [10 + (i * 7 + len(req_id)) % 900 for i in range(prompt_len)]
    return Request(request_id=req_id, prompt_token_ids=prompt, sampling_params=params, pooling_params=None)


Accept = Callable[[str, int, int], int]  # (request id, its decode step, drafts) -> accepted drafts


class FakeRunner:
    """The model runner + rejection sampler, with a known acceptance. Records the truth: per
    request, every decode step it actually sampled for (``accepted``) -- vLLM decides later which
    of them it keeps (stale outputs are discarded)."""

    def __init__(self, accept: Accept, eos_at: dict[str, int] | None = None) -> None:
        self.accept = accept
        self.eos_at = eos_at or {}
        self.prompt_left: dict[str, int] = {}
        self.emitted: dict[str, int] = defaultdict(int)
        self.steps: dict[str, int] = defaultdict(int)
        self.samples: list[tuple[str, int, int]] = []  # (request, drafted, accepted) per decode sample
        self._drafts: dict[int, object] = {}

    def _token(self, req_id: str) -> int:
        n = self.emitted[req_id]
        self.emitted[req_id] += 1
        return EOS if self.eos_at.get(req_id) == n else 100 + n % 800

    def execute(self, so):
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        for new in so.scheduled_new_reqs:
            self.prompt_left[new.req_id] = len(new.prompt_token_ids) - new.num_computed_tokens
        ids, sampled, drafts = [], [], []
        for req_id, n in so.num_scheduled_tokens.items():
            ids.append(req_id)
            d = len(so.scheduled_spec_decode_tokens.get(req_id, ()))
            left = self.prompt_left.get(req_id, 0)
            if left > 0:
                self.prompt_left[req_id] = left - n
                toks = [self._token(req_id)] if left - n <= 0 else []
            else:
                a = max(0, min(d, self.accept(req_id, self.steps[req_id], d)))
                self.steps[req_id] += 1
                self.samples.append((req_id, d, a))
                toks = [self._token(req_id) for _ in range(a + 1)]
            sampled.append(toks)
            if toks:
                drafts.append((req_id, [7] * so.num_spec_tokens_to_schedule))
        self._drafts[id(so)] = DraftTokenIds([r for r, _ in drafts], [t for _, t in drafts]) if drafts else None
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled)

    def take_draft_token_ids(self, so):
        """The drafts proposed in step ``so`` (available once that step's output is processed)."""
        return self._drafts.pop(id(so), None)


def drive(sched, runner: FakeRunner, mode: str, spec: bool, max_steps: int = 100000) -> dict[str, list[int]]:
    """Run until the scheduler has no request; returns the tokens each request was sent (what the
    client receives, from the EngineCoreOutputs)."""
    received: dict[str, list[int]] = defaultdict(list)

    def collect(outputs) -> None:
        for eco in (outputs or {}).values():
            for o in eco.outputs:
                received[o.request_id].extend(o.new_token_ids)

    def post_step(done) -> None:  # EngineCore.post_step: the drafts of the step just processed
        if spec and mode != "async" and done is not None:
            drafts = runner.take_draft_token_ids(done)
            if drafts is not None:
                sched.update_draft_token_ids(drafts)

    queue: deque = deque()
    for _ in range(max_steps):
        if mode == "sync":
            if not sched.has_requests():
                break
            so = sched.schedule(False)
            mro = runner.execute(so)
            collect(sched.update_from_output(so, mro))
            post_step(so)
            continue
        # EngineCore.step_with_batch_queue, batch queue of 2
        if not sched.has_requests() and not queue:
            break
        executed = False
        if sched.has_requests():
            so = sched.schedule(False)
            executed = so.total_num_scheduled_tokens > 0
            queue.appendleft((so, runner.execute(so)))
            if len(queue) < 2 and (executed or sched.has_requests()):
                continue
        so, mro = queue.pop()
        collect(sched.update_from_output(so, mro))
        post_step(so)
    else:
        raise RuntimeError("scheduler did not drain")
    return dict(received)
