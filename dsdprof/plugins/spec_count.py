"""A step's drafted/accepted counts when vLLM logs no stats (issue 34 part 4).

With ``log_stats`` off vLLM builds no ``SpecDecodingStats``; the adaptive plugin needs them anyway.
vLLM's ``update_from_output`` still calls the scheduler's ``make_spec_decoding_stats`` once per
request it counts, by its own rules (drafts scheduled and tokens out; aborted, finished, dropped
stale outputs and failed KV loads skipped), with that request's drafted and accepted counts; its
own method then returns at once. :meth:`SpecCount.counter`, installed on the instance in its place,
appends one small integer per call to ``keys`` (the (drafted, accepted) pair's index, from a
table: no arithmetic, no object built) -- about what vLLM's own call costs; a step is the slice of
``keys`` it appended. When the plugin feeds its queued steps to the selector (every
``rebuild_every`` steps, in a warm loop), :meth:`SpecCount.hist` turns each step's slice into two
histograms with C-level passes (``bytes``, ``bytes.translate``, a memchr-speed ``count`` per
value): drafts of ``d`` tokens, drafts with ``a`` accepted -- all ``SpecDecodingStats`` needs (its
per-position counts are their tails; :func:`hist_stats`). Which requests count is vLLM's loop's
own decision, so the counts are vLLM's whatever it skips.

A call with grammar-invalidated drafts (``num_invalid_spec_tokens``), or an engine with K > 15
(the pair's index would not fit a byte), takes :meth:`SpecCount.per_request`: the same rules in
Python -- no draft, not counted; invalidated drafts excluded (a draft left with 0 tokens still
counts, as in vLLM); out of vLLM's own bounds (drafted or accepted beyond K), not counted, never
raised.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.spec_decode.metrics import SpecDecodingStats


class SpecCount:
    """Counts a scheduler's drafts as indices in ``keys``; see the module docstring."""

    def __init__(self, sched: Any) -> None:
        self.k = k = sched.num_spec_tokens
        self.width = w = k + 1
        self.keys: list[int] = []  # the counted requests' (drafted, accepted) indices d * (K+1) + a
        # drafted 0 is no draft (an empty row: not counted) unless invalidated drafts made it 0 (key0)
        self.key0 = [[d * w + a for a in range(w)] for d in range(w)]
        self.key = [[], *self.key0[1:]]
        self.to_d = bytes(min(i // w, 255) for i in range(256))  # index -> drafted (bytes.translate)
        self.to_a = bytes(i % w for i in range(256))  # index -> accepted
        self.values = tuple(range(w))
        self.counter = self._counter() if w * w <= 256 else self.per_request

    def _counter(self):
        """``make_spec_decoding_stats`` for the instance: one append per counted request."""
        append, key, per_request = self.keys.append, self.key, self.per_request

        def count(spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                  request_id):
            if num_invalid_spec_tokens:
                return per_request(spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                   num_invalid_spec_tokens, request_id)
            try:
                append(key[num_draft_tokens][num_accepted_tokens])
            except IndexError:  # no draft, or out of vLLM's own bounds: not counted, never raised
                pass
            return spec_decoding_stats

        return count

    def per_request(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                    request_id):
        """One request by vLLM's rules, invalidated drafts subtracted (see the module docstring)."""
        if num_draft_tokens:
            if num_invalid_spec_tokens:
                num_draft_tokens -= num_invalid_spec_tokens.get(request_id, 0)
            if 0 <= num_draft_tokens <= self.k and 0 <= num_accepted_tokens <= self.k:
                self.keys.append(self.key0[num_draft_tokens][num_accepted_tokens])
        return spec_decoding_stats

    def hist(self, start: int, end: int) -> list[int]:
        """``keys[start:end]`` (a step's) as the histograms ``[drafts of d tokens for d in 0..K,
        drafts with a accepted for a in 0..K]``: C-level passes, no loop over the requests."""
        w = self.width
        if w * w > 256:
            by_d, by_a = [0] * w, [0] * w
            for i in self.keys[start:end]:
                by_d[i // w] += 1
                by_a[i % w] += 1
            return by_d + by_a
        b = bytes(self.keys[start:end])
        drafted, accepted = b.translate(self.to_d), b.translate(self.to_a)
        return [*map(drafted.count, self.values), *map(accepted.count, self.values)]

    def stats(self, start: int, end: int):
        """``keys[start:end]`` as vLLM's ``SpecDecodingStats``."""
        return hist_stats(self.hist(start, end), self.k)


def hist_stats(hist: list[int], k: int):
    """The ``SpecDecodingStats`` vLLM's ``observe_draft`` per request would have built from the
    drafts counted in ``hist`` (:meth:`SpecCount.hist`)."""
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
