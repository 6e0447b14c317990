"""The profiled cells of a ``dsdprof.ktable/v2`` table, as :class:`~dsdprof.serve.adaptive.AdaptiveKSelector`
holds them. Stdlib only."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ProfiledCell", "conditional"]


def conditional(p: Sequence[float]) -> list[float]:
    """Chain p_1..p_n -> conditional q_i = p_i / p_{i-1} (p capped to be non-increasing)."""
    out, prev = [], 1.0
    for x in p:
        x = min(max(float(x), 0.0), prev)
        out.append(x / prev if prev > 0 else 0.0)
        prev = x
    return out


class ProfiledCell:
    """One profiled (batch size, K) cell: AL, step time, its conditional acceptance ``q0`` (first K)
    and chain ``p0``; ``shared``: profiled like its batch size's reference ``ref``."""

    __slots__ = ("k", "al", "itl", "q0", "p0", "shared")

    def __init__(self, k: int, al: float, itl: float, q0: list[float], ref: list[float]) -> None:
        self.k, self.al, self.itl, self.q0 = k, al, itl, q0[:k]
        self.p0: list[float] = []
        p = 1.0
        for q in self.q0:
            p *= q
            self.p0.append(p)
        # profiled like its batch size's reference: its shift is the reference's prefix (computed once)
        self.shared = all(abs(a - b) <= 1e-9 for a, b in zip(self.q0, ref))
