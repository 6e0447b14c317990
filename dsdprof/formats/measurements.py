"""Measurement rows (Parquet): the columns, their types and meanings, modes and statuses.

Stdlib only at import time; :func:`arrow_schema` imports pyarrow lazily. The versions live in
:mod:`dsdprof.formats.versions`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

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


MEASUREMENT_COLUMNS: tuple[Column, ...] = (
    Column("cell_id", "string", "stable id of the grid cell: '<mode>-bs<B>-k<K>-r<repeat>'"),
    Column("mode", "string", "vanilla | dsd | fixed | adaptive (how the engine ran this cell; adaptive: "
                             "validate only)"),
    Column("batch_size", "int64", "concurrent requests per wave (held exactly)"),
    Column("num_spec_tokens", "int64", "K, draft tokens proposed per step (0 = no speculation)"),
    Column("repeat", "int64", "repeat index of this cell within the sweep"),
    Column("status", "string", "ok | failed"),
    Column("error", "string", "error message for failed cells, empty otherwise"),
    Column("acceptance_length", "float64",
           "tokens the target produced (accepted drafts + bonus) per request per steady-state step, counted "
           "before vLLM trims at max_tokens/EOS (v1/v2 files: tokens delivered, after trimming); paired DSD "
           "rows "
           "(v7): tokens per step of a server held at K, replayed over every request's match sequence "
           "(`measure/vllm/replay.py`; v6 rows: 1 + sum over positions j <= K of P(at least j drafts "
           "accepted), "
           "each pooled over every request-step of the group that drafted j or more; v4/v5 paired rows: the "
           "K's "
           "own steps)"),
    Column("acceptance_length_own", "float64",
           "paired DSD rows: tokens per request-step of the steps that verified this K alone, checked "
           "against "
           "acceptance_length (check 'acceptance'); cells design and vanilla: = acceptance_length"),
    Column("acceptance_per_pos", "list<float64>",
           "acceptance rate of draft position 1..K (accepted at i / drafted at i, steady steps, untrimmed; "
           "paired DSD rows (v7): AL(i) - AL(i - 1) of servers held at i and i - 1, replayed, so 1 + their "
           "sum "
           "to K is the row's acceptance_length; v6: over every step of the group that drafted position i)"),
    Column("num_drafts", "int64", "request-steps with a draft, over the steady-state steps"),
    Column("num_draft_tokens", "int64", "draft tokens scheduled in the steady-state steps"),
    Column("num_accepted_tokens", "int64", "draft tokens accepted in the steady-state steps (before "
                                           "trimming)"),
    Column("itl_s", "float64", "mean seconds per steady-state engine step (schedule+draft+verify)"),
    Column("itl_p50_s", "float64", "median steady-state step"),
    Column("itl_p90_s", "float64", "90th percentile steady-state step"),
    Column("itl_p99_s", "float64", "99th percentile steady-state step"),
    Column("tpot_s", "float64", "request-seconds per produced token over the steady-state steps"),
    Column("tpot_p50_s", "float64", "median over requests of their steady-state TPOT"),
    Column("tpot_p90_s", "float64", "90th percentile of the requests' steady-state TPOT"),
    Column("tpot_p99_s", "float64", "99th percentile of the requests' steady-state TPOT"),
    Column("tokens_per_s_per_user", "float64", "tokens/s one request gets in steady state (1/tpot_s)"),
    Column("tokens_per_s_total", "float64", "delivered tokens/s of the whole engine over the measured waves"),
    Column("consistent", "bool", "every cross-check passed (checks_failed is empty)"),
    Column("checks_failed", "string",
           "failed cross-checks, 'name: detail' joined by '; ': tokens (trace vs what the requests "
           "received), "
           "drafts (vLLM's counters vs K), counters (trace vs vLLM's spec-decode counters), timing (BS 1: "
           "AL/ITL vs vLLM's request timestamps, within consistency_tolerance), acceptance (paired: the K's "
           "own "
           "steps vs the pooled acceptance_length, beyond 4 standard errors and 2 %)"),
    Column("num_requests", "int64", "measured requests (waves x batch_size)"),
    Column("num_output_tokens", "int64", "delivered output tokens of the measured requests"),
    Column("wall_s", "float64", "wall-clock seconds of the measured waves"),
    Column("drafted_per_draft", "float64", "draft tokens per draft in the steady steps: the K actually run"),
    Column("steady_steps", "int64", "steps with exactly batch_size requests decoding, every one at the row's "
                                    "K"),
    Column("excluded_steps", "int64", "steps of the measured waves that were not steady (prefill, tails)"),
    Column("sample_acceptance_length", "list<float64>", "acceptance_length of each measured wave"),
    Column("sample_itl_s", "list<float64>", "itl_s of each measured wave"),
    Column("design", "string",
           "cells (the row's own waves) | paired (every K of the batch size ran inside the same waves, K "
           "switched "
           "per step: sample i of every K of a repeat is the same wave; vanilla rows: its waves interleaved "
           "with "
           "that group's, wave by wave; validate rows: every variant of the batch size and repeat ran on its "
           "own "
           "engine, their waves interleaved one by one, or with --design steps every variant but vanilla "
           "inside "
           "the same waves of one engine, switched per step; v1-v3 files: cells)"),
    Column("sample_block", "list<int64>",
           "paired design: per wave sample, the wave block of its (batch size, repeat) it ran in; vanilla "
           "wave j "
           "ran right beside the DSD waves of block j, so the speedup bootstrap resamples blocks jointly; "
           "validate "
           "rows: the wave, paired across variants in the regret bootstrap (empty: cells design, v1-v4 "
           "files)"),
    Column("vllm_acceptance_length", "float64", "cross-check: 1 + accepted/drafts from vLLM's counters "
                                                "(untrimmed)"),
    Column("vllm_itl_s", "float64", "cross-check: mean of vLLM's ITL histogram over the measured waves"),
    Column("vllm_tpot_s", "float64", "cross-check: mean TPOT from vLLM's request timestamps"),
    Column("vllm_drafted_per_draft", "float64", "cross-check: draft tokens per draft from vLLM's counters"),
    Column("trace_output_tokens", "int64",
           "cross-check: tokens the step trace saw delivered over the measured waves (= num_output_tokens)"),
    Column("engine", "string", "vllm | sim (sim rows are predictions)"),
    Column("engine_version", "string", "engine library version"),
    Column("model", "string", "target model"),
    Column("draft_model", "string", "draft model (empty for ngram/suffix)"),
    Column("method", "string", "speculative method"),
    Column("hardware", "string", "GPU name or CPU model"),
    Column("dtype", "string", "weights/activations dtype"),
    Column("dataset", "string", "workload dataset"),
    Column("seed", "int64", "workload seed"),
    Column("dsdprof_version", "string", "dsdprof version that wrote the row"),
    Column("created_at", "string", "UTC ISO-8601 time the cell finished"),
)

COLUMN_NAMES = tuple(c.name for c in MEASUREMENT_COLUMNS)

# The one optional column: written only by a context sweep (``[sweep] context_lens``), so files of
# every other sweep keep exactly the columns above. Absent (or null) = the spec's ``input_len``.
CONTEXT_COLUMN = Column("context_len", "int64",
                        "prompt tokens each request held before its measured decode (context sweeps only; "
                        "absent = the spec's workload.input_len)")
OPTIONAL_COLUMN_NAMES = (CONTEXT_COLUMN.name,)
# One measurement row as Python holds it before it is written (keys: the columns above, in order;
# ``context_len`` only in a context sweep's files). :data:`PYTHON_TYPES` maps each column's arrow
# type to the type here (tests check that the two agree).
PYTHON_TYPES = {"int64": "int", "float64": "float", "string": "str", "bool": "bool",
                "list<float64>": "list[float]", "list<int64>": "list[int]"}


class MeasurementRow(TypedDict, total=False):
    """A measurement row (failed cells hold None where they have no number)."""

    cell_id: str | None
    mode: str | None
    batch_size: int | None
    num_spec_tokens: int | None
    repeat: int | None
    status: str | None
    error: str | None
    acceptance_length: float | None
    acceptance_length_own: float | None
    acceptance_per_pos: list[float] | None
    num_drafts: int | None
    num_draft_tokens: int | None
    num_accepted_tokens: int | None
    itl_s: float | None
    itl_p50_s: float | None
    itl_p90_s: float | None
    itl_p99_s: float | None
    tpot_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    tpot_p99_s: float | None
    tokens_per_s_per_user: float | None
    tokens_per_s_total: float | None
    consistent: bool | None
    checks_failed: str | None
    num_requests: int | None
    num_output_tokens: int | None
    wall_s: float | None
    drafted_per_draft: float | None
    steady_steps: int | None
    excluded_steps: int | None
    sample_acceptance_length: list[float] | None
    sample_itl_s: list[float] | None
    design: str | None
    sample_block: list[int] | None
    vllm_acceptance_length: float | None
    vllm_itl_s: float | None
    vllm_tpot_s: float | None
    vllm_drafted_per_draft: float | None
    trace_output_tokens: int | None
    engine: str | None
    engine_version: str | None
    model: str | None
    draft_model: str | None
    method: str | None
    hardware: str | None
    dtype: str | None
    dataset: str | None
    seed: int | None
    dsdprof_version: str | None
    created_at: str | None
    context_len: int | None


PROVENANCE_FIELDS = (
    "engine", "engine_version", "model", "draft_model", "method", "hardware", "dtype",
    "dataset", "seed", "dsdprof_version",
)


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
