"""The K table (JSON, ``dsdprof.ktable/v1``, ``/v2``, ``/v3``): its validator, the range semantics
(:func:`ranges_from_points`, :func:`k_for_batch_size`) and its limits -- the one home behind
``show``, ``export``, ``validate`` and ``dsdprof.serve``. Its keys and types:
:class:`dsdprof.formats.ktable_types.KTable`. Stdlib only.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard, cast

from dsdprof.errors import InputError
from dsdprof.formats.ktable_types import KTable, VanillaRecord
from dsdprof.formats.versions import TABLE_SCHEMA_V1, TABLE_SCHEMA_V2, TABLE_SCHEMA_V3, TABLE_SCHEMAS

# What each version holds, key by key: dsdprof.formats.ktable_types (KTable and its parts).

# Largest K a table may hold: vLLM's rejection sampler asserts max_spec_len <= MAX_SPEC_LEN = 128
# (vllm/v1/sample/rejection_sampler.py); no engine verifies longer drafts.
MAX_K = 128
MAX_BATCH_SIZE = 2**63 - 1  # int64, the type of batch_size in measurement files: the largest a table may name
# Where ranges_from_points ends a table's last range (vLLM carries the last K forward anyway), and
# the largest batch size a sweep may measure (config.spec).
LAST_RANGE_END = 1 << 20
LAST_CONTEXT_END = 1 << 24  # where context_buckets ends the last slice (contexts past it carry forward)
MAX_CONTEXT = 2**63 - 1
MAX_CONTEXT_SLICES = 1024
INTERPOLATION = "nearest-log"  # between profiled batch sizes: the nearest on a log scale
MAX_TABLE_BYTES = 64 << 20  # a table with a million ranges is ~30 MB
_AL_SLACK = 1e-6


class TableError(ValueError):
    """A K table that cannot be used (unreadable, not JSON, or not ``dsdprof.ktable/v1``/``v2``).

    The message names the field and the value: ``field=value: reason``.
    """


def _is_number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _short(value: object, limit: int = 80) -> str:
    """``repr`` cut to ``limit`` characters, so one bad field never floods the error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int_in(value: object, where: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise TableError(f"{where}={_short(value)}: must be an integer in {lo}..{hi}")
    return value


def _number(value: object, where: str, lo: float | None = None, hi: float | None = None,
            strict_lo: bool = False) -> float:
    if not _is_number(value):
        raise TableError(f"{where}={_short(value)}: must be a finite number")
    if lo is not None and (value <= lo if strict_lo else value < lo):
        raise TableError(f"{where}={_short(value)}: must be {'>' if strict_lo else '>='} {lo}")
    if hi is not None and value > hi:
        raise TableError(f"{where}={_short(value)}: must be <= {hi}")
    return float(value)


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
        raise TableError(f"{where}: start must be {expected_start} (ranges start at 1 and are contiguous and "
                         "sorted)")
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


def validate_table(doc: object) -> KTable:
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
    if schema in (TABLE_SCHEMA_V2, TABLE_SCHEMA_V3):
        _validate_cells(doc.get("cells"))
        if doc.get("acceptance_per_pos") is not None:
            validate_acceptance(doc["acceptance_per_pos"])
    if doc.get("vanilla_faster") is not None:
        validate_vanilla(doc["vanilla_faster"])
    if schema == TABLE_SCHEMA_V3:
        validate_contexts(doc.get("contexts"))
        if doc.get("default_context") is not None:
            _int_in(doc["default_context"], "default_context", 1, MAX_CONTEXT)
    return cast(KTable, doc)


def validate_contexts(contexts: object) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """Check a v3 table's ``contexts``: a non-empty list of slices with strictly increasing integer
    ``max_context``, valid ``ranges`` (and ``points``/``cells``/``acceptance_per_pos`` when given),
    and ``context_len`` (when given) inside the slice's bucket. Returns ``[(max_context, ranges)]``."""
    if not isinstance(contexts, list) or not contexts or len(contexts) > MAX_CONTEXT_SLICES:
        raise TableError(f"contexts={_short(contexts)}: a {TABLE_SCHEMA_V3} table needs a non-empty list "
                         f"(at most {MAX_CONTEXT_SLICES}) of {{max_context, ranges}} slices")
    out: list[tuple[int, list[tuple[int, int, int]]]] = []
    prev = 0
    for i, sl in enumerate(contexts):
        where = f"contexts[{i}]"
        if not isinstance(sl, dict):
            raise TableError(f"{where}={_short(sl)}: must be an object with max_context and ranges")
        top = _int_in(sl.get("max_context"), f"{where}.max_context", 1, MAX_CONTEXT)
        if top <= prev:
            raise TableError(f"{where}.max_context={top}: must be > {prev} (slices sorted, strictly "
                             "increasing)")
        if sl.get("context_len") is not None:
            _int_in(sl["context_len"], f"{where}.context_len", prev + 1, top)
        ranges = validate_ranges(sl.get("ranges"), f"{where}.ranges")
        try:
            _validate_points(sl.get("points", []))
            if sl.get("cells") is not None:
                _validate_cells(sl["cells"])
            if sl.get("acceptance_per_pos") is not None:
                validate_acceptance(sl["acceptance_per_pos"])
            if sl.get("vanilla_faster") is not None:
                validate_vanilla(sl["vanilla_faster"])
        except TableError as err:
            raise TableError(f"{where}.{err}") from None
        out.append((top, ranges))
        prev = top
    return out


def validate_vanilla(records: object, field: str = "vanilla_faster") -> list[VanillaRecord]:
    """Optional ``vanilla_faster`` (any table version; old readers ignore it): ``[{"start", "end",
    "gain", "ci_low", "ci_high", "batch_size", "k"}, ...]`` -- batch sizes ``start..end`` (sorted,
    not overlapping) where a vanilla engine (no speculative config) measured faster than every K
    beyond its interval; ``gain`` = vanilla goodput / the best K's - 1 (> 0), ``ci_low``/``ci_high``
    its interval (null when unknown), ``batch_size`` the profiled batch size, ``k`` the table's K."""
    if not isinstance(records, list) or len(records) > MAX_CONTEXT_SLICES * 64:
        raise TableError(f"{field}={_short(records)}: must be a list of {{start, end, gain}} objects")
    prev_end = 0
    for i, r in enumerate(records):
        where = f"{field}[{i}]"
        if not isinstance(r, dict):
            raise TableError(f"{where}={_short(r)}: must be an object with start, end and gain")
        start = _int_in(r.get("start"), f"{where}.start", prev_end + 1, MAX_BATCH_SIZE)
        prev_end = _int_in(r.get("end"), f"{where}.end", start, MAX_BATCH_SIZE)
        _number(r.get("gain"), f"{where}.gain", 0.0, strict_lo=True)
        for key in ("ci_low", "ci_high"):
            if r.get(key) is not None:
                _number(r[key], f"{where}.{key}")
        if r.get("batch_size") is not None:
            _int_in(r["batch_size"], f"{where}.batch_size", 1, MAX_BATCH_SIZE)
        if r.get("k") is not None:
            _int_in(r["k"], f"{where}.k", 0, MAX_K)
    return records


# what a v3 slice holds of a v2 table
SLICE_KEYS = ("ranges", "points", "cells", "acceptance_per_pos", "vanilla_faster")


def context_slice(table: KTable, context: int) -> KTable:
    """The slice of a validated v3 ``table`` serving ``context`` (the first with ``max_context >=
    context``, else the last) as a v2-shaped table (v1 when the slice has no cells), keeping the
    whole table's provenance; its cap is the slice's ``num_speculative_tokens`` else its largest K."""
    contexts = table["contexts"]
    chosen: dict[str, Any] = dict(next((sl for sl in contexts if context <= sl["max_context"]), contexts[-1]))
    out = {k: v for k, v in table.items() if k not in ("contexts", "default_context", "context_interpolation",
                                                        "contexts_skipped", *SLICE_KEYS)}
    out.update({k: chosen[k] for k in SLICE_KEYS if k in chosen})
    out["schema"] = TABLE_SCHEMA_V2 if "cells" in chosen else TABLE_SCHEMA_V1
    cap = chosen.get("num_speculative_tokens")
    out["num_speculative_tokens"] = cap if cap is not None else max(r[2] for r in chosen["ranges"])
    return validate_table(out)


def context_buckets(contexts: list[int], last_end: int = LAST_CONTEXT_END) -> list[int]:
    """Profiled contexts (ascending) -> each slice's ``max_context``: the nearest profiled context on
    a log scale serves a request (edge ``isqrt(c_i · c_{i+1})``), the last up to ``last_end``."""
    cs = sorted(contexts)
    return [math.isqrt(a * b) for a, b in zip(cs, cs[1:])] + [max(last_end, cs[-1])]


def read_table_file(path: Any) -> KTable:
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


# --------------------------------------------------------------------------- range semantics

def ranges_from_points(points: list[tuple[int, int]], last_end: int = LAST_RANGE_END) -> list[list[int]]:
    """``[(batch_size, k), ...]`` (any order) -> merged inclusive ``[[start, end, k], ...]``."""
    if not points:
        raise InputError("points", [], "need at least one profiled batch size")
    pts = sorted(points)
    sizes = [b for b, _ in pts]
    if len(set(sizes)) != len(sizes):
        raise InputError("batch_size", sizes, "duplicate profiled batch sizes")
    ranges: list[list[int]] = []
    start = 1
    for i, (b, k) in enumerate(pts):
        if i + 1 < len(pts):
            end = math.isqrt(b * pts[i + 1][0])  # largest e with e*e <= b_i*b_{i+1}
        else:
            end = max(last_end, b)
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
        start = end + 1
    return ranges


def k_for_batch_size(ranges: list[list[int]], batch_size: int) -> int:
    """Reference (slow) lookup: the K a table gives at ``batch_size`` (carry-forward past the end)."""
    k = ranges[0][2]
    for start, _end, kk in ranges:
        if batch_size >= start:
            k = kk
    return k


def choose_k(goodput_by_k: dict[int, float], tolerance: float, slack: float = 1e-12) -> int:
    """The K rule on point estimates: the smallest K whose goodput is within ``tolerance``
    (relative) of the best. Every K a table holds was chosen by this rule -- with intervals by
    :func:`dsdprof.decide.rule.decide_batch` (the same comparison, ``rule_index``, on the points and
    on the interval's lower end; tests/decide check they agree),
    vectorised over a whole grid by ``optimal_k`` in ``tests/support/sim_grid.py``, live by
    :mod:`dsdprof.serve.adaptive`."""
    best = max(goodput_by_k.values())
    return min(k for k, g in goodput_by_k.items() if g >= best * (1.0 - tolerance) - slack * best)

