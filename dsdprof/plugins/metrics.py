"""dsdprof's Prometheus metrics, from inside vLLM's engine core, on vLLM's own ``/metrics``.

:class:`StepMetrics` is a part that dsdprof's serving scheduler
(:class:`dsdprof.plugins.serving.ServingScheduler`: the static schedule,
:mod:`dsdprof.plugins.vllm_static`, and the adaptive plugin, :mod:`dsdprof.plugins.vllm_adaptive`)
holds and calls from its vLLM methods (:class:`dsdprof.plugins.serving.MetricsPart`). The metrics
reach the API server's ``/metrics`` through
prometheus_client's **multiprocess mode**, the mechanism vLLM itself uses for ``--api-server-count
> 1``: when ``PROMETHEUS_MULTIPROC_DIR`` is set before the server starts (``dsdprof serve`` sets a
fresh directory), vLLM's ``/metrics`` serves a ``MultiProcessCollector`` over that directory, and
the metrics the engine-core process writes there appear beside vLLM's. Without it, the engine core
serves them on a side port when ``DSDPROF_METRICS_PORT`` is set, else logs once how to see them.
``DSDPROF_METRICS=0`` or ``additional_config={"dsdprof_metrics": false}`` turns them off (the
scheduler then holds no metrics part: no own code per step but its test of ``None``).
docs/observability.md lists every metric.

**Hot path**: per step an increment of a list slot (steps by batch-size bucket and K), an append
of vLLM's ``SpecDecodingStats`` of the step (summed and checked for over-verified positions at the
flush; without it the first and last request's tokens against the drafts scheduled for them), the
lengths of the first and last draft the engine hands back against the K of the step that drafted
them (sync scheduling, and async with structured outputs) -- the silent no-op alarm, O(1) -- and
a clock read. Every ``FLUSH_S`` (5) seconds -- and when no request is left running, so an idle
engine's ``/metrics`` is complete -- :meth:`StepMetrics.flush` pushes the deltas into
prometheus_client and sets the gauges (the adaptive selector's ratios:
:mod:`dsdprof.serve.observe`). Cost per step: ``benchmarks/bench_scheduler_overhead.py``
(serving vs serving+m).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from vllm.logger import init_logger

from dsdprof.serve.observe import selector_rows, shift_alarms

if TYPE_CHECKING:  # vLLM's types are Any to the type checker, which does not follow vLLM (pyproject.toml)
    from prometheus_client import Counter, Gauge
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from dsdprof.serve.adaptive import AdaptiveKSelector

logger = init_logger("vllm.dsdprof.metrics")
_clock = time.perf_counter

FLUSH_S = 5.0  # counters reach /metrics within this while the engine runs (at once when it idles)
METRICS_ENV = "DSDPROF_METRICS"  # "0": off
PORT_ENV = "DSDPROF_METRICS_PORT"  # a side port when vLLM's /metrics is not multiprocess
CONFIG_KEY = "dsdprof_metrics"  # additional_config: false turns the metrics off
LABELS = ("model_name", "engine")  # vLLM's own labels on every metric
ALWAYS_DRAFT = {"draft_model", "eagle", "eagle3", "mtp", "medusa", "mlp_speculator"}  # never a short draft

COUNTERS = {  # name (prometheus_client appends _total) -> (extra labels, help)
    "dsdprof:steps": (("batch_size_bucket", "num_speculative_tokens"),
                      "Engine steps by requests scheduled (bucket) and K scheduled (0: no drafts)."),
    "dsdprof:spec_decode_num_drafts": ((), "Drafts verified (vLLM's SpecDecodingStats, engine side)."),
    "dsdprof:spec_decode_num_draft_tokens": ((), "Draft tokens verified."),
    "dsdprof:spec_decode_num_accepted_tokens": ((), "Draft tokens accepted."),
    "dsdprof:spec_decode_num_draft_tokens_per_pos": (("position",), "Draft tokens verified per position."),
    "dsdprof:spec_decode_num_accepted_tokens_per_pos": (("position",), "Draft tokens accepted per position."),
    "dsdprof:k_switches": ((), "Times the adaptive plugin changed the K schedule it serves."),
    "dsdprof:shift_alarms": ((), "Acceptance shifts the adaptive plugin detected (CUSUM resets)."),
    "dsdprof:silent_noop_steps": ((), "Steps whose drafts did not match the K scheduled "
                                  "(K not reaching the drafter)."),
    "dsdprof:ignored_requests": ((), "Requests whose dsdprof_* extra_args keys the engine ignored."),
}
GAUGES = {
    "dsdprof:info": (("mode", "table"), "1; the schedule dsdprof serves (mode: static or adaptive)."),
    "dsdprof:num_speculative_tokens": (("batch_size_bucket",),
                                       "K the schedule serves now at the bucket's top."),
    "dsdprof:table_num_speculative_tokens": (("batch_size_bucket",), "K the table gave at the bucket's top."),
    "dsdprof:acceptance_length_ratio": (("batch_size", "bound"),
                                        "Live / table acceptance length at the K served."),
    "dsdprof:step_time_ratio": (("batch_size", "bound"), "Live / table step time at the K served."),
}
BOUNDS = ("estimate", "lower", "upper")  # 95 % interval


def buckets(max_bs: int) -> list[tuple[int, int]]:
    """Power-of-two batch-size buckets up to ``max_bs``: (1, 1), (2, 2), (3, 4), (5, 8), ..."""
    out, lo, hi = [], 1, 1
    while lo <= max_bs:
        out.append((lo, min(hi, max_bs)))
        lo, hi = hi + 1, hi * 2
    return out


def bucket_label(lo: int, hi: int) -> str:
    return str(hi) if lo == hi else f"{lo}-{hi}"


class KSource(Protocol):
    """What the metrics read of the part that chooses K (the adaptive plugin's
    :class:`~dsdprof.plugins.vllm_adaptive.AdaptiveK`): the schedule it serves unforced, a version
    that moves when it changes, and its selectors (the batch-size one first, then one per context
    slice)."""

    version: int

    @property
    def lookup(self) -> list[int]: ...

    def selectors(self) -> list[AdaptiveKSelector]: ...


def enabled(additional_config: object, environ: Mapping[str, str]) -> bool:
    cfg = (additional_config or {}).get(CONFIG_KEY, True) if isinstance(additional_config, dict) else True
    return cfg is not False and environ.get(METRICS_ENV, "1") != "0"


class StepMetrics:
    """The counters one scheduler keeps (plain lists and ints) and their Prometheus twins."""

    def __init__(self, sched: Scheduler, k: KSource | None, mode: str, table: str,
                 environ: Mapping[str, str]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        cfg = sched.vllm_config
        self.kpart = k  # None: vLLM's (static) schedule
        self.k_version = k.version if k is not None else 0  # the K part's version at the last step
        self.max_k = max_k = sched.num_spec_tokens
        self.max_bs = max_bs = cfg.scheduler_config.max_num_seqs
        self.width = max_k + 1
        self.buckets = buckets(max_bs)
        self.bucket_of = [0] * (max_bs + 1)  # requests -> bucket index * width
        for i, (lo, hi) in enumerate(self.buckets):
            for n in range(lo, hi + 1):
                self.bucket_of[n] = i * self.width
        self.steps = [0] * (len(self.buckets) * self.width)
        self.spec = [0, 0, 0]  # drafts, draft tokens, accepted tokens
        self.pending: list[SpecDecodingStats] = []  # the steps' (vLLM's) since the last flush
        self.drafted_pos, self.accepted_pos = [0] * max_k, [0] * max_k
        self.alarms = [0, 0, 0, 0]  # k_switches, shift_alarms, silent_noop_steps, ignored_requests
        self.k = 0  # the K scheduled by the step whose drafts come back next (silent no-op alarm)
        self.sampled = getattr(sched, "num_sampled_tokens_per_step", 1)  # tokens a step adds beyond drafts
        self.log_stats = bool(getattr(sched, "log_stats", False))  # vLLM builds SpecDecodingStats
        spec = cfg.speculative_config
        self.exact = spec is not None and spec.method in ALWAYS_DRAFT
        self.next_flush = 0.0
        self.failed = 0  # flushes that raised
        self.registry = CollectorRegistry()  # exposition without multiprocess mode (side port, tests)
        lv = (str(cfg.model_config.served_model_name), str(cfg.parallel_config.data_parallel_rank))
        make: dict[str, Counter] = {n: Counter(n, h, LABELS + extra, registry=self.registry)
                                    for n, (extra, h) in COUNTERS.items()}
        gauges: dict[str, Gauge] = {
            n: Gauge(n, h, LABELS + extra, registry=self.registry, multiprocess_mode="mostrecent")
            for n, (extra, h) in GAUGES.items()}
        self.gauges = gauges
        self.labels = lv
        steps = make["dsdprof:steps"]
        self._k_now = [gauges["dsdprof:num_speculative_tokens"].labels(*lv, bucket_label(lo, hi))
                       for lo, hi in self.buckets]
        self._ratio: dict[tuple[str, int, str], Gauge] = {}  # (metric, batch size, bound) -> its gauge child
        self._k_sent: list[int] = []
        self._steps = [steps.labels(*lv, bucket_label(lo, hi), str(k)) for lo, hi in self.buckets
                       for k in range(self.width)]
        self._spec = [make[n].labels(*lv) for n in ("dsdprof:spec_decode_num_drafts",
                      "dsdprof:spec_decode_num_draft_tokens", "dsdprof:spec_decode_num_accepted_tokens")]
        self._pos = [[make[n].labels(*lv, str(p)) for p in range(max_k)] for n in (
            "dsdprof:spec_decode_num_draft_tokens_per_pos",
            "dsdprof:spec_decode_num_accepted_tokens_per_pos")]
        self._alarms = [make[n].labels(*lv) for n in (
            "dsdprof:k_switches", "dsdprof:shift_alarms", "dsdprof:silent_noop_steps",
            "dsdprof:ignored_requests")]
        self._sent: dict[str, list[int]] = {}
        gauges["dsdprof:info"].labels(*lv, mode, table).set(1)
        self._table_ks = self._schedule(sched)
        gauge = gauges["dsdprof:table_num_speculative_tokens"]
        for (lo, hi), top_k in zip(self.buckets, self._table_ks):
            gauge.labels(*lv, bucket_label(lo, hi)).set(top_k)
        self._expose(environ)

    def _expose(self, environ: Mapping[str, str]) -> None:
        if environ.get("PROMETHEUS_MULTIPROC_DIR"):
            logger.info("dsdprof metrics: on vLLM's /metrics (PROMETHEUS_MULTIPROC_DIR)")
            return
        port = environ.get(PORT_ENV)
        if port:
            from prometheus_client import start_http_server

            start_http_server(int(port), registry=self.registry)
            logger.info("dsdprof metrics: on the side port %s (/metrics)", port)
            return
        logger.warning("dsdprof metrics: not exposed: start the server with PROMETHEUS_MULTIPROC_DIR "
                       "set (dsdprof serve does) or set %s", PORT_ENV)

    def _schedule(self, sched: Scheduler) -> list[int]:
        """K at each bucket's top from the lookup served now (the K part's, unforced; else vLLM's)."""
        lookup = self.kpart.lookup if self.kpart is not None else sched.dynamic_sd_lookup
        if lookup is None:
            return [self.max_k] * len(self.buckets)
        raw = list(lookup)  # a context lookup's list view (its __getitem__ reads the batch)
        return [raw[min(hi, len(raw) - 1)] for _, hi in self.buckets]

    def _push(self, key: str, values: list[int], children: list[Counter]) -> None:
        sent = self._sent.setdefault(key, [0] * len(values))
        for i, v in enumerate(values):
            if v != sent[i]:
                children[i].inc(v - sent[i])
                sent[i] = v

    def flush(self, sched: Scheduler, now: float) -> None:
        """Push every delta and set every gauge; called about every ``FLUSH_S`` seconds. Never
        raises: metrics must not stop the engine (a failure is logged once; the next flush
        retries)."""
        self.next_flush = now + FLUSH_S
        try:
            self._flush(sched)
        except Exception:  # noqa: BLE001 - whatever the selector or prometheus_client raise
            if not self.failed:
                logger.exception("dsdprof metrics: flush failed (the engine goes on)")
            self.failed += 1

    def _flush(self, sched: Scheduler) -> None:
        pending, self.pending = self.pending, []
        for sd in pending:
            self.add_spec(sd)
        sel = None
        if self.kpart is not None:
            try:
                selectors = self.kpart.selectors()
                self.alarms[1] = sum(shift_alarms(s) for s in selectors)
                sel = selectors[0]
            except (AttributeError, TypeError, ValueError, IndexError):  # not a selector: no ratios either
                sel = None
        self._push("steps", self.steps, self._steps)
        self._push("spec", self.spec, self._spec)
        self._push("drafted", self.drafted_pos, self._pos[0])
        self._push("accepted", self.accepted_pos, self._pos[1])
        self._push("alarms", self.alarms, self._alarms)
        ks = self._schedule(sched)
        if ks != self._k_sent:  # a gauge write only when the schedule moved
            self._k_sent = ks
            for child, k in zip(self._k_now, ks):
                child.set(k)
        if sel is not None:
            for row in selector_rows(sel):
                for bound, a, s in zip(BOUNDS, row[3:6], row[6:9]):
                    self._gauge("dsdprof:acceptance_length_ratio", row.batch_size, bound).set(a)
                    self._gauge("dsdprof:step_time_ratio", row.batch_size, bound).set(s)

    def _gauge(self, name: str, batch_size: int, bound: str) -> Gauge:
        key = (name, batch_size, bound)
        child = self._ratio.get(key)
        if child is None:
            child = self._ratio[key] = self.gauges[name].labels(*self.labels, str(batch_size), bound)
        return child

    def add_spec(self, sd: SpecDecodingStats) -> None:
        """One step's ``SpecDecodingStats`` (O(K)), at the flush."""
        spec = self.spec
        spec[0] += sd.num_drafts
        spec[1] += sd.num_draft_tokens
        spec[2] += sd.num_accepted_tokens
        dp, ap = self.drafted_pos, self.accepted_pos
        drafted, accepted = sd.num_draft_tokens_per_pos, sd.num_accepted_tokens_per_pos
        for i, x in enumerate(drafted[:self.max_k]):
            dp[i] += x
        for i, x in enumerate(accepted[:self.max_k]):
            ap[i] += x
        if sd.num_accepted_tokens > sd.num_draft_tokens or any(a > d for a, d in zip(accepted, drafted)):
            self.alarms[2] += 1  # a position accepted more drafts than were scheduled there

    def check_drafts(self, ids: list[list[int]]) -> None:
        """The drafts the engine hands back for the step whose output was just processed, against
        the K that step scheduled (``k``): a first or last draft longer than K, or both empty while
        K > 0 for a drafter that always drafts K (``exact``), is a silent no-op step. O(1): a
        drafter that ignores K drafts the same wrong length for every request."""
        if ids:
            a, b = len(ids[0]), len(ids[-1])
            longest = a if a > b else b
            if longest != self.k and (longest > self.k or self.exact):
                self.alarms[2] += 1

    # ------------------------------------------------------------------ the scheduler's calls, per step
    def before_update(self, scheduler_output: SchedulerOutput,
                      model_runner_output: ModelRunnerOutput) -> bool:
        """Before vLLM's ``update_from_output`` (which trims a stopped request's tokens): whether the
        step's first or last request got more tokens than the drafts scheduled for it in this very
        step + vLLM's ``num_sampled_tokens_per_step`` -- the runner verified drafts never scheduled
        (O(1)). Read for steps without vLLM's ``SpecDecodingStats`` (log_stats off, or no draft
        scheduled); with them the flush checks it exactly."""
        spec = scheduler_output.scheduled_spec_decode_tokens
        if self.log_stats and spec:
            return False
        tokens = model_runner_output.sampled_token_ids
        if not tokens:
            return False
        ids, top = model_runner_output.req_ids, self.sampled
        return (len(tokens[0]) > len(spec.get(ids[0], ())) + top
                or len(tokens[-1]) > len(spec.get(ids[-1], ())) + top)

    def after_update(self, sched: Scheduler, scheduler_output: SchedulerOutput,
                     result: dict[int, EngineCoreOutputs], over: bool) -> None:
        """After vLLM's update (and the K part's): count the step by batch-size bucket and K, queue
        vLLM's ``SpecDecodingStats`` of the step for the flush (else count ``over``), count a K
        switch, and flush every ``FLUSH_S`` seconds or when no request is left running."""
        n = len(scheduler_output.num_scheduled_tokens)
        k = self.k = scheduler_output.num_spec_tokens_to_schedule  # K of the drafts handed back next
        if n:
            try:
                self.steps[self.bucket_of[n if n <= self.max_bs else self.max_bs] + k] += 1
            except (IndexError, TypeError):  # a K beyond the engine's: not counted, never raised
                pass
            sd = None
            for eco in result.values() if result else ():
                stats = eco.scheduler_stats
                if stats is not None:
                    sd = stats.spec_decoding_stats
                    break
            if sd is not None:  # over-verified positions checked at the flush (exact, off the hot path)
                self.pending.append(sd)
            elif over:
                self.alarms[2] += 1
        kpart = self.kpart
        if kpart is not None and kpart.version != self.k_version:
            self.k_version = kpart.version
            self.alarms[0] += 1
        now = _clock()
        if now >= self.next_flush or not sched.running:
            self.flush(sched, now)

    def count_request(self, request: Request, profiled: Mapping[str, object]) -> None:
        """A request added carrying ``dsdprof_*`` extra_args keys the engine did not act on (not
        one of a dsdprof run's ``profiled`` requests) is counted as ignored."""
        params = request.sampling_params
        extra = params.extra_args if params is not None else None
        if extra and type(extra) is dict and any(type(k) is str and k.startswith("dsdprof_") for k in extra):
            if request.request_id not in profiled:
                self.alarms[3] += 1
