"""The profiling scheduler's trace records (:mod:`dsdprof.plugins.vllm_profiling`): what a step
traced, built in the step or, for a step kept by reference, when the engine is idle; and the
trace's flush. A mixin over vLLM's Scheduler, below :class:`~.vllm_profiling._DsdprofMixin`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from dsdprof.formats.trace import TraceRecord, encode_flush, step_record
from dsdprof.plugins.profiling_keys import Profiled

_LIVE = object()  # the model runner hands the same req_id_to_index every step: copied


class _StepRecords:
    """See the module docstring; state set by ``_DsdprofMixin._dsdprof_init``."""

    if TYPE_CHECKING:  # vLLM's Scheduler and the tracing mixin
        requests: Any
        _dsdprof_steps: dict[int, Any]
        _dsdprof_buffers: dict[str, list[TraceRecord]]
        _dsdprof_pending: list[tuple]
        _dsdprof_seen: dict[str, Any]
        _dsdprof_profiles: dict[str, Profiled]
        _dsdprof_fin: dict[str, int]
        _dsdprof_cut: dict[str, int]
        _dsdprof_index: Any
        _dsdprof_index_fresh: bool
        _dsdprof_trace_dir: str
        dsdprof_ignored: int

    def _dsdprof_step_info(self, scheduled: dict, new_ids, spec: dict, requests, profiles,
                           computed: dict | None, k_next: int, arm):
        """(trace, wave, [(req_id, decoding)], prefill tokens, others, k_next, arm) of a step, or None
        when it traced no request. From the step's SchedulerOutput: tokens scheduled per request,
        the new requests' ids, the drafts scheduled; ``computed``: the computed tokens before the step
        of the requests it continued (None: read from the requests, right after it was scheduled)."""
        if not scheduled:
            return None
        path, wave = "", 0
        reqs: list[tuple[str, bool]] = []  # (req_id, decoding)
        prefill_tokens = others = 0
        for req_id, n in scheduled.items():
            request = requests.get(req_id)
            if request is None:
                continue
            drafted = len(spec.get(req_id, ()))
            decoding = (req_id not in new_ids and n == 1 + drafted and (
                computed[req_id] if computed is not None else request.num_computed_tokens - n)
                >= request.num_prompt_tokens)
            if not decoding:
                prefill_tokens += n
            p = profiles.get(req_id)
            if p is None or not p.trace:
                others += 1
                continue
            if not path:
                path, wave = p.trace, p.wave
            elif p.trace != path or p.wave != wave:
                others += 1
                continue
            reqs.append((req_id, decoding))
        return (path, wave, reqs, prefill_tokens, others, k_next, arm) if path else None

    def _dsdprof_kept_info(self, so, arm):
        """:meth:`_dsdprof_step_info` of a step kept by reference (its ``SchedulerOutput``: tokens and
        drafts scheduled, new requests, the continued ones' computed tokens before it, k_next; vLLM
        builds every one of them per step), any time later; ``arm``: its arm, taken at its update."""
        cached = so.scheduled_cached_reqs
        return self._dsdprof_step_info(
            so.num_scheduled_tokens, {r.req_id for r in so.scheduled_new_reqs},
            so.scheduled_spec_decode_tokens, self._dsdprof_seen, self._dsdprof_profiles,
            dict(zip(cached.req_ids, cached.num_computed_tokens)),
            int(getattr(so, "num_spec_tokens_to_schedule", -1)), arm)

    def _dsdprof_build(self) -> None:
        """The kept steps' records, in order, as the per-step path records them: a request's output
        was stale when it was seen finished before the step's update; it was delivered what vLLM
        left of its sampled tokens (trimmed in place at a stop); it finished in the step when seen
        finished right after it."""
        pending, self._dsdprof_pending = self._dsdprof_pending, []
        fin, per_step = self._dsdprof_fin, getattr(self, "num_sampled_tokens_per_step", 1)
        for so, arm, u, index, lens, invalid, trimmed, t_end, t_own in pending:
            info = self._dsdprof_kept_info(so, arm)
            if info is None:
                continue
            spec, invalid, trimmed = so.scheduled_spec_decode_tokens, invalid or {}, trimmed or {}
            rows = []
            for req_id, decoding in info[2]:
                seen = fin.get(req_id, 2 * u + 1)
                i = index.get(req_id)
                g = lens[i] if (lens and i is not None) else 0
                d = len(spec.get(req_id, ()))
                a = max(g - per_step, 0) if d and (g or per_step == 0) else 0
                d = d - invalid.get(req_id, 0) if d else 0
                got = trimmed.get(req_id, g)
                rows.append((req_id, decoding, seen < 2 * u, got, d, a, g, seen <= 2 * u))
            self._dsdprof_append(info, rows, t_end, t_own)

    def _dsdprof_uncut(self, lens: list[int] | None, index: dict[str, int]) -> dict[str, int]:
        """Put back into ``lens`` (sampled counts read after vLLM's update) the tokens vLLM cut from
        the lists of the requests it stopped in it (``del new_token_ids[num_new:]``, in place, before
        :meth:`_handle_stopped_request`); returns what it left them (delivered). From the async
        scheduler's output placeholders (tokens scheduled, not yet delivered: ``num_sampled_tokens_per_step``
        plus the drafts per step scheduled): at the stop they are what this step sampled beyond
        the cut plus the steps scheduled since, still kept in ``_dsdprof_steps``. O(stops)."""
        cut, self._dsdprof_cut = self._dsdprof_cut, {}
        per_step, left = getattr(self, "num_sampled_tokens_per_step", 1), {}
        for req_id, placeholders in cut.items():
            i = index.get(req_id)
            if lens is None or i is None:
                continue
            later = sum(per_step + len(k.scheduled_spec_decode_tokens.get(req_id, ()))
                        for k in self._dsdprof_steps.values()
                        if type(k) is not tuple and req_id in k.num_scheduled_tokens)
            left[req_id] = n = lens[i]
            lens[i] = n + placeholders - later
        return left

    def _dsdprof_fresh(self, index: dict) -> dict:
        """A copy of a kept step's ``req_id_to_index`` until two kept steps showed two dict objects:
        then the runner builds one per step (vLLM 0.32's and 0.33's V1 and V2 runners do; so does a copy
        across processes) and later steps keep it by reference. The same object twice: copied for good."""
        first = self._dsdprof_index
        if first is None:
            self._dsdprof_index = index
        elif first is index:
            self._dsdprof_index = _LIVE
        elif first is not _LIVE:
            self._dsdprof_index, self._dsdprof_index_fresh = None, True
        return dict(index)

    @staticmethod
    def _dsdprof_kv_failed(mro) -> bool:
        """A failed KV load: vLLM skips the affected outputs (build the step's record in it)."""
        kv = getattr(mro, "kv_connector_output", None)
        return kv is not None and bool(getattr(kv, "failed_recving", None)
                                       or getattr(kv, "invalid_block_ids", None))

    def _dsdprof_before(self, info, so, mro) -> list[tuple]:
        """Per traced request, before vLLM processes the output (and trims it in place):
        (id, request, decoding, stale, output tokens so far, drafted, accepted, sampled)."""
        sampled = mro.sampled_token_ids
        index = mro.req_id_to_index
        spec = so.scheduled_spec_decode_tokens
        invalid = so.num_invalid_spec_tokens or {}
        per_step = getattr(self, "num_sampled_tokens_per_step", 1)
        rows = []
        for req_id, decoding in info[2]:
            request = self.requests.get(req_id)
            stale = request is None or request.is_finished() or bool(
                getattr(request, "num_stale_output_tokens", 0)
                and getattr(request, "drop_stale_output", False))
            i = index.get(req_id)
            g = len(sampled[i]) if (sampled and i is not None) else 0
            d = len(spec.get(req_id, ()))
            a = max(g - per_step, 0) if d and (g or per_step == 0) else 0
            d = d - invalid.get(req_id, 0) if d else 0
            done = 0 if stale else request.num_output_tokens
            rows.append((req_id, request, decoding, stale, done, d, a, g))
        return rows

    def _dsdprof_record_output(self, info, before, t_end: float, t_own: float) -> None:
        self._dsdprof_append(info, [(req_id, decoding, stale, 0 if stale else request.num_output_tokens - n,
                                     d, a, g, not stale and request.is_finished())
                                    for req_id, request, decoding, stale, n, d, a, g in before], t_end, t_own)

    def _dsdprof_append(self, info, rows, t_end: float, t_own: float) -> None:
        """Buffer a step's record; ``rows``: (req_id, decoding, stale, delivered, drafted, accepted,
        sampled, finished) per traced request."""
        path, wave, reqs, prefill_tokens, others, k_next, arm = info
        ids, drafted, accepted, generated, finished, delivered = [], [], [], [], [], {}
        stale_n = 0
        for req_id, decoding, stale, got, d, a, g, done in rows:
            if stale:
                stale_n += 1
                continue
            delivered[req_id] = got
            if decoding:
                ids.append(req_id)
                drafted.append(d)
                accepted.append(a)
                generated.append(g)
                finished.append(done)
        if not delivered:  # every output of the step was stale (async: the wave already finished)
            return
        self._dsdprof_buffers.setdefault(path, []).append(step_record(
            wave=wave, t_end=t_end, t_own=t_own, scheduled=len(reqs), decoding=len(ids),
            prefill_tokens=prefill_tokens, others=others, stale=stale_n, ids=ids, drafted=drafted,
            accepted=accepted, generated=generated, delivered=delivered, finished=finished, k_next=k_next,
            arm=arm))

    def _dsdprof_flush(self) -> None:
        trace_dir = self._dsdprof_trace_dir
        for path, records in self._dsdprof_buffers.items():
            if not trace_dir or os.path.dirname(path) != trace_dir:
                continue  # never outside the run's trace directory
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(path, flags, 0o644)
                with os.fdopen(fd, "a") as fh:
                    fh.write(encode_flush(records))
            except OSError:
                self.dsdprof_ignored += 1  # a trace that cannot be written fails its cell, not the engine
        self._dsdprof_buffers = {}
