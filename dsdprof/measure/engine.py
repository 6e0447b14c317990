"""The engine protocol: what a sweep needs from anything that can run (or predict) a cell."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

from dsdprof.formats.measurements import MODE_DSD, MODE_FIXED, MODE_VANILLA, Provenance


@dataclass(frozen=True, order=True)
class Cell:
    """One grid point: ``waves`` waves of exactly ``batch_size`` requests at K drafts."""

    repeat: int
    batch_size: int
    mode: str  # vanilla | dsd | fixed
    num_spec_tokens: int
    context_len: int = 0  # prompt tokens per request; 0 = the spec's workload.input_len (no context axis)
    group: tuple[int, ...] = ()  # paired design: every K measured inside the same waves as this one
    # (a vanilla cell with a group: its waves interleave with that group's, one per wave block)
    interleave: tuple[tuple[str, int], ...] = ()  # validate's paired design: the (mode, K) of every
    # variant of this batch size and repeat, each on its own engine, their waves interleaved one by one

    @property
    def unit(self) -> tuple | None:
        """Paired design: the cells measured together (a batch size's vanilla cell and DSD group of
        one repeat, or validate's variants of one batch size and repeat); None for a cell of its own."""
        if self.group:
            return (self.repeat, self.batch_size, self.context_len, self.group)
        return (self.repeat, self.batch_size, self.context_len, self.interleave) if self.interleave else None

    @property
    def cell_id(self) -> str:
        base = f"{self.mode}-bs{self.batch_size}-k{self.num_spec_tokens}-r{self.repeat}"
        return f"{base}-c{self.context_len}" if self.context_len else base


@dataclass(frozen=True)
class StepStats:
    """The headline numbers of a cell over its steady-state steps: declared once, shared by the
    step trace's summary (:class:`dsdprof.measure.vllm.trace.TraceSummary`) and the cell's
    measurement (:class:`CellMeasurement`); their meaning is in
    :data:`dsdprof.formats.measurements.MEASUREMENT_COLUMNS` (a test keeps the three in step)."""

    acceptance_length: float
    acceptance_per_pos: tuple[float, ...]
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    itl_s: float
    itl_p50_s: float
    itl_p90_s: float
    itl_p99_s: float
    tpot_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float

    def step_stats(self) -> dict:
        """These fields as keyword arguments (to build another record from them)."""
        return {f.name: getattr(self, f.name) for f in fields(StepStats)}


@dataclass(frozen=True)
class CellMeasurement(StepStats):
    """What an engine reports for one finished cell (latencies in seconds).

    For vLLM the headline numbers (:class:`StepStats`) come from the engine-core step trace over
    steady-state steps (:mod:`dsdprof.measure.vllm.trace`); the ``vllm_*`` fields are vLLM's own
    counters, histogram and request timestamps over the same waves, kept as independent cross-checks.
    """

    tokens_per_s_per_user: float
    tokens_per_s_total: float
    num_requests: int
    num_output_tokens: int
    wall_s: float
    drafted_per_draft: float = float("nan")
    acceptance_length_own: float = float("nan")  # paired: the K's own steps (acceptance_length is pooled)
    steady_steps: int = 0
    excluded_steps: int = 0
    sample_acceptance_length: tuple[float, ...] = ()
    sample_itl_s: tuple[float, ...] = ()
    sample_block: tuple[int, ...] = ()  # paired design: the wave block each sample ran in (see vanilla_waves)
    vllm_acceptance_length: float = float("nan")
    vllm_itl_s: float = float("nan")
    vllm_tpot_s: float = float("nan")
    vllm_drafted_per_draft: float = float("nan")
    trace_output_tokens: int = 0  # tokens the step trace saw delivered over the measured waves
    checks_failed: str = ""  # failed cross-checks, "name: by how much; ..." ("" = all passed)


@runtime_checkable
class Engine(Protocol):
    """Runs or predicts cells. ``speculation_mode`` says how K > 0 cells run: ``dsd`` (one
    engine switching K per wave) or ``fixed`` (one engine per K). Vanilla cells (K = 0, no
    speculative config) are the baseline."""

    name: str

    @property
    def speculation_mode(self) -> str: ...

    def provenance(self) -> Provenance: ...

    def measure(self, cell: Cell) -> CellMeasurement: ...

    def close(self) -> None: ...


def balanced_order(m: int, s: int) -> list[int]:
    """Row ``s`` of a Williams design over ``m`` items: a permutation of ``range(m)``.

    Over ``m`` consecutive rows (``2m`` when ``m`` is odd) every item takes every position equally
    often and follows every other item equally often, so neither "first in the block" nor "right
    after X" effects stay with one item.
    """
    if m <= 0:
        return []
    base = [0]
    lo, hi = 1, m - 1
    while len(base) < m:
        base.append(lo)
        lo += 1
        if len(base) < m:
            base.append(hi)
            hi -= 1
    period = m if m % 2 == 0 else 2 * m
    s %= period
    row = [(x + s) % m for x in base]
    return row[::-1] if s >= m else row


VANILLA_MIN_WAVES = 2  # vanilla's waves bracket the group's: a drift's linear part cancels in its ratio


def vanilla_waves(waves: int, group_size: int) -> int:
    """Measured vanilla waves beside a paired group of ``group_size`` Ks sharing ``waves`` waves: one
    K's share, ``ceil(waves / group_size)``, and at least :data:`VANILLA_MIN_WAVES` (warm-up waves come
    on top). Vanilla is one baseline, not one row per K, so it costs the engine time of one K, not of
    the whole group; with fewer waves than Ks one K's share would be one wave, run wholly before or
    after the group's, and a machine's drift over the group's waves would go into vanilla's ratio to
    every K (:func:`unit_layout`)."""
    return max(VANILLA_MIN_WAVES, math.ceil(waves / max(1, group_size)))


def wave_blocks(waves: int, blocks: int) -> list[range]:
    """The group's ``waves`` measured waves cut into ``blocks`` contiguous blocks, as equal as can be
    (the first ones one wave longer): block ``j`` runs right beside vanilla wave ``j``."""
    blocks = max(1, min(blocks, waves))
    base, extra = divmod(waves, blocks)
    out, start = [], 0
    for j in range(blocks):
        stop = start + base + (1 if j < extra else 0)
        out.append(range(start, stop))
        start = stop
    return out


@dataclass(frozen=True)
class UnitLayout:
    """How a paired unit's two engines take turns: the group's waves cut into ``blocks``, the block of
    each vanilla wave (``vanilla_block``) and the run order, ``spans``: (the group's turn?, first wave,
    stop) of the group's waves or of vanilla's."""

    blocks: tuple[range, ...]
    vanilla_block: tuple[int, ...]
    spans: tuple[tuple[bool, int, int], ...]


def unit_layout(waves: int, group_size: int, rot: int = 0) -> UnitLayout:
    """The paired unit's layout: :func:`vanilla_waves` blocks of the group's ``waves`` waves, vanilla
    wave ``j`` right beside block ``j``, the group first in block ``j`` when ``j + rot`` is even, so two
    consecutive blocks run group-vanilla-vanilla-group (or the reverse) and a drift linear in time
    lengthens vanilla's waves and the group's alike. Vanilla's two waves (fewer waves than twice the
    Ks) make the whole unit a palindrome, its waves and the group's centred on the same time: an odd
    group wave count puts the last wave of block 0 between vanilla's two (group^k, vanilla, group,
    vanilla, group^k), and a group of one wave (one block) sits between vanilla's waves, both in
    block 0. What stays: the second engine's warm-up waves run between the two engines' measured
    waves (half a warm-up of drift, its sign flipping with ``rot``)."""
    n = vanilla_waves(waves, group_size)
    blocks = wave_blocks(waves, n)
    if len(blocks) < n:  # one group wave: vanilla, the group, vanilla
        return UnitLayout(tuple(blocks), (0,) * n,
                          ((False, 0, 1), (True, 0, waves), *((False, j, j + 1) for j in range(1, n))))
    if n == 2 and waves % 2 and rot % 2 == 0:  # group^k, vanilla, group, vanilla, group^k
        k = waves // 2
        odd = ((True, 0, k), (False, 0, 1), (True, k, k + 1), (False, 1, 2), (True, k + 1, waves))
        return UnitLayout(tuple(blocks), (0, 1), tuple(x for x in odd if x[2] > x[1]))
    spans: list[tuple[bool, int, int]] = []
    for j, r in enumerate(blocks):
        pair = [(True, r.start, r.stop), (False, j, j + 1)]
        spans += pair if (j + rot) % 2 == 0 else pair[::-1]
    return UnitLayout(tuple(blocks), tuple(range(n)), tuple(spans))


def plan_cells(batch_sizes: list[int], ks: list[int], repeats: int, speculation_mode: str,
               include_vanilla: bool = True, context_lens: list[int] | None = None,
               paired: bool = False) -> list[Cell]:
    """The cells of :func:`iter_cells` as a list."""
    return list(iter_cells(batch_sizes, ks, repeats, speculation_mode, include_vanilla, context_lens, paired))


def iter_cells(batch_sizes: list[int], ks: list[int], repeats: int, speculation_mode: str,
               include_vanilla: bool = True, context_lens: list[int] | None = None,
               paired: bool = False) -> Iterator[Cell]:
    """Cells in run order, built as they are consumed: repeats interleaved, the order inside a
    block rotated.

    DSD mode runs one block per batch size per repeat (vanilla and every K of that batch size, so
    drift hits all K alike); the block for repeat ``r`` and the ``i``-th batch size is ordered by
    row ``r + i`` of a Williams design (:func:`balanced_order`), so no cell is always first and
    none always follows the same cell. Fixed mode groups by K (one engine per K; vanilla is the
    K=0 engine) and loops batch sizes inside a group; the order of the groups is row ``r`` of the
    design. ``paired`` (DSD mode only): every cell of a block carries ``group`` = every K, so the
    engine runs the DSD cells inside the same waves and the vanilla cell's waves interleaved with
    theirs, wave block by wave block (one unit: its rows are measured, and re-measured, together).
    """
    if speculation_mode not in (MODE_DSD, MODE_FIXED):
        raise ValueError(f"speculation_mode={speculation_mode!r}")
    if context_lens:
        yield from _plan_contexts(batch_sizes, ks, repeats, speculation_mode, include_vanilla, context_lens)
        return
    for r in range(repeats):
        if speculation_mode == MODE_DSD:
            for i, b in enumerate(batch_sizes):
                g = tuple(ks) if paired and ks else ()
                block = ([Cell(r, b, MODE_VANILLA, 0, group=g)] if include_vanilla else []) + \
                    [Cell(r, b, MODE_DSD, k, group=g) for k in ks]
                yield from (block[j] for j in balanced_order(len(block), r + i))
        else:
            groups = ([(MODE_VANILLA, 0)] if include_vanilla else []) + \
                [(MODE_FIXED, k) for k in ks if k != 0]  # fixed K=0 is vanilla
            for j in balanced_order(len(groups), r):
                yield from (Cell(r, b, groups[j][0], groups[j][1]) for b in batch_sizes)


def _plan_contexts(batch_sizes: list[int], ks: list[int], repeats: int, speculation_mode: str,
                   include_vanilla: bool, context_lens: list[int]) -> Iterator[Cell]:
    """:func:`plan_cells` over a context axis. DSD: inside each repeat the grid of every context in
    turn (contexts rotate with the repeat, so none always runs first); the block of the ``i``-th
    batch size at the ``c``-th context is ordered by Williams row ``r + c + i``. Fixed: the K groups
    (one engine each, ordered by row ``r``) stay outermost, every context's batch sizes inside."""
    n = len(context_lens)
    for r in range(repeats):
        if speculation_mode == MODE_FIXED:
            groups = (([(MODE_VANILLA, 0)] if include_vanilla else [])
                      + [(MODE_FIXED, k) for k in ks if k != 0])
            for g in balanced_order(len(groups), r):
                mode, k = groups[g]
                yield from (Cell(r, b, mode, k, context_lens[(j + r) % n]) for j in range(n)
                            for b in batch_sizes)
            continue
        for j in range(n):
            ci = (j + r) % n
            for i, b in enumerate(batch_sizes):
                block = ([Cell(r, b, MODE_VANILLA, 0, context_lens[ci])] if include_vanilla else []) + \
                    [Cell(r, b, MODE_DSD, k, context_lens[ci]) for k in ks]
                yield from (block[x] for x in balanced_order(len(block), r + ci + i))
