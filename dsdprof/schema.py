"""The one place that owns dsdprof's on-disk formats and their versions.

* Measurement rows (Parquet): :data:`MEASUREMENT_COLUMNS`, version :data:`MEASUREMENT_SCHEMA_VERSION`.
  Every Parquet file written by dsdprof carries the version and the run's provenance in its
  key-value metadata under :data:`PARQUET_METADATA_KEY`.
* The K table (JSON): :data:`TABLE_SCHEMA` and :func:`validate_table`.

This module is stdlib-only at import time so that ``dsdprof.runtime`` stays free of pandas,
pyarrow, torch and vllm; :func:`arrow_schema` imports pyarrow lazily.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MEASUREMENT_SCHEMA_VERSION = "dsdprof.measurements/v2"
# Every measurement version this dsdprof reads (v2 added columns; v1 files lack them).
READABLE_MEASUREMENT_VERSIONS = ("dsdprof.measurements/v1", "dsdprof.measurements/v2")
PARQUET_METADATA_KEY = b"dsdprof"
TABLE_SCHEMA = "dsdprof.ktable/v1"

# Values of the ``mode`` column.
MODE_VANILLA = "vanilla"  # engine started without any speculative config (the baseline)
MODE_DSD = "dsd"  # one engine in vLLM's dynamic-SD mode, K switched per wave
MODE_FIXED = "fixed"  # one engine per K (fallback for methods that cannot run in DSD mode)
MODES = (MODE_VANILLA, MODE_DSD, MODE_FIXED)

STATUS_OK = "ok"
STATUS_FAILED = "failed"

# The four columns any Parquet handed to ``analyze``/``export`` must have.
CONTRACT_COLUMNS = ("batch_size", "num_spec_tokens", "acceptance_length", "itl_s")


@dataclass(frozen=True)
class Column:
    name: str
    arrow_type: str  # "int64" | "float64" | "string" | "bool" | "list<float64>"
    doc: str


MEASUREMENT_COLUMNS: tuple[Column, ...] = (
    Column("cell_id", "string", "stable id of the grid cell: '<mode>-bs<B>-k<K>-r<repeat>'"),
    Column("mode", "string", "vanilla | dsd | fixed (how the engine ran this cell)"),
    Column("batch_size", "int64", "concurrent requests per wave (held exactly)"),
    Column("num_spec_tokens", "int64", "K, draft tokens proposed per step (0 = no speculation)"),
    Column("repeat", "int64", "repeat index of this cell within the sweep"),
    Column("status", "string", "ok | failed"),
    Column("error", "string", "error message for failed cells, empty otherwise"),
    Column("acceptance_length", "float64",
           "tokens DELIVERED per request per steady-state step (after trimming at max_tokens/EOS)"),
    Column("acceptance_per_pos", "list<float64>", "acceptance rate of draft position 1..K (steady steps)"),
    Column("num_drafts", "int64", "request-steps with a draft, over the steady-state steps"),
    Column("num_draft_tokens", "int64", "draft tokens scheduled in the steady-state steps"),
    Column("num_accepted_tokens", "int64", "draft tokens accepted in the steady-state steps (before trimming)"),
    Column("itl_s", "float64", "mean seconds per steady-state engine step (schedule+draft+verify)"),
    Column("itl_p50_s", "float64", "median steady-state step"),
    Column("itl_p90_s", "float64", "90th percentile steady-state step"),
    Column("itl_p99_s", "float64", "99th percentile steady-state step"),
    Column("tpot_s", "float64", "request-seconds per delivered token over the steady-state steps"),
    Column("tpot_p50_s", "float64", "median over requests of their steady-state TPOT"),
    Column("tpot_p90_s", "float64", "90th percentile of the requests' steady-state TPOT"),
    Column("tpot_p99_s", "float64", "99th percentile of the requests' steady-state TPOT"),
    Column("tokens_per_s_per_user", "float64", "delivered tokens/s seen by one request (1/tpot_s)"),
    Column("tokens_per_s_total", "float64", "delivered tokens/s of the whole engine over the measured waves"),
    Column("goodput_check", "float64", "(acceptance_length/itl_s) * tpot_s; 1 when the window is steady"),
    Column("consistent", "bool", "goodput_check within consistency_tolerance of 1"),
    Column("num_requests", "int64", "measured requests (waves x batch_size)"),
    Column("num_output_tokens", "int64", "delivered output tokens of the measured requests"),
    Column("wall_s", "float64", "wall-clock seconds of the measured waves"),
    Column("drafted_per_draft", "float64", "draft tokens per draft in the steady steps: the K actually run"),
    Column("steady_steps", "int64", "steps with exactly batch_size requests decoding at the row's K"),
    Column("excluded_steps", "int64", "steps of the measured waves that were not steady (prefill, tails)"),
    Column("sample_acceptance_length", "list<float64>", "acceptance_length of each measured wave"),
    Column("sample_itl_s", "list<float64>", "itl_s of each measured wave"),
    Column("vllm_acceptance_length", "float64", "cross-check: 1 + accepted/drafts from vLLM's counters (untrimmed)"),
    Column("vllm_itl_s", "float64", "cross-check: mean of vLLM's ITL histogram over the measured waves"),
    Column("vllm_tpot_s", "float64", "cross-check: mean TPOT from vLLM's request timestamps"),
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
PROVENANCE_FIELDS = (
    "engine", "engine_version", "model", "draft_model", "method", "hardware", "dtype",
    "dataset", "seed", "dsdprof_version",
)


def arrow_schema():  # -> pyarrow.Schema
    """The pyarrow schema of a measurement file (pyarrow imported lazily)."""
    import pyarrow as pa

    types = {
        "int64": pa.int64(), "float64": pa.float64(), "string": pa.string(), "bool": pa.bool_(),
        "list<float64>": pa.list_(pa.float64()),
    }
    return pa.schema([pa.field(c.name, types[c.arrow_type]) for c in MEASUREMENT_COLUMNS])


def empty_row() -> dict[str, Any]:
    """A row with every column present and null-ish defaults."""
    row: dict[str, Any] = {}
    for c in MEASUREMENT_COLUMNS:
        row[c.name] = {"string": "", "list<float64>": []}.get(c.arrow_type)
    return row


# --------------------------------------------------------------------------- table JSON

class TableError(ValueError):
    """A K table that does not follow ``dsdprof.ktable/v1`` (message names the field)."""


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_ranges(ranges: object, field: str = "ranges") -> list[tuple[int, int, int]]:
    """Check ``[[start, end, k], ...]``: ints, inclusive, first start 1, contiguous, sorted, K >= 0.

    Returns the ranges as tuples. Raises :class:`TableError` naming the field and value.
    """
    if not isinstance(ranges, list) or not ranges:
        raise TableError(f"{field}={ranges!r}: must be a non-empty list of [start, end, k]")
    out: list[tuple[int, int, int]] = []
    expected_start = 1
    for i, r in enumerate(ranges):
        where = f"{field}[{i}]"
        if not isinstance(r, (list, tuple)) or len(r) != 3 or not all(_is_int(v) for v in r):
            raise TableError(f"{where}={r!r}: must be [start, end, k] with three integers")
        start, end, k = r
        if start != expected_start:
            raise TableError(
                f"{where}={list(r)!r}: start must be {expected_start} "
                "(ranges start at 1 and are contiguous and sorted)")
        if end < start:
            raise TableError(f"{where}={list(r)!r}: end must be >= start")
        if k < 0:
            raise TableError(f"{where}={list(r)!r}: k must be >= 0")
        out.append((start, end, k))
        expected_start = end + 1
    return out


def validate_table(doc: object) -> dict[str, Any]:
    """Validate a parsed K-table document; return it unchanged. Raises :class:`TableError`."""
    if not isinstance(doc, dict):
        raise TableError(f"table={type(doc).__name__}: must be a JSON object")
    schema = doc.get("schema")
    if schema != TABLE_SCHEMA:
        raise TableError(f"schema={schema!r}: expected {TABLE_SCHEMA!r}")
    validate_ranges(doc.get("ranges"))
    points = doc.get("points", [])
    if not isinstance(points, list):
        raise TableError(f"points={points!r}: must be a list")
    for i, p in enumerate(points):
        if not isinstance(p, dict) or not _is_int(p.get("batch_size")) or not _is_int(p.get("k")):
            raise TableError(f"points[{i}]={p!r}: needs integer batch_size and k")
        for key in ("goodput", "acceptance_length", "itl_s"):
            v = p.get(key)
            if v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise TableError(f"points[{i}].{key}={v!r}: must be a finite number")
    prov = doc.get("provenance", {})
    if not isinstance(prov, dict):
        raise TableError(f"provenance={prov!r}: must be an object")
    return doc
