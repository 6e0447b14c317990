"""Print KSelector.select() ns/call next to a bare list index (the floor for any lookup)."""

from __future__ import annotations

import timeit

from dsdprof.runtime import KSelector


def main() -> None:
    ranges = [[1, 1, 5], [2, 3, 4], [4, 11, 3], [12, 45, 2], [46, 181, 1], [182, 1 << 20, 0]]
    sel = KSelector(ranges)
    lookup = [0] + [sel.select(b) for b in range(1, 257)]
    sizes = [1, 3, 7, 16, 33, 64, 100, 200, 250, 5000 % 256 + 1]
    n = 200_000
    select = sel.select
    t_sel = min(timeit.repeat(lambda: [select(b) for b in sizes], number=n // len(sizes), repeat=5))
    t_idx = min(timeit.repeat(lambda: [lookup[b] for b in sizes], number=n // len(sizes), repeat=5))
    t_loop = min(timeit.repeat(lambda: [b for b in sizes], number=n // len(sizes), repeat=5))
    per = lambda t: (t - t_loop) / n * 1e9  # noqa: E731 - subtract the list-comprehension overhead
    print(f"KSelector.select : {per(t_sel):6.1f} ns/call (+ loop overhead {t_loop / n * 1e9:.1f} ns)")
    print(f"bare list index  : {per(t_idx):6.1f} ns/call")
    print(f"batch size beyond the last range (tail path): {per(min(timeit.repeat(lambda: [select(10**6) for _ in sizes], number=n // len(sizes), repeat=5))):6.1f} ns/call")


if __name__ == "__main__":
    main()
