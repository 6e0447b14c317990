"""Serve a K table inside serving code. Stdlib only: importing this costs nothing.

    from dsdprof.runtime import KSelector
    selector = KSelector.from_file("tables/llama8b.json")
    k = selector.select(batch_size)

``select`` is an index into a list built at load time (O(1), no allocation). For every
``batch_size >= 1`` it returns what vLLM's ``build_dynamic_sd_schedule_lookup`` returns for the
same ranges: K of the range holding the batch size, carried forward past the last range, capped
at ``num_speculative_tokens``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from dsdprof.schema import TableError, validate_ranges, validate_table

__all__ = ["KSelector", "TableError"]


class KSelector:
    """Batch size -> K lookup for a validated table."""

    __slots__ = ("_lookup", "_tail_k", "_size", "ranges", "max_k")

    def __init__(self, ranges: Sequence[Sequence[int]], max_k: int | None = None) -> None:
        parsed = validate_ranges(list(list(r) if isinstance(r, tuple) else r for r in ranges))
        cap = max(k for _, _, k in parsed) if max_k is None else max_k
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
            raise TableError(f"num_speculative_tokens={max_k!r}: must be an integer >= 0")
        last_start = parsed[-1][0]
        lookup = [0] * (last_start + 1)  # index 0 unused, like vLLM's dense schedule
        for start, end, k in parsed:
            for b in range(start, min(end, last_start) + 1):
                lookup[b] = min(k, cap)
        self._lookup = lookup
        self._size = last_start + 1
        self._tail_k = min(parsed[-1][2], cap)
        self.ranges = tuple(parsed)
        self.max_k = cap

    @classmethod
    def from_dict(cls, doc: Any) -> "KSelector":
        """From a parsed ``dsdprof.ktable/v1`` document; raises :class:`TableError` if malformed."""
        validate_table(doc)
        return cls(doc["ranges"], doc.get("num_speculative_tokens"))

    @classmethod
    def from_file(cls, path: str | Path) -> "KSelector":
        """Load and validate a table JSON file; raises :class:`TableError` if unusable."""
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise TableError(f"table={str(path)!r}: cannot read ({err.strerror})") from None
        try:
            doc = json.loads(text)
        except ValueError as err:
            raise TableError(f"table={str(path)!r}: not valid JSON ({err})") from None
        return cls.from_dict(doc)

    def select(self, batch_size: int) -> int:
        """K for ``batch_size`` (any int >= 1; larger than every range -> the last K)."""
        if batch_size < self._size:
            return self._lookup[batch_size]
        return self._tail_k

    __call__ = select

    def __repr__(self) -> str:
        return f"KSelector(ranges={list(map(list, self.ranges))!r}, max_k={self.max_k})"
