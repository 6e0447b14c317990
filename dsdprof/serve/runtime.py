"""Serve a K table inside serving code. Stdlib only: importing this costs nothing.

    from dsdprof.runtime import KSelector
    selector = KSelector.from_file("tables/llama8b.json")
    k = selector.select(batch_size)                 # the table's batch-size-only answer
    k = selector.select(batch_size, context_len)    # a dsdprof.ktable/v3 table: K by batch size x context

For every ``batch_size >= 1``, ``select`` returns what vLLM's ``build_dynamic_sd_schedule_lookup``
returns for the same ranges: K of the range holding the batch size, carried forward past the last
range, capped at ``num_speculative_tokens``. For ``batch_size <= 0`` (no request scheduled) it
returns the K of batch size 1 -- never another batch size's K.

``select`` is a small Python function generated once per table and stored on the instance: one
comparison and one list index for an int batch size inside its list (:data:`LIST_MIN`,
:data:`LOAD_CAP`, :data:`GROW_CAP`), a slow path that answers exactly as the ranges do for
everything else. Its cost and the rules for contexts (:data:`CONTEXT_DENSE_CAP`,
:meth:`KSelector.for_context`) are in docs/ktable.md ("Serving: KSelector") and docs/context.md
("Serving"); the optional ``vanilla_faster`` records (:meth:`KSelector.vanilla_faster`, which
``select`` ignores) in docs/ktable.md ("Vanilla").

:class:`AdaptiveKSelector` (in :mod:`dsdprof.serve.adaptive`, re-exported here) re-derives K per batch
size from live acceptance counts; it needs a ``dsdprof.ktable/v2`` (or v3: its batch-size-only answer) table.
"""


from __future__ import annotations

import operator
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from dsdprof.formats.ktable import (
    TableError,
    read_table_file,
    validate_num_speculative_tokens,
    validate_ranges,
    validate_table,
)

__all__ = ["CONTEXT_DENSE_CAP", "DENSE_CAP", "GROW_CAP", "KSelector", "LIST_MIN", "LOAD_CAP", "TableError",
           "VanillaGap", "batch_context",
           "build_lookup"]

# build_lookup's dict (AdaptiveKSelector.select) holds batch sizes up to here (and below the last start)
DENSE_CAP = 4096
DENSE_MIN = 1024  # ... and always at least up to here, even when the last range starts lower
CONTEXT_DENSE_CAP = 1 << 18  # contexts up to here pick their slice by one list index
# KSelector.select: batch sizes up to max(last range start, here) are one list index from load
LIST_MIN = 4096
LOAD_CAP = 1 << 16  # ... but at most up to here at load (512 KiB) ...
GROW_CAP = 1 << 20  # ... and up to here once asked for (the list grows in place; 8 B a batch size)


class _Lookup(dict[int, int]):
    """``{batch_size: K}`` for batch sizes 0..dense_end; every other key is answered by
    :meth:`__missing__` (which stores nothing): ``n <= 0`` -> K of batch size 1, ``n`` at or past
    the last range's start -> the last K, anything between -> binary search over range starts."""

    __slots__ = ("_starts", "_ks", "_tail_start", "_tail_k", "_k_of_1")
    _starts: list[int]
    _ks: list[int]
    _tail_start: int
    _tail_k: int
    _k_of_1: int

    def __missing__(self, batch_size: int) -> int:
        if batch_size < 1:
            return self._k_of_1
        if batch_size >= self._tail_start:
            return self._tail_k
        return self._ks[bisect_right(self._starts, batch_size) - 1]


def build_lookup(ranges: Sequence[Sequence[int]], cap: int, dense_cap: int = DENSE_CAP) -> _Lookup:
    """The lookup for validated, contiguous ``ranges`` with K capped at ``cap``.

    Time and memory: O(len(ranges) + min(last start, dense_cap)).
    """
    starts = [r[0] for r in ranges]
    ks = [min(r[2], cap) for r in ranges]
    dense_end = min(max(starts[-1], DENSE_MIN), dense_cap)
    dense = lookup_list(ranges, cap, dense_end) if dense_end else [0]
    dense[0] = ks[0]  # K of batch size 1 (documented n <= 0 behaviour)
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


_SRC_BS = """
def select(batch_size, context_len=None):
    try:
        if batch_size >= 0:
            return _k[batch_size]
    except (IndexError, TypeError):
        pass
    return _far(batch_size, context_len)
"""

_SRC_CTX = """
def select(batch_size, context_len=None):
    try:
        if context_len is None:
            if batch_size >= 0:
                return _k[batch_size]
        elif 1 < context_len <= {cn} and batch_size >= 0:
            return _f[context_len][batch_size]
    except (IndexError, TypeError):
        pass
    return _far(batch_size, context_len)
"""


def _compile(src: str, **names: Any) -> Any:
    """``select`` from a constant source (only ints are formatted in), its names its globals: a
    global load is the cheapest way for a CPython function to reach per-table objects."""
    exec(src, names)  # noqa: S102
    return names["select"]


class _Served:
    """One set of ranges as ``select`` serves it: ``list`` (``list[b]`` = K(b), ``list[0]`` = K(1);
    max(last range start, :data:`LIST_MIN`) long at load, at most :data:`LOAD_CAP`, grown in place
    on demand up to :data:`GROW_CAP`) and the slow path :meth:`far`."""

    __slots__ = ("ranges", "cap", "list", "lookup")

    def __init__(self, ranges: Sequence[tuple[int, int, int]], cap: int) -> None:
        self.ranges, self.cap = ranges, cap
        self.lookup = build_lookup(ranges, cap, 0)  # no dense part: the slow path only
        self.list = lookup_list(ranges, cap, min(max(ranges[-1][0], LIST_MIN), LOAD_CAP))
        self.list[0] = self.lookup[0]

    def far(self, batch_size: Any, context_len: Any = None) -> int:
        """A batch size outside the list: an int up to :data:`GROW_CAP` grows it (to the next
        doubling, so a new largest batch size costs this once), anything else is answered by the
        lookup (exactly as vLLM's ranges: negatives -> K(1), the last K carried forward)."""
        lst = self.list
        if type(batch_size) is int and len(lst) <= batch_size <= GROW_CAP:
            new = lookup_list(self.ranges, self.cap, min(max(2 * len(lst), batch_size + 1), GROW_CAP + 1) - 1)
            new[0] = lst[0]
            if len(new) > len(lst):
                lst[:] = new  # in place, one C call: a reader in another thread always sees a correct prefix
            return new[batch_size]
        return self.lookup[batch_size]


def _selector(default: _Served, slices: Sequence[_Served], tops: Sequence[int]) -> Any:
    """``select(batch_size, context_len=None)`` (see the module docstring): one comparison and one
    list index for ``select(n)`` with ``0 <= n < len(list)``; two more comparisons and one more list
    index for ``select(n, ctx)`` with ``1 < ctx <= min(last bucket, CONTEXT_DENSE_CAP)``. Nothing on
    these paths raises; everything else goes to ``_far``, which answers as the lookups do."""
    if not slices:
        return _compile(_SRC_BS, _k=default.list, _far=default.far)
    last_start = tops[-2] + 1 if len(tops) > 1 else 1

    def _far(batch_size: Any, context_len: Any) -> int:
        c = _as_context(context_len)
        if c is None:
            return default.far(batch_size)
        if c >= last_start:
            return slices[-1].far(batch_size)
        return slices[bisect_left(tops, c)].far(batch_size)
    index = _context_index(tops)
    by_context = [slices[i].list for i in index]  # context -> its slice's list
    return _compile(_SRC_CTX.format(cn=len(index) - 1), _k=default.list, _f=by_context, _far=_far)


class KSelector:
    """Batch size (x context) -> K for a validated table.

    ``select(batch_size, context_len=None)`` is the lookup (call it as ``selector.select(n)``,
    ``selector.select(n, ctx)`` or ``selector(n, ctx)``). ``for_context(ctx)`` is the selector of
    the slice serving ``ctx`` (bucket once per batch, then ``.select(n)``). ``lookup_list(max_batch_size,
    context_len=None)`` gives the same schedule as a dense list indexed by batch size, exactly what
    vLLM's ``build_dynamic_sd_schedule_lookup`` builds (index 0 unused, 0). ``contexts``:
    ``((max_context, ranges), ...)`` of a v3 table (empty for v1/v2). ``vanilla``: where the table
    says no speculation measured faster than every K (see :meth:`vanilla_faster`).
    """

    __slots__ = ("select", "_lookup", "ranges", "max_k", "contexts", "vanilla", "_served", "_by_slice")
    select: Callable[..., int]

    def __init__(self, ranges: Sequence[Sequence[int]], max_k: int | None = None,
                 contexts: Sequence[tuple[Any, ...]] = (), vanilla: Sequence[Any] = ()) -> None:
        parsed, cap = _parse(ranges, max_k)
        slices = [(int(c[0]), _parse(c[1], cap)[0]) for c in contexts]
        self._served = _Served(parsed, cap)
        served = [_Served(r, cap) for _, r in slices]
        self._lookup = self._served.lookup
        self.select = _selector(self._served, served, [top for top, _ in slices])
        self.ranges = tuple(parsed)
        self.max_k = cap
        self.contexts = tuple((top, tuple(r)) for top, r in slices)
        self.vanilla = _parse_vanilla(vanilla)
        self._by_slice = tuple(_slice_selector(sv, _parse_vanilla(c[2] if len(c) > 2 else ()))
                               for sv, c in zip(served, contexts))

    @classmethod
    def from_dict(cls, doc: Any) -> KSelector:
        """From a parsed ``dsdprof.ktable/v1``, ``/v2`` or ``/v3`` document; :class:`TableError` if
        malformed."""
        validate_table(doc)
        return cls(doc["ranges"], doc.get("num_speculative_tokens"),
                   [(sl["max_context"], sl["ranges"], sl.get("vanilla_faster") or ())
                    for sl in doc.get("contexts") or ()],
                   doc.get("vanilla_faster") or ())

    @classmethod
    def from_file(cls, path: str | Path) -> KSelector:
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

    def for_context(self, context_len: int | None) -> KSelector:
        """The selector of the slice serving ``context_len`` (``self`` on a v1/v2 table or without
        a context): bucket once per batch, then ``.select(batch_size)`` per step, as fast as a v2
        table's ``select``."""
        i = self.slice_index(context_len)
        return self._by_slice[i] if i >= 0 else self

    def vanilla_faster(self, batch_size: int) -> VanillaGap | None:
        """Where the table records that no speculation (a vanilla engine) measured faster than every
        K at ``batch_size``: that record (``gain``: vanilla's goodput over the best K's, minus 1,
        with its interval), else None. Not on the hot path: O(number of records)."""
        for gap in self.vanilla:
            if gap.start <= batch_size <= gap.end:
                return gap
        return None

    def lookup_list(self, max_batch_size: int, context_len: int | None = None) -> list[int]:
        """``[0, K(1), ..., K(max_batch_size)]``: vLLM's dense schedule for these ranges (the slice
        serving ``context_len`` on a v3 table) and cap."""
        i = self.slice_index(context_len)
        return lookup_list(self.contexts[i][1] if i >= 0 else self.ranges, self.max_k, max_batch_size)

    def __repr__(self) -> str:
        extra = f", contexts={[(t, list(map(list, r))) for t, r in self.contexts]!r}" if self.contexts else ""
        return f"KSelector(ranges={list(map(list, self.ranges))!r}, max_k={self.max_k}{extra})"


class VanillaGap(NamedTuple):
    """Batch sizes ``start..end`` where a vanilla engine (no speculative config) measured faster than
    every K of the table (vLLM's K=0 still runs the drafter): ``gain`` = vanilla goodput / the best
    K's - 1, ``ci_low``/``ci_high`` its interval (None when unknown), ``k`` the K served there."""
    start: int
    end: int
    gain: float
    ci_low: float | None = None
    ci_high: float | None = None
    k: int | None = None


def _parse_vanilla(records: Any) -> tuple[VanillaGap, ...]:
    """A table's ``vanilla_faster`` records (already validated by :func:`validate_table`, or
    :class:`VanillaGap` tuples) as sorted :class:`VanillaGap` tuples."""
    out = []
    for r in records or ():
        if isinstance(r, dict):
            r = VanillaGap(int(r["start"]), int(r["end"]), float(r["gain"]), r.get("ci_low"),
                           r.get("ci_high"), r.get("k"))
        out.append(VanillaGap(*r))
    return tuple(sorted(out))


def _slice_selector(served: _Served, vanilla: tuple[VanillaGap, ...]) -> KSelector:
    """A v2-like :class:`KSelector` of one context slice, sharing the v3 selector's list."""
    sel = KSelector.__new__(KSelector)
    sel._served, sel._lookup, sel._by_slice = served, served.lookup, ()
    sel.ranges, sel.max_k, sel.contexts, sel.vanilla = tuple(served.ranges), served.cap, (), vanilla
    sel.select = _compile(_SRC_BS, _k=served.list, _far=served.far)
    return sel


def lookup_list(ranges: Sequence[Sequence[int]], cap: int, max_batch_size: int) -> list[int]:
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
    request among many short ones the K of an all-long batch. (tests/serve/test_context.py checks this on
    the step model.) An empty batch is context 0.
    """
    total = n = 0
    for c in contexts:
        total += c
        n += 1
    return total // n if n else 0
