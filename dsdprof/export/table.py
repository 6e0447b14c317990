"""Build, write and convert the portable K table (``dsdprof.ktable/v2``; v1 still loads).

Between profiled batch sizes, K is taken from the nearest profiled batch size on a log scale,
ties going to the smaller one: batch size ``b`` between profiled ``b_i < b_{i+1}`` gets ``K_i``
when ``b*b <= b_i*b_{i+1}`` and ``K_{i+1}`` otherwise (so with profiled 4 and 8, BS 5 takes K(4),
BS 6 and 7 take K(8)). Batch sizes below the smallest profiled one take its K; batch sizes above
the largest take the largest one's K (the last range ends at :data:`LAST_RANGE_END` and, as in
vLLM, K carries forward beyond it). Adjacent ranges with the same K are merged.

A v2 table also carries ``cells`` (median step time ``itl_s``, ``acceptance_length`` and goodput
of every profiled (batch size, K)) and ``acceptance_per_pos`` (the profiled p_i = accepted at
position i / drafts), which :class:`dsdprof.serve.adaptive.AdaptiveKSelector` uses to re-derive K for
the acceptance it sees live. :func:`vllm_speculative_config` is vLLM's native form;
TensorRT-LLM's ``draft_len_schedule`` is in :mod:`dsdprof.export.trtllm`.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any, TypedDict, cast

from dsdprof import __version__
from dsdprof.errors import InputError
from dsdprof.formats.jsontypes import JSONObject
from dsdprof.formats.ktable import (
    INTERPOLATION,
    TableError,
    ranges_from_points,
    read_table_file,
    validate_num_speculative_tokens,
    validate_ranges,
    validate_table,
)
from dsdprof.formats.ktable_types import KTable, ServedTable, TableCell
from dsdprof.formats.versions import TABLE_SCHEMA

if TYPE_CHECKING:
    import pandas as pd


# ----------------------------------------------------------------------------- building

def _plain(v: Any) -> Any:
    """numpy scalar / NaN -> plain JSON value (NaN and NA -> None)."""
    if hasattr(v, "item") and callable(v.item):
        try:
            v = v.item()
        except (ValueError, TypeError):
            pass
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    try:
        import pandas as pd

        if v is pd.NA or v is pd.NaT:
            return None
    except ImportError:  # pragma: no cover - pandas is a core dependency
        pass
    return v


def _as_floats(v: Any) -> list[float] | None:
    """A per-position list from a DataFrame cell (list, tuple or numpy array), else None."""
    if v is None or isinstance(v, (str, bytes, float, int)):
        return None
    try:
        out = [float(x) for x in v]
    except (TypeError, ValueError):
        return None
    return out if out and all(math.isfinite(x) for x in out) else None


def per_cell_acceptance(rows) -> dict[tuple[int, int], list[float]]:
    """Median per position of ok speculative rows' ``acceptance_per_pos``, per (batch size, K).

    Only lists with exactly K positions count (K=0 and malformed rows are skipped).
    """
    if rows is None or "acceptance_per_pos" not in rows.columns:
        return {}
    df = rows
    if "status" in df.columns:
        df = df[df["status"].astype(str) == "ok"]
    if "mode" in df.columns:
        df = df[df["mode"].astype(str) != "vanilla"]
    groups: dict[tuple[int, int], list[list[float]]] = {}
    for b, k, per_pos in zip(df["batch_size"], df["num_spec_tokens"], df["acceptance_per_pos"]):
        vals = _as_floats(per_pos)
        if vals is not None and int(k) > 0 and len(vals) == int(k):
            groups.setdefault((int(b), int(k)), []).append(vals)
    return {key: [median(col) for col in zip(*lists)] for key, lists in groups.items()}


def profiled_acceptance(per_cell: dict[tuple[int, int], list[float]]) -> list[float]:
    """Pooled profile: per position, the median over batch sizes of the largest-K cell's value."""
    largest: dict[int, list[float]] = {}
    for (b, _k), per_pos in sorted(per_cell.items()):
        largest[b] = per_pos  # sorted by k within b: the last one is the largest K
    if not largest:
        return []
    depth = max(len(p) for p in largest.values())
    out = []
    for i in range(depth):
        vals = [p[i] for p in largest.values() if len(p) > i]
        out.append(min(1.0, max(0.0, median(vals))))
    return out


def build_table(analysis: Any, source: str = "", rows: pd.DataFrame | None = None,
                decided: bool = True) -> KTable:
    """``dsdprof.ktable/v2`` document from an :class:`dsdprof.decide.analysis.Analysis`, validated.

    Per-position acceptance comes from ``analysis.cells["acceptance_per_pos"]`` when the analysis
    has it, else from the raw measurement ``rows`` (a DataFrame) when given; without either the
    table has no ``acceptance_per_pos`` (it still serves statically, but not adaptively).
    """
    return validate_table(table_document(analysis, ranges_from_points(analysis.points), source, rows,
                                         decided=decided))


def table_document(analysis: Any, ranges: list[list[int]], source: str = "", rows: pd.DataFrame | None = None,
                   decided: bool = True) -> KTable:
    """:func:`build_table` before its validation, ``ranges`` given (``ranges_from_points`` of the
    analysis' points): the export path builds the document from plain data, calling nothing back,
    and validates it last. Its points are the analysis' decisions
    (:class:`dsdprof.decide.decision.BatchDecision`: K*, goodput, the speedups) with, when
    ``decided``, how sure the data are (decided, the runner-up, the margin and its interval)."""
    points = []
    for d in analysis.decisions:
        point = {
            "batch_size": d.batch_size, "k": d.k, "goodput": float(d.goodput),
            "acceptance_length": float(d.acceptance_length), "itl_s": float(d.itl_s),
            "speedup_vs_baseline": _plain(d.speedup_vs_baseline),
            "speedup_vs_fixed_k": {str(k): float(v) for k, v in d.speedup_vs_k.items() if not math.isnan(v)},
        }
        if decided:
            point.update(decided=bool(d.decided), runner_up=d.runner_up, margin=_plain(d.margin),
                         ci_low=_plain(d.ci_low), ci_high=_plain(d.ci_high))
        points.append(point)

    cells_df = analysis.cells  # one row per (batch size, K): its own list is its median
    per_cell = per_cell_acceptance(cells_df if "acceptance_per_pos" in cells_df.columns else rows)
    cells = []
    for b, k, al, itl, goodput in zip(cells_df["batch_size"], cells_df["num_spec_tokens"],
                                      cells_df["acceptance_length"], cells_df["itl_s"], cells_df["goodput"]):
        cell: TableCell = {"batch_size": int(b), "k": int(k), "itl_s": float(itl),
                "acceptance_length": float(al), "goodput": float(goodput)}
        if (int(b), int(k)) in per_cell:
            cell["acceptance_per_pos"] = per_cell[(int(b), int(k))]
        cells.append(cell)

    prov = {k: (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
            for k, v in analysis.provenance.items()}
    prov.update({"source": source, "dsdprof_version": __version__,
                 "created_at": datetime.now(UTC).isoformat(timespec="seconds")})
    doc = {
        "schema": TABLE_SCHEMA,
        "num_speculative_tokens": max(r[2] for r in ranges),
        "ranges": ranges,
        "interpolation": INTERPOLATION,
        "tolerance": analysis.tolerance,
        "shape": analysis.shape,
        "points": points,
        "cells": cells,
        "acceptance_per_pos": profiled_acceptance(per_cell) or None,
        "provenance": prov,
    }
    # where no speculation beat every K beyond its interval (an analysis-like object without them: none)
    if vanilla := getattr(analysis, "vanilla_faster", None):
        doc["vanilla_faster"] = vanilla
    return cast(KTable, doc)


def gap_text(gain: float, lo: Any = None, hi: Any = None) -> str:
    """``+12.6 % [+8.1, +17.0]`` (the interval when known)."""
    txt = f"{gain * 100:+.1f} %"
    if lo is not None and hi is not None and math.isfinite(float(lo)) and math.isfinite(float(hi)):
        txt += f" [{float(lo) * 100:+.1f}, {float(hi) * 100:+.1f}]"
    return txt


def vanilla_warning(table: ServedTable, engine: str = "vLLM") -> str | None:
    """What an export of ``table`` must say when the table records that a vanilla engine (no
    speculative config) measured faster than every K (``vanilla_faster``): the batch sizes, the gap
    with its interval, and that the schedule cannot express it (vLLM's K=0 still runs the drafter)."""
    records = table.get("vanilla_faster") or []
    if not records:
        return None
    parts = [f"{r['start']}..{r['end']} {gap_text(r['gain'], r.get('ci_low'), r.get('ci_high'))}"
             + (f" (profiled at {r['batch_size']})" if r.get("batch_size") else "") for r in records]
    return (f"vanilla (no speculative config) measured faster than every K at batch sizes {'; '.join(parts)} "
            f"(vanilla goodput / best K's - 1, with its interval); {engine}'s schedule still speculates "
            "there "
            "(in vLLM K=0 still runs the drafter): route those batch sizes to a deployment without "
            "speculation, "
            "or accept the loss (docs/ktable.md#vanilla; the table's vanilla_faster records it)")


# ----------------------------------------------------------------------------- reading / writing

def load_table(path: str | Path) -> KTable:
    """Read and validate a v1 or v2 table (the validator shared with ``dsdprof.serve.runtime``).

    A missing file is an :class:`InputError`; anything else unusable is a ``TableError``.
    """
    p = Path(path)
    if not p.exists():
        raise InputError("table", str(p), "file not found")
    return read_table_file(p)


class VllmSpeculativeConfig(TypedDict, total=False):
    """vLLM's ``--speculative-config`` as dsdprof writes it (dynamic-SD mode)."""

    method: str
    model: str
    num_speculative_tokens: int
    num_speculative_tokens_per_batch_size: list[list[int]]


def vllm_speculative_config(table: ServedTable) -> VllmSpeculativeConfig:
    """vLLM ``--speculative-config`` JSON serving this table in vLLM's dynamic-SD mode.

    Same output for v1 and v2 tables. The draft (``model``) is the table's ``provenance.draft_model``,
    absolute when it is a directory that exists where this runs. The table is validated first;
    the schedule is checked with vLLM's own ``validate_and_normalize_dynamic_sd_schedule`` when
    vLLM is installed.
    """
    validate_table(table)
    return vllm_config_document(table)


def vllm_config_document(table: ServedTable) -> VllmSpeculativeConfig:
    """:func:`vllm_speculative_config` of a table validated elsewhere (plain data: this calls
    nothing back; the export path validates the table last). InputError when K = 0 everywhere,
    TableError when vLLM rejects the schedule."""
    ranges = [list(r) for r in table["ranges"]]
    max_k = max(r[2] for r in ranges)
    if max_k <= 0:
        raise InputError("ranges", ranges, "K=0 at every batch size: serve without a speculative config")
    cfg: VllmSpeculativeConfig = {}
    prov = table.get("provenance", {})
    method = prov.get("method")
    if method:
        cfg["method"] = cast(str, method)  # provenance values are strings (not checked here: plain data)
    draft = prov.get("draft_model")
    if draft and method not in ("ngram", "suffix", "mtp", None):
        # a draft directory that exists here is written absolute (the config then serves from any
        # directory); anything else as the sweep named it: a Hugging Face id, or a path relative to
        # the directory the sweep ran in (provenance.source is the run, relative to the same)
        local = Path(str(draft)).expanduser()
        cfg["model"] = str(local.resolve()) if local.is_dir() else cast(str, draft)
    cfg["num_speculative_tokens"] = max_k
    cfg["num_speculative_tokens_per_batch_size"] = ranges
    try:
        from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule
    except Exception:  # noqa: BLE001 - vLLM not installed: the table validator still runs
        return cfg
    try:
        validate_and_normalize_dynamic_sd_schedule(ranges)
    except ValueError as err:
        raise TableError(f"ranges={ranges!r}: rejected by vLLM ({err})") from None
    return cfg


def check_vllm_config(cfg: Any) -> None:
    """Validator for a written vLLM speculative config: the table's range and K rules, K cap >= 1."""
    if not isinstance(cfg, dict):
        raise TableError(f"config={type(cfg).__name__}: must be a JSON object")
    validate_ranges(cfg.get("num_speculative_tokens_per_batch_size"), "num_speculative_tokens_per_batch_size")
    if validate_num_speculative_tokens(cfg.get("num_speculative_tokens")) < 1:
        raise TableError("num_speculative_tokens=0: vLLM needs at least 1")


# The measured engines' graph settings (dsdprof.measure.vllm.engine.VllmEngine.cudagraph_kwargs),
# as the run's provenance records them.
COMPILATION_PROVENANCE = "extra_compilation_config"


def vllm_compilation_config(table: ServedTable) -> JSONObject:
    """vLLM ``--compilation-config`` JSON with the CUDA-graph settings the table's measurement ran
    under, so that a server of :func:`vllm_speculative_config` captures the graphs that were timed.

    InputError when the measurement recorded none (CPU engine, ``enforce_eager``, the analytic model)."""
    raw = (table.get("provenance") or {}).get(COMPILATION_PROVENANCE)
    if not raw:
        raise InputError("--format", "vllm-compilation", "the measurement recorded no compilation_config "
                         "(a CPU engine, enforce_eager or the analytic model): serve as the sweep ran")
    try:
        cfg = json.loads(cast(str, raw))  # not a string: TypeError, refused below
    except (TypeError, ValueError):
        raise TableError(f"provenance.{COMPILATION_PROVENANCE}={raw!r}: not one run's JSON object "
                         "(tables of runs with different graph settings cannot carry one)") from None
    check_vllm_compilation_config(cfg)
    return cfg


def check_vllm_compilation_config(cfg: Any) -> None:
    """Validator for a written compilation config: an object; capture sizes positive integers, their
    largest the ``max_cudagraph_capture_size`` when both are given (vLLM's rule)."""
    if not isinstance(cfg, dict) or not cfg:
        raise TableError(f"compilation_config={cfg!r}: must be a non-empty JSON object")
    sizes = cfg.get("cudagraph_capture_sizes")
    if sizes is not None and (not isinstance(sizes, list) or not sizes
                              or not all(type(x) is int and x > 0 for x in sizes)):
        raise TableError(f"compilation_config.cudagraph_capture_sizes={sizes!r}: must be positive integers")
    top = cfg.get("max_cudagraph_capture_size")
    if top is not None and sizes is not None and top != max(sizes):
        raise TableError(f"compilation_config.max_cudagraph_capture_size={top!r}: must be the largest "
                         "capture size")


def read_vllm_config(doc: dict[str, Any]) -> KTable | None:
    """dsdprof's own vLLM ``--speculative-config`` export read back as a v1 table of the same K
    per batch size (not validated yet); None when ``doc`` is no such export."""
    if "num_speculative_tokens_per_batch_size" not in doc:
        return None
    ranges = [list(r) for r in doc["num_speculative_tokens_per_batch_size"]]
    prov = {k: doc[k] for k in ("method", "model") if doc.get(k)}
    table: dict[str, Any] = {"schema": "dsdprof.ktable/v1", "ranges": ranges, "provenance": prov}
    if doc.get("num_speculative_tokens") is not None:
        table["num_speculative_tokens"] = doc["num_speculative_tokens"]
    return cast(KTable, table)
