"""vLLM plugin: the profiled K table follows the acceptance the engine sees, per batch size.

Start vLLM with ``scheduler_cls = "dsdprof.engines.vllm_adaptive.make_scheduler"``, in dynamic-SD
mode (``speculative_config.num_speculative_tokens_per_batch_size`` set, e.g. ``dsdprof export
--format vllm``), and a ``dsdprof.ktable/v2`` table named by ``additional_config =
{"dsdprof_adaptive": {"table": PATH}}`` or ``DSDPROF_ADAPTIVE_TABLE=PATH``
(:mod:`dsdprof.serve.settings`). The factory builds the sync or async scheduler by the
``async_scheduling`` vLLM resolved, like :func:`dsdprof.engines.vllm_scheduler.make_scheduler`,
whose mixin every class here keeps; it ignores every dsdprof key of a client's ``extra_args`` unless
a dsdprof run started the engine (``dsdprof validate --adaptive``), and then costs nothing per step.

* **Start.** An :class:`~dsdprof.serve.adaptive.AdaptiveKSelector` on the table, capped at the engine's
  ``num_speculative_tokens``; vLLM's ``dynamic_sd_lookup`` becomes the selector's lookup, so the
  engine serves the table's K from the first step (the configured schedule only switches vLLM's
  dynamic-SD mode on).
* **Every step** (``update_from_output``): vLLM's own per-step ``SpecDecodingStats`` -- drafts,
  accepted per position, drafted per position -- counted by vLLM's rules (grammar-invalidated
  drafts excluded, vLLM's ``num_sampled_tokens_per_step`` subtracted, stale outputs of finished or
  preempted requests skipped, before the output is trimmed) are queued with the step's time
  (below); every ``rebuild_every`` queued steps they go to ``selector.observe_step`` and
  ``selector.observe`` one step at a time (drafted per position only when the step mixed draft
  lengths) and the selector re-derives K per batch size -- the same state at every rebuild as
  feeding each step at once, for a tuple append per step. When vLLM logs no stats
  it builds no ``SpecDecodingStats``; the plugin's ``make_spec_decoding_stats``, which vLLM's loop
  calls once per request it counts, appends one small integer, and after the loop the step's drafts
  are counted by length and by accepted count in a few C-level passes
  (:mod:`dsdprof.plugins.spec_count`). When the selector's
  ``version`` moves the new dense lookup replaces ``dynamic_sd_lookup``. Cost per step at 256
  running + 2,000 waiting: ``benchmarks/bench_scheduler_overhead.py``, docs/adaptive.md.
* **vLLM's semantics stay**: K is looked up by the number of requests scheduled in the step
  (``dynamic_sd_lookup[len(num_scheduled_tokens)]``), as with a static schedule. No client can
  force K: only in an engine a dsdprof run started do its own requests (carrying the run's secret)
  force one; their acceptance is observed like any other.
* **Step times** (``update_from_output``): the time since the previous step's output, when the
  step was pure -- every request decoding with the K the step also drafts (``total_num_scheduled_tokens
  == requests * (1 + num_spec_tokens_to_schedule)``) -- is queued for ``selector.observe_step(requests, K,
  seconds)`` (steps at K=0 too); the acceptance of every step is referred to its own batch size.
* **Exploration**: on unforced steps the selector's :meth:`~dsdprof.serve.adaptive.AdaptiveKSelector.explore`
  may serve a neighbouring K for 2 steps in 256 (<= 1 %), so Ks not served still get step times.
* **Validate's steps design** (a dsdprof run only: requests carrying the run's secret and a K
  sequence of arms, :mod:`dsdprof.plugins.vllm_profiling`): the plugin's K serves the
  ``ARM_ENGINE`` steps, other arms force theirs; the selector learns the acceptance of the steps
  that verified the plugin's own drafts and the time of the steps that also drafted its K, never
  what another arm's steps show, so it learns per own step what it would learn alone.
* **K=0 is not a trap**: a step without drafts teaches the selector nothing, so once K is 0
  wherever the engine runs the estimate could never recover. After ``probe_every`` steps in a row
  without a draft (default 1024; 0 = never), one unforced step runs at K=1.

* **Context** (a ``dsdprof.ktable/v3`` table): one selector per context slice, all fed the same
  acceptance; every step serves the slice of the batch's **mean** context
  (:func:`dsdprof.serve.runtime.batch_context`: the step's attention cost is linear in each
  request's context, so a batch costs what B requests at the mean cost), O(B) per step. The
  context is read when vLLM looks K up (:class:`_ContextLookup`), after the step admitted its new
  requests, so a batch arriving at an idle engine is served its own context from its first step.
  A v1/v2 table keeps the batch-size-only lookup.

* **Metrics** (:class:`~dsdprof.plugins.metrics.MetricsMixin`, first in the MRO): K served, steps
  at K=0, acceptance per position, live / table ratios, switches, shift and silent no-op alarms on
  vLLM's ``/metrics`` (docs/observability.md).

The acceptance estimate is one per engine (all requests, all batch sizes); see docs/adaptive.md.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

from vllm.logger import init_logger

from dsdprof.formats.ktable import context_slice, read_table_file
from dsdprof.formats.ktable_types import KTable
from dsdprof.plugins.metrics import MetricsMixin
from dsdprof.plugins.names import ARM_ENGINE
from dsdprof.plugins.spec_count import SpecCount
from dsdprof.plugins.vllm_profiling import (
    TracingAsyncScheduler,
    TracingScheduler,
    _DsdprofMixin,
    build_for_config,
    class_for_config,
)
from dsdprof.serve.adaptive import AdaptiveKSelector
from dsdprof.serve.runtime import batch_context
from dsdprof.serve.settings import AdaptiveSettingError, resolve_settings

logger = init_logger("vllm.dsdprof.adaptive")  # vLLM's handler and level (VLLM_LOGGING_LEVEL)
_clock = time.perf_counter  # the step clock (a module global: tests drive it)

class _ContextLookup(list):
    """``dynamic_sd_lookup`` for a v3 table. vLLM indexes it once per step by the number of requests
    scheduled, after admitting the step's new requests; the index picks the slice of the running
    batch's mean context (``num_tokens``: a new request's prompt counts) and records it for the
    step's time. As a list it holds the batch-size-only schedule (``len`` and copies stay right)."""

    __slots__ = ("_sched",)
    _sched: Any  # the scheduler serving it

    def __getitem__(self, n):
        s = self._sched
        ctx = batch_context(r.num_tokens for r in s.running)
        i = 0
        for top, _ in s._adaptive_ctx:
            if ctx <= top:
                break
            i += 1
        s._adaptive_ctx_i = i = min(i, len(s._adaptive_ctx) - 1)
        return s._adaptive_ctx_lookups[i][n]


class _AdaptiveMixin:
    """See the module docstring. Sits before dsdprof's tracing mixin in the MRO."""

    if TYPE_CHECKING:  # what vLLM's Scheduler and dsdprof's tracing mixin (after this one in the MRO) hold
        vllm_config: Any
        num_spec_tokens: int
        dynamic_sd_lookup: Any
        _dsdprof_token: str
        _dsdprof_table_lookup: Any
        _dsdprof_static: Any
        _dsdprof_reqs: dict[str, Any]

        def _dsdprof_init(self, environ: Any = None) -> None: ...

        def schedule(self, *args: Any, **kwargs: Any) -> Any: ...

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._adaptive_setup(self.vllm_config.additional_config)

    def _adaptive_setup(self, additional_config, environ=None) -> None:
        """Load the table (the engine fails to start on a bad one) and serve its lookup."""
        if not self.num_spec_tokens or self.dynamic_sd_lookup is None:
            raise AdaptiveSettingError(
                f"speculative_config.num_speculative_tokens_per_batch_size={None!r}: the adaptive scheduler "
                "needs vLLM's dynamic-SD mode (serve the table's `dsdprof export --format vllm` speculative "
                "config)")
        settings = resolve_settings(additional_config, environ)
        table = read_table_file(settings.table_path)  # read once: the selector and the context slices
        self.dsdprof_selector = settings.selector(
            max_k=self.num_spec_tokens, table=table)
        self._adaptive_context_setup(settings, table)
        self._adaptive_max_bs = len(self.dynamic_sd_lookup) - 1
        self._adaptive_keys: list[int] | None = None  # counted requests when vLLM builds no SpecDecodingStats
        if not getattr(self, "log_stats", True):
            self._adaptive_count = count = SpecCount(self)
            self._adaptive_keys = count.keys  # a step's: keys[_adaptive_mark:] after vLLM's loop
            self._adaptive_mark = 0
            self.make_spec_decoding_stats = count.counter
        self._adaptive_queue: list = []  # drafted steps not yet fed to the selector
        self._adaptive_every = self.dsdprof_selector.rebuild_every
        self._adaptive_version: tuple[Any, ...] | int = -1
        self._adaptive_probe_every = settings.probe_every
        self._adaptive_idle = 0  # steps in a row without a draft
        self._adaptive_t: float | None = None  # perf_counter() at the previous step's update (None: none yet)
        self._adaptive_swap()
        self._dsdprof_static = list(self._dsdprof_table_lookup)  # validate's ARM_TABLE: K at start
        self._adaptive_probe = [min(1, self.num_spec_tokens)] * len(self.dynamic_sd_lookup)
        self._adaptive_update = super().update_from_output  # type: ignore[misc]  # vLLM's method
        if not self._dsdprof_token:
            self._adaptive_skip_tracing()
        sel = self.dsdprof_selector
        logger.info("dsdprof adaptive K: table %s (from %s), K <= %d, K per profiled batch size %s",
                    settings.table_path, settings.source, sel.max_k, sel.ks)

    def _adaptive_context_setup(self, settings, doc: KTable) -> None:
        """A v3 table (``doc``, the table file's): an adaptive selector per context slice
        (``_adaptive_ctx``: (max_context, selector)); none for v1/v2."""
        self._adaptive_ctx = [(sl["max_context"], AdaptiveKSelector(
            context_slice(doc, sl["max_context"]), max_k=self.num_spec_tokens, **dict(settings.options)))
            for sl in doc.get("contexts") or ()]
        self._adaptive_ctx_lookups: list[list[int]] = []
        self._adaptive_ctx_i = 0  # the slice the last step served (its selector learns that step's time)

    def _adaptive_versions(self) -> tuple:
        return (self.dsdprof_selector.version, *(s.version for _, s in self._adaptive_ctx))

    def _adaptive_swap(self) -> None:
        """Serve the selector's current lookup (also as the tracing mixin's unforced schedule)."""
        sel = self.dsdprof_selector
        self._adaptive_ctx_lookups = [s.lookup_list(self._adaptive_max_bs) for _, s in self._adaptive_ctx]
        lookup = sel.lookup_list(self._adaptive_max_bs)
        if self._adaptive_ctx:  # one lookup object for good: it picks the context slice when indexed
            ctx_lookup = getattr(self, "_adaptive_ctx_lookup", None)
            if ctx_lookup is None:
                ctx_lookup = _ContextLookup()
            ctx_lookup[:] = lookup
            ctx_lookup._sched = self
            self._adaptive_ctx_lookup = lookup = ctx_lookup
        old = getattr(self, "_dsdprof_table_lookup", None)
        if old is None:
            self.dynamic_sd_lookup = lookup
            self._dsdprof_init()  # the mixin's baseline: this lookup
        else:
            if self.dynamic_sd_lookup is old:  # not forced this step
                self.dynamic_sd_lookup = lookup
            self._dsdprof_table_lookup = lookup
        self._adaptive_version = self._adaptive_versions()

    def _dsdprof_apply_k(self) -> None:
        if self._dsdprof_reqs:  # a dsdprof run's requests may force K
            super()._dsdprof_apply_k()  # type: ignore[misc]  # the tracing mixin's, next in the MRO
        else:
            self.dynamic_sd_lookup = self._dsdprof_table_lookup
        if self.dynamic_sd_lookup is self._dsdprof_table_lookup:
            probe = self.dsdprof_selector.explore(self._adaptive_max_bs)  # <= 1 % of steps: a neighbouring K
            if probe is not None:
                self.dynamic_sd_lookup = probe
                return
        if (self._adaptive_probe_every and self._adaptive_idle >= self._adaptive_probe_every
                and self.dynamic_sd_lookup is self._dsdprof_table_lookup):
            self.dynamic_sd_lookup = self._adaptive_probe
            self._adaptive_idle = 0

    def _adaptive_skip_tracing(self) -> None:
        """No dsdprof run started this engine (no run secret), so the tracing mixin never acts
        (no request is profiled): where its method is the one in force, bind vLLM's own on the
        instance and skip its frame -- a few us each per step at 256 running. K is still applied
        before vLLM schedules. An override added above the tracing mixin stays in force."""
        cls, vllm = type(self), cast(Any, super(_DsdprofMixin, self))  # vLLM's Scheduler
        for name in ("has_requests", "add_request"):
            if getattr(cls, name) is getattr(_DsdprofMixin, name):
                setattr(self, name, getattr(vllm, name))
        if getattr(self._adaptive_update, "__func__", None) is _DsdprofMixin.update_from_output:
            self._adaptive_update = vllm.update_from_output
        if cls.schedule is _DsdprofMixin.schedule:
            vllm_schedule, apply_k = vllm.schedule, self._dsdprof_apply_k

            def schedule(*args, **kwargs):
                apply_k()
                return vllm_schedule(*args, **kwargs)

            self.schedule = schedule  # type: ignore[method-assign]  # vLLM's, K applied, on the instance

    def update_from_output(self, scheduler_output, model_runner_output):
        """vLLM's, then queue what the step tells the selector: its duration when it was pure
        (:meth:`_adaptive_step_time`) and its acceptance counts -- vLLM's own, by vLLM's rules
        (grammar-invalidated drafts excluded, ``num_sampled_tokens_per_step`` subtracted, stale
        outputs skipped), before vLLM trims the sampled tokens: its ``SpecDecodingStats`` attached
        to the step's outputs, or its slice of the indices :class:`.SpecCount` appended (counted
        when fed). A tuple append per step; every ``rebuild_every`` queued steps
        :meth:`_adaptive_feed` feeds the queue."""
        result = self._adaptive_update(scheduler_output, model_runner_output)
        n, k, seconds = self._adaptive_step_time(scheduler_output)
        keys = self._adaptive_keys
        prev, arm = self.dsdprof_step_arms
        if prev is not None or arm is not None:  # validate's steps design: learn from own steps only
            if prev != ARM_ENGINE:  # the step verified another arm's drafts
                if keys is not None:
                    del keys[self._adaptive_mark:]
                return result
            if arm != ARM_ENGINE:  # verified the plugin's drafts, drafted another arm's K: acceptance only
                seconds = None
        if keys is None:
            stats = None
            for eco in (result or {}).values():
                if eco.scheduler_stats is not None:
                    stats = eco.scheduler_stats.spec_decoding_stats
                    break
            drafted = stats is not None and stats.num_drafts
        else:  # the step's slice of keys, counted when fed
            start, end = self._adaptive_mark, len(keys)
            drafted = end > start
            if drafted:
                stats, self._adaptive_mark = (start, end), end
        if drafted:
            self._adaptive_idle = 0
        else:
            self._adaptive_idle += 1
            if seconds is None:
                return result
            stats = None
        queue = self._adaptive_queue
        queue.append((stats, n, k, seconds, self._adaptive_ctx_i))
        if len(queue) >= self._adaptive_every:
            self._adaptive_feed()
        return result

    def _adaptive_feed(self) -> bool:
        """Feed the queued steps to the selector in order: each step's time
        (``observe_step``, also to the context slice that served it), then its acceptance
        (:meth:`_adaptive_observe`). The selector only accumulates between rebuilds and rebuilds on
        its own step counts, so its state at each rebuild -- hence K -- is what feeding every step at
        once would give; a step pays for an append (the selector's arithmetic on the step right
        after vLLM's costs ~10x what it costs in this warm loop: cold caches), and the new lookup is
        served from the next step. True when the served lookup changed."""
        queue, self._adaptive_queue = self._adaptive_queue, []
        sel, ctx = self.dsdprof_selector, self._adaptive_ctx
        changed = False
        for stats, n, k, seconds, ci in queue:
            if seconds is not None:
                sel.observe_step(n, k, seconds)
                if ctx:  # the slice served at this step's context learns its time too
                    ctx[ci][1].observe_step(n, k, seconds)
            if type(stats) is tuple:  # a step's slice of the keys counted for it (log_stats off)
                stats = self._adaptive_count.stats(*stats)
            if stats is not None:
                changed |= self._adaptive_observe(stats, n)
        if self._adaptive_keys:  # every step's keys are queued (or dropped): counted
            self._adaptive_keys.clear()
            self._adaptive_mark = 0
        if self._adaptive_versions() != self._adaptive_version:  # K moved on step times alone
            self._adaptive_swap()
            logger.info("dsdprof adaptive K: now %s (step times)", sel.ks)
            changed = True
        return changed

    def _adaptive_step_time(self, scheduler_output) -> tuple:
        """``(requests, K, seconds)`` of the step: ``seconds`` since the previous step's output when
        every scheduled request verified and drafted the same K (no prefill, no K change) -- a step
        of the table's kind -- else None."""
        now = _clock()
        last, self._adaptive_t = self._adaptive_t, now
        n = len(scheduler_output.num_scheduled_tokens)
        if not n:
            self._adaptive_t = None  # an empty step: the next interval would include idle time
            return 0, None, None
        k = getattr(scheduler_output, "num_spec_tokens_to_schedule", None)
        if last is not None and type(k) is int and scheduler_output.total_num_scheduled_tokens == n * (1 + k):
            return n, k, now - last
        return n, k, None

    def _adaptive_observe(self, stats, batch_size: int | None = None) -> bool:
        """Feed one step's acceptance (vLLM's ``SpecDecodingStats``: its own, or the one
        :meth:`.SpecCount.stats` built from the step's counted drafts) to the selector now; True when
        the served lookup changed. O(K) per step, whatever the number of requests."""
        drafts = stats.num_drafts if stats is not None else 0
        if not drafts:
            self._adaptive_idle += 1
            return False
        self._adaptive_idle = 0
        per_pos = stats.num_draft_tokens_per_pos
        hi = len(per_pos)
        while hi and not per_pos[hi - 1]:
            hi -= 1
        accepted = list(stats.num_accepted_tokens_per_pos[:hi])
        drafted = list(per_pos[:hi])
        sel = self.dsdprof_selector
        mixed = None if all(d == drafts for d in drafted) else drafted
        for s in (sel, *(s for _, s in self._adaptive_ctx)):
            s.observe(drafts, accepted, mixed, batch_size=batch_size or None)
        if self._adaptive_versions() == self._adaptive_version:
            return False
        self._adaptive_swap()
        logger.info("dsdprof adaptive K: now %s (acceptance per position %s)", sel.ks,
                    [round(p, 3) for p in sel.acceptance()])
        return True


class AdaptiveScheduler(MetricsMixin, _AdaptiveMixin, TracingScheduler):
    """vLLM's synchronous scheduler + dsdprof's tracing mixin + live-acceptance K + metrics."""

    dsdprof_mode = "adaptive"


class AdaptiveAsyncScheduler(MetricsMixin, _AdaptiveMixin, TracingAsyncScheduler):
    """vLLM's async scheduler + dsdprof's tracing mixin + live-acceptance K + metrics."""

    dsdprof_mode = "adaptive"


def scheduler_class_for(scheduler_config) -> type:
    """The class :func:`make_scheduler` builds for vLLM's resolved scheduler config."""
    return class_for_config(scheduler_config, AdaptiveScheduler, AdaptiveAsyncScheduler)


def make_scheduler(*args, **kwargs):
    """``scheduler_cls`` for vLLM: the adaptive scheduler matching vLLM's own async choice."""
    return build_for_config(AdaptiveScheduler, AdaptiveAsyncScheduler, args, kwargs)
