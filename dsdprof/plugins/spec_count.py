"""A step's drafted/accepted counts when vLLM logs no stats (issue 34 part 4), in bulk.

With ``log_stats`` off vLLM builds no ``SpecDecodingStats``; the adaptive plugin needs them anyway,
by vLLM's rules in ``Scheduler.update_from_output``: a request with drafts scheduled
(``scheduled_spec_decode_tokens``) whose output has tokens counts one draft of ``len(drafts)`` minus
its grammar-invalidated drafts (``num_invalid_spec_tokens``), ``tokens - 1`` accepted
(``num_sampled_tokens_per_step`` = 1); vLLM's loop skips a request it no longer holds, a finished
one, a stale output it drops (``drop_stale_output``), a failed KV load. ``SpecDecodingStats`` only
needs how many drafts had each length and how many accepted each count (the per-position counts
are their tails), so ``hist`` holds those two histograms: ``hist[d]`` drafts of ``d`` tokens, then
``hist[K + 1 + a]`` drafts with ``a`` accepted.

:meth:`SpecCount.count` counts a step before vLLM's loop with a few C-level passes (``map(len,
...)``, ``list.count`` per length) instead of a Python call per request. Which requests vLLM's loop
skips is known from the rare events that cause it, not from a pass over the step's requests:
vLLM's ``_free_blocks`` (the one place a request leaves ``requests``: finished, aborted) records a
request whose tokens are still in flight (``num_in_flight_tokens``, until the steps holding them
are counted), ``_preempt_request`` and ``_handle_stopped_request`` one whose in-flight output vLLM
will drop. At a step only those requests are checked, by vLLM's own test, and taken back. A step
anything else may apply to -- grammar-invalidated drafts, an empty or out-of-range draft or output,
requests missing from the output -- is counted in vLLM's loop instead, per request
(:meth:`SpecCount.per_request`), as is every step of an engine with a KV or EC connector (finished
requests held, failed loads) or whose vLLM lacks the names above. Both fill the same ``hist``.
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.spec_decode.metrics import SpecDecodingStats

logger = init_logger("vllm.dsdprof.adaptive")
_MISSING = object()
# names vLLM's update_from_output must use for the skip rules above to be the ones it applies
_LOOP_NAMES = frozenset({"requests", "is_finished", "num_stale_output_tokens", "drop_stale_output",
                         "num_in_flight_tokens", "make_spec_decoding_stats", "scheduled_spec_decode_tokens"})
_HOOKS = ("_free_blocks", "_preempt_request", "_handle_stopped_request")


def _vllm_update(sched: Any):
    """vLLM's own ``update_from_output`` (the first class of vLLM's that defines it), or None."""
    for cls in type(sched).__mro__:
        if cls.__module__.startswith("vllm.") and "update_from_output" in vars(cls):
            return vars(cls)["update_from_output"]
    return None


class SpecCount:
    """Counts a scheduler's drafted steps into ``hist`` (``2 * (K+1)`` cells); see the module docstring."""

    def __init__(self, sched: Any, hist: list[int]) -> None:
        self.sched = sched
        self.hist = hist
        self.k = sched.num_spec_tokens
        self.width = self.k + 1
        self.tokens = tuple(range(1, self.width + 1))  # an output's tokens: 1 .. K + 1
        self.touched: dict[str, int] = {}  # request -> tokens in flight when freed, or -1: dropped output
        self.limit = 16 * getattr(sched, "max_num_running_reqs", 256) + 64  # beyond: pruning broke
        self.per_request_steps = 0  # drafted steps counted in vLLM's loop
        self.taken_back = 0  # requests counted in bulk that vLLM's loop skips
        self.shared = isinstance(sched, AsyncScheduler)  # drafts scheduled: one placeholder list
        self.bulk = self._hook()

    def _hook(self) -> bool:
        """Install the event hooks on the instance; False (count per request) where the rules may differ."""
        s = self.sched
        update = _vllm_update(s)
        code = getattr(update, "__code__", None)
        if (getattr(s, "connector", None) is not None or getattr(s, "ec_connector", None) is not None
                or getattr(s, "num_sampled_tokens_per_step", 1) != 1 or code is None
                or not _LOOP_NAMES <= set(code.co_names)
                or not all(callable(getattr(s, n, None)) for n in _HOOKS)):
            return False
        touched = self.touched
        free, preempt, stopped = (getattr(s, n) for n in _HOOKS)

        def _free_blocks(request):  # vLLM's only removal from requests
            left = request.num_in_flight_tokens
            if left > 0:
                touched[request.request_id] = left
            else:
                touched.pop(request.request_id, None)
            return free(request)

        def _preempt_request(request, *args, **kwargs):
            out = preempt(request, *args, **kwargs)
            if request.num_stale_output_tokens > 0 and request.drop_stale_output:
                touched.setdefault(request.request_id, -1)
            return out

        def _handle_stopped_request(request):
            out = stopped(request)
            if request.num_stale_output_tokens > 0 and request.drop_stale_output:
                touched.setdefault(request.request_id, -1)
            return out

        s._free_blocks, s._preempt_request, s._handle_stopped_request = (
            _free_blocks, _preempt_request, _handle_stopped_request)
        return True

    def count(self, so: Any, mro: Any) -> bool:
        """Count step ``so`` (its output ``mro``) into ``hist`` now, before vLLM's
        ``update_from_output``; False (nothing counted) when vLLM's loop must count it."""
        spec = so.scheduled_spec_decode_tokens
        skipped = self._skipped(spec, so.num_scheduled_tokens) if self.touched else ()  # every step
        if not spec:
            return True
        if not self.bulk or so.num_invalid_spec_tokens:
            return False
        n, sampled = len(spec), mro.sampled_token_ids
        try:  # lengths as bytes: one C pass each, then a memchr-speed count per length
            if n == len(sampled) == len(so.num_scheduled_tokens):  # every request drafted: all rows
                lens = bytes(map(len, sampled))
            else:
                lens = bytes(map(len, map(sampled.__getitem__, map(mro.req_id_to_index.__getitem__, spec))))
            drafts = None
            if self.shared:  # async: every request's drafts the scheduler's one placeholder list
                vals = list(spec.values())
                first = len(vals[0])
                if vals.count(vals[0]) != n:  # an identity pass: the same object
                    drafts = bytes(map(len, vals))
            else:
                drafts = bytes(map(len, spec.values()))
                first = drafts[0]
        except (KeyError, IndexError, TypeError, ValueError):  # ValueError: a length beyond 255
            return False
        width = self.width
        if 0 < first < width and (drafts is None or drafts.count(first) == n):  # one draft length
            by_d = [0] * width
            by_d[first] = n
        elif drafts is None:
            return False
        else:
            by_d = [0, *map(drafts.count, self.tokens[:-1])]
        by_a = list(map(lens.count, self.tokens))  # t tokens: t - 1 accepted
        if sum(by_d) != n or sum(by_a) != n:  # an empty or out-of-range draft or output
            return False
        for req_id in skipped:  # counted above, skipped by vLLM's loop: taken back
            self.taken_back += 1
            by_d[len(spec[req_id])] -= 1
            by_a[len(sampled[mro.req_id_to_index[req_id]]) - 1] -= 1
        hist = self.hist
        for d, c in enumerate(by_d):
            if c:
                hist[d] += c
        for a, c in enumerate(by_a, width):
            if c:
                hist[a] += c
        return True

    def _skipped(self, spec: dict, scheduled: dict) -> list[str]:
        """The recorded requests vLLM's loop will skip in this step (its own test, on their state
        now); prunes those no later step can skip (called at every step while any is recorded)."""
        requests, touched, out = self.sched.requests, self.touched, []
        for req_id, left in list(touched.items()):
            req = requests.get(req_id)
            dropped = req is not None and req.num_stale_output_tokens > 0 and req.drop_stale_output
            if req_id in spec and (req is None or req.is_finished() or dropped):
                out.append(req_id)
            if left >= 0:  # freed: its tokens still in flight are in this step or later ones
                left -= scheduled.get(req_id, 0)
                if left > 0:
                    touched[req_id] = left
                else:
                    del touched[req_id]
            elif not dropped:  # vLLM drained the dropped output (a new drop records it again)
                del touched[req_id]
        if len(touched) > self.limit:
            logger.warning("dsdprof adaptive K: %d requests tracked for the bulk count; counting per "
                           "request from now on", len(touched))
            self.unhook()
        return out

    def unhook(self) -> None:
        """Count per request from now on: vLLM's own methods back, nothing tracked."""
        self.bulk = False
        for name in _HOOKS:
            self.sched.__dict__.pop(name, None)
        self.touched.clear()

    def counter(self):
        """``make_spec_decoding_stats`` counting one request (vLLM calls it once per drafted
        request): vLLM's rules (no draft: not counted; grammar-invalidated drafts excluded) into
        ``hist``; out of vLLM's own bounds: not counted, never raised."""
        hist, k, width = self.hist, self.k, self.width

        def count(spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                  request_id):
            if num_draft_tokens:
                if num_invalid_spec_tokens:
                    num_draft_tokens -= num_invalid_spec_tokens.get(request_id, 0)
                if 0 <= num_draft_tokens <= k and 0 <= num_accepted_tokens <= k:
                    hist[num_draft_tokens] += 1
                    hist[width + num_accepted_tokens] += 1
            return spec_decoding_stats

        return count

    def per_request(self, update, so: Any, mro: Any):
        """vLLM's ``update`` with :meth:`counter` as the scheduler's ``make_spec_decoding_stats``
        for this one call (whatever the instance held before is put back)."""
        if so.scheduled_spec_decode_tokens:
            self.per_request_steps += 1
        d = self.sched.__dict__
        before = d.get("make_spec_decoding_stats", _MISSING)
        d["make_spec_decoding_stats"] = self.counter()
        try:
            return update(so, mro)
        finally:
            if before is _MISSING:
                del d["make_spec_decoding_stats"]
            else:
                d["make_spec_decoding_stats"] = before


def hist_stats(hist: list[int], k: int):
    """The ``SpecDecodingStats`` vLLM's ``observe_draft`` per request would have built from the
    drafts counted in ``hist`` (:class:`SpecCount`)."""
    width = k + 1
    by_d, by_a = hist[:width], hist[width:]
    stats = SpecDecodingStats.new(k)
    stats.num_drafts = sum(by_d)
    stats.num_draft_tokens = sum(d * n for d, n in enumerate(by_d))
    stats.num_accepted_tokens = sum(a * n for a, n in enumerate(by_a))
    acc = dr = 0
    for pos in range(k, 0, -1):  # position pos (1-based) counts every draft reaching it
        acc += by_a[pos]
        dr += by_d[pos]
        stats.num_accepted_tokens_per_pos[pos - 1] = acc
        stats.num_draft_tokens_per_pos[pos - 1] = dr
    return stats
