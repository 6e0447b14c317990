"""Serve a K table inside serving code. Stdlib only: importing this costs nothing.

    from dsdprof.runtime import KSelector
    selector = KSelector.from_file("tables/llama8b.json")
    k = selector.select(batch_size)

For every ``batch_size >= 1``, ``select`` returns what vLLM's ``build_dynamic_sd_schedule_lookup``
returns for the same ranges: K of the range holding the batch size, carried forward past the last
range, capped at ``num_speculative_tokens``. For ``batch_size <= 0`` (no request scheduled) it
returns the K of batch size 1 -- never another batch size's K.

Cost: loading is O(number of ranges + :data:`DENSE_CAP`) in time and memory at most, whatever
the batch sizes in the table (a range starting at 10**12 is fine). ``select`` is one C-level dict
lookup (no Python frame, no allocation) for ``0 <= batch_size <= max(DENSE_MIN, min(last range
start, DENSE_CAP))``; any other batch size at or past the last range's start, or ``<= 0``, is
O(1) in a small Python method; only batch sizes above :data:`DENSE_CAP` that fall before the last
range's start take a binary search over the range starts (O(log ranges)).

:class:`AdaptiveKSelector` (in :mod:`dsdprof.serve.adaptive`, re-exported here) re-derives K per batch
size from live acceptance counts; it needs a ``dsdprof.ktable/v2`` table.
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path
from typing import Any, Sequence

from dsdprof.formats.ktable import TableError, read_table_file, validate_num_speculative_tokens, validate_ranges, validate_table

__all__ = ["DENSE_CAP", "KSelector", "TableError", "build_lookup"]

DENSE_CAP = 4096  # batch sizes up to here (and below the last range's start) are one dict lookup
DENSE_MIN = 1024  # ... and always at least up to here, even when the last range starts lower


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


class KSelector:
    """Batch size -> K for a validated table.

    ``select(batch_size)`` is the lookup (an attribute holding a bound C method: call it as
    ``selector.select(n)`` or ``selector(n)``). ``lookup_list(max_batch_size)`` gives the same
    schedule as a dense list indexed by batch size, exactly what vLLM's
    ``build_dynamic_sd_schedule_lookup`` builds (index 0 unused, 0).
    """

    __slots__ = ("select", "_lookup", "ranges", "max_k")

    def __init__(self, ranges: Sequence[Sequence[int]], max_k: int | None = None) -> None:
        parsed, cap = _parse(ranges, max_k)
        self._lookup = build_lookup(parsed, cap)
        self.select = self._lookup.__getitem__
        self.ranges = tuple(parsed)
        self.max_k = cap

    @classmethod
    def from_dict(cls, doc: Any) -> "KSelector":
        """From a parsed ``dsdprof.ktable/v1`` or ``/v2`` document; :class:`TableError` if malformed."""
        validate_table(doc)
        return cls(doc["ranges"], doc.get("num_speculative_tokens"))

    @classmethod
    def from_file(cls, path: str | Path) -> "KSelector":
        """Load and validate a table file; any unusable file is a :class:`TableError`."""
        return cls.from_dict(read_table_file(path))

    def __call__(self, batch_size: int) -> int:
        return self.select(batch_size)

    def lookup_list(self, max_batch_size: int) -> list[int]:
        """``[0, K(1), ..., K(max_batch_size)]``: vLLM's dense schedule for these ranges and cap."""
        return lookup_list(self.ranges, self.max_k, max_batch_size)

    def __repr__(self) -> str:
        return f"KSelector(ranges={list(map(list, self.ranges))!r}, max_k={self.max_k})"


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
