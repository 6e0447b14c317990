"""Engine processes: one vLLM engine per child process (:class:`EngineWorker`), started on first
use and kept alive by an :class:`EnginePool`, and the one-line root cause of a failed start."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dsdprof.measure.engine import CellMeasurement
from dsdprof.measure.vllm.resources import LLMKwargs
from dsdprof.measure.vllm.worker import CellRequest, WorkerConfig, worker_main


class EngineFailure(RuntimeError):
    """An engine failed to start, died, or a cell raised inside it."""


def _one_line(err: BaseException, limit: int = 400) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_GENERIC_FAILURES = ("initialization failed", "See root cause above", "See stack trace")


def root_cause(err: BaseException, log_path: str = "") -> str:
    """One line for an engine that failed to start: vLLM's own root cause from the engine log
    when the exception only says "see above" (the engine core's error is logged, not raised)."""
    message = _one_line(err)
    if not log_path or not any(g in message for g in _GENERIC_FAILURES):
        return message
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return message
    for line in lines:
        text = line.split("] ", 1)[-1].strip() if "ERROR" in line else line.strip()
        head = text.split(":", 1)[0]
        if (head.endswith(("Error", "Exception")) and " " not in head
                and not any(g in text for g in _GENERIC_FAILURES)):
            return _one_line(RuntimeError(text))
    return message


class EngineWorker:
    """Parent-side handle of one engine process."""

    def __init__(self, config: WorkerConfig, start_timeout_s: float, wait: bool = True) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, config), daemon=False)
        self.proc.start()
        child.close()
        self._deadline = time.monotonic() + start_timeout_s
        self.info: Any = None
        self._stop_sent = False
        if wait:
            self.wait_started()

    def wait_started(self) -> EngineWorker:
        """Block until the engine reports ready (its ``info``), within the start timeout counted from
        the spawn; raises :class:`EngineFailure` (the process killed) when it fails or times out."""
        if self.info is None:
            self.info = self._receive(max(self._deadline - time.monotonic(), 0.0), "engine start")
        return self

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
            raise EngineFailure(f"engine process died during {what} "
                                f"(exit code {self.proc.exitcode})") from None
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

    def pause(self) -> None:
        """SIGSTOP the worker's process group (front end, engine core, model worker): an idle vLLM
        engine keeps polling (its shm broadcast queue spins ``sched_yield`` for 1 s after each read)
        and would take CPU from the engine being measured. :meth:`resume` undoes it."""
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_group(signal.SIGCONT)

    def _signal_group(self, sig: int) -> None:
        if self.proc.pid is not None and self.proc.is_alive():
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def request_stop(self) -> None:
        """Ask the engine to shut down, without waiting (:meth:`stop` waits): vLLM's shutdown takes
        seconds, so a pool's engines shut down side by side (:meth:`EnginePool.close`)."""
        self.resume()  # a paused engine could not read the stop message
        if self.alive and not self._stop_sent:
            try:
                self.conn.send(("stop",))
                self._stop_sent = True
            except (OSError, BrokenPipeError):
                pass

    def stop(self) -> None:
        self.request_stop()
        if self._stop_sent:
            self.proc.join(60)
        self.kill()

    def kill(self) -> None:
        """Kill the worker's whole process group (engine core, workers), even if its leader is gone."""
        pid = self.proc.pid
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                if self.proc.is_alive():
                    self.proc.kill()
            self.proc.join(10)
        self.conn.close()


StartWorker = Callable[[WorkerConfig, float], Any]
# Pause every other engine of a pool while one measures (EnginePool.exclusive); see docs/lab/notebook.md.
# Off by default: measured, it removed ~2 % of a core at BS 8 and no interval narrowed, while a
# paused engine cannot see its parent die (a worker exits on its pipe's EOF), so a kill -9 of the
# sweep would leave it stopped, holding its memory. DSDPROF_PAUSE_IDLE_ENGINES=1 turns it on.
PAUSE_IDLE_ENGINES = os.environ.get("DSDPROF_PAUSE_IDLE_ENGINES", "") == "1"
# Spawn a run's engines side by side (EnginePool.prestart); DSDPROF_PRESTART_ENGINES=0 starts them in
# turn, as before (to time the two side by side: benchmarks).
PRESTART_ENGINES = os.environ.get("DSDPROF_PRESTART_ENGINES", "1") != "0"


class EnginePool:
    """Engine workers by key (``vanilla``, ``dsd``, ``fixed-<K>``, ...), started lazily and kept
    alive so cells can interleave; a key whose start failed stays failed. Shared by sweep and
    validate. ``start_worker(config, timeout_s)`` defaults to a vLLM child process."""

    def __init__(self, kwargs_for: Callable[[str], LLMKwargs], workload, start_timeout_s: float,
                 log_dir: Path | None = None, start_worker: StartWorker | None = None,
                 max_output_len: int = 2, run_token: str = "", trace_dir: str = "") -> None:
        self._run_token = run_token
        self._trace_dir = trace_dir
        self._kwargs_for = kwargs_for
        self._max_output_len = max_output_len
        self._workload = workload
        self._timeout = start_timeout_s
        self._log_dir = log_dir
        self._start = start_worker or EngineWorker
        self._workers: dict[str, Any] = {}
        self._starting: dict[str, EngineWorker] = {}  # spawned by prestart, not yet waited for
        self.pause_idle = PAUSE_IDLE_ENGINES
        self.start_errors: dict[str, str] = {}
        self.info: dict[str, Any] = {}

    def log_path(self, key: str) -> str:
        return str(self._log_dir / f"engine-{key}.log") if self._log_dir is not None else ""

    def get(self, key: str):
        if key in self.start_errors:
            raise EngineFailure(f"engine {key!r} failed to start: {self.start_errors[key]}")
        w = self._workers.get(key)
        if w is not None and w.alive:
            return w
        if w is not None:
            w.kill()
        try:
            starting = self._starting.pop(key, None)
            if starting is not None:
                w = starting.wait_started()
            else:
                w = self._start(self._config(key), self._timeout)
        except Exception as err:  # noqa: BLE001 - remembered so later cells fail fast
            self.start_errors[key] = root_cause(err, self.log_path(key))
            raise EngineFailure(self.start_errors[key]) from None
        self._workers[key] = w
        self.info.update(w.info)
        return w

    def _config(self, key: str) -> WorkerConfig:
        return WorkerConfig(self._kwargs_for(key), self._workload, self.log_path(key), self._max_output_len,
                            self._run_token, self._trace_dir)

    def prestart(self, keys: list[str]) -> None:
        """Spawn the engines of ``keys`` now, side by side, without waiting: an engine's start is
        minutes of single-threaded imports and loading (three processes on vLLM's CPU build), so a
        sweep that needs two engines waits for the slower one instead of both in turn. :meth:`get`
        waits for each in the order it is asked for, so the first failure reported is the first
        engine's, as before. Only the default process workers start early (a ``start_worker`` of a
        test starts on :meth:`get`); never on a GPU, where engines starting together would each
        read the other's memory as taken (the caller decides: :class:`~.engine.VllmEngine`)."""
        if self._start is not EngineWorker or not PRESTART_ENGINES:
            return
        for key in keys:
            if key in self._workers or key in self._starting or key in self.start_errors:
                continue
            self._starting[key] = EngineWorker(self._config(key), self._timeout, wait=False)

    @contextmanager
    def exclusive(self, key: str):
        """The worker of ``key`` (started if needed), with every other live engine of the pool paused
        (:meth:`EngineWorker.pause`) until the block ends, error or not (``pause_idle`` off: nothing
        is paused). Workers without ``pause`` (test fakes) are left alone."""
        paused: list[Any] = []
        try:
            if self.pause_idle:
                for k, w in list(self._workers.items()):
                    if k != key and hasattr(w, "pause") and w.alive:
                        paused.append(w)  # before the signal: resumed even if pausing is interrupted
                        w.pause()
            yield self.get(key)
        finally:
            for w in paused:
                w.resume()

    def stop(self, key: str) -> None:
        w = self._workers.pop(key, None)
        if w is not None:
            w.stop()

    def keys(self) -> list[str]:
        return list(self._workers)

    def close(self) -> None:
        for w in self._workers.values():  # every engine's shutdown at once, then each waited for
            getattr(w, "request_stop", lambda: None)()  # test fakes may not have it
        for w in self._workers.values():
            w.stop()
        self._workers.clear()
        for starting in self._starting.values():  # spawned early, never asked for (a failed sweep)
            starting.kill()
        self._starting.clear()


