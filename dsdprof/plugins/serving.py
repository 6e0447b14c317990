"""dsdprof's serving scheduler: vLLM's scheduler holding dsdprof's parts, and calling them.

One class per vLLM scheduler base -- :class:`ServingScheduler` (vLLM's ``Scheduler``) and
:class:`ServingAsyncScheduler` (``AsyncScheduler``, its base switched, nothing else) -- serves both
``scheduler_cls`` paths a serving config names: ``dsdprof.engines.vllm_static.make_scheduler`` (the
table's static schedule, vLLM's own lookup) and ``dsdprof.engines.vllm_adaptive.make_scheduler``
(the adaptive plugin). Its subclasses there only name the mode and the K part. It holds:

* **the K part** (:class:`KPart`; :class:`dsdprof.plugins.vllm_adaptive.AdaptiveK`, the adaptive
  selector's part; none for the static schedule): the lookup served per step and what each step's
  output teaches it;
* **the metrics part** (:class:`MetricsPart`; :class:`dsdprof.plugins.metrics.StepMetrics`; none with
  ``DSDPROF_METRICS=0``): counters and the silent no-op alarm on vLLM's ``/metrics``;
* **the tracer**: the profiling scheduler it extends (:mod:`dsdprof.plugins.vllm_profiling`, the
  scheduler sweeps start). It acts only in an engine a dsdprof run started (``dsdprof validate
  --adaptive``: the run's secret in the environment) and only for the adaptive plugin; everywhere
  else each method below calls vLLM's own directly, so the tracer costs no frame per step.

Every vLLM method dsdprof's serving engines override is overridden here, once, and nowhere on the
instance: ``has_requests``, ``add_request``, ``schedule``, ``update_from_output``,
``update_draft_token_ids``, ``update_draft_token_ids_in_output``; and ``make_spec_decoding_stats``
only where the K part counts drafts (vLLM logs no stats): vLLM calls it once per drafted request, so
an override would cost every engine that logs stats a frame per request; there its class is a
C-level property returning the K part's counter (no frame of ours). At start a scheduler takes
:func:`serving_class`'s variant of its class: where no part acts in one of the methods above (no
tracer, no metrics part, no K part), the variant holds vLLM's own function for it, so an engine pays
a frame of ours per step only for the parts it runs. The tracer's own list is in
:mod:`dsdprof.plugins.vllm_profiling`; docs/vllm-internals.md lists both.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from vllm.logger import init_logger

from dsdprof.plugins.metrics import StepMetrics, enabled
from dsdprof.plugins.vllm_profiling import (
    TracingAsyncScheduler,
    TracingScheduler,
    _DsdprofMixin,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request

    from dsdprof.plugins.spec_count import SpecCount
    from dsdprof.serve.adaptive import AdaptiveKSelector

logger = init_logger("vllm.dsdprof.metrics")

Lookup = list[int]  # vLLM's dynamic_sd_lookup: K by the number of requests scheduled in the step
Arms = tuple[int | None, int | None]  # the tracer's arms of the previous and of this step
Outputs: TypeAlias = "dict[int, EngineCoreOutputs]"  # what vLLM's update_from_output returns


class KPart(Protocol):
    """The part that chooses K (the adaptive plugin's). It calls the ``serve`` callback it was built
    with whenever its :attr:`lookup` changes (``version`` moves with it)."""

    version: int
    count: SpecCount | None  # counts vLLM's drafts when vLLM logs no stats (else None)

    @property
    def lookup(self) -> Lookup: ...

    def pick(self, lookup: Lookup) -> Lookup:
        """Before vLLM schedules: the lookup this step serves, given the one it would (a probe or
        exploration lookup instead of :attr:`lookup`, now and then)."""
        ...

    def learn(self, scheduler_output: SchedulerOutput, result: Outputs, arms: Arms) -> None:
        """After vLLM's update: what the step tells (its time, its acceptance)."""
        ...

    def selectors(self) -> list[AdaptiveKSelector]: ...


class MetricsPart(Protocol):
    """The metrics part: :class:`dsdprof.plugins.metrics.StepMetrics`."""

    def before_update(self, scheduler_output: SchedulerOutput,
                      model_runner_output: ModelRunnerOutput) -> bool: ...

    def after_update(self, sched: ServingScheduler, scheduler_output: SchedulerOutput, result: Outputs,
                     over: bool) -> None: ...

    def check_drafts(self, ids: list[list[int]]) -> None: ...

    def count_request(self, request: Request, profiled: Mapping[str, object]) -> None: ...


# (the scheduler, vLLM's additional_config, the environment, the scheduler's serve callback) -> the part
KPartFactory = Callable[["ServingScheduler", object, Mapping[str, str], Callable[[Lookup], None]], KPart]


def _set_spec_stats(sched: ServingScheduler, fn: Callable[..., object]) -> None:
    sched._dsdprof_spec_stats = fn


_VARIANTS: dict[tuple[type, frozenset[str], bool], type] = {}


def serving_class(cls: type, direct: frozenset[str] = frozenset(), counting: bool = False) -> type:
    """The class a serving scheduler of class ``cls`` takes at start: ``cls`` itself, or its subclass
    (one per combination, made once) in which every method named in ``direct`` is vLLM's own function
    -- a call costs no frame of ours where no part acts in it -- and, with ``counting``,
    ``make_spec_decoding_stats`` is the instance's ``_dsdprof_spec_stats`` (the K part's
    :class:`~dsdprof.plugins.spec_count.SpecCount` counter, when vLLM logs no stats)."""
    if not direct and not counting:
        return cls
    key = (cls, direct, counting)
    sub = _VARIANTS.get(key)
    if sub is None:
        vllm: Any = super(_DsdprofMixin, cls)  # vLLM's scheduler: the classes after the tracer
        ns: dict[str, object] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                 "__doc__": cls.__doc__, "_dsdprof_serving_base": cls}
        ns.update((name, getattr(vllm, name)) for name in sorted(direct))
        if counting:  # vLLM calls it once per drafted request: a C-level attribute read, no frame of ours
            ns["make_spec_decoding_stats"] = property(attrgetter("_dsdprof_spec_stats"), _set_spec_stats)
        sub = _VARIANTS[key] = type(cls.__name__, (cls,), ns)
    return sub


class ServingScheduler(TracingScheduler):
    """vLLM's synchronous scheduler + dsdprof's K part, metrics part and tracer (module docstring)."""

    if TYPE_CHECKING:  # vLLM's Scheduler state this class reads
        vllm_config: VllmConfig
        log_stats: bool
        _dsdprof_spec_stats: Callable[..., object]

    dsdprof_mode = "static"  # the metrics' mode label; "adaptive" with a K part
    k_part: KPartFactory | None = None  # builds the K part (a subclass's staticmethod); None: vLLM's K
    dsdprof_k: KPart | None = None
    dsdprof_metrics: MetricsPart | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # vLLM's Scheduler.__init__, then the tracer's state
        self._serving_setup(self.vllm_config.additional_config)

    def _serving_setup(self, additional_config: object, environ: Mapping[str, str] | None = None) -> None:
        """Build the parts and bind, once, the method each of this class's calls goes to: the
        tracer's in an engine a dsdprof run started (adaptive only), else vLLM's own."""
        env = os.environ if environ is None else environ
        vllm: Any = super(_DsdprofMixin, self)  # vLLM's scheduler: the class after the tracer
        self._dsdprof_traced = traced = bool(self._dsdprof_token) and self.k_part is not None
        if not traced:  # the tracer never acts: no run secret (the static schedule ignores one)
            self._dsdprof_token = ""
            self._dsdprof_late = False
        tracer: Any = super() if traced else vllm
        self._has = tracer.has_requests
        self._add = tracer.add_request
        self._schedule = tracer.schedule
        self._update = tracer.update_from_output
        self._draft = vllm.update_draft_token_ids
        self._draft_out = vllm.update_draft_token_ids_in_output
        k = self.dsdprof_k = (None if self.k_part is None
                              else self.k_part(self, additional_config, env, self._dsdprof_serve))
        counting = False
        if k is not None:
            self._dsdprof_static = list(k.lookup)  # validate's ARM_TABLE: K at start
            if k.count is not None:  # vLLM logs no stats: the K part counts vLLM's drafts
                self._dsdprof_spec_stats = k.count.counter
                counting = True
        self.dsdprof_metrics = None
        if enabled(additional_config, env):
            cfg = additional_config if isinstance(additional_config, dict) else {}
            table = ((cfg.get("dsdprof_adaptive") or {}).get("table", "")
                     if self.dsdprof_mode == "adaptive" else "")
            self.dsdprof_metrics = StepMetrics(self, k, self.dsdprof_mode, str(table), env)
        else:
            logger.info("dsdprof metrics: off")
        cls = getattr(type(self), "_dsdprof_serving_base", type(self))
        self.__class__ = serving_class(cls, self._direct(k, self.dsdprof_metrics), counting)

    def _direct(self, k: KPart | None, m: MetricsPart | None) -> frozenset[str]:
        """The overridden methods in which no part acts here: served by vLLM's own function."""
        names = set()
        if m is None:
            names |= {"update_draft_token_ids", "update_draft_token_ids_in_output"}
        if not self._dsdprof_traced:
            names.add("has_requests")
            if m is None:
                names.add("add_request")
            if k is None:
                names.add("schedule")
                if m is None:
                    names.add("update_from_output")
        return frozenset(names)

    def _dsdprof_serve(self, lookup: Lookup) -> None:
        """The K part's new lookup: served from the next step (this one too when no run's request
        forced K), and the tracer's unforced schedule."""
        if self.dynamic_sd_lookup is self._dsdprof_table_lookup:  # not forced this step
            self.dynamic_sd_lookup = lookup
        self._dsdprof_table_lookup = lookup

    # ------------------------------------------------------------------ vLLM's methods
    def has_requests(self) -> bool:
        return self._has()

    def add_request(self, request: Request) -> None:
        self._add(request)
        m = self.dsdprof_metrics
        if m is not None:
            m.count_request(request, self._dsdprof_reqs)

    def schedule(self, *args: object, **kwargs: object) -> SchedulerOutput:
        k = self.dsdprof_k
        if k is not None and not self._dsdprof_traced:  # traced: the tracer calls _dsdprof_apply_k
            self.dynamic_sd_lookup = k.pick(k.lookup)
        return self._schedule(*args, **kwargs)

    def _dsdprof_apply_k(self) -> None:
        """The tracer's hook before vLLM schedules (traced engines): a run's request may force K;
        else the K part's lookup."""
        k = self.dsdprof_k
        if k is None:
            return super()._dsdprof_apply_k()
        if self._dsdprof_reqs:
            super()._dsdprof_apply_k()
            lookup = self.dynamic_sd_lookup
        else:
            lookup = self.dynamic_sd_lookup = self._dsdprof_table_lookup
        if lookup is not None:  # never None once a K part serves
            self.dynamic_sd_lookup = k.pick(lookup)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> Outputs:
        m = self.dsdprof_metrics
        over = m.before_update(scheduler_output, model_runner_output) if m is not None else False
        result = self._update(scheduler_output, model_runner_output)
        k = self.dsdprof_k
        if k is not None:
            k.learn(scheduler_output, result, self.dsdprof_step_arms)
        if m is not None:
            m.after_update(self, scheduler_output, result, over)
        return result

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        """Sync scheduling hands each step's drafts right after that step's output: checked against
        the K that step scheduled (:meth:`StepMetrics.check_drafts`), then vLLM's."""
        m = self.dsdprof_metrics
        if m is not None:
            m.check_drafts(draft_token_ids.draft_token_ids)
        self._draft(draft_token_ids)

    def update_draft_token_ids_in_output(self, draft_token_ids: DraftTokenIds,
                                         scheduler_output: SchedulerOutput) -> None:
        """Async scheduling with structured outputs hands the drafts of the step just processed
        here (to validate them for the next step): the same check, then vLLM's."""
        m = self.dsdprof_metrics
        if m is not None:
            m.check_drafts(draft_token_ids.draft_token_ids)
        self._draft_out(draft_token_ids, scheduler_output)


class ServingAsyncScheduler(ServingScheduler, TracingAsyncScheduler):
    """The same on vLLM's async scheduler (its default on GPU where supported)."""

