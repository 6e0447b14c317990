"""Prompts by category (domain): split a workload file per category.

A JSONL/JSON workload may carry a ``category`` per record (MT-Bench's layout: ``{"category":
"coding", "turns": [...]}``; a SPEED-Bench-like file: ``{"category": ..., "prompt": ...}``).
:func:`split_by_category` writes one file per category, each an ordinary dsdprof dataset, so a
sweep measures one category at a time: every wave's requests share a category, and its rows (and
their ``acceptance_per_pos``) are that category's. ``dsdprof compare-drafts`` runs one sweep per
(draft, category) this way; the category is the run directory's name and becomes a ``category``
column when the runs are read together (:mod:`dsdprof.decide.domains`), not a Parquet column.

The shipped toy sets (``sweeps/prompts/toy-domains.jsonl``) are made by
``tests/support/toy_domains.py``; docs/drafts.md says how far they are from real traffic.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from dsdprof.errors import InputError
from dsdprof.formats.jsontypes import JSONObject
from dsdprof.measure.workload import read_json_records

CATEGORY_KEY = "category"


def read_records(dataset: str | Path) -> list[JSONObject]:
    """The dict records of a .jsonl/.json workload file."""
    records = read_json_records(dataset, "a category workload must be a .jsonl/.json file")
    return [r for r in records if isinstance(r, dict)]


def category_counts(records: list[JSONObject]) -> dict[str, int]:
    """Records per category (records without a string ``category`` are left out)."""
    counts = Counter(c for r in records if isinstance(c := r.get(CATEGORY_KEY), str))
    return dict(sorted(counts.items()))


def split_by_category(dataset: str | Path, out_dir: str | Path,
                      categories: list[str] | None = None) -> dict[str, Path]:
    """Write ``OUT_DIR/<category>.jsonl`` per category (all, or ``categories`` in that order)."""
    records = read_records(dataset)
    counts = category_counts(records)
    if not counts:
        raise InputError("workload.dataset", str(dataset), f"no record has a string {CATEGORY_KEY!r} field")
    wanted = list(categories) if categories else list(counts)
    for c in wanted:
        if c not in counts:
            raise InputError("domains.categories", c, f"not a category of {dataset} ({', '.join(counts)})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for c in wanted:
        path = out / f"{_safe(c)}.jsonl"
        rows = [json.dumps(r) for r in records if r.get(CATEGORY_KEY) == c]
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        paths[c] = path
    return paths


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "_"


def parse_mix(text: str, categories: list[str]) -> dict[str, float]:
    """``code=0.7,text=0.3`` -> weights summing to 1 over ``categories`` (unnamed ones weigh 0)."""
    weights: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        try:
            w = float(value)
        except ValueError:
            raise InputError("--mix", part, "expected CATEGORY=WEIGHT, e.g. code=0.7,text=0.3") from None
        if not sep or w < 0 or w != w or w == float("inf"):
            raise InputError("--mix", part, "expected CATEGORY=WEIGHT with a finite weight >= 0")
        if name.strip() not in categories:
            raise InputError("--mix", name.strip(), f"not a measured category ({', '.join(categories)})")
        weights[name.strip()] = w
    total = sum(weights.values())
    if total <= 0:
        raise InputError("--mix", text, "weights must not all be 0")
    return {c: weights.get(c, 0.0) / total for c in categories}
