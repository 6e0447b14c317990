"""Serve a K table inside serving code. Stdlib only: importing this costs nothing.

    from dsdprof.runtime import KSelector
    selector = KSelector.from_file("tables/llama8b.json")
    k = selector.select(batch_size)                 # the table's batch-size-only answer
    k = selector.select(batch_size, context_len)    # a dsdprof.ktable/v3 table: K by batch size x context

For every ``batch_size >= 1``, ``select`` returns what vLLM's ``build_dynamic_sd_schedule_lookup``
returns for the same ranges: K of the range holding the batch size, carried forward past the last
range, capped at ``num_speculative_tokens``. For ``batch_size <= 0`` (no request scheduled) it
returns the K of batch size 1 -- never another batch size's K.

Cost: loading is O(number of ranges + :data:`DENSE_CAP`) in time and memory at most, whatever
the batch sizes in the table (a range starting at 10**12 is fine). ``select`` is a small Python
function built once per table shape and bound on the instance (``sel.select(n)`` is one plain
call). Its common case is one list index behind one comparison (``select(n)``: ``0 < n <=
max(DENSE_MIN, min(last range start, DENSE_CAP))``) or two list indexes behind two
(``select(n, ctx)`` on a v3 table: ``1 < ctx <= min(last bucket, CONTEXT_DENSE_CAP)``, then the
slice's dense list); a failed index costs nothing until it happens. Everything else -- ``n <= 0``,
batch sizes past the dense list (O(1) past the last range's start, a binary search over the
range starts only between :data:`DENSE_CAP` and it), contexts past the dense list (the last slice
or a binary search over the buckets), contexts 0 and 1 (so that ``True``/``False`` stay "no
context"), non-int arguments -- takes a slow path (~0.5 us) that answers exactly as the
per-slice dict lookups do. ``for_context(context_len)`` returns the slice's C-level lookup for
callers that bucket once per batch (no Python frame at all).

Context (``dsdprof.ktable/v3``): ``select(batch_size, context_len)`` serves the slice whose bucket
holds ``context_len`` (contexts past the last bucket: the last slice; ``None``, a negative, a
``bool`` or a non-integer context: the batch-size-only answer; an integer of another type, e.g. a
NumPy integer, is a context, as list indexing takes it). One list index picks the slice for
contexts up to :data:`CONTEXT_DENSE_CAP` (2 MB per selector). A v1/v2 table ignores ``context_len``.

:class:`AdaptiveKSelector` (in :mod:`dsdprof.serve.adaptive`, re-exported here) re-derives K per batch
size from live acceptance counts; it needs a ``dsdprof.ktable/v2`` (or v3: its batch-size-only answer) table.
"""

from __future__ import annotations

import operator
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Any, Sequence

from dsdprof.formats.ktable import TableError, read_table_file, validate_num_speculative_tokens, validate_ranges, validate_table

__all__ = ["CONTEXT_DENSE_CAP", "DENSE_CAP", "KSelector", "TableError", "batch_context", "build_lookup"]

DENSE_CAP = 4096  # batch sizes up to here (and below the last range's start) are one list index in select
DENSE_MIN = 1024  # ... and always at least up to here, even when the last range starts lower
CONTEXT_DENSE_CAP = 1 << 18  # contexts up to here pick their slice by one list index


class _Lookup(dict):
    """``{batch_size: K}`` for batch sizes 0..dense_end; every other key is answered by
    :meth:`__missing__` (which stores nothing): ``n <= 0`` -> K of batch size 1, ``n`` at or past
    the last range's start -> the last K, anything between -> binary search over range starts."""

    __slots__ = ("_starts", "_ks", "_tail_start", "_tail_k", "_k_of_1")

    def __missing__(self, batch_size: int) -> int:
        if batch_size < 1:
            return self._k_of_1
        if batch_size >= self._tail_start:
            return self._tail_k
        return self._ks[bisect_right(self._starts, batch_size) - 1]


def build_lookup(ranges: Sequence[tuple[int, int, int]], cap: int, dense_cap: int = DENSE_CAP) -> _Lookup:
    """The lookup for validated, contiguous ``ranges`` with K capped at ``cap``.

    Time and memory: O(len(ranges) + min(last start, dense_cap)).
    """
    starts = [r[0] for r in ranges]
    ks = [min(r[2], cap) for r in ranges]
    dense_end = min(max(starts[-1], DENSE_MIN), dense_cap)
    dense: list[int] = [ks[0]]  # index 0: K of batch size 1 (documented n <= 0 behaviour)
    for (start, end, _), k in zip(ranges, ks):
        if start > dense_end:
            break
        dense.extend([k] * (min(end, dense_end) - start + 1))
    dense.extend([ks[-1]] * (dense_end + 1 - len(dense)))  # carry forward past the last range
    lookup = _Lookup(enumerate(dense))
    lookup._starts, lookup._ks = starts, ks
    lookup._tail_start, lookup._tail_k, lookup._k_of_1 = starts[-1], ks[-1], ks[0]
    return lookup


def _parse(ranges: Sequence[Sequence[int]], max_k: Any) -> tuple[list[tuple[int, int, int]], int]:
    if not isinstance(ranges, (list, tuple)):
        raise TableError(f"ranges={type(ranges).__name__}: must be a list of [start, end, k]")
    parsed = validate_ranges([list(r) if isinstance(r, tuple) else r for r in ranges])
    cap = max(k for _, _, k in parsed) if max_k is None else validate_num_speculative_tokens(max_k)
    return parsed, cap


def _context_index(tops: Sequence[int], dense_cap: int = CONTEXT_DENSE_CAP) -> list[int]:
    """``index[c]`` = the slice serving context ``c``, for ``0 <= c <= min(tops[-1], dense_cap)``
    (the last slice included: it serves every context past its start)."""
    end = min(tops[-1], dense_cap)
    index: list[int] = []
    for i, top in enumerate(tops):
        index.extend([i] * (min(top, end) + 1 - len(index)))
        if len(index) > end:
            break
    return index


def _dense(lookup: _Lookup) -> list[int]:
    """``lookup`` as a list indexed by batch size (index 0 unused: ``select`` sends ``n <= 0`` to the lookup)."""
    return list(lookup.values())  # built from enumerate(0..dense_end): values in batch-size order


def _as_context(context_len: Any) -> int | None:
    """The context ``context_len`` stands for, or None (serve the batch-size-only answer): an
    integer >= 0 (``int`` or what list indexing takes as one, e.g. a NumPy integer; not ``bool``)."""
    if context_len is None or type(context_len) is bool:
        return None
    try:
        c = operator.index(context_len)
    except TypeError:  # float, str, ...: no context
        return None
    return c if c >= 0 else None


def _selector(default: _Lookup, slices: Sequence[_Lookup], tops: Sequence[int]) -> Any:
    """``select(batch_size, context_len=None)``: see the module docstring. The common case is
    one or two list indexes behind two comparisons (``batch_size > 0``, ``context_len > 1``; a
    failed index is caught at no cost until it happens); everything else (``n <= 0``, batch sizes
    or contexts past the dense lists, bad types, contexts 0 and 1 so that ``True``/``False`` stay
    "no context") goes to ``_far``, which answers exactly as the lookups do."""
    if not slices:
        def select(batch_size: int, context_len: Any = None, _k: list = _dense(default), _far: Any = default.__getitem__) -> int:
            try:
                if batch_size > 0:
                    return _k[batch_size]
            except (IndexError, TypeError):
                pass
            return _far(batch_size)
        return select
    last_start = tops[-2] + 1 if len(tops) > 1 else 1
    dense = [_dense(s) for s in slices]
    by_context = [dense[i] for i in _context_index(tops)]  # context -> its slice's dense list

    def _far(batch_size: Any, context_len: Any) -> int:
        c = _as_context(context_len)
        if c is None:
            return default[batch_size]
        if c >= last_start:
            return slices[-1][batch_size]
        return slices[bisect_left(tops, c)][batch_size]

    def select(batch_size: int, context_len: Any = None, _k: list = _dense(default), _f: list = by_context,
               _far: Any = _far) -> int:
        if context_len is None:
            try:
                if batch_size > 0:
                    return _k[batch_size]
            except (IndexError, TypeError):
                pass
            return _far(batch_size, None)
        try:
            if context_len > 1 and batch_size > 0:
                return _f[context_len][batch_size]
        except (IndexError, TypeError):
            pass
        return _far(batch_size, context_len)
    return select


class KSelector:
    """Batch size (x context) -> K for a validated table.

    ``select(batch_size, context_len=None)`` is the lookup (call it as ``selector.select(n)``,
    ``selector.select(n, ctx)`` or ``selector(n, ctx)``). ``lookup_list(max_batch_size, context_len=None)``
    gives the same schedule as a dense list indexed by batch size, exactly what vLLM's
    ``build_dynamic_sd_schedule_lookup`` builds (index 0 unused, 0). ``contexts``: ``((max_context,
    ranges), ...)`` of a v3 table (empty for v1/v2).
    """

    __slots__ = ("select", "_lookup", "ranges", "max_k", "contexts", "_slices")

    def __init__(self, ranges: Sequence[Sequence[int]], max_k: int | None = None,
                 contexts: Sequence[tuple[int, Sequence[Sequence[int]]]] = ()) -> None:
        parsed, cap = _parse(ranges, max_k)
        slices = [(int(top), _parse(r, cap)[0]) for top, r in contexts]
        self._lookup = build_lookup(parsed, cap)
        self._slices = [build_lookup(r, cap) for _, r in slices]
        self.select = _selector(self._lookup, self._slices, [top for top, _ in slices])
        self.ranges = tuple(parsed)
        self.max_k = cap
        self.contexts = tuple((top, tuple(r)) for top, r in slices)

    @classmethod
    def from_dict(cls, doc: Any) -> "KSelector":
        """From a parsed ``dsdprof.ktable/v1``, ``/v2`` or ``/v3`` document; :class:`TableError` if malformed."""
        validate_table(doc)
        return cls(doc["ranges"], doc.get("num_speculative_tokens"),
                   [(sl["max_context"], sl["ranges"]) for sl in doc.get("contexts") or ()])

    @classmethod
    def from_file(cls, path: str | Path) -> "KSelector":
        """Load and validate a table file; any unusable file is a :class:`TableError`."""
        return cls.from_dict(read_table_file(path))

    def __call__(self, batch_size: int, context_len: int | None = None) -> int:
        return self.select(batch_size, context_len)

    def slice_index(self, context_len: int | None) -> int:
        """Which context slice serves ``context_len`` (-1: the batch-size-only answer)."""
        c = _as_context(context_len) if self.contexts else None
        if c is None:
            return -1
        return next((i for i, (top, _) in enumerate(self.contexts) if c <= top), len(self.contexts) - 1)

    def for_context(self, context_len: int | None) -> Any:
        """The C-level batch-size lookup serving ``context_len`` (bucket once, look up per batch)."""
        i = self.slice_index(context_len)
        return (self._slices[i] if i >= 0 else self._lookup).__getitem__

    def lookup_list(self, max_batch_size: int, context_len: int | None = None) -> list[int]:
        """``[0, K(1), ..., K(max_batch_size)]``: vLLM's dense schedule for these ranges (the slice
        serving ``context_len`` on a v3 table) and cap."""
        i = self.slice_index(context_len)
        return lookup_list(self.contexts[i][1] if i >= 0 else self.ranges, self.max_k, max_batch_size)

    def __repr__(self) -> str:
        extra = f", contexts={[(t, list(map(list, r))) for t, r in self.contexts]!r}" if self.contexts else ""
        return f"KSelector(ranges={list(map(list, self.ranges))!r}, max_k={self.max_k}{extra})"


def lookup_list(ranges: Sequence[tuple[int, int, int]], cap: int, max_batch_size: int) -> list[int]:
    """Dense ``[0, K(1), ..., K(max_batch_size)]`` for contiguous ranges (K carried forward)."""
    if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 1:
        raise ValueError(f"max_batch_size={max_batch_size!r}: must be an integer >= 1")
    out = [0]
    for start, end, k in ranges:
        if start > max_batch_size:
            break
        out.extend([min(k, cap)] * (min(end, max_batch_size) - start + 1))
    out.extend([min(ranges[-1][2], cap)] * (max_batch_size + 1 - len(out)))
    return out


def batch_context(contexts: Any) -> int:
    """The context a batch is served at: the **mean** of its requests' contexts (KV positions).

    Why the mean and not the max: one step's time is the shared weight pass plus, per request, its
    attention -- a KV read of ``kv · C_i`` bytes (and ``t · C_i`` of math) that is linear in C_i
    (:func:`dsdprof.measure.sim.model.attention_term`). K is one value for the whole step, so the
    step costs ``dense(B, K) + Σ_i attn(C_i, K) = dense(B, K) + B · attn(mean C, K)``: the batch
    behaves exactly like B requests at the mean context. The max would serve a batch with one long
    request among many short ones the K of an all-long batch. (tests/test_context.py checks this on
    the step model.) An empty batch is context 0.
    """
    total = n = 0
    for c in contexts:
        total += c
        n += 1
    return total // n if n else 0
