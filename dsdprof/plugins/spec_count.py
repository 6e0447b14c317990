"""A step's drafted/accepted counts in bulk, for an engine that logs no stats (issue 34 part 4).

With ``log_stats`` off vLLM builds no ``SpecDecodingStats``; the adaptive plugin then needs each
drafted request's (drafted, accepted) pair, by vLLM's rules in ``Scheduler.update_from_output``:

* counted: a request with drafts scheduled (``scheduled_spec_decode_tokens``) whose output has
  tokens (or ``num_sampled_tokens_per_step == 0``); drafted = its drafts minus the grammar-invalidated
  ones (``num_invalid_spec_tokens``), accepted = ``max(tokens - num_sampled_tokens_per_step, 0)``;
* skipped: a request no longer in ``requests`` or finished (aborted or stopped while the step ran),
  a failed KV load, a stale output vLLM drops (``drop_stale_output``, after a preemption).

:meth:`BulkCounter.count` counts the step before vLLM's loop, with C-level operations (``map``,
``collections.Counter`` over ``drafted * G + tokens``), then takes back the few requests that vLLM
skips for being gone (normally none). A step where anything else may apply -- a KV connector, a
KV output reporting failures, grammar-invalidated drafts, a stale or finished request still held
-- returns False and the caller counts it per request, in vLLM's loop, as before
(:meth:`BulkCounter.per_request`). Both fill the same ``hist[drafted * (K+1) + accepted]``.
"""

from __future__ import annotations

from collections import Counter
from itertools import filterfalse, repeat
from operator import add, attrgetter, mul
from typing import Any

_G = 1 << 20  # key = drafted * _G + tokens sampled (tokens < _G)
_stale = attrgetter("num_stale_output_tokens")
_status = attrgetter("status")
_MISSING = object()


class BulkCounter:
    """Counts a scheduler's steps into ``hist`` (``(K+1)^2`` cells); see the module docstring."""

    def __init__(self, sched: Any, hist: list[int]) -> None:
        self.sched = sched
        self.hist = hist
        self.width = sched.num_spec_tokens + 1
        self.sampled = getattr(sched, "num_sampled_tokens_per_step", 1)
        self.bulk = getattr(sched, "connector", None) is None  # a KV connector: per request, always
        self.per_request_steps = 0  # steps counted in vLLM's loop (drafts scheduled, bulk not safe)
        self.taken_back = 0  # requests counted in bulk, then taken back (vLLM skips them: gone)
        try:
            from vllm.v1.request import RequestStatus
            self.finished_above = int(RequestStatus.PREEMPTED)  # vLLM's is_finished: status > PREEMPTED
        except (ImportError, AttributeError):
            self.bulk = False

    def count(self, so: Any, mro: Any) -> bool:
        """Count step ``so`` (its output ``mro``) into ``hist`` now, before vLLM's
        ``update_from_output``; False (nothing counted) when the step must be counted per request."""
        spec = so.scheduled_spec_decode_tokens
        if not spec:
            return True
        if not self.bulk or so.num_invalid_spec_tokens:
            return False
        kvo = mro.kv_connector_output
        if kvo and (kvo.failed_recving or kvo.invalid_block_ids):
            return False
        requests = self.sched.requests
        gone = spec.keys() - requests.keys()
        try:
            held = list(map(requests.__getitem__, filterfalse(gone.__contains__, spec) if gone else spec))
            if held and (max(map(_stale, held)) > 0 or max(map(_status, held)) > self.finished_above):
                return False
            tokens = mro.sampled_token_ids
            at = mro.req_id_to_index.__getitem__
            lengths = map(len, map(tokens.__getitem__, map(at, spec))) if tokens else repeat(0)
            keys = Counter(map(add, map(mul, map(len, spec.values()), repeat(_G)), lengths))
            for req_id in gone:  # vLLM skips them: taken back
                self.taken_back += 1
                keys[len(spec[req_id]) * _G + (len(tokens[at(req_id)]) if tokens else 0)] -= 1
        except (KeyError, IndexError, AttributeError, TypeError):  # an output vLLM's loop must judge
            return False
        self._add(keys)
        return True

    def _add(self, keys: Counter) -> None:
        hist, width, sampled = self.hist, self.width, self.sampled
        for key, n in keys.items():
            drafted, got = divmod(key, _G)
            if not n or not drafted or (not got and sampled):
                continue
            i = drafted * width + (got - sampled if got > sampled else 0)
            if i < len(hist):  # out of vLLM's own bounds: not counted, never raised
                hist[i] += n

    def counter(self):
        """``make_spec_decoding_stats`` counting one request (vLLM calls it once per drafted
        request): vLLM's rules into ``hist``, no object built."""
        hist, width = self.hist, self.width

        def count(spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                  request_id):
            if num_draft_tokens:
                if num_invalid_spec_tokens:
                    num_draft_tokens -= num_invalid_spec_tokens.get(request_id, 0)
                i = num_draft_tokens * width + num_accepted_tokens
                if 0 <= i < len(hist):  # out of vLLM's own bounds: not counted, never raised
                    hist[i] += 1
            return spec_decoding_stats

        return count

    def per_request(self, update, so: Any, mro: Any):
        """vLLM's ``update`` with :meth:`counter` as the scheduler's ``make_spec_decoding_stats``
        for this one call (whatever the instance held before is put back)."""
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
