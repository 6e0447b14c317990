"""Adaptive K: the profiled table + the acceptance and step times seen live -> K per batch size.

Stdlib only. A ``dsdprof.ktable/v2`` table keeps, per profiled (batch size b, K), the step time
ITL(b, K), the acceptance length AL(b, K) and (per cell) the per-position acceptance p0_1..p0_K.
:class:`AdaptiveKSelector` starts from it and follows what the engine reports:

* ``observe(num_drafts, accepted_per_pos, drafted_per_pos=None, batch_size=None)``: one step's
  acceptance counts in vLLM's layout (``accepted_per_pos[i]``: drafts whose position i+1 was
  accepted), estimated by :class:`dsdprof.serve.stats.AcceptanceStats`.
* ``observe_step(batch_size, k, seconds)``: the duration of one engine step that verified and
  drafted ``k`` tokens per request at ``batch_size``, estimated by
  :class:`dsdprof.serve.stats.StepTimes` against the machine factor of its moment.
* ``explore(max_batch_size)`` (once per engine step): ``PROBE_STEPS`` steps in every
  ``explore_every`` run a neighbouring K, so the Ks not served still get timed.

Invalid counts or times are ignored and counted in ``rejected`` (before any state changes);
nothing on the serving path raises. The goodput per profiled cell, the table's K kept at the
profile (a faded handicap), the step-time evidence (:meth:`AdaptiveKSelector._weigh_step_times`),
the hysteresis and the exploration are derived in docs/adaptive.md ("The math").

**Serving** is as :class:`dsdprof.serve.runtime.KSelector`: ``select(n)`` is one C-level dict lookup,
swapped with one attribute store on a change (call it as ``selector.select(n)``);
:meth:`lookup_list` gives vLLM's dense list and ``version`` counts changes. Rebuilds run in
:meth:`observe` every ``rebuild_every`` steps with drafts (and steps at K=0), on each of the
first 8 and every 4th of the ``rebuild_every`` steps after a detected shift, or on :meth:`rebuild`.
"""


from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dsdprof.formats.ktable import (
    TableError,
    choose_k,
    ranges_from_points,
    read_table_file,
    validate_num_speculative_tokens,
    validate_ranges,
    validate_table,
)
from dsdprof.formats.ktable_types import KTable, TableCell
from dsdprof.formats.versions import TABLE_SCHEMA_V2, TABLE_SCHEMA_V3
from dsdprof.serve.profile import ProfiledCell, conditional
from dsdprof.serve.runtime import build_lookup, lookup_list
from dsdprof.serve.stats import (
    Q_FLOOR,
    SIDE_HALF_LIFE,
    AcceptanceStats,
    StepTimes,
    _check_fraction,
    _check_int,
    _check_positive,
    check_counts,
    check_seconds,
)

__all__ = ["AdaptiveKSelector", "PROBE_STEPS"]

PROBE_STEPS = 2
SETTLE_STEPS = 64  # a new K's first steps at a batch size are timed against the old K's machine factor
SETTLE_MARGIN = 0.5  # extra margin to return to a K left, fading to 0 over SETTLE_STEPS steps (no flip-flop)
FADE = 0.20  # live goodputs this far (log) from the profile: the table's handicap is gone
STEP_Z = 2.0  # a K's step time departs from the table's ratio only beyond this many standard errors
TIMED = 2.0  # decayed steps at a batch size from which a K counts as timed there (not extrapolated)
NOISE_PRIOR = 0.10  # step-to-step log noise assumed before a batch size has its own estimate


class AdaptiveKSelector:
    """Batch size -> K, re-derived from live acceptance and step times on a v2 table.

    See the module docstring. ``select(n)`` behaves like ``KSelector.select``. Not thread-safe
    for concurrent :meth:`observe` calls; ``select`` may run concurrently with a rebuild.
    """

    __slots__ = ("select", "version", "max_k", "ranges", "margin", "prior_weight", "half_life",
                 "rebuild_every", "explore_every", "itl_half_life", "tolerance", "rejected",
                 "_sizes", "_ends", "_cells", "_ref", "_k", "_table_k", "_g0", "_handicap", "_q0",
                 "_pooled_q0", "_acc", "_itl", "_pending", "_hot", "_last_bucket", "_tick", "_probe",
                 "_probe_up", "_since", "_left", "_steps")

    def __init__(self, table: KTable, *, margin: float = 0.02, prior_weight: float = 16.0,
                 half_life: float = 2048.0, rebuild_every: int = 32, max_k: int | None = None,
                 allowed_ks: Iterable[int] | None = None, explore_every: int = 256,
                 itl_half_life: float = 256.0) -> None:
        table = validate_table(table)  # JSON reaches here through read_table_file / validate_table
        if table["schema"] not in (TABLE_SCHEMA_V2, TABLE_SCHEMA_V3):  # v3: its batch-size-only answer
            raise TableError(f"schema={table['schema']!r}: adaptive K needs a {TABLE_SCHEMA_V2} table "
                             "(measured step time per batch size and K); re-export it: `dsdprof export RUN`")
        p0 = table.get("acceptance_per_pos")
        if not p0:
            raise TableError(f"acceptance_per_pos={p0!r}: adaptive K needs the profiled per-position "
                             "acceptance (the sweep's rows had no acceptance_per_pos)")
        self.margin = _check_fraction("margin", margin)
        self.prior_weight = _check_positive("prior_weight", prior_weight)
        self.half_life = _check_positive("half_life", half_life)
        self.itl_half_life = _check_positive("itl_half_life", itl_half_life)
        self.rebuild_every = _check_int("rebuild_every", rebuild_every, 1)
        self.explore_every = _check_int("explore_every", explore_every, 0)
        if 0 < self.explore_every < PROBE_STEPS * 100:
            raise ValueError(f"explore_every={explore_every!r}: must be 0 (never) or >= {PROBE_STEPS * 100} "
                             f"(exploration is {PROBE_STEPS} steps per period, at most 1 % of steps)")
        self.tolerance = float(table.get("tolerance") or 0.0)
        ranges = validate_ranges(table["ranges"])
        cap = table.get("num_speculative_tokens") if max_k is None else max_k
        self.max_k = (max(k for _, _, k in ranges) if cap is None
                      else validate_num_speculative_tokens(cap, "max_k"))
        allowed = (None if allowed_ks is None
                   else {validate_num_speculative_tokens(k, "allowed_ks") for k in allowed_ks})
        self._build_grid(table, allowed)
        self.rejected = 0
        self._pending = self._hot = 0
        self._last_bucket: int | None = None
        self._tick = 0
        self._probe: list[int] | None = None
        self._probe_up = False
        self.version = 0
        self._swap()
        self.version = 0

    def _build_grid(self, table: KTable, allowed: set[int] | None) -> None:
        pooled = conditional(table.get("acceptance_per_pos") or [])
        grid: dict[int, dict[int, TableCell]] = {}
        for c in table.get("cells") or ():
            k = c["k"]
            if k <= self.max_k and (allowed is None or k in allowed):
                grid.setdefault(c["batch_size"], {})[k] = c
        if not grid:
            raise TableError(f"cells: no measured cell with K <= {self.max_k}"
                             + (f" in allowed_ks={sorted(allowed)}" if allowed is not None else ""))
        depth = max(1, max(k for cells in grid.values() for k in cells))
        pooled = (pooled + [pooled[-1]] * depth)[:depth]
        self._pooled_q0 = [max(q, Q_FLOOR) for q in pooled]
        self._sizes = sorted(grid)
        self._ends = [math.isqrt(a * b) for a, b in zip(self._sizes, self._sizes[1:])]
        lookup = build_lookup(validate_ranges(table["ranges"]), self.max_k)
        self._cells, self._q0, self._k, self._table_k, self._g0, self._handicap = [], [], {}, {}, [], []
        self._ref: list[list[float]] = []
        for b in self._sizes:
            cells = grid[b]
            deepest = max((c for c in cells.values() if c.get("acceptance_per_pos")), key=lambda c: c["k"],
                          default=None)
            ref = conditional(deepest["acceptance_per_pos"]) if deepest else []
            ref = ref + pooled[len(ref):]
            self._q0.append([max(q, Q_FLOOR) for q in ref])
            self._ref.append(ref)
            row = {}
            for k, c in sorted(cells.items()):
                own = conditional(c.get("acceptance_per_pos") or [])
                row[k] = ProfiledCell(k, float(c["acceptance_length"]), float(c["itl_s"]),
                                      own + ref[len(own):], ref)
            self._cells.append(row)
            g0 = {k: c.al / c.itl for k, c in row.items()}
            self._g0.append(g0)
            kt = lookup[b]
            self._table_k[b] = kt if kt in row else None
            self._handicap.append({k: (max(1.0, g / g0[kt]) if kt in row and k != kt else 1.0)
                                   for k, g in g0.items()})
        self._acc = AcceptanceStats(depth, self.half_life, self.prior_weight)
        self._itl = StepTimes([{k: c.itl for k, c in row.items()} for row in self._cells], self.itl_half_life)
        self._since = [SETTLE_STEPS] * len(self._sizes)  # steps each batch size served its K since it changed
        self._left: list[dict[int, int]] = [{} for _ in self._sizes]  # K -> the step it was last left at
        self._steps = 0  # steps with drafts / at K=0
        for bi, b in enumerate(self._sizes):  # a table K capped or not allowed: the best candidate instead
            table_k = self._table_k[b]
            self._k[b] = table_k if table_k is not None else self._decide(bi, None, [1.0] * depth)

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> AdaptiveKSelector:
        """Load a v2 table file (the typed edge: read, parsed and validated into a
        :class:`~dsdprof.formats.ktable_types.KTable`); any unusable file (or a v1 table) is a
        :class:`TableError`. ``kwargs``: the constructor's options."""
        return cls(read_table_file(path), **kwargs)

    @classmethod
    def from_doc(cls, doc: object, **kwargs: Any) -> AdaptiveKSelector:
        """A parsed JSON document (``json.loads``'s): validated into a ``KTable`` first."""
        return cls(validate_table(doc), **kwargs)

    # ------------------------------------------------------------------ live input

    def _bucket(self, batch_size: int) -> int:
        """Index of the profiled batch size nearest (log scale, as the table's ranges) to ``batch_size``."""
        return bisect_left(self._ends, batch_size)

    def observe(self, num_drafts: int, accepted_per_pos: Sequence[int],
                drafted_per_pos: Sequence[int] | None = None, batch_size: int | None = None) -> bool:
        """Add one step's acceptance counts; True when the lookup changed. Bad counts: ignored, counted.

        ``batch_size``: the step's number of requests (its profile is the reference); default the
        batch size of the last :meth:`observe_step`, else the pooled profile.
        """
        if type(num_drafts) is int and num_drafts == 0:
            return False
        if not check_counts(num_drafts, accepted_per_pos, drafted_per_pos) or (
                batch_size is not None and type(batch_size) is not int):
            self.rejected += 1
            return False
        last = self._last_bucket if batch_size is None else self._bucket(batch_size)
        q0 = self._pooled_q0 if last is None else self._q0[last]
        self._steps += 1
        if self._acc.update(int(num_drafts), accepted_per_pos, drafted_per_pos, q0):
            self._hot = self.rebuild_every  # a shift: re-derive K on each of the next rebuild_every steps
        self._pending += 1
        if self._hot:
            self._hot -= 1
            if self._hot % 4 == 3 or self._hot >= self.rebuild_every - 8:
                return self.rebuild()
        if self._pending >= self.rebuild_every:
            return self.rebuild()
        return False

    def observe_step(self, batch_size: int, k: int | None, seconds: float | None) -> bool:
        """One engine step that verified and drafted ``k`` per request at ``batch_size`` took
        ``seconds``; True when the lookup changed. Bad input: ignored, counted. ``seconds=None``:
        no time (a mixed step), only the batch size for the next :meth:`observe`."""
        if seconds is None and type(batch_size) is int and batch_size >= 1:
            self._last_bucket = self._bucket(batch_size)
            self._itl.tick += 1  # an untimed step: time passes between the cells' timings too
            return False
        if type(batch_size) is not int or type(k) is not int or batch_size < 1 or not check_seconds(seconds):
            self.rejected += 1
            return False
        bucket = self._bucket(batch_size)
        self._last_bucket = bucket
        served = k == self._k[self._sizes[bucket]]
        if served and self._since[bucket] < SETTLE_STEPS:  # a new K's first steps: timed against the old K's
            self._since[bucket] += 1
            self._itl.update(bucket, k, float(seconds), False)
            if self._since[bucket] == SETTLE_STEPS:
                self._itl.refit()  # its estimate from those steps: the reference the machine factor follows
        else:
            self._itl.update(bucket, k, float(seconds), served)
        if k == 0:  # no observe() follows: count the step here
            self._pending += 1
            self._steps += 1
            if self._pending >= self.rebuild_every:
                return self.rebuild()
        return False

    def acceptance(self, batch_size: int | None = None) -> list[float]:
        """Live p_1..p_L (first i drafts all accepted) at ``batch_size``'s profile, or the pooled one."""
        q0 = self._pooled_q0 if batch_size is None else self._q0[self._bucket(batch_size)]
        out, p = [], 1.0
        for r, q in zip(self._acc.ratios(), q0):
            p *= min(1.0, r * q)
            out.append(p)
        return out

    def acceptance_interval(self, z: float = 1.96) -> list[tuple[float, float]]:
        """Approximate interval of each position's live / profiled ratio (1 = as profiled)."""
        return self._acc.intervals(z)

    def step_time(self, batch_size: int, k: int) -> float:
        """Current step-time estimate of a profiled cell (KeyError if K was not measured there), on
        the machine as it runs now (the machine factor included)."""
        return self._itl.est[self._sizes.index(batch_size)][k] * math.exp(self._itl.machine)

    # ------------------------------------------------------------------ K

    def goodput(self, batch_size: int) -> dict[int, float]:
        """Live goodput estimate (tokens/s per request) of each candidate K at a profiled batch size."""
        return self._goodputs(self._sizes.index(batch_size), self._acc.ratios())

    def _goodputs(self, bi: int, r: list[float]) -> dict[int, float]:
        est = self._itl.est[bi]
        shared = [0.0]  # shift of the batch size's reference chain at each depth
        p = p0 = 1.0
        shift = 0.0
        for ri, q in zip(r, self._ref[bi]):
            x = ri * q
            p *= x if x < 1.0 else 1.0
            p0 *= q
            shift += p - p0
            shared.append(shift)
        out = {}
        for k, c in self._cells[bi].items():
            if c.shared:
                shift = shared[k]
            else:
                p, shift = 1.0, 0.0
                for ri, q, p0 in zip(r, c.q0, c.p0):
                    x = ri * q
                    p *= x if x < 1.0 else 1.0
                    shift += p - p0
            out[k] = min(k + 1.0, max(1.0, c.al + shift)) / est[k]
        return out

    def _decide(self, bi: int, current: int | None, r: list[float]) -> int:
        score = self._goodputs(bi, r)
        if current is not None:  # step times against the table's ratios: believed only beyond their noise
            self._weigh_step_times(bi, current, score)
        g0, handicap = self._g0[bi], self._handicap[bi]
        ratios = [v / g0[k] for k, v in score.items()]
        anchor = current if current is not None else self._table_k[self._sizes[bi]]
        level = 1.0 if anchor is None else score[anchor] / g0[anchor]  # the machine's level: cancels
        dist = max(math.log(max(ratios) / level), -math.log(min(ratios) / level))
        rho = 1.0 - dist / FADE
        if rho > 0:  # near the profile: a K that beat the table's K there carries that as a handicap
            for k, h in handicap.items():
                if h > 1.0:
                    score[k] /= h**rho
        best = max(score.values())
        if current is not None and best <= (1.0 + self.margin) * score[current]:
            return current
        new = choose_k(score, 1.0 - 1.0 / (1.0 + self.margin / 2))  # the K rule, inside the hysteresis band
        fade = 1.0 - (self._steps - self._left[bi].get(new, -SETTLE_STEPS)) / SETTLE_STEPS
        band = 1.0 + self.margin + SETTLE_MARGIN * fade
        if current is not None and fade > 0 and best <= band * score[current]:
            return current  # back to a K left in the last SETTLE_STEPS steps: a wider band (no flip-flop)
        return new

    def _weigh_step_times(self, bi: int, current: int, score: dict[int, float]) -> None:
        """Scale each candidate's score for what its step-time estimate is worth (module docstring,
        "Step-time evidence"). A move away from the table's K: its contrast to the table's ratio,
        c_K = log(est_K / T_K) - log(est_cur / T_cur), counts only beyond ``STEP_Z`` standard errors.
        Any other move: a thinly observed K must win by its uncertainty (at most margin / 2)."""
        itl = self._itl
        est, table, n, last = itl.est[bi], itl.table[bi], itl.n[bi], itl.last[bi]
        sigma = itl.noise_sd(bi)
        kt = self._table_k[self._sizes[bi]]
        away = -1 if kt is None else abs(current - kt)  # candidates farther from the table's K than this
        z = STEP_Z * (sigma or NOISE_PRIOR)
        base = est[current] / table[current]
        n_cur, t_cur = n[current], last[current]
        timed: list[int] | None = None  # the Ks timed here (and whether b's fit has a slope), once
        sloped = False
        for k in score:
            if k == current:
                continue
            if kt is None or abs(k - kt) <= away:
                score[k] /= 1.0 + min(self.margin / 2, sigma / math.sqrt(1.0 + n[k]))
                continue
            nk, tk = n[k], last[k]
            if timed is None:
                timed = [j for j, w in n.items() if w >= TIMED]
                sloped = sum(1 for w in n.values() if w >= 0.5) >= 2  # b's fit in K has a slope
            lever = 1.0
            if nk < TIMED:
                if sloped:  # its estimate is b's fit, extrapolated: the error grows with the distance
                    lever += min([abs(k - j) for j in timed], default=0)
                elif nk < 1.0:  # b's fit is a scale: K is known from the other batch sizes (its K effect)
                    nk, tk = itl.everywhere()[k]
            # the K served, last timed before K: discounted by the steps between (not side by side)
            nc = n_cur * 0.5 ** ((tk - t_cur) / SIDE_HALF_LIFE) if tk > t_cur else n_cur
            shrink = z * lever * math.sqrt(1.0 / (1.0 + nc) + 1.0 / (1.0 + nk))
            ratio, band = est[k] / table[k] / base, math.exp(shrink)  # exp(c_K), exp(the shrink)
            score[k] *= band if ratio > band else 1.0 / band if ratio * band < 1.0 else ratio

    def rebuild(self) -> bool:
        """Re-derive K at every profiled batch size (with hysteresis); swap the lookup if any moved."""
        self._pending = 0
        self._itl.refit()
        r = self._acc.ratios()
        changed = False
        for bi, b in enumerate(self._sizes):
            new = self._decide(bi, self._k[b], r)
            if new != self._k[b]:
                self._left[bi][self._k[b]] = self._steps
                self._k[b] = new
                self._since[bi] = 0
                changed = True
        if changed:
            self._swap()
        return changed

    def _swap(self) -> None:
        ranges = [(a, b, k) for a, b, k in ranges_from_points(list(self._k.items()))]
        lookup = build_lookup(ranges, self.max_k)
        self.ranges = tuple(ranges)
        self.select = lookup.__getitem__  # one attribute store: select() sees old or new, never half
        self._probe = None
        self.version += 1

    # ------------------------------------------------------------------ exploration

    def explore(self, max_batch_size: int) -> list[int] | None:
        """Call once per engine step before scheduling: a dense probe lookup (index = batch size)
        for ``PROBE_STEPS`` steps of every ``explore_every``, else None (serve :meth:`lookup_list`)."""
        every = self.explore_every
        if not every:
            return None
        tick = self._tick = self._tick + 1
        phase = (tick + PROBE_STEPS - 1) % every  # the last PROBE_STEPS steps of every period
        if phase >= PROBE_STEPS:
            return None
        if phase == 0 or self._probe is None or len(self._probe) != max_batch_size + 1:
            if phase == 0:
                self._probe_up = not self._probe_up
            points = [(b, self._neighbour(bi, self._k[b])) for bi, b in enumerate(self._sizes)]
            self._probe = lookup_list(ranges_from_points(points), self.max_k, max_batch_size)
        return self._probe

    def _neighbour(self, bi: int, k: int) -> int:
        ks = sorted(self._cells[bi])
        i = ks.index(k)
        down, up = ks[i - 1] if i > 0 else None, ks[i + 1] if i + 1 < len(ks) else None
        first, second = (up, down) if self._probe_up else (down, up)
        return first if first is not None else second if second is not None else k

    # ------------------------------------------------------------------ views

    @property
    def ks(self) -> dict[int, int]:
        """Current K at each profiled batch size."""
        return dict(self._k)

    @property
    def table_ks(self) -> dict[int, int | None]:
        """The table's K at each profiled batch size (None where it is not a candidate)."""
        return dict(self._table_k)

    def lookup_list(self, max_batch_size: int) -> list[int]:
        """``[0, K(1), ..., K(max_batch_size)]``: assignable to vLLM's scheduler ``dynamic_sd_lookup``."""
        return lookup_list(self.ranges, self.max_k, max_batch_size)

    def __call__(self, batch_size: int) -> int:
        return self.select(batch_size)

    def __repr__(self) -> str:
        return (f"AdaptiveKSelector(ks={self._k!r}, acceptance={[round(p, 3) for p in self.acceptance()]!r}, "
                f"version={self.version}, rejected={self.rejected})")
