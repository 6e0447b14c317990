"""The K table's keys and types, every version (``dsdprof.ktable/v1``, ``/v2``, ``/v3``): what
:func:`dsdprof.formats.ktable.validate_table` checks and returns. A table is JSON, so these are
``TypedDict`` s (plain dicts at run time); unknown keys are allowed (forward compatibility), the
known ones are listed here. Stdlib only.

* v1: ``ranges`` (what is served: ``[start, end, K]``, contiguous from batch size 1), optional
  ``num_speculative_tokens`` (a cap on K, as in vLLM), ``points`` (the profiled optimum per batch
  size), ``provenance`` and descriptive keys.
* v2: v1 plus ``cells`` -- the measured step time and acceptance length of every profiled (batch
  size, K) -- and ``acceptance_per_pos``, the profiled per-position acceptance p_i (accepted at
  position i / drafts), so K can be re-derived for another acceptance (:mod:`dsdprof.serve.adaptive`).
* v3: v2 (its top level is the slice of ``default_context``, the shortest profiled context) plus
  ``contexts``: slices sorted by ``max_context``; a request context C is served by the first slice
  with C <= max_context, contexts past the last by the last.
* any version: ``vanilla_faster`` -- where a vanilla engine measured faster than every K.
"""

from __future__ import annotations

from typing import TypedDict

from dsdprof.formats.jsontypes import ProvenanceRecord


class _PointKeys(TypedDict):
    batch_size: int
    k: int


class TablePoint(_PointKeys, total=False):
    """``points[i]``: the K chosen at a profiled batch size and how sure it is."""

    goodput: float
    acceptance_length: float
    itl_s: float
    speedup_vs_baseline: float | None
    speedup_vs_fixed_k: dict[str, float]  # "K" -> goodput of the chosen K / goodput of K
    decided: bool | None
    runner_up: int | None
    margin: float | None
    ci_low: float | None
    ci_high: float | None


class _CellKeys(_PointKeys):
    itl_s: float
    acceptance_length: float


class TableCell(_CellKeys, total=False):
    """``cells[i]`` (v2, v3): one measured (batch size, K)."""

    goodput: float
    acceptance_per_pos: list[float]


class _VanillaKeys(TypedDict):
    start: int
    end: int
    gain: float


class VanillaRecord(_VanillaKeys, total=False):
    """``vanilla_faster[i]``: batch sizes ``start..end`` where vanilla beat every K by ``gain``."""

    ci_low: float | None
    ci_high: float | None
    batch_size: int
    k: int


class _Served(TypedDict, total=False):
    """What a table and each of its context slices both hold (besides ``ranges``)."""

    num_speculative_tokens: int
    points: list[TablePoint]
    cells: list[TableCell]  # v2, v3
    acceptance_per_pos: list[float] | None  # v2, v3
    vanilla_faster: list[VanillaRecord]


class _RangesKey(TypedDict):
    ranges: list[list[int]]


class ServedTable(_RangesKey, _Served, total=False):
    """What an engine's config reads of a table (a :class:`KTable`, or the view of one context
    slice that ``dsdprof.export.context.served_view`` cuts): ranges, cap, provenance,
    ``vanilla_faster``."""

    provenance: ProvenanceRecord


class _SliceKeys(_RangesKey):
    max_context: int


class ContextSlice(_SliceKeys, _Served, total=False):
    """``contexts[i]`` (v3): the v2 keys of the table profiled at ``context_len``."""

    context_len: int
    partial: str


class _TableKeys(_RangesKey):
    schema: str


class KTable(_TableKeys, _Served, total=False):
    """A K table, any version (``schema``)."""

    interpolation: str
    tolerance: float
    shape: str
    provenance: ProvenanceRecord
    default_context: int  # v3
    context_interpolation: str  # v3
    contexts: list[ContextSlice]  # v3
    contexts_skipped: dict[str, str]  # v3: context -> why it has no slice
