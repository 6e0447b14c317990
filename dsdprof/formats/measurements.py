"""Measurement rows (Parquet): the columns, their types and meanings, modes and statuses.

Stdlib only at import time; :func:`arrow_schema` imports pyarrow lazily. The versions live in
:mod:`dsdprof.formats.versions`.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, TypedDict, cast

# Values of the ``mode`` column.
MODE_VANILLA = "vanilla"  # engine started without any speculative config (the baseline)
MODE_DSD = "dsd"  # one engine in vLLM's dynamic-SD mode, K switched per wave
MODE_FIXED = "fixed"  # one engine per K (fallback for methods that cannot run in DSD mode)
MODE_ADAPTIVE = "adaptive"  # validate only: the table served by dsdprof's adaptive vLLM scheduler
MODES = (MODE_VANILLA, MODE_DSD, MODE_FIXED, MODE_ADAPTIVE)

STATUS_OK = "ok"
STATUS_FAILED = "failed"

# The four columns any Parquet handed to ``analyze``/``export`` must have.
CONTRACT_COLUMNS = ("batch_size", "num_spec_tokens", "acceptance_length", "itl_s")


@dataclass(frozen=True)
class Column:
    name: str
    arrow_type: str  # "int64" | "float64" | "string" | "bool" | "list<float64>" | "list<int64>"
    doc: str


# The arrow type of each Python type a row holds (``X | None`` is stored as ``X``, null when None).
ARROW_TYPES: dict[object, str] = {int: "int64", float: "float64", str: "string", bool: "bool",
                                  list[float]: "list<float64>", list[int]: "list<int64>"}


def row_columns(row: type) -> tuple[Column, ...]:
    """The columns a row ``TypedDict`` declares, in its key order: each key's name, the arrow type of
    its Python type and its meaning (the text of the key's ``Annotated``)."""
    columns = []
    for name, hint in typing.get_type_hints(row, include_extras=True).items():
        if typing.get_origin(hint) is not Annotated:
            raise TypeError(f"{row.__name__}.{name}: declare it as Annotated[type, meaning]")
        python_type, doc = typing.get_args(hint)
        if isinstance(python_type, UnionType):  # X | None
            python_type = next(a for a in typing.get_args(python_type) if a is not type(None))
        columns.append(Column(name, ARROW_TYPES[python_type], doc))
    return tuple(columns)


class ProvenanceColumns(TypedDict, total=False):
    """Where a row came from: the same columns, in this order, in measurement and rollout files
    (an engine reports them as a :class:`Provenance`)."""

    engine: Annotated[str, "vllm | sim (sim rows are predictions)"]
    engine_version: Annotated[str, "engine library version"]
    model: Annotated[str, "target model"]
    draft_model: Annotated[str, "draft model (empty for ngram/suffix)"]
    method: Annotated[str, "speculative method"]
    hardware: Annotated[str, "GPU name or CPU model"]
    dtype: Annotated[str, "weights/activations dtype"]
    dataset: Annotated[str, "workload dataset"]
    seed: Annotated[int, "workload seed"]
    dsdprof_version: Annotated[str, "dsdprof version that wrote the row"]


class Provenance(ProvenanceColumns, total=False):
    """What an engine reports (:meth:`dsdprof.measure.engine.Engine.provenance`): the provenance
    columns, and ``extra`` (in the run's manifest and files' metadata as ``extra_<key>``)."""

    extra: dict[str, str]


class _CellColumns(TypedDict, total=False):
    cell_id: Annotated[str | None, "stable id of the grid cell: '<mode>-bs<B>-k<K>-r<repeat>'"]
    mode: Annotated[str | None, "vanilla | dsd | fixed | adaptive (how the engine ran this cell; adaptive: "
                    "validate only)"]
    batch_size: Annotated[int | None, "concurrent requests per wave (held exactly)"]
    num_spec_tokens: Annotated[int | None, "K, draft tokens proposed per step (0 = no speculation)"]
    repeat: Annotated[int | None, "repeat index of this cell within the sweep"]
    status: Annotated[str | None, "ok | failed"]
    error: Annotated[str | None, "error message for failed cells, empty otherwise"]
    acceptance_length: Annotated[float | None, "tokens the target produced (accepted drafts + bonus) per "
                                 "request per steady-state step, counted before vLLM trims at max_tokens/EOS "
                                 "(v1/v2 files: tokens delivered, after trimming); paired DSD rows (v7): "
                                 "tokens per step of a server held at K, replayed over every request's match "
                                 "sequence (`measure/vllm/replay.py`; v6 rows: 1 + sum over positions j <= K "
                                 "of P(at least j drafts accepted), each pooled over every request-step of "
                                 "the group that drafted j or more; v4/v5 paired rows: the K's own steps)"]
    acceptance_length_own: Annotated[float | None, "paired DSD rows: tokens per request-step of the steps "
                                     "that verified this K alone, checked against acceptance_length (check "
                                     "'acceptance'); cells design and vanilla: = acceptance_length"]
    acceptance_per_pos: Annotated[list[float] | None, "acceptance rate of draft position 1..K (accepted at i "
                                  "/ drafted at i, steady steps, untrimmed; paired DSD rows (v7): AL(i) - "
                                  "AL(i - 1) of servers held at i and i - 1, replayed, so 1 + their sum to K "
                                  "is the row's acceptance_length; v6: over every step of the group that "
                                  "drafted position i)"]
    num_drafts: Annotated[int | None, "request-steps with a draft, over the steady-state steps"]
    num_draft_tokens: Annotated[int | None, "draft tokens scheduled in the steady-state steps"]
    num_accepted_tokens: Annotated[int | None, "draft tokens accepted in the steady-state steps (before "
                                   "trimming)"]
    itl_s: Annotated[float | None, "mean seconds per steady-state engine step (schedule+draft+verify)"]
    itl_p50_s: Annotated[float | None, "median steady-state step"]
    itl_p90_s: Annotated[float | None, "90th percentile steady-state step"]
    itl_p99_s: Annotated[float | None, "99th percentile steady-state step"]
    tpot_s: Annotated[float | None, "request-seconds per produced token over the steady-state steps"]
    tpot_p50_s: Annotated[float | None, "median over requests of their steady-state TPOT"]
    tpot_p90_s: Annotated[float | None, "90th percentile of the requests' steady-state TPOT"]
    tpot_p99_s: Annotated[float | None, "99th percentile of the requests' steady-state TPOT"]
    tokens_per_s_per_user: Annotated[float | None, "tokens/s one request gets in steady state (1/tpot_s)"]
    tokens_per_s_total: Annotated[float | None, "delivered tokens/s of the whole engine over the measured "
                                  "waves"]
    consistent: Annotated[bool | None, "every cross-check passed (checks_failed is empty)"]
    checks_failed: Annotated[str | None, "failed cross-checks, 'name: detail' joined by '; ': tokens (trace "
                             "vs what the requests received), drafts (vLLM's counters vs K), counters (trace "
                             "vs vLLM's spec-decode counters), timing (BS 1: AL/ITL vs vLLM's request "
                             "timestamps, within consistency_tolerance), acceptance (paired: the K's own "
                             "steps vs the pooled acceptance_length, beyond 4 standard errors and 2 %)"]
    num_requests: Annotated[int | None, "measured requests (waves x batch_size)"]
    num_output_tokens: Annotated[int | None, "delivered output tokens of the measured requests"]
    wall_s: Annotated[float | None, "wall-clock seconds of the measured waves"]
    drafted_per_draft: Annotated[float | None, "draft tokens per draft in the steady steps: the K actually "
                                 "run"]
    steady_steps: Annotated[int | None, "steps with exactly batch_size requests decoding, every one at the "
                            "row's K"]
    excluded_steps: Annotated[int | None, "steps of the measured waves that were not steady (prefill, tails)"]
    sample_acceptance_length: Annotated[list[float] | None, "acceptance_length of each measured wave"]
    sample_itl_s: Annotated[list[float] | None, "itl_s of each measured wave"]
    design: Annotated[str | None, "cells (the row's own waves) | paired (every K of the batch size ran "
                      "inside the same waves, K switched per step: sample i of every K of a repeat is the "
                      "same wave; vanilla rows: its waves interleaved with that group's, wave by wave; "
                      "validate rows: every variant of the batch size and repeat ran on its own engine, "
                      "their waves interleaved one by one, or with --design steps every variant but vanilla "
                      "inside the same waves of one engine, switched per step; v1-v3 files: cells)"]
    sample_block: Annotated[list[int] | None, "paired design: per wave sample, the wave block of its (batch "
                            "size, repeat) it ran in; vanilla wave j ran right beside the DSD waves of block "
                            "j, so the speedup bootstrap resamples blocks jointly; validate rows: the wave, "
                            "paired across variants in the regret bootstrap (empty: cells design, v1-v4 "
                            "files)"]
    vllm_acceptance_length: Annotated[float | None, "cross-check: 1 + accepted/drafts from vLLM's counters "
                                      "(untrimmed)"]
    vllm_itl_s: Annotated[float | None, "cross-check: mean of vLLM's ITL histogram over the measured waves"]
    vllm_tpot_s: Annotated[float | None, "cross-check: mean TPOT from vLLM's request timestamps"]
    vllm_drafted_per_draft: Annotated[float | None, "cross-check: draft tokens per draft from vLLM's "
                                      "counters"]
    trace_output_tokens: Annotated[int | None, "cross-check: tokens the step trace saw delivered over the "
                                   "measured waves (= num_output_tokens)"]


class MeasurementRow(_CellColumns, ProvenanceColumns, total=False):
    """A measurement row as Python holds it before it is written: each key a column of the file, in
    order, with its Python type (failed cells hold None where they have no number) and its meaning.
    ``context_len`` is the one optional column: written only by a context sweep (``[sweep]
    context_lens``), so files of every other sweep keep exactly the other columns; absent (or null)
    = the spec's ``input_len``."""

    created_at: Annotated[str | None, "UTC ISO-8601 time the cell finished"]
    context_len: Annotated[int | None, "prompt tokens each request held before its measured decode (context "
                           "sweeps only; absent = the spec's workload.input_len)"]


_ROW_COLUMNS = row_columns(MeasurementRow)
MEASUREMENT_COLUMNS: tuple[Column, ...] = tuple(c for c in _ROW_COLUMNS if c.name != "context_len")
COLUMN_NAMES = tuple(c.name for c in MEASUREMENT_COLUMNS)
CONTEXT_COLUMN = _ROW_COLUMNS[-1]
OPTIONAL_COLUMN_NAMES = (CONTEXT_COLUMN.name,)
PROVENANCE_FIELDS = tuple(typing.get_type_hints(ProvenanceColumns))


def columns_schema(columns: Sequence[Column]) -> Any:  # a pyarrow.Schema
    """The pyarrow schema of ``columns``, in order (pyarrow imported lazily: formats/ is stdlib only)."""
    import pyarrow as pa

    types = {
        "int64": pa.int64(), "float64": pa.float64(), "string": pa.string(), "bool": pa.bool_(),
        "list<float64>": pa.list_(pa.float64()), "list<int64>": pa.list_(pa.int64()),
    }
    return pa.schema([pa.field(c.name, types[c.arrow_type]) for c in columns])


def arrow_schema(with_context: bool = False) -> Any:  # a pyarrow.Schema
    """The pyarrow schema of a measurement file; ``with_context`` adds :data:`CONTEXT_COLUMN` (last, so
    every other column keeps its place)."""
    return columns_schema(MEASUREMENT_COLUMNS + ((CONTEXT_COLUMN,) if with_context else ()))


def empty_row() -> MeasurementRow:
    """A row with every column present and null-ish defaults (the keys of a :class:`MeasurementRow`)."""
    row: dict[str, Any] = {}
    for c in MEASUREMENT_COLUMNS:
        row[c.name] = {"string": "", "list<float64>": [], "list<int64>": []}.get(c.arrow_type)
    return cast(MeasurementRow, row)


def row_values(values: Mapping[str, Any], strict: bool = True) -> MeasurementRow:
    """``values`` (a measurement's fields, a run's provenance) as a partial :class:`MeasurementRow`:
    the keys that are measurement columns. ``strict``: any other key is a ValueError naming it
    (a field no column stores); else it is left out."""
    names = set(COLUMN_NAMES) | set(OPTIONAL_COLUMN_NAMES)
    unknown = sorted(set(values) - names)
    if strict and unknown:
        raise ValueError(f"unknown measurement columns {unknown}")
    return cast(MeasurementRow, {k: v for k, v in values.items() if k in names})
