"""``dsdprof compare-drafts``: one spec, several drafts of one target, on a workload by category.

The spec is an ordinary sweep spec plus a ``[[drafts]]`` list (each a ``name`` with the
``method``, ``draft_model``, ``speculative_extra`` and ``dsd_mode`` it puts in ``[engine]``) and
an optional ``[domains] categories`` (docs/drafts.md, "The spec"). One sweep runs per (draft,
category) into ``OUT/<draft>/<category>/`` (``OUT/<draft>/all/`` without categories); in the
paired design every sweep interleaves the same vanilla configuration with its Ks. A drafter that
proposes a variable number of tokens a step (n-gram, suffix decoding) runs in the **cells
design** (its steps are never "pure K"; docs/drafts.md), suffix decoding with ``dsd_mode =
"fixed"`` (vLLM 0.32's suffix proposer asserts the configured K every step). ``OUT/_drafts.json``
records the plan and each draft's design.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from pydantic import JsonValue

from dsdprof.config.spec import SweepSpec, parse_spec, read_spec_toml
from dsdprof.errors import InputError
from dsdprof.measure.categories import category_counts, read_records, split_by_category
from dsdprof.measure.vllm.worker import VARIABLE_DRAFT_METHODS

PLAN_FILE = "_drafts.json"
ALL = "all"
_DRAFT_KEYS = ("name", "method", "draft_model", "speculative_extra", "dsd_mode")
# vLLM 0.32's suffix-decoding proposer asserts the step's K is the configured one: one engine per K
FIXED_K_METHODS = frozenset({"suffix"})


class _DraftName(TypedDict):
    name: str
    method: str
    draft_model: str | None
    speculative_extra: dict[str, JsonValue]  # vLLM's speculative_config keys, passed through


class Draft(_DraftName, total=False):
    """One ``[[drafts]]`` entry, defaults filled; ``design`` is set by :func:`plan_drafts`."""

    dsd_mode: str
    design: str


@dataclass(frozen=True)
class DraftPlan:
    spec_path: str
    drafts: list[Draft]
    categories: dict[str, int]  # category -> prompts in the workload ({"all": n} without categories)
    specs: dict[tuple[str, str], SweepSpec]  # (draft, category) -> the spec of its sweep


def _drafts(raw: Any) -> list[Draft]:
    if not isinstance(raw, list) or not raw:
        raise InputError("drafts", raw, "needs a [[drafts]] list with at least one draft")
    seen: set[str] = set()
    out: list[Draft] = []
    for i, d in enumerate(raw):
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not d["name"]:
            raise InputError(f"drafts[{i}].name", d, "each draft needs a name")
        extra = sorted(set(d) - set(_DRAFT_KEYS))
        if extra:
            raise InputError(f"drafts[{i}].{extra[0]}", d[extra[0]],
                             f"unknown key (known: {', '.join(_DRAFT_KEYS)})")
        if d["name"] in seen or d["name"].startswith("_") or "/" in d["name"]:
            raise InputError(f"drafts[{i}].name", d["name"], "must be unique, not start with '_', no '/'")
        seen.add(d["name"])
        draft = Draft(name=d["name"], method=d.get("method", "draft_model"), draft_model=d.get("draft_model"),
                      speculative_extra=d.get("speculative_extra", {}))
        if "dsd_mode" in d:
            draft["dsd_mode"] = d["dsd_mode"]
        out.append(draft)
    return out


def draft_design(method: str, design: str) -> str:
    """The spec's design, except ``cells`` for a drafter that proposes 0..K tokens a step."""
    return "cells" if method in VARIABLE_DRAFT_METHODS else design


def plan_drafts(spec_path: str | Path, out: str | Path) -> DraftPlan:
    """Validate the spec, its drafts and categories; write the per-category prompt files."""
    p = Path(spec_path)
    data = read_spec_toml(p)
    drafts = _drafts(data.pop("drafts", None))
    domains = data.pop("domains", {}) or {}
    wanted = domains.get("categories")
    dataset = str((data.get("workload") or {}).get("dataset", "synthetic"))
    counts: dict[str, int] = {}
    if dataset.endswith((".jsonl", ".json")) and wanted != [ALL]:
        counts = category_counts(read_records(dataset))
    files: dict[str, str | None] = {ALL: None}
    if counts:
        split = split_by_category(dataset, Path(out) / "_prompts", wanted)
        files = {c: str(path) for c, path in split.items()}
        counts = {c: counts[c] for c in split}
    else:
        counts = {ALL: 0}
    specs = {}
    for d in drafts:
        d["design"] = draft_design(d["method"], str((data.get("sweep") or {}).get("design", "paired")))
        for c, path in files.items():
            one = copy.deepcopy(data)
            one.setdefault("sweep", {})["design"] = d["design"]
            engine = one.setdefault("engine", {})
            engine["method"] = d["method"]
            engine.pop("draft_model", None)
            if d["draft_model"]:
                engine["draft_model"] = d["draft_model"]
            engine["speculative_extra"] = d["speculative_extra"]
            if "dsd_mode" in d or d["method"] in FIXED_K_METHODS:
                engine["dsd_mode"] = d.get("dsd_mode", "fixed")
            if path is not None:
                one.setdefault("workload", {})["dataset"] = path
            specs[(d["name"], c)] = parse_spec(one)
    return DraftPlan(str(p), drafts, counts, specs)


def write_plan(plan: DraftPlan, out: str | Path) -> Path:
    from dsdprof.io.atomic import write_json_atomic

    doc = {"spec": plan.spec_path, "drafts": plan.drafts, "categories": plan.categories,
           "runs": {f"{d}/{c}": f"{d}/{c}" for d, c in plan.specs}}
    path = Path(out) / PLAN_FILE
    write_json_atomic(path, doc, force=True)
    return path


def run_compare_drafts(spec_path: str | Path, out: str | Path, resume: bool = False,
                       run_one: Callable[[SweepSpec, Path, bool], Any] | None = None,
                       only: list[str] | None = None) -> dict[tuple[str, str], Any]:
    """Run every (draft, category) sweep, category by category (``only``: the listed ``draft`` or
    ``draft/category``); ``resume`` continues the runs already started."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_drafts(spec_path, out)
    write_plan(plan, out)
    if run_one is None:
        from dsdprof.measure.runner import run_sweep

        def run_one(spec: SweepSpec, d: Path, again: bool) -> Any:
            return run_sweep(spec, d, resume=again)
    results = {}
    cats = list(plan.categories)
    # category by category: an interrupted comparison still has every draft on the first categories
    for (draft, cat), spec in sorted(plan.specs.items(), key=lambda kv: cats.index(kv[0][1])):
        if only and draft not in only and f"{draft}/{cat}" not in only:
            continue
        run_dir = out / draft / cat
        results[(draft, cat)] = run_one(spec, run_dir, resume and run_dir.exists())
    return results
