"""Build, write and convert the portable K table (``dsdprof.ktable/v1``).

Between profiled batch sizes, K is taken from the nearest profiled batch size on a log scale,
ties going to the smaller one: batch size ``b`` between profiled ``b_i < b_{i+1}`` gets ``K_i``
when ``b*b <= b_i*b_{i+1}`` and ``K_{i+1}`` otherwise (so with profiled 4 and 8, BS 5 takes K(4),
BS 6 and 7 take K(8)). Batch sizes below the smallest profiled one take its K; batch sizes above
the largest take the largest one's K (the last range ends at :data:`LAST_RANGE_END` and, as in
vLLM, K carries forward beyond it). Adjacent ranges with the same K are merged.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dsdprof import __version__
from dsdprof.errors import InputError
from dsdprof.schema import TABLE_SCHEMA, TableError, validate_ranges, validate_table

LAST_RANGE_END = 1 << 20
INTERPOLATION = "nearest-log"


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
    for start, end, kk in ranges:
        if batch_size >= start:
            k = kk
    return k


def build_table(analysis, source: str = "") -> dict[str, Any]:
    """K table document from an :class:`dsdprof.analysis.Analysis`."""
    opt = analysis.optimal
    ranges = ranges_from_points([(int(b), int(k)) for b, k in zip(opt["batch_size"], opt["k"])])
    speedup_cols = [c for c in opt.columns if c.startswith("speedup_vs_k")]
    points = []
    for _, row in opt.iterrows():
        base = row["speedup_vs_baseline"]
        points.append({
            "batch_size": int(row["batch_size"]), "k": int(row["k"]),
            "goodput": float(row["goodput"]), "acceptance_length": float(row["acceptance_length"]),
            "itl_s": float(row["itl_s"]),
            "speedup_vs_baseline": None if math.isnan(base) else float(base),
            "speedup_vs_fixed_k": {c.removeprefix("speedup_vs_k"): float(row[c])
                                   for c in speedup_cols if not math.isnan(row[c])},
        })
    prov = {k: (v if isinstance(v, (str, int, float, bool)) or v is None else str(v))
            for k, v in analysis.provenance.items()}
    prov.update({"source": source, "dsdprof_version": __version__,
                 "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    doc = {
        "schema": TABLE_SCHEMA,
        "num_speculative_tokens": max(r[2] for r in ranges),
        "ranges": ranges,
        "interpolation": INTERPOLATION,
        "tolerance": analysis.tolerance,
        "shape": analysis.shape,
        "points": points,
        "provenance": prov,
    }
    return validate_table(doc)


def load_table(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise InputError("table", str(p), "file not found")
    try:
        doc = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError("table", str(p), f"not valid JSON ({err})") from None
    return validate_table(doc)


def vllm_speculative_config(table: dict[str, Any]) -> dict[str, Any]:
    """vLLM ``--speculative-config`` JSON serving this table in vLLM's dynamic-SD mode.

    Checked with vLLM's own ``validate_and_normalize_dynamic_sd_schedule`` when vLLM is installed.
    """
    ranges = [list(r) for r in validate_ranges(table["ranges"])]
    max_k = max(r[2] for r in ranges)
    if max_k <= 0:
        raise InputError("ranges", ranges, "K=0 at every batch size: serve without a speculative config")
    cfg: dict[str, Any] = {}
    prov = table.get("provenance", {})
    method = prov.get("method")
    if method:
        cfg["method"] = method
    draft = prov.get("draft_model")
    if draft and method not in ("ngram", "suffix", "mtp", None):
        cfg["model"] = draft
    cfg["num_speculative_tokens"] = max_k
    cfg["num_speculative_tokens_per_batch_size"] = ranges
    try:
        from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule
    except Exception:  # noqa: BLE001 - vLLM not installed: our own validator already ran
        return cfg
    try:
        validate_and_normalize_dynamic_sd_schedule(ranges)
    except ValueError as err:
        raise TableError(f"ranges={ranges!r}: rejected by vLLM ({err})") from None
    return cfg


def write_json_atomic(path: str | Path, doc: dict[str, Any], force: bool = False) -> Path:
    """Write JSON via a temp file + rename; refuse to replace an existing file unless ``force``."""
    p = Path(path)
    if p.exists() and not force:
        raise InputError("output", str(p), "exists; pass --force to replace it")
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, p)
    return p
