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
  preempted requests skipped, before the output is trimmed) go to ``selector.observe`` (drafted
  per position only when the step mixed draft lengths). Reading them costs O(K) per step. Every ``rebuild_every`` steps the selector re-derives K per batch size;
  when its ``version`` moves the new dense lookup replaces ``dynamic_sd_lookup``.
* **vLLM's semantics stay**: K is looked up by the number of requests scheduled in the step
  (``dynamic_sd_lookup[len(num_scheduled_tokens)]``), as with a static schedule. No client can
  force K: only in an engine a dsdprof run started do its own requests (carrying the run's secret)
  force one; their acceptance is observed like any other.
* **K=0 is not a trap**: a step without drafts teaches the selector nothing, so once K is 0
  wherever the engine runs the estimate could never recover. After ``probe_every`` steps in a row
  without a draft (default 1024; 0 = never), one unforced step runs at K=1.

* **Context** (a ``dsdprof.ktable/v3`` table): one selector per context slice, all fed the same
  acceptance; every step serves the slice of the batch's **mean** context
  (:func:`dsdprof.serve.runtime.batch_context`: the step's attention cost is linear in each
  request's context, so a batch costs what B requests at the mean cost), O(B) per step. A v1/v2
  table keeps the batch-size-only lookup.

The acceptance estimate is one per engine (all requests, all batch sizes); see docs/adaptive.md.
"""

from __future__ import annotations

from vllm.logger import init_logger
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from dsdprof.formats.ktable import context_slice, read_table_file
from dsdprof.serve.adaptive import AdaptiveKSelector
from dsdprof.serve.runtime import batch_context
from dsdprof.serve.settings import AdaptiveSettingError, resolve_settings
from dsdprof.plugins.vllm_profiling import (
    TracingAsyncScheduler, TracingScheduler, build_for_config, class_for_config,
)

logger = init_logger("vllm.dsdprof.adaptive")  # vLLM's handler and level (VLLM_LOGGING_LEVEL)

class _AdaptiveMixin:
    """See the module docstring. Sits before dsdprof's tracing mixin in the MRO."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._adaptive_setup(self.vllm_config.additional_config)  # type: ignore[attr-defined]

    def _adaptive_setup(self, additional_config, environ=None) -> None:
        """Load the table (the engine fails to start on a bad one) and serve its lookup."""
        if not self.num_spec_tokens or self.dynamic_sd_lookup is None:  # type: ignore[attr-defined]
            raise AdaptiveSettingError(
                f"speculative_config.num_speculative_tokens_per_batch_size={None!r}: the adaptive scheduler needs "
                "vLLM's dynamic-SD mode (serve the table's `dsdprof export --format vllm` speculative config)")
        settings = resolve_settings(additional_config, environ)
        self.dsdprof_selector = settings.selector(max_k=self.num_spec_tokens)  # type: ignore[attr-defined]
        self._adaptive_context_setup(settings)
        self._adaptive_max_bs = len(self.dynamic_sd_lookup) - 1  # type: ignore[attr-defined]
        self._adaptive_pending = None
        if not getattr(self, "log_stats", True):  # vLLM builds no SpecDecodingStats: build them for us
            self.make_spec_decoding_stats = self._adaptive_make_spec_stats
        self._adaptive_version = -1
        self._adaptive_probe_every = settings.probe_every
        self._adaptive_idle = 0  # steps in a row without a draft
        self._adaptive_swap()
        self._adaptive_probe = [min(1, self.num_spec_tokens)] * len(self.dynamic_sd_lookup)  # type: ignore[attr-defined]
        logger.info("dsdprof adaptive K: table %s (from %s), K <= %d, K per profiled batch size %s",
                    settings.table_path, settings.source, self.dsdprof_selector.max_k, self.dsdprof_selector.ks)

    def _adaptive_context_setup(self, settings) -> None:
        """A v3 table: an adaptive selector per context slice (``_adaptive_ctx``: (max_context,
        selector)); none for v1/v2."""
        doc = read_table_file(settings.table_path)
        self._adaptive_ctx = [(sl["max_context"], AdaptiveKSelector(
            context_slice(doc, sl["max_context"]), max_k=self.num_spec_tokens, **dict(settings.options)))  # type: ignore[attr-defined]
            for sl in doc.get("contexts") or ()]
        self._adaptive_ctx_lookups: list[list[int]] = []

    def _adaptive_versions(self) -> tuple:
        return (self.dsdprof_selector.version, *(s.version for _, s in self._adaptive_ctx))

    def _adaptive_context_lookup(self) -> None:
        """Before vLLM looks K up: the unforced schedule is the slice of the batch's mean context."""
        if not self._adaptive_ctx:
            return
        ctx = batch_context(r.num_computed_tokens for r in self.running)  # type: ignore[attr-defined]
        i = next((j for j, (top, _) in enumerate(self._adaptive_ctx) if ctx <= top), len(self._adaptive_ctx) - 1)
        self._dsdprof_table_lookup = self._adaptive_ctx_lookups[i]

    def _adaptive_swap(self) -> None:
        """Serve the selector's current lookup (also as the tracing mixin's unforced schedule)."""
        sel = self.dsdprof_selector
        self._adaptive_ctx_lookups = [s.lookup_list(self._adaptive_max_bs) for _, s in self._adaptive_ctx]
        lookup = sel.lookup_list(self._adaptive_max_bs)
        old = getattr(self, "_dsdprof_table_lookup", None)
        if old is None:
            self.dynamic_sd_lookup = lookup  # type: ignore[attr-defined]
            self._dsdprof_init()  # type: ignore[attr-defined]  # the mixin's baseline: this lookup
        else:
            if self.dynamic_sd_lookup is old:  # type: ignore[attr-defined]  # not forced this step
                self.dynamic_sd_lookup = lookup  # type: ignore[attr-defined]
            self._dsdprof_table_lookup = lookup
        self._adaptive_version = self._adaptive_versions()

    def _dsdprof_apply_k(self) -> None:
        self._adaptive_context_lookup()
        super()._dsdprof_apply_k()  # type: ignore[misc]  # forced K, else the adaptive lookup
        if (self._adaptive_probe_every and self._adaptive_idle >= self._adaptive_probe_every
                and self.dynamic_sd_lookup is self._dsdprof_table_lookup):  # type: ignore[attr-defined]
            self.dynamic_sd_lookup = self._adaptive_probe  # type: ignore[attr-defined]
            self._adaptive_idle = 0

    def update_from_output(self, scheduler_output, model_runner_output):  # type: ignore[override]
        result = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        self._adaptive_observe(self._adaptive_step_stats(result))
        return result

    def _adaptive_step_stats(self, result):
        """vLLM's own ``SpecDecodingStats`` of the step just processed: counted by vLLM's rules
        (grammar-invalidated drafts excluded, ``num_sampled_tokens_per_step`` subtracted, stale
        outputs skipped), before vLLM trims the sampled tokens. O(1): vLLM already built them --
        attached to the step's outputs when the engine logs stats, else captured by
        :meth:`_adaptive_make_spec_stats`."""
        pending = self._adaptive_pending
        if pending is not None:
            self._adaptive_pending = None
            return pending
        for eco in (result or {}).values():
            stats = eco.scheduler_stats
            if stats is not None:
                return stats.spec_decoding_stats
        return None

    def _adaptive_make_spec_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                  num_invalid_spec_tokens, request_id):
        """vLLM's ``make_spec_decoding_stats`` without its ``log_stats`` gate (installed on the
        instance only when the engine does not log stats): the step's stats for the selector."""
        if spec_decoding_stats is None:
            spec_decoding_stats = SpecDecodingStats.new(self.num_spec_tokens)  # type: ignore[attr-defined]
            self._adaptive_pending = spec_decoding_stats
        if num_invalid_spec_tokens:
            num_draft_tokens -= num_invalid_spec_tokens.get(request_id, 0)
        spec_decoding_stats.observe_draft(num_draft_tokens=num_draft_tokens, num_accepted_tokens=num_accepted_tokens)
        return spec_decoding_stats

    def _adaptive_observe(self, stats) -> bool:
        """Feed one step's acceptance (vLLM's ``SpecDecodingStats``) to the selector; True when the
        served lookup changed. O(K) per step, whatever the number of requests."""
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
            s.observe(drafts, accepted, mixed)
        if self._adaptive_versions() == self._adaptive_version:
            return False
        self._adaptive_swap()
        logger.info("dsdprof adaptive K: now %s (acceptance per position %s)", sel.ks,
                    [round(p, 3) for p in sel.acceptance()])
        return True


class AdaptiveScheduler(_AdaptiveMixin, TracingScheduler):
    """vLLM's synchronous scheduler + dsdprof's tracing mixin + live-acceptance K."""


class AdaptiveAsyncScheduler(_AdaptiveMixin, TracingAsyncScheduler):
    """vLLM's async scheduler + dsdprof's tracing mixin + live-acceptance K."""


def scheduler_class_for(scheduler_config) -> type:
    """The class :func:`make_scheduler` builds for vLLM's resolved scheduler config."""
    return class_for_config(scheduler_config, AdaptiveScheduler, AdaptiveAsyncScheduler)


def make_scheduler(*args, **kwargs):
    """``scheduler_cls`` for vLLM: the adaptive scheduler matching vLLM's own async choice."""
    return build_for_config(AdaptiveScheduler, AdaptiveAsyncScheduler, args, kwargs)
