"""vLLM plugin: the profiled K table follows the acceptance the engine sees, per batch size.

Start vLLM with ``scheduler_cls = "dsdprof.engines.vllm_adaptive.make_scheduler"``, in dynamic-SD
mode (``speculative_config.num_speculative_tokens_per_batch_size`` set, e.g. ``dsdprof export
--format vllm``), and a ``dsdprof.ktable/v2`` table named by ``additional_config =
{"dsdprof_adaptive": {"table": PATH}}`` or ``DSDPROF_ADAPTIVE_TABLE=PATH``
(:mod:`dsdprof.serve.settings`). The factory builds the sync or async scheduler by the
``async_scheduling`` vLLM resolved: :class:`dsdprof.plugins.serving.ServingScheduler` (or its async
twin) holding :class:`AdaptiveK`, this module's part, with the metrics part. It ignores every
dsdprof key of a client's ``extra_args`` unless a dsdprof run started the engine (``dsdprof validate
--adaptive``: then the profiling scheduler it extends acts), and then costs nothing per step.

* **Start.** An :class:`~dsdprof.serve.adaptive.AdaptiveKSelector` on the table, capped at the
  engine's ``num_speculative_tokens``; vLLM's ``dynamic_sd_lookup`` becomes the selector's lookup.
* **Every step** (``update_from_output``): vLLM's own ``SpecDecodingStats`` of the step (or, with
  log_stats off, the counts :mod:`dsdprof.plugins.spec_count` keeps) and, for a pure step, its
  time are queued; every ``rebuild_every`` queued steps they go to ``selector.observe_step`` and
  ``selector.observe`` one step at a time, and a new ``version`` replaces ``dynamic_sd_lookup``.
  vLLM still looks K up by the number of requests scheduled in the step; no client can force K.
* **Exploration** (:meth:`~dsdprof.serve.adaptive.AdaptiveKSelector.explore`) on unforced steps,
  and one step at K=1 after ``probe_every`` steps in a row without a draft (K=0 is not a trap).
* **Context** (a ``dsdprof.ktable/v3`` table): one selector per slice; every step serves the slice
  of the batch's mean context (:func:`dsdprof.serve.runtime.batch_context`), read when vLLM looks
  K up (:class:`ContextLookup`).
* **Metrics**: :class:`~dsdprof.plugins.metrics.StepMetrics`, the scheduler's other part
  (docs/observability.md).

Each step's rules, the validate steps design and the cost per step
(``benchmarks/bench_scheduler_overhead.py``): docs/adaptive.md ("In vLLM"), docs/context.md
("Serving") and docs/measurement.md.
"""


from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from vllm.logger import init_logger

from dsdprof.formats.ktable import context_slice, read_table_file
from dsdprof.formats.ktable_types import KTable
from dsdprof.plugins.names import ARM_ENGINE
from dsdprof.plugins.serving import ServingAsyncScheduler, ServingScheduler
from dsdprof.plugins.spec_count import SpecCount
from dsdprof.plugins.vllm_profiling import scheduler_pair
from dsdprof.serve.adaptive import AdaptiveKSelector
from dsdprof.serve.runtime import batch_context
from dsdprof.serve.settings import AdaptiveSettingError, AdaptiveSettings, resolve_settings

if TYPE_CHECKING:  # vLLM's types (Any to the type checker, which does not follow vLLM: pyproject.toml)
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.request import Request
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

logger = init_logger("vllm.dsdprof.adaptive")  # vLLM's handler and level (VLLM_LOGGING_LEVEL)
_clock = time.perf_counter  # the step clock (a module global: tests drive it)

# a queued step: (acceptance: vLLM's SpecDecodingStats, or a (start, end) slice of SpecCount.keys,
# or None; requests; K; seconds or None; the context slice that served it)
Step = tuple["SpecDecodingStats | tuple[int, int] | None", int, "int | None", "float | None", int]


class Host(Protocol):
    """What :class:`AdaptiveK` reads of vLLM's scheduler that holds it."""

    num_spec_tokens: int
    dynamic_sd_lookup: list[int] | None
    running: list[Request]


class ContextLookup(list[int]):
    """``dynamic_sd_lookup`` for a v3 table. vLLM indexes it once per step by the number of requests
    scheduled, after admitting the step's new requests; the index picks the slice of the running
    batch's mean context (``num_tokens``: a new request's prompt counts) and records it for the
    step's time. As a list it holds the batch-size-only schedule (``len`` and copies stay right)."""

    __slots__ = ("_part",)
    _part: AdaptiveK

    def __getitem__(self, n):  # vLLM indexes it by an int only
        part = self._part
        ctx = batch_context(r.num_tokens for r in part.host.running)
        i = 0
        for top, _ in part.contexts:
            if ctx <= top:
                break
            i += 1
        part.ctx_i = i = min(i, len(part.contexts) - 1)
        return part.ctx_lookups[i][n]


class AdaptiveK:
    """The adaptive selector's part of the serving scheduler (:class:`dsdprof.plugins.serving.KPart`):
    the table's selector (and one per context slice), the lookup served, the steps queued for the
    selector, the K=0 probe. See the module docstring."""

    def __init__(self, host: Host, additional_config: object, environ: Mapping[str, str] | None,
                 serve: Callable[[list[int]], None]) -> None:
        """Load the table (the engine fails to start on a bad one) and serve its lookup
        (``serve``: the scheduler's, called whenever the lookup changes)."""
        vllm_lookup = host.dynamic_sd_lookup
        if not host.num_spec_tokens or vllm_lookup is None:
            raise AdaptiveSettingError(
                f"speculative_config.num_speculative_tokens_per_batch_size={None!r}: the adaptive scheduler "
                "needs vLLM's dynamic-SD mode (serve the table's `dsdprof export --format vllm` speculative "
                "config)")
        self.host, self._serve = host, serve
        max_k = host.num_spec_tokens
        settings = resolve_settings(additional_config, environ)
        table = read_table_file(settings.table_path)  # read once: the selector and the context slices
        self.selector = settings.selector(max_k=max_k, table=table)
        self.contexts = self._context_selectors(settings, table, max_k)  # (max_context, selector)
        self.ctx_lookups: list[list[int]] = []
        self.ctx_i = 0  # the slice the last step served (its selector learns that step's time)
        self.max_bs = len(vllm_lookup) - 1
        # counted requests when vLLM builds no SpecDecodingStats (log_stats off): SpecCount's keys
        self.count = SpecCount(host) if not getattr(host, "log_stats", True) else None
        self.keys = self.count.keys if self.count is not None else None
        self.mark = 0  # a step's keys: keys[mark:] after vLLM's loop
        self.queue: list[Step] = []  # drafted steps not yet fed to the selector
        self.every = self.selector.rebuild_every
        self.probe_every = settings.probe_every
        self.idle = 0  # steps in a row without a draft
        self.t: float | None = None  # perf_counter() at the previous step's update (None: none yet)
        self.version = 0  # moves whenever the lookup does
        self._lookup: list[int] = []
        self._ctx_lookup: ContextLookup | None = None
        self._versions: tuple[int, ...] = ()
        self._swap()
        self.version = 0
        self.probe = [min(1, max_k)] * len(vllm_lookup)
        sel = self.selector
        logger.info("dsdprof adaptive K: table %s (from %s), K <= %d, K per profiled batch size %s",
                    settings.table_path, settings.source, sel.max_k, sel.ks)

    @staticmethod
    def _context_selectors(settings: AdaptiveSettings, doc: KTable,
                           max_k: int) -> list[tuple[int, AdaptiveKSelector]]:
        """A v3 table (``doc``, the table file's): an adaptive selector per context slice; none for v1/v2."""
        return [(sl["max_context"], AdaptiveKSelector(
            context_slice(doc, sl["max_context"]), max_k=max_k, **dict(settings.options)))
            for sl in doc.get("contexts") or ()]

    @property
    def lookup(self) -> list[int]:
        """The lookup served when no run's request forces K (a :class:`ContextLookup` for v3)."""
        return self._lookup

    def selectors(self) -> list[AdaptiveKSelector]:
        return [self.selector, *(s for _, s in self.contexts)]

    def _current(self) -> tuple[int, ...]:
        return (self.selector.version, *(s.version for _, s in self.contexts))

    def _swap(self) -> None:
        """Serve the selectors' current lookup."""
        self.ctx_lookups = [s.lookup_list(self.max_bs) for _, s in self.contexts]
        lookup = self.selector.lookup_list(self.max_bs)
        if self.contexts:  # one lookup object for good: it picks the context slice when indexed
            if self._ctx_lookup is None:
                self._ctx_lookup = ContextLookup()
                self._ctx_lookup._part = self
            self._ctx_lookup[:] = lookup
            lookup = self._ctx_lookup
        self._lookup = lookup
        self._versions = self._current()
        self.version += 1
        self._serve(lookup)

    # ------------------------------------------------------------------ before vLLM schedules
    def pick(self, lookup: list[int]) -> list[int]:
        """The lookup the step serves: ``lookup`` (the scheduler's: this part's, or one a run's request
        forced); when it is this part's, the selector's exploration lookup (<= 1 % of steps: a
        neighbouring K), or K=1 after ``probe_every`` steps in a row without a draft."""
        if lookup is not self._lookup:
            return lookup
        probe = self.selector.explore(self.max_bs)
        if probe is not None:
            return probe
        if self.probe_every and self.idle >= self.probe_every:
            self.idle = 0
            return self.probe
        return lookup

    # ------------------------------------------------------------------ after vLLM's update
    def learn(self, scheduler_output: SchedulerOutput, result: dict[int, EngineCoreOutputs],
              arms: tuple[int | None, int | None]) -> None:
        """Queue what the step tells the selector: its duration when it was pure
        (:meth:`step_time`) and its acceptance counts -- vLLM's own, by vLLM's rules
        (grammar-invalidated drafts excluded, ``num_sampled_tokens_per_step`` subtracted, stale
        outputs skipped), before vLLM trims the sampled tokens: its ``SpecDecodingStats`` attached
        to the step's outputs (``result``), or its slice of the indices :class:`.SpecCount`
        appended (counted when fed). A tuple append per step; every ``rebuild_every`` queued steps
        :meth:`feed` feeds the queue. ``arms``: the tracer's (previous step's, this step's) arm."""
        n, k, seconds = self.step_time(scheduler_output)
        keys = self.keys
        prev, arm = arms
        if prev is not None or arm is not None:  # validate's steps design: learn from own steps only
            if prev != ARM_ENGINE:  # the step verified another arm's drafts
                if keys is not None:
                    del keys[self.mark:]
                return
            if arm != ARM_ENGINE:  # verified the plugin's drafts, drafted another arm's K: acceptance only
                seconds = None
        stats: SpecDecodingStats | tuple[int, int] | None
        if keys is None:
            sd = None
            for eco in (result or {}).values():
                if eco.scheduler_stats is not None:
                    sd = eco.scheduler_stats.spec_decoding_stats
                    break
            drafted = sd is not None and sd.num_drafts
            stats = sd
        else:  # the step's slice of keys, counted when fed
            start, end = self.mark, len(keys)
            drafted = end > start
            if drafted:
                stats, self.mark = (start, end), end
        if drafted:
            self.idle = 0
        else:
            self.idle += 1
            if seconds is None:
                return
            stats = None
        queue = self.queue
        queue.append((stats, n, k, seconds, self.ctx_i))
        if len(queue) >= self.every:
            self.feed()

    def feed(self) -> bool:
        """Feed the queued steps to the selector in order: each step's time
        (``observe_step``, also to the context slice that served it), then its acceptance
        (:meth:`observe`). The selector only accumulates between rebuilds and rebuilds on
        its own step counts, so its state at each rebuild -- hence K -- is what feeding every step at
        once would give; a step pays for an append (the selector's arithmetic on the step right
        after vLLM's costs ~10x what it costs in this warm loop: cold caches), and the new lookup is
        served from the next step. True when the served lookup changed."""
        queue, self.queue = self.queue, []
        sel, ctx = self.selector, self.contexts
        changed = False
        for stats, n, k, seconds, ci in queue:
            if seconds is not None:
                sel.observe_step(n, k, seconds)
                if ctx:  # the slice served at this step's context learns its time too
                    ctx[ci][1].observe_step(n, k, seconds)
            if type(stats) is tuple and self.count is not None:  # a step's slice of the counted keys
                stats = self.count.stats(*stats)
            if stats is not None:
                changed |= self.observe(stats, n)
        if self.keys:  # every step's keys are queued (or dropped): counted
            self.keys.clear()
            self.mark = 0
        if self._current() != self._versions:  # K moved on step times alone
            self._swap()
            logger.info("dsdprof adaptive K: now %s (step times)", sel.ks)
            changed = True
        return changed

    def step_time(self, scheduler_output: SchedulerOutput) -> tuple[int, int | None, float | None]:
        """``(requests, K, seconds)`` of the step: ``seconds`` since the previous step's output when
        every scheduled request verified and drafted the same K (no prefill, no K change) -- a step
        of the table's kind -- else None."""
        now = _clock()
        last, self.t = self.t, now
        n = len(scheduler_output.num_scheduled_tokens)
        if not n:
            self.t = None  # an empty step: the next interval would include idle time
            return 0, None, None
        k = getattr(scheduler_output, "num_spec_tokens_to_schedule", None)
        if last is not None and type(k) is int and scheduler_output.total_num_scheduled_tokens == n * (1 + k):
            return n, k, now - last
        return n, k, None

    def observe(self, stats: SpecDecodingStats | None, batch_size: int | None = None) -> bool:
        """Feed one step's acceptance (vLLM's ``SpecDecodingStats``: its own, or the one
        :meth:`.SpecCount.stats` built from the step's counted drafts) to the selector now; True when
        the served lookup changed. O(K) per step, whatever the number of requests."""
        if stats is None or not stats.num_drafts:
            self.idle += 1
            return False
        drafts = stats.num_drafts
        self.idle = 0
        per_pos = stats.num_draft_tokens_per_pos
        hi = len(per_pos)
        while hi and not per_pos[hi - 1]:
            hi -= 1
        accepted = list(stats.num_accepted_tokens_per_pos[:hi])
        drafted = list(per_pos[:hi])
        sel = self.selector
        mixed = None if all(d == drafts for d in drafted) else drafted
        for s in (sel, *(s for _, s in self.contexts)):
            s.observe(drafts, accepted, mixed, batch_size=batch_size or None)
        if self._current() == self._versions:
            return False
        self._swap()
        logger.info("dsdprof adaptive K: now %s (acceptance per position %s)", sel.ks,
                    [round(p, 3) for p in sel.acceptance()])
        return True


class AdaptiveScheduler(ServingScheduler):
    """vLLM's synchronous scheduler + the adaptive K part + metrics (+ the tracer in a run's engine)."""

    dsdprof_mode = "adaptive"
    k_part = staticmethod(AdaptiveK)


class AdaptiveAsyncScheduler(ServingAsyncScheduler):
    """vLLM's async scheduler + the adaptive K part + metrics (+ the tracer in a run's engine)."""

    dsdprof_mode = "adaptive"
    k_part = staticmethod(AdaptiveK)


# the adaptive scheduler matching vLLM's own async choice (dsdprof.engines.vllm_adaptive.make_scheduler)
scheduler_class_for, make_scheduler = scheduler_pair(AdaptiveScheduler, AdaptiveAsyncScheduler)
