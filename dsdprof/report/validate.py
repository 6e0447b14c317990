"""``dsdprof validate``: serve a K table on real vLLM and compare it with vanilla and fixed K.

Three kinds of engine, each in its own worker process (:class:`EngineWorker`), all kept alive for
the whole run so the cells can be interleaved per batch size (drift hits every variant alike; the
order of the variants rotates from one batch size / repeat to the next):

* ``vanilla``: no speculative config (the baseline);
* ``fixed-<K>``: ``num_speculative_tokens = K``, no dynamic schedule;
* ``dsd``: the table served exactly as a user would, through vLLM's own
  ``num_speculative_tokens_per_batch_size`` (:func:`dsdprof.table.vllm_speculative_config`) with
  vLLM's default scheduler. Requests carry no dsdprof K, so vLLM's lookup picks K by batch size.
  A table with K=0 everywhere is served without a speculative config.

Every cell is one durable Parquet row (:class:`SweepWriter`): ``mode`` is ``vanilla`` | ``fixed`` |
``dsd``; ``num_spec_tokens`` is the fixed K, or for DSD the table's K at that batch size. The
comparison itself is :func:`dsdprof.report.compare.compare`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dsdprof import __version__
from dsdprof.engines.base import Cell, Provenance
from dsdprof.errors import InputError
from dsdprof.schema import MODE_DSD, MODE_FIXED, MODE_VANILLA
from dsdprof.storage import SWEEP_META, SweepWriter, provenance_dict
from dsdprof.sweep import SweepProgress, measurement_row, run_cells
from dsdprof.table import k_for_batch_size

VALIDATE_KEY = "validate"  # key in _sweep.json marking a validate run
DEFAULT_FIXED_KS = (3,)


@dataclass(frozen=True)
class ValidateSummary:
    out: Path
    total: int
    ok: int
    failed: int
    skipped: int
    warnings: tuple[str, ...] = ()


def worker_key(cell: Cell) -> str:
    """Which engine runs a cell: ``vanilla``, ``fixed-<K>`` or ``dsd``."""
    if cell.mode == MODE_FIXED:
        return f"fixed-{cell.num_spec_tokens}"
    return cell.mode


def plan_validation(batch_sizes: list[int], fixed_ks: list[int], ranges: list[list[int]],
                    repeats: int) -> list[Cell]:
    """Cells in run order: per repeat, per batch size, every variant, order rotated each time."""
    if not fixed_ks:
        raise InputError("--fixed-k", [], "need at least one fixed K")
    for k in fixed_ks:
        if k < 1:
            raise InputError("--fixed-k", k, "must be >= 1 (K=0 is the vanilla engine)")
    if len(set(fixed_ks)) != len(fixed_ks):
        raise InputError("--fixed-k", fixed_ks, "duplicate K")
    cells: list[Cell] = []
    turn = 0
    for r in range(repeats):
        for b in sorted(batch_sizes):
            variants = [Cell(r, b, MODE_VANILLA, 0)]
            variants += [Cell(r, b, MODE_FIXED, k) for k in sorted(fixed_ks)]
            variants.append(Cell(r, b, MODE_DSD, k_for_batch_size(ranges, b)))
            shift = turn % len(variants)
            cells.extend(variants[shift:] + variants[:shift])
            turn += 1
    return cells


def dsd_llm_kwargs(base: dict[str, Any], table: dict[str, Any], spec) -> dict[str, Any] | None:
    """vllm.LLM kwargs serving ``table`` through vLLM's own per-batch-size schedule.

    ``None`` when the table has K=0 everywhere (then DSD is served without speculation). The
    method and draft model come from the spec being run (the table's provenance may name another
    path for the same model); ranges and max K come from the table.
    """
    from dsdprof.table import vllm_speculative_config

    if max(r[2] for r in table["ranges"]) == 0:
        return None
    cfg = vllm_speculative_config(table)
    e = spec.engine
    cfg["method"] = e.method
    cfg.pop("model", None)
    if e.draft_model:
        cfg["model"] = e.draft_model
    cfg.update(e.speculative_extra)
    kwargs = dict(base)
    kwargs["speculative_config"] = cfg
    return kwargs


def table_warnings(table: dict[str, Any], spec) -> list[str]:
    """Mismatches between the table's provenance and the spec being validated."""
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


def start_engine_worker(llm_kwargs: dict[str, Any], workload, timeout_s: float):
    """Default worker factory: one vLLM engine in a child process."""
    from dsdprof.engines.vllm_engine import EngineWorker
    from dsdprof.engines.vllm_worker import WorkerConfig

    return EngineWorker(WorkerConfig(llm_kwargs, workload), timeout_s)


class _Engines:
    """Lazily started engine workers, one per key; a key whose start failed stays failed."""

    def __init__(self, kwargs_for: Callable[[str], dict[str, Any]], workload, start_timeout_s: float,
                 start_worker: Callable[..., Any]) -> None:
        self._kwargs_for = kwargs_for
        self._workload = workload
        self._timeout = start_timeout_s
        self._start = start_worker
        self._workers: dict[str, Any] = {}
        self._start_errors: dict[str, str] = {}
        self.info: dict[str, Any] = {}

    def get(self, key: str):
        if key in self._start_errors:
            raise RuntimeError(f"engine {key!r} failed to start: {self._start_errors[key]}")
        w = self._workers.get(key)
        if w is not None and w.alive:
            return w
        if w is not None:
            w.kill()
        try:
            w = self._start(self._kwargs_for(key), self._workload, self._timeout)
        except Exception as err:  # noqa: BLE001 - remembered so later cells fail fast
            self._start_errors[key] = f"{type(err).__name__}: {err}"
            raise
        self._workers[key] = w
        self.info.update(w.info)
        return w

    def close(self) -> None:
        for w in self._workers.values():
            w.stop()
        self._workers.clear()


def _provenance(spec, info: dict[str, Any], table_path: str) -> Provenance:
    from dsdprof.engines.vllm_engine import _engine_version
    from dsdprof.engines.vllm_worker import detect_hardware

    e, w = spec.engine, spec.workload
    return Provenance(
        engine="vllm", engine_version=info.get("engine_version") or _engine_version(),
        model=e.model, draft_model=e.draft_model or "", method=e.method,
        hardware=info.get("hardware") or detect_hardware(), dtype=e.dtype, dataset=w.dataset,
        seed=w.seed, dsdprof_version=__version__,
        extra={"run_kind": VALIDATE_KEY, "validate_table": table_path},
    )


def _check_resume(out: Path, validate_doc: dict[str, Any]) -> None:
    meta = out / SWEEP_META
    if not meta.is_file():
        return
    try:
        stored = json.loads(meta.read_text()).get("spec", {}).get(VALIDATE_KEY)
    except ValueError:
        return
    if stored != validate_doc:
        raise InputError("table", validate_doc.get("table"), f"differs from the validate run being resumed in {out}")


def run_validation(table: dict[str, Any], spec, out_dir: str | Path, fixed_ks: list[int],
                   table_path: str = "", resume: bool = False,
                   on_progress: Callable[[SweepProgress], None] | None = None,
                   start_worker: Callable[..., Any] | None = None) -> ValidateSummary:
    """Run vanilla / fixed K / DSD cells of ``spec``'s workload into ``out_dir``.

    ``start_worker(llm_kwargs, workload, timeout_s)`` starts one engine (default: a vLLM child
    process); it returns an object with ``run(CellRequest, timeout_s)``, ``alive``, ``info``,
    ``stop()`` and ``kill()``.
    """
    from dsdprof.engines.vllm_engine import DEFAULT_START_TIMEOUT_S, VllmEngine

    notify = on_progress or (lambda _e: None)
    if spec.engine.name != "vllm":
        raise InputError("engine.name", spec.engine.name, "validate runs real vLLM: use name = \"vllm\"")
    ranges = [list(r) for r in table["ranges"]]
    cells = plan_validation(spec.sweep.batch_sizes, fixed_ks, ranges, spec.sweep.repeats)
    validate_doc = {"table": table_path, "ranges": ranges, "fixed_ks": sorted(fixed_ks)}
    spec_dump = spec.model_dump(mode="json")
    spec_dump[VALIDATE_KEY] = validate_doc
    out = Path(out_dir)
    if resume:
        _check_resume(out, validate_doc)
    writer = SweepWriter(out, spec_dump, resume=resume)  # refuses to overwrite before any work

    kw = VllmEngine(spec)  # only builds kwargs here; its own workers are never started
    base = kw.llm_kwargs(MODE_VANILLA)
    dsd_kwargs = dsd_llm_kwargs(base, table, spec)

    def kwargs_for(key: str) -> dict[str, Any]:
        if key == MODE_DSD:
            return dsd_kwargs if dsd_kwargs is not None else dict(base)
        return kw.llm_kwargs(key)

    timeout = float(spec.engine.extra.get("dsdprof_start_timeout_s", DEFAULT_START_TIMEOUT_S))
    cell_timeout = float(spec.engine.extra.get("dsdprof_cell_timeout_s", 3600))
    engines = _Engines(kwargs_for, spec.workload, timeout, start_worker or start_engine_worker)
    warnings = tuple(table_warnings(table, spec))
    if dsd_kwargs is None:
        warnings += ("table has K=0 at every batch size: DSD is served without a speculative config",)
    try:
        todo = [c for c in cells if c.cell_id not in writer.done]
        if todo:
            try:
                engines.get(worker_key(todo[0]))  # provenance from a live engine when possible
            except Exception:  # noqa: BLE001 - the failure becomes that cell's row below
                pass
        prov = provenance_dict(_provenance(spec, engines.info, table_path))
        writer.start(prov)
        total = len(cells)
        notify(SweepProgress("plan", 0, total, message=f"{total} cells: vanilla, fixed K={sorted(fixed_ks)}, DSD"))
        ok, failed, skipped = run_cells(
            cells, writer, lambda cell: _measure(engines, cell, spec, prov, cell_timeout),
            prov, spec.sweep.consistency_tolerance, notify)
        return ValidateSummary(out, len(cells), ok, failed, skipped, warnings)
    finally:
        engines.close()


def _measure(engines: _Engines, cell: Cell, spec, prov: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    from dsdprof.engines.vllm_worker import CellRequest

    s = spec.sweep
    req = CellRequest(batch_size=cell.batch_size, num_spec_tokens=None,  # never force K
                      positions=cell.num_spec_tokens, waves=s.waves, warmup=s.warmup,
                      output_len=s.output_len, temperature=spec.workload.temperature,
                      seed=spec.workload.seed)
    m = engines.get(worker_key(cell)).run(req, timeout_s)
    return measurement_row(cell, m, prov, s.consistency_tolerance)


def is_validate_run(path: str | Path) -> bool:
    """True when ``path`` (directory or Parquet file) was written by ``dsdprof validate``."""
    from dsdprof.analysis import read_provenance

    try:
        if read_provenance(path).get("extra_run_kind") == VALIDATE_KEY:
            return True
    except InputError:
        return False
    meta = Path(path) / SWEEP_META
    try:
        return meta.is_file() and VALIDATE_KEY in json.loads(meta.read_text()).get("spec", {})
    except ValueError:
        return False
