"""Adaptive K: the profiled step times + the acceptance seen live -> K per batch size. Stdlib only.

A ``dsdprof.ktable/v2`` table keeps what profiling measured per (batch size b, K): the step time
ITL(b, K) and the acceptance length AL(b, K), plus the profiled per-position acceptance
p0_1..p0_L. Step time is a property of model + hardware; acceptance moves with the traffic.
:class:`AdaptiveKSelector` keeps the first and follows the second.

**Acceptance.** vLLM counts, per step, the drafts (``num_drafts``) and how many drafts had
position i accepted (``num_accepted_tokens_per_pos[i]``). For a chain drafter a position is
accepted only if every earlier one was, so p_i = accepted_i / drafts is already the probability
that the first i drafted tokens are all accepted, and a K-token draft delivers
AL(K) = 1 + sum_{i=1..K} p_i tokens per step. The estimate is kept as conditional rates
q_i = p_i / p_{i-1} (p_0 = 1), each from exponentially decayed counts::

    S_i <- S_i * 0.5**(x_i / H) + accepted_i        x_i = accepted_{i-1}   (exposure; accepted_0 = drafts)
    E_i <- E_i * 0.5**(x_i / H) + x_i               q_i = S_i / E_i,  p_i = q_1 * ... * q_i

starting from a prior worth ``prior_weight`` drafts of the profile (E_i = w * p0_{i-1},
S_i = w * p0_i), so a few samples barely move it and the prior fades with half-life H
(``half_life``, in exposures). Only positions that were drafted are updated: when K is small the
deeper q_i keep their last value and p_i still follows the observed shallower positions.
(With ``drafted_per_pos`` -- vLLM's ``num_draft_tokens_per_pos`` -- the exposure of position i is
accepted_{i-1} * drafted_i / drafted_{i-1}, for observations that mix draft lengths.)

**K per profiled batch size.** With the live p and the profile p0, the acceptance length of each
profiled cell is shifted by the change in expected accepted tokens, and goodput re-derived::

    AL'(b, K) = AL(b, K) + sum_{i<=K} (p_i - p0_i)      (clamped to [1, K+1])
    G(b, K)   = AL'(b, K) / ITL(b, K)

Anchoring on the measured AL(b, K) keeps whatever the measurement saw beyond 1 + sum p0 (e.g.
requests ending inside a step), and reproduces the static table's goodputs exactly while p = p0.
K_b starts at the table's K and is switched only when the best candidate beats it by more than
``margin`` (hysteresis)::

    switch when   max_K G(b, K) > (1 + margin) * G(b, K_b)
    to            the smallest K with G(b, K) >= max_K G(b, K) / (1 + margin / 2)

so K_b never stays more than ``margin`` below the best the estimate allows, and after a switch it
sits inside half the band: it takes a further change in acceptance, not noise, to move it again.
(The static table chose the smallest K within its ``tolerance`` of the best; such a K is kept as
long as it is within ``margin`` of the best.) Candidates are the Ks measured at b, at most
``max_k`` (vLLM's ``num_speculative_tokens``), optionally restricted to ``allowed_ks`` (e.g. the
Ks an engine captured CUDA graphs for; a table K outside them is replaced at construction).

**Serving.** K_b at the profiled batch sizes become ranges by the table's nearest-log rule
(:func:`dsdprof.export.table.ranges_from_points`); the lookup is rebuilt off the hot path -- in
:meth:`observe` every ``rebuild_every`` observations, or by :meth:`rebuild` -- and only when some
K_b changed; it is swapped in with one attribute store. ``select(n)`` is the same C-level dict
lookup as :class:`dsdprof.serve.runtime.KSelector` (O(1), allocation-free); call it as
``selector.select(n)`` (do not cache the bound method: a rebuild replaces it).
:meth:`lookup_list` gives the schedule as vLLM's dense ``dynamic_sd_lookup`` list; ``version``
increments on every change, so a scheduler can copy it only when it moved.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Sequence

from dsdprof.serve.runtime import build_lookup, lookup_list
from dsdprof.formats.ktable import TableError, read_table_file, validate_num_speculative_tokens, validate_ranges, validate_table
from dsdprof.formats.versions import TABLE_SCHEMA_V2, TABLE_SCHEMA_V3
from dsdprof.formats.ktable import ranges_from_points

__all__ = ["AdaptiveKSelector"]


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}={value!r}: must be a number in [0, 1)")
    return float(value)


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}={value!r}: must be a finite number > 0")
    return float(value)


class AdaptiveKSelector:
    """Batch size -> K, re-derived from live acceptance on a v2 table's measured ITL grid.

    See the module docstring for the math. ``select(n)`` behaves like ``KSelector.select``
    (``n <= 0`` -> K of batch size 1). Not thread-safe for concurrent :meth:`observe` calls;
    ``select`` may run concurrently with a rebuild (it sees the old or the new lookup).
    """

    __slots__ = ("select", "version", "max_k", "ranges", "margin", "prior_weight",
                 "half_life", "rebuild_every", "_grid", "_k", "_p0", "_q0", "_succ", "_expo", "_pending")

    def __init__(self, table: dict[str, Any], *, margin: float = 0.02, prior_weight: float = 256.0,
                 half_life: float = 2048.0, rebuild_every: int = 32,
                 max_k: int | None = None, allowed_ks: Iterable[int] | None = None) -> None:
        validate_table(table)
        if table["schema"] not in (TABLE_SCHEMA_V2, TABLE_SCHEMA_V3):  # v3: its batch-size-only answer (top level)
            raise TableError(f"schema={table['schema']!r}: adaptive K needs a {TABLE_SCHEMA_V2} table "
                             "(measured step time per batch size and K); re-export it with `dsdprof export RUN`")
        p0 = table.get("acceptance_per_pos")
        if not p0:
            raise TableError(f"acceptance_per_pos={p0!r}: adaptive K needs the profiled per-position acceptance "
                             "(the sweep's rows had no acceptance_per_pos)")
        self.margin = _check_fraction("margin", margin)
        self.prior_weight = _check_positive("prior_weight", prior_weight)
        self.half_life = _check_positive("half_life", half_life)
        if isinstance(rebuild_every, bool) or not isinstance(rebuild_every, int) or rebuild_every < 1:
            raise ValueError(f"rebuild_every={rebuild_every!r}: must be an integer >= 1")
        self.rebuild_every = rebuild_every
        ranges = validate_ranges(table["ranges"])
        cap = table.get("num_speculative_tokens") if max_k is None else max_k
        self.max_k = max(k for _, _, k in ranges) if cap is None else validate_num_speculative_tokens(cap, "max_k")
        allowed = None if allowed_ks is None else {validate_num_speculative_tokens(k, "allowed_ks") for k in allowed_ks}

        grid: dict[int, dict[int, tuple[float, float]]] = {}
        for c in table["cells"]:
            k = c["k"]
            if k <= self.max_k and (allowed is None or k in allowed):
                grid.setdefault(c["batch_size"], {})[k] = (float(c["acceptance_length"]), float(c["itl_s"]))
        if not grid:
            raise TableError(f"cells: no measured cell with K <= {self.max_k}"
                             + (f" in allowed_ks={sorted(allowed)}" if allowed is not None else ""))
        self._grid = dict(sorted(grid.items()))
        lookup = build_lookup(ranges, self.max_k)
        self._k = {b: lookup[b] for b in self._grid}  # start from the K the table serves
        self.ranges = tuple(ranges)
        self.select = lookup.__getitem__
        self.version = 0

        self._p0, self._q0, self._succ, self._expo = [], [], [], []
        prev = 1.0
        for p in p0:
            p = min(float(p), prev)  # a chain's p_i cannot exceed p_{i-1}
            self._p0.append(p)
            self._q0.append(p / prev if prev > 0 else 0.0)
            self._succ.append(self.prior_weight * p)
            self._expo.append(self.prior_weight * prev)
            prev = p
        self._pending = 0
        forced = {b for b, k in self._k.items() if k not in self._grid[b]}  # capped / not allowed
        if forced:
            for b in forced:
                self._k[b] = self._target(self.goodput(b))
            self._swap()
            self.version = 0

    @classmethod
    def from_dict(cls, doc: Any, **kwargs: Any) -> "AdaptiveKSelector":
        return cls(doc, **kwargs)

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> "AdaptiveKSelector":
        """Load a v2 table file; any unusable file (or a v1 table) is a :class:`TableError`."""
        return cls(read_table_file(path), **kwargs)

    # ------------------------------------------------------------------ acceptance

    def observe(self, num_drafts: int, accepted_per_pos: Sequence[int],
                drafted_per_pos: Sequence[int] | None = None) -> bool:
        """Add one step's (or interval's) counts; every ``rebuild_every`` calls, re-derive K.

        ``num_drafts``: drafts (request-steps with a proposal). ``accepted_per_pos[i]``: drafts
        whose position i+1 was accepted (vLLM's ``num_accepted_tokens_per_pos``); its length is
        the K that was drafted. Returns True when the lookup changed.
        """
        if num_drafts <= 0:
            return False
        prev_acc = float(num_drafts)
        prev_drafted = prev_acc
        succ, expo = self._succ, self._expo
        for i in range(min(len(accepted_per_pos), len(succ))):
            acc = float(accepted_per_pos[i])
            if drafted_per_pos is None:
                exposure = prev_acc
            else:
                drafted = float(drafted_per_pos[i])
                exposure = prev_acc * drafted / prev_drafted if prev_drafted > 0 else 0.0
                prev_drafted = drafted
            if not exposure > 0:
                break
            if not acc >= 0:
                raise ValueError(f"accepted_per_pos[{i}]={accepted_per_pos[i]!r}: must be >= 0")
            acc = min(acc, exposure)
            decay = 0.5 ** (exposure / self.half_life)
            succ[i] = succ[i] * decay + acc
            expo[i] = expo[i] * decay + exposure
            prev_acc = acc
        self._pending += 1
        if self._pending >= self.rebuild_every:
            return self.rebuild()
        return False

    def acceptance(self) -> list[float]:
        """Current estimate of p_1..p_L (probability that the first i drafted tokens are accepted)."""
        out, p = [], 1.0
        for s, e, q0 in zip(self._succ, self._expo, self._q0):
            p *= min(1.0, s / e) if e > 0 else q0
            out.append(p)
        return out

    # ------------------------------------------------------------------ K

    def _shift(self) -> list[float]:
        """``shift[K] = sum_{i<=K} (p_i - p0_i)``: the change in expected accepted tokens at K."""
        shift, acc = [0.0], 0.0
        for live, prof in zip(self.acceptance(), self._p0):
            acc += live - prof
            shift.append(acc)
        return shift

    def goodput(self, batch_size: int, _shift: list[float] | None = None) -> dict[int, float]:
        """Re-derived goodput (tokens/s per request) of each candidate K at a profiled batch size."""
        shift = self._shift() if _shift is None else _shift
        last = len(shift) - 1
        return {k: min(k + 1.0, max(1.0, al + shift[k if k < last else last])) / itl
                for k, (al, itl) in self._grid[batch_size].items()}

    def rebuild(self) -> bool:
        """Re-derive K at every profiled batch size (with hysteresis); swap the lookup if any moved."""
        self._pending = 0
        changed = False
        shift = self._shift()
        for b in self._grid:
            g = self.goodput(b, shift)
            if max(g.values()) > (1.0 + self.margin) * g.get(self._k[b], -math.inf):
                new = self._target(g)
                if new != self._k[b]:
                    self._k[b] = new
                    changed = True
        if changed:
            self._swap()
        return changed

    def _target(self, g: dict[int, float]) -> int:
        """Smallest K within half the hysteresis band of the best."""
        best = max(g.values())
        return min(k for k, v in g.items() if v >= best / (1.0 + self.margin / 2))

    def _swap(self) -> None:
        ranges = [tuple(r) for r in ranges_from_points(list(self._k.items()))]
        lookup = build_lookup(ranges, self.max_k)
        self.ranges = tuple(ranges)
        self.select = lookup.__getitem__  # one attribute store: select() sees old or new, never half
        self.version += 1

    @property
    def ks(self) -> dict[int, int]:
        """Current K at each profiled batch size."""
        return dict(self._k)

    def lookup_list(self, max_batch_size: int) -> list[int]:
        """``[0, K(1), ..., K(max_batch_size)]``: assignable to vLLM's scheduler ``dynamic_sd_lookup``."""
        return lookup_list(self.ranges, self.max_k, max_batch_size)

    def __call__(self, batch_size: int) -> int:
        return self.select(batch_size)

    def __repr__(self) -> str:
        return (f"AdaptiveKSelector(ks={self._k!r}, acceptance={[round(p, 3) for p in self.acceptance()]!r}, "
                f"version={self.version})")

