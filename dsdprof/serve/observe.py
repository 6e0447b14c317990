"""What the adaptive selector knows, as numbers an operator reads (``dsdprof:`` metrics,
docs/observability.md). Stdlib only; read at a metrics flush (about once a second), never per step.

Per profiled batch size ``b`` and the K served there now:

* **acceptance length ratio**: the live acceptance length at (b, K) over the table's, with the
  interval the per-position acceptance intervals give (each position's live / profiled ratio at
  its lower and upper bound, :meth:`AcceptanceStats.intervals`, z = 1.96);
* **step time ratio**: the live step-time estimate at (b, K) -- the machine factor included, as
  :meth:`AdaptiveKSelector.step_time` -- over the table's, with a log-normal interval from the
  step-to-step noise seen at b over sqrt(1 + the cell's decayed step count) (1.0 in log space
  while b has no settled noise estimate: an interval that says "not known yet").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from dsdprof.serve.adaptive import AdaptiveKSelector

__all__ = ["Row", "selector_rows", "shift_alarms"]

UNKNOWN_LOG_SE = 1.0  # the step-time ratio's log standard error before any noise is measured


class Row(NamedTuple):
    batch_size: int
    k: int
    table_k: int | None
    al_ratio: float
    al_lo: float
    al_hi: float
    step_ratio: float
    step_lo: float
    step_hi: float


def selector_rows(sel: AdaptiveKSelector, z: float = 1.96) -> list[Row]:
    """One :class:`Row` per profiled batch size of an :class:`~dsdprof.serve.adaptive.AdaptiveKSelector`."""
    acc = sel._acc
    ratios = acc.ratios()
    bounds = acc.intervals(z)
    lo = [a for a, _ in bounds]
    hi = [b for _, b in bounds]
    itl = sel._itl
    machine = math.exp(itl.machine)
    table_ks = sel.table_ks
    rows = []
    for bi, b in enumerate(sel._sizes):
        k = sel._k[b]
        cell = sel._cells[bi][k]
        est = itl.est[bi][k]
        al = [sel._goodputs(bi, r)[k] * est for r in (ratios, lo, hi)]
        se = itl.noise_sd(bi)
        se = se / math.sqrt(1.0 + itl.n[bi][k]) if se > 0 else UNKNOWN_LOG_SE
        st = est * machine / cell.itl
        rows.append(Row(b, k, table_ks.get(b), al[0] / cell.al, min(al[1], al[0]) / cell.al,
                        max(al[2], al[0]) / cell.al, st, st * math.exp(-z * se), st * math.exp(z * se)))
    return rows


def shift_alarms(sel: AdaptiveKSelector) -> int:
    """Shifts of acceptance the selector detected so far (its CUSUM resets)."""
    return int(sel._acc.resets)
