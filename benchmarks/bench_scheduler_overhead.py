"""Per-step cost of dsdprof's schedulers next to vLLM's plain one, at a large batch, no GPU.

    python benchmarks/bench_scheduler_overhead.py [--running 256] [--waiting 2000] [--steps 300] [--k 3]

vLLM's real ``Scheduler`` is driven in ``EngineCore.step``'s order (``has_requests``,
``schedule``, the model, ``update_from_output``, ``update_draft_token_ids``) by the fake model
runner of ``tests/vllm_fakes.py`` (known, deterministic chain acceptance; the runner is not
timed). The schedulers run side by side in one process, interleaved step by step (a fresh
random order every step, ``--seed``), each on its own copy of the same requests:

* **plain**: vLLM's ``Scheduler`` in dynamic-SD mode (``num_speculative_tokens_per_batch_size``);
  **plain-2**, a second copy of it, shows the noise floor;
* **serving**: ``dsdprof.plugins.vllm_adaptive``'s ``AdaptiveScheduler`` (the serving plugin:
  ``dsdprof.plugins.serving.ServingScheduler`` holding the adaptive K part) on
  a v2 table whose K is the engine's maximum at every batch size, so it serves the same K as plain
  (checked: the run stops if any step's K differs, except the plugin's exploration steps -- 2 in
  256 at a neighbouring K, run but not compared: ``explore()``'s per-step tick is in every compared
  step, building the probe lookup once per 256 steps is not);
* **serving+m**: the same serving plugin with dsdprof's metrics on (``dsdprof.plugins.metrics``,
  issue 34; **serving** runs with ``{"dsdprof_metrics": false}``), writing to a
  ``PROMETHEUS_MULTIPROC_DIR`` as under ``dsdprof serve``; its ``added`` against serving is the
  metrics' own cost per step. The metrics' flush (every ``FLUSH_S`` = 5 s, not once a step) is timed
  on its own after the run and printed with what it adds per step at a given step rate;
* **profiling**: ``dsdprof.plugins.vllm_profiling``'s ``TracingScheduler`` in an engine a dsdprof
  run started (run secret in the environment), every request carrying the secret, K and a trace
  name -- a sweep's requests;
* **plain-a** and **profiling-a**: vLLM's ``AsyncScheduler`` and ``TracingAsyncScheduler`` (async
  scheduling, vLLM's GPU default for EAGLE), driven in ``EngineCore.step_with_batch_queue``'s order
  with a queue of 2: each step schedules step n+1, then processes step n's output; **per-step-a**:
  ``TracingAsyncScheduler`` building every step's record inside the step (``_dsdprof_defer =
  False``: the async scheduler before the idle build), the side-by-side reference for profiling-a.

Every one is built on a subclass of vLLM's ``Scheduler`` that times its entry points, so the
dsdprof classes keep their MRO with that class in vLLM's place. Per step and scheduler two
numbers: **step CPU** -- thread CPU time of its calls (``ratio``, and ``added`` against plain:
median and mean of the middle 90 % of per-step differences) -- and **own code** -- the wall time
of its calls minus the time inside vLLM's methods (plus, without ``log_stats``, the time in
``make_spec_decoding_stats``, which the serving plugin replaces), against plain's. Own code is what
the goal is about; a busy machine disturbs it far less than the step's CPU time. ``--running``
requests run (``max_num_seqs``) and ``--waiting`` more wait behind them for the whole measurement
(outputs long enough that none finishes). Both ``log_stats`` settings run, each in a fresh process
(``--log-stats on|off`` runs one): on (``vllm serve``'s default) and off (``vllm.LLM``'s default,
where the serving plugin counts the acceptance vLLM then skips). Goal (issue 16): the serving
plugin adds <= 50 us per step at 256 running + 2,000 waiting;
(issue 34) with its metrics on too.

**in ITL**: the part of a scheduler's own code that stays inside the step time its trace records.
The synchronous profiling scheduler times its own work and records ``t_end`` without it
(``dsdprof.plugins.vllm_profiling``), so its ``in ITL`` is its own code less the own time it
subtracted in the step (``_dsdprof_own``), against plain's. The async one subtracts nothing (its
work overlaps the GPU's step, and lengthens it only where the CPU is the bottleneck): its ``in
ITL`` is all its own code in the step, the worst case. For the others it is their own code.
Goal (issue 30): <= 20 us per step for the profiling scheduler, sync and async, at 256 running +
2,000 waiting. (The profiling schedulers' per-request bookkeeping runs when the engine is idle --
never here, where nothing finishes.)

``--only NAMES`` builds only those schedulers (comma-separated; plain and plain-a, the references,
always). ``--before REV`` adds **before**, **before-a**, **before-s** and **before+m**: the profiling
schedulers (``TracingScheduler``, ``TracingAsyncScheduler``) and the serving plugin with metrics
off and on (``AdaptiveScheduler``) of git revision REV, loaded from ``git show
REV:dsdprof/plugins/...`` (the modules of ``BEFORE_MODULES`` REV has) beside today's, so a change
is compared side by side in one run (interleaved step by step like the others; ``--only
profiling,profiling-a --before HEAD``, ``--only serving,serving+m --before HEAD``).
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
import zlib
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.vllm_fakes import FakeRunner, make_request, make_scheduler, vllm_config  # noqa: E402

TOKEN = "b" * 32
ALPHA = 0.8  # per-position conditional acceptance of the fake runner
PROMPT = 16
GOAL_US = 50.0
GOAL_ITL_US = 20.0  # the profiling scheduler's own work left inside its trace's step time
SERVING_M = ("serving+m", "before+m")  # the serving plugin with metrics on (today's, --before REV's)
SERVING = ("serving", "before-s", *SERVING_M)  # every copy of the serving plugin


def accept(req_id: str, step: int, drafted: int) -> int:
    """Deterministic chain acceptance: the same for every scheduler's copy of a request."""
    h = zlib.crc32(f"{req_id}:{step}".encode())
    a = 0
    while a < drafted and ((h >> (4 * a)) & 15) < ALPHA * 16:
        a += 1
    return a


def table(max_k: int, max_bs: int) -> dict:
    """A v2 table whose best K is ``max_k`` at every batch size (step time barely grows with K)."""
    from dsdprof.formats.ktable import ranges_from_points

    sizes = sorted({1, 2, 4, 8, 16, 32, 64, 128, max_bs})
    p = [ALPHA ** i for i in range(1, max_k + 1)]
    al = {k: 1 + sum(p[:k]) for k in range(max_k + 1)}
    return {"schema": "dsdprof.ktable/v2", "num_speculative_tokens": max_k,
            "ranges": ranges_from_points([(b, max_k) for b in sizes]),
            "cells": [{"batch_size": b, "k": k, "itl_s": 0.01 * (1 + 0.001 * k), "acceptance_length": al[k]}
                      for b in sizes for k in al],
            "acceptance_per_pos": p}


def timed_base(base=None):
    """vLLM's ``Scheduler`` (or ``base``) with its entry points timed (``perf_counter_ns`` into
    ``vllm_ns``): a class built on it measures its own code as (time in its calls) - (time in vLLM's)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    clock = time.perf_counter_ns

    class Timed(base or Scheduler):  # type: ignore[misc,valid-type]
        vllm_ns = 0

        def has_requests(self):
            t = clock()
            r = super().has_requests()
            self.vllm_ns += clock() - t
            return r

        def schedule(self, *args, **kwargs):
            t = clock()
            r = super().schedule(*args, **kwargs)
            self.vllm_ns += clock() - t
            return r

        def update_from_output(self, scheduler_output, model_runner_output):
            t = clock()
            r = super().update_from_output(scheduler_output, model_runner_output)
            self.vllm_ns += clock() - t
            return r

        def update_draft_token_ids(self, draft_token_ids):
            t = clock()
            super().update_draft_token_ids(draft_token_ids)
            self.vllm_ns += clock() - t

    return Timed


BEFORE_MODULES = ("profiling_keys", "profiling_records", "vllm_profiling", "spec_count", "metrics",
                  "serving", "vllm_adaptive")  # dsdprof/plugins/*.py (serving: since issue 44)


def before_module(rev: str, tmp: str):
    """dsdprof's profiling and serving scheduler modules as of git revision ``rev`` (with the
    records, keys, counting and metrics modules of that revision), imported under other names beside
    today's: ``(profiling module, serving module)``."""
    import importlib
    import subprocess

    root = Path(__file__).resolve().parents[1]
    for mod in BEFORE_MODULES:
        try:
            text = subprocess.run(["git", "show", f"{rev}:dsdprof/plugins/{mod}.py"], cwd=root, check=True,
                                  capture_output=True, text=True).stdout
        except subprocess.CalledProcessError as e:
            if mod == "serving" and ("does not exist" in e.stderr or "but not in" in e.stderr):
                continue  # a revision before the serving scheduler's own module
            raise SystemExit(f"--before {rev}: {e.stderr.strip()}") from None
        for other in BEFORE_MODULES:
            text = text.replace(f"dsdprof.plugins.{other}", f"_before_{other}")
        Path(tmp, f"_before_{mod}.py").write_text(text)
    sys.path.insert(0, tmp)
    try:
        return tuple(importlib.import_module(f"_before_{m}") for m in ("vllm_profiling", "vllm_adaptive"))
    finally:
        sys.path.remove(tmp)


def classes(only: str = "", before=None) -> dict[str, type]:
    """name -> class: each of dsdprof's schedulers with the timed vLLM scheduler as its base
    (``only``: those named, comma-separated, and the plain references; ``before``: the modules of
    :func:`before_module`, as the before/before-a/before+m rows)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from dsdprof.plugins import vllm_adaptive, vllm_profiling

    timed, timed_async = timed_base(), timed_base(AsyncScheduler)
    out = {"plain": timed, "plain-2": timed}  # plain-2: a second plain copy, the noise floor
    rows = [("serving", vllm_adaptive.AdaptiveScheduler, Scheduler, timed),
            ("serving+m", vllm_adaptive.AdaptiveScheduler, Scheduler, timed),
            ("profiling", vllm_profiling.TracingScheduler, Scheduler, timed),
            ("plain-a", None, AsyncScheduler, timed_async),
            ("profiling-a", vllm_profiling.TracingAsyncScheduler, AsyncScheduler, timed_async),
            ("per-step-a", vllm_profiling.TracingAsyncScheduler, AsyncScheduler, timed_async)]
    if before is not None:
        rows += [("before", before[0].TracingScheduler, Scheduler, timed),
                 ("before-a", before[0].TracingAsyncScheduler, AsyncScheduler, timed_async),
                 ("before-s", before[1].AdaptiveScheduler, Scheduler, timed),
                 ("before+m", before[1].AdaptiveScheduler, Scheduler, timed)]
    wanted = {n.strip() for n in only.split(",") if n.strip()}
    unknown = wanted - {r[0] for r in rows} - set(out)
    if unknown:
        raise SystemExit(f"--only: unknown scheduler(s) {sorted(unknown)}; known: {list(out)} + "
                         f"{[r[0] for r in rows]}")
    if wanted:
        if "plain-2" not in wanted:
            del out["plain-2"]
        rows = [r for r in rows if r[0] in wanted or r[0] in ("plain-a", "before", "before-a", "before-s",
                                                               "before+m")]
    for name, real, vllm, base in rows:
        if real is None:
            out[name] = base
            continue
        mixins = tuple(c for c in real.__mro__[1:] if c.__module__.startswith(("dsdprof.", "_before_")))
        if real.__mro__[1 + len(mixins)] is not vllm:
            raise SystemExit(f"{real.__name__}: MRO {real.__mro__} is not dsdprof mixins over "
                             f"{vllm.__name__}")
        # the class's own settings (the async ones, the serving mode and K part), not its machinery
        own = {k: v for k, v in vars(real).items() if not k.startswith("__") and k != "_abc_impl"}
        if name == "per-step-a":  # the async scheduler's records built in every step, as before
            own["_dsdprof_defer"] = False
        out[name] = type(f"Timed{real.__name__}", mixins + (base,), own)
    return out


def time_callback(sched, log_stats: bool) -> None:
    """Without ``log_stats`` time ``make_spec_decoding_stats`` -- called by vLLM's
    ``update_from_output`` once per drafted request; the serving plugin replaces vLLM's no-op one
    then -- into ``callback_ns``, which :func:`step` counts as the scheduler's own code, for every
    scheduler alike (plain: vLLM's no-op). With ``log_stats`` it is vLLM's own, in every scheduler."""
    clock, inner = time.perf_counter_ns, sched.make_spec_decoding_stats
    sched.callback_ns = 0
    if log_stats:
        return

    def timed(*args, **kwargs):
        t = clock()
        r = inner(*args, **kwargs)
        sched.callback_ns += clock() - t
        return r

    sched.make_spec_decoding_stats = timed


def build(args, log_stats: bool, tmp: str) -> dict:
    """name -> (scheduler, runner), each on its own copy of the same requests."""
    from dsdprof.serve.settings import adaptive_additional_config

    total = args.running + args.waiting
    max_len = PROMPT + args.output + args.k + 8
    blocks = args.running * (max_len // 16 + 2) + 64
    config = vllm_config(args.k, args.running, max_model_len=max_len, num_blocks=blocks)
    table_path = Path(tmp) / "table.json"
    table_path.write_text(json.dumps(table(args.k, args.running)))
    config.additional_config = adaptive_additional_config(str(table_path))
    # each serving copy's step clock: a fixed 20 ms per reading of its own (a C-level callable, as
    # cheap as perf_counter; set before each of its steps, :func:`measure`), so the wall time the
    # other schedulers take between a copy's steps never reads as a slow K and the copies serve the
    # same K as plain (the selector's arithmetic still runs)
    scheds = {}
    for name, cls in classes(args.only, args.before_module).items():
        profiled = name.startswith(("profiling", "per-step", "before")) and name not in SERVING
        if profiled:  # an engine a dsdprof run started: the run's secret and trace directory
            os.environ.update({"DSDPROF_RUN_TOKEN": TOKEN, "DSDPROF_TRACE_DIR": tmp})
        own = copy.copy(config)  # metrics on for serving+m only
        own.additional_config = {**config.additional_config, "dsdprof_metrics": name in SERVING_M}
        try:
            sched = make_scheduler(cls, own, log_stats)
        finally:
            os.environ.pop("DSDPROF_RUN_TOKEN", None), os.environ.pop("DSDPROF_TRACE_DIR", None)
        time_callback(sched, log_stats)
        if name in SERVING:
            sched.bench_clock = functools.partial(next, itertools.count(0.0, 0.02))
        if name in SERVING_M:
            time_flushes(sched)
        for i in range(total):
            extra = ({"dsdprof_run": TOKEN, "dsdprof_num_spec_tokens": args.k, "dsdprof_trace": "bench",
                      "dsdprof_wave": 0} if profiled else None)
            sched.add_request(make_request(f"r{i}", PROMPT, args.output, extra, eos=False))
        scheds[name] = (sched, FakeRunner(accept), deque() if name.endswith("-a") else None)
    return scheds


def step(sched, runner, queue) -> tuple[int, int, int, int]:
    """One ``EngineCore.step`` (sync) + ``post_step``, or with a ``queue`` one
    ``step_with_batch_queue`` (async): (CPU ns in the scheduler's calls, ns of its own code outside
    vLLM's, K scheduled, ns of its own time it keeps out of its trace's step time). The fake runner
    is not counted."""
    if queue is not None:
        return step_async(sched, runner, queue)
    cpu, wall = time.thread_time_ns, time.perf_counter_ns  # CPU time: a busy machine's waits don't count
    vllm0 = sched.vllm_ns - sched.callback_ns
    out0 = getattr(sched, "_dsdprof_own", 0.0)
    c0, w0 = cpu(), wall()
    sched.has_requests()
    so = sched.schedule(False)
    w1, c1 = wall(), cpu()
    mro = runner.execute(so)
    c2, w2 = cpu(), wall()
    sched.update_from_output(so, mro)
    w3 = wall()
    drafts = runner.take_draft_token_ids(so)
    w4 = wall()
    if drafts is not None:
        sched.update_draft_token_ids(drafts)
    w5, c3 = wall(), cpu()
    own = (w1 - w0) + (w3 - w2) + (w5 - w4) - (sched.vllm_ns - sched.callback_ns - vllm0)
    kept_out = round((getattr(sched, "_dsdprof_own", 0.0) - out0) * 1e9)
    return (c1 - c0) + (c3 - c2), own, so.num_spec_tokens_to_schedule, kept_out


def step_async(sched, runner, queue: deque) -> tuple[int, int, int, int]:
    """``EngineCore.step_with_batch_queue`` with a queue of 2: schedule step n+1 (the model runs it
    while) step n's output is processed. Nothing is subtracted from an async trace's step time."""
    cpu, wall = time.thread_time_ns, time.perf_counter_ns
    vllm0 = sched.vllm_ns - sched.callback_ns
    out0 = getattr(sched, "_dsdprof_own", 0.0)
    c0, w0 = cpu(), wall()
    sched.has_requests()
    so = sched.schedule(False)
    w1, c1 = wall(), cpu()
    queue.appendleft((so, runner.execute(so)))
    c2, w2 = cpu(), wall()
    if len(queue) == 2:
        sched.update_from_output(*queue.pop())
    w3, c3 = wall(), cpu()
    own = (w1 - w0) + (w3 - w2) - (sched.vllm_ns - sched.callback_ns - vllm0)
    subtracted = getattr(sched, "_dsdprof_subtract_own", False)  # False: TracingAsyncScheduler's
    kept_out = round((getattr(sched, "_dsdprof_own", 0.0) - out0) * 1e9) if subtracted else 0
    return (c1 - c0) + (c3 - c2), own, so.num_spec_tokens_to_schedule, kept_out


def measure(args, log_stats: bool) -> dict:
    from dsdprof.plugins import vllm_adaptive

    # the serving modules whose step clock each serving copy sets (today's; --before REV's)
    clocked = [vllm_adaptive] + ([args.before_module[1]] if args.before_module else [])
    with tempfile.TemporaryDirectory() as tmp:
        scheds = build(args, log_stats, tmp)
        names = list(scheds)
        cpu: dict[str, list[int]] = {n: [] for n in names}
        own: dict[str, list[int]] = {n: [] for n in names}
        itl: dict[str, list[int]] = {n: [] for n in names}  # own code left inside the trace's step time
        gc.collect()
        gc.freeze()  # as vLLM's engine core does after start-up
        probes, rng = 0, random.Random(args.seed)
        for i in range(args.warmup + args.steps):
            # a fresh random order every step: with a rotation each scheduler always followed the
            # same one, and one following its own twin (plain-2 after plain, serving+m after serving)
            # ran its code warm (plain-2 read -3 to -13 us of own code against plain, log_stats off)
            order = rng.sample(names, len(names))
            ks, costs = {}, {}
            for n in order:
                clock = getattr(scheds[n][0], "bench_clock", None)
                if clock is not None:
                    for mod in clocked:
                        mod._clock = clock
                c, o, ks[n], out = step(*scheds[n])
                costs[n] = (c, o, o - out)
            if len(set(ks.values())) != 1:
                others = {v for n, v in ks.items() if n not in SERVING}
                probes += 1
                # each serving copy explores 2 in 256
                if len(others) != 1 or probes > max(8, args.steps // 25):
                    raise SystemExit(f"step {i}: the schedulers served different K {ks}: not comparable")
                continue  # an exploration step of the serving plugin (a neighbouring K): not compared
            if i >= args.warmup:
                for n, (c, o, i_) in costs.items():
                    cpu[n].append(c)
                    own[n].append(o)
                    itl[n].append(i_)
        gc.unfreeze()
        metered = scheds.get("serving+m")
        in_step = [ns / 1e3 for ns in metered[0].flush_ns] if metered else []
        flush_us = time_flush(metered[0]) if metered else None
        for n, (s, _, _) in scheds.items():
            state = (len(s.running), len(s.waiting))
            if state != (args.running, args.waiting):
                raise SystemExit(f"{n}: {state} running/waiting at the end, wanted "
                                 f"({args.running}, {args.waiting}): lengthen --output")
    return {"cpu": cpu, "own": own, "itl": itl, "k": ks["plain"], "probes": probes, "flush_us": flush_us,
            "in_step": in_step}


def time_flushes(sched) -> None:
    """Record the wall time of every flush the metrics run inside a step (``flush_ns``): part of
    that step's own code, here also on its own."""
    m, clock = sched.dsdprof_metrics, time.perf_counter_ns
    inner, sched.flush_ns = m.flush, []

    def timed(s, now):
        t = clock()
        inner(s, now)
        sched.flush_ns.append(clock() - t)

    m.flush = timed


def time_flush(sched, n: int = 200) -> float:
    """Median us of one metrics flush (every delta pushed, every gauge set; the counters move
    between calls, as they do between flushes)."""
    m, out = sched.dsdprof_metrics, []
    for _ in range(n):
        m.steps[0] += 1
        m.spec[0] += 1
        t = time.perf_counter_ns()
        m.flush(sched, 0.0)
        out.append((time.perf_counter_ns() - t) / 1e3)
    return statistics.median(out)


def middle_mean(xs: list[float], keep: float = 0.9) -> float:
    xs = sorted(xs)
    cut = int(len(xs) * (1 - keep) / 2)
    return statistics.fmean(xs[cut:len(xs) - cut])


def report(label: str, res: dict) -> tuple[float, float, float, float]:
    """Print the table; returns (the serving plugin's median own-code cost per step with metrics
    off, with metrics on, the profiling scheduler's median own code left inside its trace's step
    time, sync and async), all in us against plain (plain-a for the async rows)."""
    cpu, own, itl = res["cpu"], res["own"], res["itl"]
    print(f"\n{label}  (K={res['k']}, {len(cpu['plain'])} steps compared; {res['probes']} exploration "
          f"steps of the serving plugin at a neighbouring K not compared)")
    print(f"{'scheduler':>11} {'CPU us':>8} {'ratio':>6} {'added':>7} {'mean90':>7} | {'own us':>7} "
          f"{'mean90':>7} | {'in ITL':>7} {'mean90':>7}")
    own_meds, itl_meds = {}, {}
    for name in cpu:
        ref = "plain-a" if name.endswith("-a") else "plain"
        base, base_own = cpu[ref], own[ref]
        diff = [(t - b) / 1e3 for t, b in zip(cpu[name], base)]
        own_diff = [(t - b) / 1e3 for t, b in zip(own[name], base_own)]
        itl_diff = [(t - b) / 1e3 for t, b in zip(itl[name], base_own)]
        med = statistics.median(cpu[name]) / 1e3
        ratio = med / (statistics.median(base) / 1e3)
        own_med, itl_med = statistics.median(own_diff), statistics.median(itl_diff)
        own_meds[name], itl_meds[name] = own_med, itl_med
        note = " (ref)" if name in ("plain", "plain-a") else ""
        print(f"{name:>11} {med:>8.1f} {ratio:>6.3f} {statistics.median(diff):>7.1f} "
              f"{middle_mean(diff):>7.1f} | {own_med:>7.1f} {middle_mean(own_diff):>7.1f} | "
              f"{itl_med:>7.1f} {middle_mean(itl_diff):>7.1f}{note}")
    from dsdprof.plugins.metrics import FLUSH_S

    side = [(m - o) / 1e3 for m, o in zip(own.get("serving+m", ()), own.get("serving", ()))]
    if side:
        print(f"metrics on vs off (serving+m - serving, own code): median {statistics.median(side):.1f} us "
              f"per step, mean90 {middle_mean(side):.1f}; one flush {res['flush_us']:.0f} us warm (every "
              f"{FLUSH_S:.0f} s: {res['flush_us'] / (FLUSH_S * 100):.1f} us per step at 100 steps/s)")
    if res["in_step"]:
        print(f"flushes inside steps: {len(res['in_step'])}, median "
              f"{statistics.median(res['in_step']):.0f} us, max {max(res['in_step']):.0f} us")
    profiling_a, per_step_a = itl_meds.get("profiling-a"), itl_meds.get("per-step-a")
    if profiling_a is not None and per_step_a is not None:
        print(f"async, own code in the step: profiling-a {profiling_a:.1f} us, per-step-a "
              f"{per_step_a:.1f} us (ratio {profiling_a / per_step_a if per_step_a else float('nan'):.3f})")
    for now, was in (("profiling", "before"), ("profiling-a", "before-a"), ("serving", "before-s"),
                     ("serving+m", "before+m")):
        if now in itl_meds and was in itl_meds:
            side = [(a - b) / 1e3 for a, b in zip(itl[now], itl[was])]
            print(f"{now} - {was} (in ITL, same steps): median {statistics.median(side):.1f} us, mean90 "
                  f"{middle_mean(side):.1f} ({now} {itl_meds[now]:.1f} us, {was} {itl_meds[was]:.1f} us)")
    return (own_meds.get("serving"), own_meds.get("serving+m"), itl_meds.get("profiling"),
            itl_meds.get("profiling-a"))


def in_child(argv: list[str], log_stats: bool) -> dict:
    """:func:`measure` for one ``log_stats`` setting in a fresh process of this script. In one
    process the second setting's schedulers were built in the heap the first one's left: the first
    built (plain, the reference) got the freed, scattered memory and ran 180-370 us of CPU and 2-7 us
    of own code per step slower than plain-2, an identical copy built after it (log_stats off,
    2026-12-03), which read as dsdprof's schedulers costing that much less."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "result.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--log-stats",
               "on" if log_stats else "off", "--result-json", str(out)]
        import subprocess

        rc = subprocess.run(cmd).returncode
        if rc:
            raise SystemExit(f"log_stats={log_stats}: the measuring process exited with {rc}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--running", type=int, default=256, help="requests running (max_num_seqs)")
    ap.add_argument("--waiting", type=int, default=2000, help="requests waiting behind them")
    ap.add_argument("--k", type=int, default=3, help="speculative tokens per step (default 3)")
    ap.add_argument("--steps", type=int, default=300, help="measured steps per scheduler")
    ap.add_argument("--seed", type=int, default=0, help="seed of the schedulers' order in each step")
    ap.add_argument("--warmup", type=int, default=20, help="unmeasured first steps (prefill)")
    ap.add_argument("--output", type=int, default=0, help="output tokens per request (default: enough)")
    ap.add_argument("--only", default="", metavar="NAMES",
                    help="build only these schedulers, comma-separated (plain and plain-a always)")
    ap.add_argument("--before", default="", metavar="REV",
                    help="add the profiling schedulers of git revision REV (rows before, before-a)")
    ap.add_argument("--log-stats", choices=("both", "on", "off"), default="both",
                    help="which log_stats settings to run, each in a fresh process of its own (default both)")
    ap.add_argument("--result-json", default="", help=argparse.SUPPRESS)  # a child's: measure, write, exit
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    before_dir = tempfile.mkdtemp(prefix="bench-before-")
    args.before_module = before_module(args.before, before_dir) if args.before else None
    args.output = args.output or (args.k + 1) * (args.steps + args.warmup) + 64
    # as under `dsdprof serve`: metrics in prometheus_client's multiprocess files (set before vLLM
    # imports prometheus_client, which picks its value class at import)
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="bench-metrics-"))
    import logging

    logging.getLogger("vllm").setLevel(logging.WARNING)
    if args.result_json:
        Path(args.result_json).write_text(json.dumps(measure(args, args.log_stats == "on")))
        return 0
    print(f"{args.running} running + {args.waiting} waiting requests, prompt {PROMPT}, "
          f"fake acceptance {ALPHA} per position; per-step time of the scheduler calls")
    worst: list[list[float]] = [[], [], [], []]  # serving, serving+m, profiling, profiling-a
    for log_stats in (True, False):
        if args.log_stats != "both" and log_stats != (args.log_stats == "on"):
            continue
        for acc, value in zip(worst, report(f"log_stats={log_stats}", in_child(argv, log_stats))):
            if value is not None:
                acc.append(value)
    for values, goal, text in (
            (worst[0], GOAL_US, "serving plugin: its own code costs at most {} us per step, median"),
            (worst[1], GOAL_US, "serving plugin with metrics on: at most {} us per step, median"),
            (worst[2], GOAL_ITL_US, "profiling scheduler: at most {} us per step of its own code stays "
                                    "inside the step time its trace records, median"),
            (worst[3], GOAL_ITL_US, "profiling scheduler, async: at most {} us per step of its own code, "
                                    "all of it in the step time where the CPU is the bottleneck, median")):
        if values:  # not built with --only
            value = max(values)
            verdict = "met" if value <= goal else "NOT met"
            print(("\n" if text.startswith("serving plugin:") else "")
                  + text.format(f"{value:.1f}") + f" (goal <= {goal:.0f} us: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
