"""The engine protocol: what a sweep needs from anything that can run (or predict) a cell."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from dsdprof.formats.measurements import MODE_DSD, MODE_FIXED, MODE_VANILLA


@dataclass(frozen=True, order=True)
class Cell:
    """One grid point: ``waves`` waves of exactly ``batch_size`` requests at K drafts."""

    repeat: int
    batch_size: int
    mode: str  # vanilla | dsd | fixed
    num_spec_tokens: int
    group: tuple[int, ...] = ()  # paired design: every K measured inside the same waves as this one

    @property
    def cell_id(self) -> str:
        return f"{self.mode}-bs{self.batch_size}-k{self.num_spec_tokens}-r{self.repeat}"


@dataclass(frozen=True)
class CellMeasurement:
    """What an engine reports for one finished cell (latencies in seconds).

    For vLLM the headline numbers come from the engine-core step trace over steady-state steps
    (:mod:`dsdprof.measure.vllm.trace`); the ``vllm_*`` fields are vLLM's own counters, histogram and
    request timestamps over the same waves, kept as independent cross-checks.
    """

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
    tokens_per_s_per_user: float
    tokens_per_s_total: float
    num_requests: int
    num_output_tokens: int
    wall_s: float
    drafted_per_draft: float = float("nan")
    steady_steps: int = 0
    excluded_steps: int = 0
    sample_acceptance_length: tuple[float, ...] = ()
    sample_itl_s: tuple[float, ...] = ()
    vllm_acceptance_length: float = float("nan")
    vllm_itl_s: float = float("nan")
    vllm_tpot_s: float = float("nan")
    vllm_drafted_per_draft: float = float("nan")
    trace_output_tokens: int = 0  # tokens the step trace saw delivered over the measured waves
    checks_failed: str = ""  # failed cross-checks, "name: by how much; ..." ("" = all passed)


@dataclass(frozen=True)
class Provenance:
    """Where a measurement came from; written into every row and every file's metadata."""

    engine: str
    engine_version: str
    model: str
    draft_model: str
    method: str
    hardware: str
    dtype: str
    dataset: str
    seed: int
    dsdprof_version: str
    extra: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """Runs or predicts cells. ``speculation_mode`` says how K > 0 cells run: ``dsd`` (one
    engine switching K per wave) or ``fixed`` (one engine per K). Vanilla cells (K = 0, no
    speculative config) are the baseline."""

    name: str
    speculation_mode: str

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


def plan_cells(batch_sizes: list[int], ks: list[int], repeats: int, speculation_mode: str,
               include_vanilla: bool = True, paired: bool = False) -> list[Cell]:
    """Cells in run order: repeats interleaved, the order inside a block rotated.

    DSD mode runs one block per batch size per repeat (vanilla and every K of that batch size, so
    drift hits all K alike); the block for repeat ``r`` and the ``i``-th batch size is ordered by
    row ``r + i`` of a Williams design (:func:`balanced_order`), so no cell is always first and
    none always follows the same cell. Fixed mode groups by K (one engine per K; vanilla is the
    K=0 engine) and loops batch sizes inside a group; the order of the groups is row ``r`` of the
    design. ``paired`` (DSD mode only): the DSD cells of a block carry ``group`` = every K, so the
    engine runs them inside the same waves; the block is then vanilla and the group, in design order.
    """
    if speculation_mode not in (MODE_DSD, MODE_FIXED):
        raise ValueError(f"speculation_mode={speculation_mode!r}")
    cells: list[Cell] = []
    for r in range(repeats):
        if speculation_mode == MODE_DSD:
            for i, b in enumerate(batch_sizes):
                if paired and ks:
                    vanilla = [[Cell(r, b, MODE_VANILLA, 0)]] if include_vanilla else []
                    blocks = vanilla + [[Cell(r, b, MODE_DSD, k, tuple(ks)) for k in ks]]
                    for j in balanced_order(len(blocks), r + i):
                        cells.extend(blocks[j])
                    continue
                block = ([Cell(r, b, MODE_VANILLA, 0)] if include_vanilla else []) + \
                    [Cell(r, b, MODE_DSD, k) for k in ks]
                cells.extend(block[j] for j in balanced_order(len(block), r + i))
        else:
            groups = ([[Cell(r, b, MODE_VANILLA, 0) for b in batch_sizes]] if include_vanilla else []) + \
                [[Cell(r, b, MODE_FIXED, k) for b in batch_sizes] for k in ks if k != 0]  # fixed K=0 is vanilla
            for j in balanced_order(len(groups), r):
                cells.extend(groups[j])
    return cells
