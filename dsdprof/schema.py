"""The one place that owns dsdprof's on-disk formats and their versions.

* Measurement rows (Parquet): :data:`MEASUREMENT_COLUMNS`, version :data:`MEASUREMENT_SCHEMA_VERSION`.
  Every Parquet file written by dsdprof carries the version and the run's provenance in its
  key-value metadata under :data:`PARQUET_METADATA_KEY`.
* The K table (JSON): :data:`TABLE_SCHEMA` (v2; v1 still loads), :func:`validate_table` and
  :func:`read_table_file` -- the one validator behind ``show``, ``export``, ``validate`` and
  ``dsdprof.runtime``.

This module is stdlib-only at import time so that ``dsdprof.runtime`` stays free of pandas,
pyarrow, torch and vllm; :func:`arrow_schema` imports pyarrow lazily.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MEASUREMENT_SCHEMA_VERSION = "dsdprof.measurements/v3"
# Every measurement version this dsdprof reads (v2 added columns, v1 files lack them; v3 counts
# acceptance_length untrimmed, drops the identity goodput_check and adds the cross-check columns
# vllm_drafted_per_draft, trace_output_tokens, checks_failed -- v1/v2 files lack them).
READABLE_MEASUREMENT_VERSIONS = ("dsdprof.measurements/v1", "dsdprof.measurements/v2", "dsdprof.measurements/v3")
PARQUET_METADATA_KEY = b"dsdprof"
TABLE_SCHEMA = "dsdprof.ktable/v2"  # the K-table version dsdprof writes (v1 still loads)

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
    arrow_type: str  # "int64" | "float64" | "string" | "bool" | "list<float64>"
    doc: str


MEASUREMENT_COLUMNS: tuple[Column, ...] = (
    Column("cell_id", "string", "stable id of the grid cell: '<mode>-bs<B>-k<K>-r<repeat>'"),
    Column("mode", "string", "vanilla | dsd | fixed | adaptive (how the engine ran this cell; adaptive: validate only)"),
    Column("batch_size", "int64", "concurrent requests per wave (held exactly)"),
    Column("num_spec_tokens", "int64", "K, draft tokens proposed per step (0 = no speculation)"),
    Column("repeat", "int64", "repeat index of this cell within the sweep"),
    Column("status", "string", "ok | failed"),
    Column("error", "string", "error message for failed cells, empty otherwise"),
    Column("acceptance_length", "float64",
           "tokens the target produced (accepted drafts + bonus) per request per steady-state step, counted "
           "before vLLM trims at max_tokens/EOS (v1/v2 files: tokens delivered, after trimming)"),
    Column("acceptance_per_pos", "list<float64>",
           "acceptance rate of draft position 1..K (accepted at i / drafted at i, steady steps, untrimmed)"),
    Column("num_drafts", "int64", "request-steps with a draft, over the steady-state steps"),
    Column("num_draft_tokens", "int64", "draft tokens scheduled in the steady-state steps"),
    Column("num_accepted_tokens", "int64", "draft tokens accepted in the steady-state steps (before trimming)"),
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
           "failed cross-checks, 'name: detail' joined by '; ': tokens (trace vs what the requests received), "
           "drafts (vLLM's counters vs K), counters (trace vs vLLM's spec-decode counters), timing (BS 1: "
           "AL/ITL vs vLLM's request timestamps, within consistency_tolerance)"),
    Column("num_requests", "int64", "measured requests (waves x batch_size)"),
    Column("num_output_tokens", "int64", "delivered output tokens of the measured requests"),
    Column("wall_s", "float64", "wall-clock seconds of the measured waves"),
    Column("drafted_per_draft", "float64", "draft tokens per draft in the steady steps: the K actually run"),
    Column("steady_steps", "int64", "steps with exactly batch_size requests decoding, every one at the row's K"),
    Column("excluded_steps", "int64", "steps of the measured waves that were not steady (prefill, tails)"),
    Column("sample_acceptance_length", "list<float64>", "acceptance_length of each measured wave"),
    Column("sample_itl_s", "list<float64>", "itl_s of each measured wave"),
    Column("vllm_acceptance_length", "float64", "cross-check: 1 + accepted/drafts from vLLM's counters (untrimmed)"),
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
#
# dsdprof.ktable/v1: ``ranges`` (what is served), optional ``num_speculative_tokens`` (a cap on K,
#   as in vLLM), ``points`` (the profiled optimum per batch size), ``provenance`` and descriptive keys.
# dsdprof.ktable/v2: v1 plus ``cells`` -- the measured step time and acceptance length of every
#   profiled (batch size, K) -- and ``acceptance_per_pos``, the profiled per-position acceptance
#   p_i (accepted at position i / drafts), so K can be re-derived for another acceptance
#   (:mod:`dsdprof.adaptive`) without re-profiling. Both versions load everywhere.

TABLE_SCHEMA_V1 = "dsdprof.ktable/v1"
TABLE_SCHEMA_V2 = "dsdprof.ktable/v2"
TABLE_SCHEMAS = (TABLE_SCHEMA_V1, TABLE_SCHEMA_V2)
# Largest K a table may hold: vLLM's rejection sampler asserts max_spec_len <= MAX_SPEC_LEN = 128
# (vllm/v1/sample/rejection_sampler.py); no engine verifies longer drafts.
MAX_K = 128
MAX_BATCH_SIZE = 2**63 - 1  # int64, the type of batch_size in measurement files
MAX_TABLE_BYTES = 64 << 20  # a table with a million ranges is ~30 MB
_AL_SLACK = 1e-6


class TableError(ValueError):
    """A K table that cannot be used (unreadable, not JSON, or not ``dsdprof.ktable/v1``/``v2``).

    The message names the field and the value: ``field=value: reason``.
    """


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _short(value: object, limit: int = 80) -> str:
    """``repr`` cut to ``limit`` characters, so one bad field never floods the error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int_in(value: object, where: str, lo: int, hi: int) -> int:
    if not _is_int(value) or not lo <= value <= hi:
        raise TableError(f"{where}={_short(value)}: must be an integer in {lo}..{hi}")
    return value  # type: ignore[return-value]


def _number(value: object, where: str, lo: float | None = None, hi: float | None = None,
            strict_lo: bool = False) -> float:
    if not _is_number(value):
        raise TableError(f"{where}={_short(value)}: must be a finite number")
    if lo is not None and (value <= lo if strict_lo else value < lo):  # type: ignore[operator]
        raise TableError(f"{where}={_short(value)}: must be {'>' if strict_lo else '>='} {lo}")
    if hi is not None and value > hi:  # type: ignore[operator]
        raise TableError(f"{where}={_short(value)}: must be <= {hi}")
    return float(value)  # type: ignore[arg-type]


def validate_ranges(ranges: object, field: str = "ranges") -> list[tuple[int, int, int]]:
    """Check ``[[start, end, k], ...]``: integers, inclusive, first start 1, contiguous, sorted,
    batch sizes <= :data:`MAX_BATCH_SIZE`, 0 <= K <= :data:`MAX_K`.

    Returns the ranges as tuples. Raises :class:`TableError` naming the field and value.
    """
    if not isinstance(ranges, list) or not ranges:
        raise TableError(f"{field}={_short(ranges)}: must be a non-empty list of [start, end, k]")
    out: list[tuple[int, int, int]] = []
    expected_start = 1
    for i, r in enumerate(ranges):  # O(len(ranges)); kept lean: tables may hold many ranges
        if type(r) not in (list, tuple) or len(r) != 3:
            raise TableError(f"{field}[{i}]={_short(r)}: must be [start, end, k] with three integers")
        start, end, k = r
        if type(start) is not int or type(end) is not int or type(k) is not int:  # bool is not int
            raise TableError(f"{field}[{i}]={_short(r)}: must be [start, end, k] with three integers")
        if start != expected_start or end < start or end > MAX_BATCH_SIZE or not 0 <= k <= MAX_K:
            _range_error(field, i, r, expected_start)
        out.append((start, end, k))
        expected_start = end + 1
    return out


def _range_error(field: str, i: int, r: Any, expected_start: int) -> None:
    start, end, k = r
    where = f"{field}[{i}]={_short(list(r))}"
    if start != expected_start:
        raise TableError(f"{where}: start must be {expected_start} (ranges start at 1 and are contiguous and sorted)")
    if end < start:
        raise TableError(f"{where}: end must be >= start")
    if end > MAX_BATCH_SIZE:
        raise TableError(f"{where}: end must be <= {MAX_BATCH_SIZE}")
    raise TableError(f"{where}: k must be in 0..{MAX_K}")


def validate_num_speculative_tokens(value: object, field: str = "num_speculative_tokens") -> int:
    """The cap on K (vLLM's ``num_speculative_tokens``): an integer in 0..:data:`MAX_K`."""
    return _int_in(value, field, 0, MAX_K)


def validate_acceptance(per_pos: object, field: str = "acceptance_per_pos") -> list[float]:
    """Per-position acceptance ``[p_1, ..., p_K]``: each a probability in [0, 1]."""
    if not isinstance(per_pos, list) or len(per_pos) > MAX_K:
        raise TableError(f"{field}={_short(per_pos)}: must be a list of at most {MAX_K} numbers")
    return [_number(p, f"{field}[{i}]", 0.0, 1.0) for i, p in enumerate(per_pos)]


_POINT_OPTIONAL_NUMBERS = ("goodput", "acceptance_length", "itl_s", "speedup_vs_baseline",
                           "margin", "ci_low", "ci_high")


def _validate_points(points: object) -> None:
    if not isinstance(points, list):
        raise TableError(f"points={_short(points)}: must be a list")
    for i, p in enumerate(points):
        where = f"points[{i}]"
        if not isinstance(p, dict):
            raise TableError(f"{where}={_short(p)}: must be an object with batch_size and k")
        _int_in(p.get("batch_size"), f"{where}.batch_size", 1, MAX_BATCH_SIZE)
        _int_in(p.get("k"), f"{where}.k", 0, MAX_K)
        for key in _POINT_OPTIONAL_NUMBERS:
            if p.get(key) is not None:
                _number(p[key], f"{where}.{key}")
        if p.get("runner_up") is not None:
            _int_in(p["runner_up"], f"{where}.runner_up", 0, MAX_K)
        if p.get("decided") is not None and not isinstance(p["decided"], bool):
            raise TableError(f"{where}.decided={_short(p['decided'])}: must be true, false or null")
        fixed = p.get("speedup_vs_fixed_k")
        if fixed is not None:
            if not isinstance(fixed, dict):
                raise TableError(f"{where}.speedup_vs_fixed_k={_short(fixed)}: must be an object")
            for k, v in fixed.items():
                _number(v, f"{where}.speedup_vs_fixed_k.{k}")


def _validate_cells(cells: object) -> None:
    if not isinstance(cells, list) or not cells:
        raise TableError(f"cells={_short(cells)}: a {TABLE_SCHEMA_V2} table needs a non-empty list of "
                         "measured cells {batch_size, k, itl_s, acceptance_length}")
    seen: set[tuple[int, int]] = set()
    for i, c in enumerate(cells):
        where = f"cells[{i}]"
        if not isinstance(c, dict):
            raise TableError(f"{where}={_short(c)}: must be an object")
        b = _int_in(c.get("batch_size"), f"{where}.batch_size", 1, MAX_BATCH_SIZE)
        k = _int_in(c.get("k"), f"{where}.k", 0, MAX_K)
        if (b, k) in seen:
            raise TableError(f"{where}={_short(c)}: duplicate cell batch_size={b} k={k}")
        seen.add((b, k))
        _number(c.get("itl_s"), f"{where}.itl_s", 0.0, strict_lo=True)
        _number(c.get("acceptance_length"), f"{where}.acceptance_length", 1.0 - _AL_SLACK, k + 1 + _AL_SLACK)
        if c.get("goodput") is not None:
            _number(c["goodput"], f"{where}.goodput", 0.0)
        if c.get("acceptance_per_pos") is not None:
            per_pos = validate_acceptance(c["acceptance_per_pos"], f"{where}.acceptance_per_pos")
            if len(per_pos) > k:
                raise TableError(f"{where}.acceptance_per_pos={_short(per_pos)}: more positions than k={k}")


def validate_table(doc: object) -> dict[str, Any]:
    """Validate a parsed ``dsdprof.ktable/v1`` or ``/v2`` document; return it unchanged.

    Raises :class:`TableError` naming the first bad field. Unknown top-level keys are allowed
    (forward compatibility); known keys must have the documented types and bounds.
    """
    if not isinstance(doc, dict):
        raise TableError(f"table={type(doc).__name__}: must be a JSON object")
    schema = doc.get("schema")
    if schema not in TABLE_SCHEMAS:
        raise TableError(f"schema={_short(schema)}: expected one of {', '.join(TABLE_SCHEMAS)}")
    validate_ranges(doc.get("ranges"))
    if doc.get("num_speculative_tokens") is not None:
        validate_num_speculative_tokens(doc["num_speculative_tokens"])
    _validate_points(doc.get("points", []))
    if doc.get("tolerance") is not None:
        _number(doc["tolerance"], "tolerance", 0.0, 1.0)
    for key in ("interpolation", "shape"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise TableError(f"{key}={_short(doc[key])}: must be a string")
    prov = doc.get("provenance", {})
    if not isinstance(prov, dict):
        raise TableError(f"provenance={_short(prov)}: must be an object")
    if schema == TABLE_SCHEMA_V2:
        _validate_cells(doc.get("cells"))
        if doc.get("acceptance_per_pos") is not None:
            validate_acceptance(doc["acceptance_per_pos"])
    return doc


def read_table_file(path: Any) -> dict[str, Any]:
    """Read, parse and validate a table file. Every failure is a :class:`TableError`:
    unreadable, larger than :data:`MAX_TABLE_BYTES`, not UTF-8, not JSON, or not a valid table.
    """
    import json
    import os

    where = f"table={os.fspath(path)!r}"
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_TABLE_BYTES + 1)
    except OSError as err:
        raise TableError(f"{where}: cannot read ({err.strerror or type(err).__name__})") from None
    if len(data) > MAX_TABLE_BYTES:
        raise TableError(f"{where}: larger than {MAX_TABLE_BYTES >> 20} MiB, not a K table")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TableError(f"{where}: not UTF-8 text (invalid byte at offset {err.start})") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise TableError(f"{where}: not valid JSON ({_short(str(err), 120)})") from None
    return validate_table(doc)
