"""``dsdprof validate``: serve a K table on real vLLM and compare it with vanilla and fixed K.

The variants, each on its own engine from the same engine pool and cell runner as ``sweep``, all
alive for the whole run: ``vanilla`` (no speculative config), ``fixed-<K>``, ``dsd`` (the table
served through vLLM's own ``num_speculative_tokens_per_batch_size``, :func:`dsd_llm_kwargs`; each
cell checks its steady steps drafted the table's K) and, with ``--adaptive``, ``adaptive`` (the
table served by dsdprof's adaptive scheduler, :func:`adaptive_llm_kwargs`). ``--design``: paired
(the variants' waves interleaved one by one), steps (every variant but vanilla inside the same
waves of one engine, switched per step) or cells (:func:`plan_validation`). Every cell is one
durable Parquet row, ``mode`` = ``vanilla`` | ``fixed`` | ``dsd`` | ``adaptive``. The user's
account: docs/reference.md ("Check a table before you ship it"); the comparison itself is
:func:`dsdprof.report.compare.compare`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from dsdprof.config.run import RUN_KIND_VALIDATE
from dsdprof.errors import InputError
from dsdprof.export.table import vllm_speculative_config
from dsdprof.formats.ktable import TableError, k_for_batch_size
from dsdprof.formats.ktable_types import KTable
from dsdprof.formats.measurements import MODE_ADAPTIVE, MODE_DSD, MODE_FIXED, MODE_VANILLA, MeasurementRow
from dsdprof.io.atomic import write_json_atomic
from dsdprof.io.manifest import normalised_spec_dump
from dsdprof.measure.engine import Cell
from dsdprof.measure.runner import SweepProgress, SweepSummary, run_plan
from dsdprof.measure.vllm.engine import VllmEngine
from dsdprof.measure.vllm.resources import LLMKwargs
from dsdprof.plugins.names import Arm, holds_arms

VALIDATE_KEY = RUN_KIND_VALIDATE  # key in _sweep.json marking a validate run
# validate --design: waves interleaved (default) | arms per step | cells
DESIGNS = ("paired", "steps", "cells")
ADAPTIVE_TABLE_FILE = "_adaptive_table.json"  # the table the adaptive engine loads, in OUT


@dataclass(frozen=True)
class ValidateSummary(SweepSummary):
    warnings: tuple[str, ...] = ()


def worker_key(cell: Cell) -> str:
    """Which engine runs a cell: ``vanilla``, ``fixed-<K>``, ``dsd`` or ``adaptive`` (steps design:
    every variant but vanilla on the adaptive engine, or without it on ``dsd``)."""
    if holds_arms(cell.group) and cell.mode != MODE_VANILLA:
        return MODE_ADAPTIVE if Arm.ENGINE in cell.group else MODE_DSD
    if cell.mode == MODE_FIXED:
        return f"fixed-{cell.num_spec_tokens}"
    return cell.mode


def plan_validation(batch_sizes: list[int], fixed_ks: list[int], ranges: list[list[int]],
                    repeats: int, adaptive_k: int | None = None, design: str = "paired") -> list[Cell]:
    """Cells in run order: per repeat, per batch size, every variant, order rotated each time.
    ``adaptive_k`` (the adaptive engine's largest K) adds an ``adaptive`` cell per batch size.
    ``design``: ``paired`` (every cell of a batch size and repeat carries ``interleave``, the
    variants' (mode, K): their waves run interleaved one by one, :mod:`dsdprof.measure.vllm.interleave`),
    ``steps`` (every cell carries ``group`` = the arms -- adaptive, the table, each fixed K -- run
    inside the same waves of one engine, switched per step; no fixed K above that engine's K)
    or ``cells`` (each cell's waves back to back)."""
    if design not in DESIGNS:
        raise InputError("--design", design, f"must be one of {', '.join(DESIGNS)}")
    if not fixed_ks:
        raise InputError("--fixed-k", [], "need at least one fixed K")
    for k in fixed_ks:
        if k < 1:
            raise InputError("--fixed-k", k, "must be >= 1 (K=0 is the vanilla engine)")
    if len(set(fixed_ks)) != len(fixed_ks):
        raise InputError("--fixed-k", fixed_ks, "duplicate K")
    arms: tuple[int, ...] = ()
    if design == "steps":
        engine_k = adaptive_k if adaptive_k is not None else max(r[2] for r in ranges)
        if engine_k < 1:
            raise InputError("--design", design, "the table serves K=0 at every batch size: no engine to "
                             "switch K in (use --design paired)")
        if max(fixed_ks) > engine_k:
            raise InputError("--fixed-k", max(fixed_ks), f"above K={engine_k}, the largest K of the engine "
                             "the steps design runs every variant on")
        arms = ((Arm.ENGINE,) if adaptive_k is not None else ()) + (Arm.TABLE,) + tuple(sorted(fixed_ks))
    cells: list[Cell] = []
    turn = 0
    for r in range(repeats):
        for b in sorted(batch_sizes):
            variants = [Cell(r, b, MODE_VANILLA, 0)]
            variants += [Cell(r, b, MODE_FIXED, k) for k in sorted(fixed_ks)]
            variants.append(Cell(r, b, MODE_DSD, k_for_batch_size(ranges, b)))
            if adaptive_k is not None:
                variants.append(Cell(r, b, MODE_ADAPTIVE, adaptive_k))
            shift = turn % len(variants)
            variants = variants[shift:] + variants[:shift]
            if design == "paired":
                pairs = tuple((c.mode, c.num_spec_tokens) for c in variants)
                variants = [replace(c, interleave=pairs) for c in variants]
            elif arms:
                variants = [replace(c, group=arms) for c in variants]
            cells.extend(variants)
            turn += 1
    return cells


def dsd_llm_kwargs(base: LLMKwargs, table: KTable, spec) -> LLMKwargs | None:
    """vllm.LLM kwargs serving ``table`` through vLLM's own per-batch-size schedule.

    ``None`` when the table has K=0 everywhere (then DSD is served without speculation). The
    method and draft model come from the spec being run (the table's provenance may name another
    path for the same model); ranges and max K come from the table.
    """
    if max(r[2] for r in table["ranges"]) == 0:
        return None
    cfg = vllm_speculative_config(table)
    cfg["method"] = spec.engine.method
    return _with_speculative(base, cfg, spec)


def _with_speculative(base: LLMKwargs, cfg: Mapping[str, object], spec) -> LLMKwargs:
    """``base`` serving ``cfg`` with the spec's draft model (not the table's) and speculative extras."""
    cfg = {k: v for k, v in cfg.items() if k != "model"}
    if spec.engine.draft_model:
        cfg["model"] = spec.engine.draft_model
    cfg.update(spec.engine.speculative_extra)
    return {**base, "speculative_config": cfg}


def adaptive_max_k(table: KTable, options: Mapping[str, object] | None) -> int:
    """The adaptive engine's ``num_speculative_tokens`` (largest K the table measured), after
    checking that the plugin accepts the table and ``options``; InputError otherwise."""
    from dsdprof.serve.adaptive import AdaptiveKSelector
    from dsdprof.serve.settings import AdaptiveSettingError, adaptive_additional_config, resolve_settings

    try:
        settings = resolve_settings(adaptive_additional_config("-", options), environ={})
    except AdaptiveSettingError as err:
        raise InputError("--adaptive-config", json.dumps(options), str(err)) from None
    ks = [int(c["k"]) for c in table.get("cells") or []]
    if not ks or max(ks) < 1:
        raise InputError("table.cells", f"K={sorted(set(ks))}",
                         "--adaptive needs a v2 table with a measured K >= 1")
    try:
        AdaptiveKSelector.from_doc(table, max_k=max(ks), **dict(settings.options))
    except TableError as err:
        raise InputError("table", table.get("schema"), f"--adaptive: {err}") from None
    except (TypeError, ValueError) as err:
        raise InputError("--adaptive-config", json.dumps(options), str(err)) from None
    return max(ks)


def adaptive_llm_kwargs(base: LLMKwargs, table: KTable, spec, table_file: str, max_k: int,
                        options: Mapping[str, object]) -> LLMKwargs:
    """vllm.LLM kwargs of the adaptive engine: the static table's schedule (vLLM's dynamic-SD mode)
    with ``num_speculative_tokens = max_k``, dsdprof's adaptive scheduler, and the table file."""
    from dsdprof.serve.settings import ADAPTIVE_SCHEDULER_QUALNAME, adaptive_additional_config

    schedule = [list(r) for r in table["ranges"]]
    kwargs = _with_speculative(base, {"method": spec.engine.method, "num_speculative_tokens": max_k,
                                      "num_speculative_tokens_per_batch_size": schedule}, spec)
    kwargs["scheduler_cls"] = ADAPTIVE_SCHEDULER_QUALNAME
    kwargs["additional_config"] = {**cast("dict[str, object]", base.get("additional_config") or {}),
                                   **adaptive_additional_config(table_file, options)}
    return kwargs


def check_validate_spec(spec) -> None:
    """validate serves tables on real vLLM: any other engine is one InputError."""
    if spec.engine.name != "vllm":
        raise InputError("engine.name", spec.engine.name, "validate runs real vLLM: use name = \"vllm\"")


def table_warnings(table: KTable, spec) -> list[str]:
    """Mismatches between the table's provenance and the spec being validated (a spec validate
    cannot run is refused first: errors come before warnings)."""
    check_validate_spec(spec)
    prov = table.get("provenance", {}) or {}
    out = []
    for key, ours in (("model", spec.engine.model), ("draft_model", spec.engine.draft_model or ""),
                      ("method", spec.engine.method)):
        theirs = prov.get(key)
        if theirs and ours and str(theirs) != str(ours):
            out.append(f"table was profiled with {key}={theirs!r}, the spec runs {ours!r}")
    points = sorted(int(p["batch_size"]) for p in table.get("points", []) if "batch_size" in p)
    if points:
        outside = [b for b in spec.sweep.batch_sizes if b < points[0] or b > points[-1]]
        if outside:
            out.append(f"batch sizes {outside} lie outside the table's profiled {points[0]}..{points[-1]}")
    return out


def validation_engine(spec, table: KTable, out: Path, fixed_engines: int = 1,
                      adaptive: tuple[str, int, Mapping[str, object]] | None = None, table_path: str = "",
                      start_worker: Callable[..., Any] | None = None, steps: bool = False) -> VllmEngine:
    """The vLLM engines of a validate run: vanilla and fixed K as in a sweep, plus ``table`` served
    on the ``dsd`` engine through vLLM's own schedule and, with ``adaptive = (table file, max K,
    options)``, on the ``adaptive`` engine through dsdprof's plugin. ``steps``: the steps design, where
    only vanilla and one more engine are alive."""
    engine = VllmEngine(spec, out_dir=out, one_fixed_engine=False, start_worker=start_worker,
                        concurrent_engines=2 if steps else 2 + fixed_engines + (adaptive is not None))
    served = {MODE_DSD: dsd_llm_kwargs(engine.base_kwargs(), table, spec)}
    if adaptive is not None:
        served[MODE_ADAPTIVE] = adaptive_llm_kwargs(engine.base_kwargs(), table, spec, *adaptive)
    engine.serve(served, {"run_kind": VALIDATE_KEY, "validate_table": table_path})
    return engine


class ValidatePlanner:
    """The validation cells once, on engines started for them (models checked, the first cell's
    engine warm so that the rows' provenance comes from a live engine)."""

    def __init__(self, cells: list[Cell], variants: str) -> None:
        self._cells, self._variants, self._planned = cells, variants, False

    def start(self, engine: Any, done: set[str]) -> str:
        todo = [c for c in self._cells if c.cell_id not in done]
        if todo:
            engine.check_models()
            if (prestart := getattr(engine, "prestart", None)) is not None:  # every engine it needs
                prestart(list(dict.fromkeys(worker_key(c) for c in todo)))
            try:
                engine.pool.get(worker_key(todo[0]))  # provenance from a live engine when possible
            except Exception:  # noqa: BLE001 - the failure becomes that cell's row
                pass
        return VALIDATE_KEY

    def plan(self, rows: list[MeasurementRow]) -> list[Cell]:
        if self._planned:
            return []
        self._planned = True
        return self._cells

    def admit(self, cell: Cell, rows: list[MeasurementRow]) -> bool:
        return True

    def describe(self, cells: list[Cell], mode: str) -> str:
        return f"{len(cells)} cells: {self._variants}"

    def finish(self, rows: list[MeasurementRow]) -> None:
        pass


def run_validation(table: KTable, spec, out_dir: str | Path, fixed_ks: list[int],
                   table_path: str = "", resume: bool = False,
                   on_progress: Callable[[SweepProgress], None] | None = None,
                   start_worker: Callable[..., Any] | None = None,
                   adaptive: Mapping[str, object] | None = None, design: str = "paired") -> ValidateSummary:
    """Run vanilla / fixed K / DSD (/ adaptive) cells of ``spec``'s workload into ``out_dir``.

    ``adaptive``: None, or the selector options (``{}`` for defaults) of an ``adaptive`` variant.
    ``design``: ``paired`` (the variants of a batch size and repeat interleaved wave by wave, so
    the regret intervals pair wave ``j`` of every variant), ``steps`` (every variant but vanilla
    inside the same waves of one engine, switched per step) or ``cells`` (:func:`plan_validation`).

    The same cell loop as ``sweep`` (:func:`dsdprof.measure.runner.run_plan`) on the same engine
    pool (:class:`~dsdprof.measure.vllm.engine.VllmEngine`, the table's engines added with
    :meth:`~dsdprof.measure.vllm.engine.VllmEngine.serve`): every engine is alive for the whole run
    (GPU memory split between them), and every cell is measured from the engine-core step trace
    with its K verified (the table's K at the batch size for DSD). ``start_worker(WorkerConfig,
    timeout_s)`` replaces the vLLM child process (orchestration tests only).
    """
    check_validate_spec(spec)
    if spec.sweep.context_lens:
        raise InputError("sweep.context_lens", spec.sweep.context_lens,
                         "validate serves one context (workload.input_len): leave context_lens out")
    ranges = [list(r) for r in table["ranges"]]
    adaptive_k = adaptive_max_k(table, adaptive) if adaptive is not None else None
    cells = plan_validation(spec.sweep.batch_sizes, fixed_ks, ranges, spec.sweep.repeats, adaptive_k, design)
    validate_doc: dict[str, Any] = {"table": table_path, "ranges": ranges, "fixed_ks": sorted(fixed_ks)}
    if design != "cells":  # only then, so that cell-by-cell runs keep their manifest hash
        validate_doc["design"] = design
    if adaptive is not None:  # only then, so that runs without it keep their manifest hash
        digest = hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()
        validate_doc["adaptive"] = {"options": dict(adaptive), "max_k": adaptive_k, "table_sha256": digest}
    spec_dump = normalised_spec_dump(spec)  # the same dump as sweep (for a vLLM spec: model_dump)
    spec_dump[VALIDATE_KEY] = validate_doc
    out = Path(out_dir)
    warnings = list(table_warnings(table, spec))

    def make_engine() -> VllmEngine:
        adaptive_engine = None
        if adaptive is not None and adaptive_k is not None:
            table_file = write_json_atomic(out / ADAPTIVE_TABLE_FILE, table, force=True)
            adaptive_engine = (str(table_file.resolve()), adaptive_k, dict(adaptive))
        engine = validation_engine(spec, table, out, len(fixed_ks), adaptive_engine, table_path, start_worker,
                                   steps=design == "steps")
        if engine.served[MODE_DSD] is None:
            warnings.append("table has K=0 at every batch size: DSD is served without a speculative config")
        return engine

    variants = f"vanilla, fixed K={sorted(fixed_ks)}, DSD" + (", adaptive" if adaptive is not None else "")
    variants += {"paired": "; design paired (variants' waves interleaved)", "cells": "; design cells",
                 "steps": "; design steps (variants switched per step in one engine)"}[design]
    res = run_plan(ValidatePlanner(cells, variants), spec_dump, out, make_engine, resume=resume,
                   on_progress=on_progress)
    return ValidateSummary(out, res.total, res.ok, res.failed, res.skipped, res.speculation_mode,
                           tuple(warnings))

