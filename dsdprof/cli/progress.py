"""Progress of ``sweep`` and ``validate``: a rich bar on a terminal, plain lines in logs.

When stderr is not a terminal (nohup, Slurm, CI, ``tee``) a bar would print once, at the end.
There, :class:`LogProgress` prints the grid first (the runner's ``begin`` event, from the spec's
sizes, before the engine starts or a cell is built), one plain line per finished cell (cells done,
the cell, its status and AL/ITL, the rate and the ETA) and, whenever no line came for
:data:`HEARTBEAT_S` seconds (an engine starting, a long cell), a line saying which cell is running
and for how long.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

HEARTBEAT_S = 10.0  # at most this long between two lines in a log while the run is alive


def duration(seconds: float) -> str:
    if seconds is None or math.isnan(seconds) or math.isinf(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def cell_label(cell: Any) -> str:
    return f"BS {cell.batch_size} K {cell.num_spec_tokens} {cell.mode}" if cell is not None else ""


class LogProgress:
    """Plain progress lines for logs. Use as a context manager; feed it runner events."""

    def __init__(self, console: Console, name: str, heartbeat_s: float = HEARTBEAT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.name, self.heartbeat_s, self.clock = console, name, heartbeat_s, clock
        self.total = 0
        self.done = 0
        self.measured = 0  # cells run in this process (skipped ones cost no time; a paired unit's at once)
        self.units: set = set()
        self.ahead = 0  # rows of paired units already run but not reported yet
        self.started = clock()
        self.running: tuple[str, float] | None = None
        self.last_line = clock()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def line(self, text: str) -> None:
        with self._lock:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self.last_line = self.clock()

    def rate_eta(self) -> str:
        elapsed = self.clock() - self.started
        if self.measured == 0 or elapsed <= 0:
            return f"elapsed {duration(elapsed)}"
        per_cell = elapsed / self.measured
        left = max(0, self.total - self.done - self.ahead)
        return (f"{60.0 / per_cell:.1f} cells/min, elapsed {duration(elapsed)}, "
                f"ETA {duration(per_cell * left)}")

    def __call__(self, ev: Any) -> None:
        if ev.phase == "begin":
            self.line(f"{self.name}: {ev.message}")
            return
        if ev.phase == "plan":
            self.total, self.done = ev.total, ev.index
            self.line(f"{self.name}: {ev.message}")
            return
        label = cell_label(ev.cell)
        if ev.phase == "start":
            self.running = (label, self.clock())
            return
        if ev.phase not in ("done", "skip"):
            return
        self.done = ev.index
        self.running = None
        if ev.phase == "skip":
            return  # resumed cells: the next finished cell's line counts them
        unit = getattr(ev.cell, "unit", None)
        if unit is None:
            self.measured += 1
        elif unit not in self.units:  # a paired unit's first row: its engine time bought every row of it
            self.units.add(unit)
            self.measured += len(ev.cell.group) + 1  # its DSD group and the vanilla cell
            self.ahead += len(ev.cell.group)  # its other rows follow at once
        else:
            self.ahead = max(0, self.ahead - 1)
        status = ev.status or "ok"
        detail = ""
        if status == "ok" and not math.isnan(ev.acceptance_length) and not math.isnan(ev.itl_s):
            detail = f" AL {ev.acceptance_length:.2f} ITL {ev.itl_s * 1e3:.2f} ms"
        elif status != "ok":
            detail = f": {' '.join(str(ev.message).split())[:200]}"
        self.line(f"{self.name} [{self.done}/{self.total}] {label} {status}{detail}; {self.rate_eta()}")

    def beat(self) -> str | None:
        """The heartbeat line when none came for ``heartbeat_s`` (printed; None otherwise)."""
        now = self.clock()
        if now - self.last_line < self.heartbeat_s:
            return None
        running = self.running
        what = f"running {running[0]} for {duration(now - running[1])}" if running else "waiting"
        text = f"{self.name} [{self.done}/{self.total}] {what}; {self.rate_eta()}"
        self.line(text)
        return text

    def _beat(self) -> None:
        while not self._stop.wait(min(self.heartbeat_s, 1.0)):
            self.beat()

    def __enter__(self) -> LogProgress:
        self._thread = threading.Thread(target=self._beat, name="dsdprof-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


def run_progress(err_console: Console, name: str, notices: list[str], first_error: list[str]):
    """(context manager, callback) for a run of cells (``sweep``, ``validate``: ``name``): a rich bar
    on a terminal, else :class:`LogProgress`. ``notices`` print once the run has planned; failed
    cells' messages go to ``first_error``."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[cell]}"), TimeElapsedColumn(), TextColumn("ETA"),
                        TimeRemainingColumn(), console=err_console, transient=False)
    log = None if err_console.is_terminal else LogProgress(err_console, name)  # logs: plain lines
    task = None

    def on_progress(ev: Any) -> None:
        nonlocal task
        if ev.phase in ("begin", "plan"):  # the run directory is ours: notices first
            for notice in notices:
                err_console.print(notice, style="yellow", markup=False, highlight=False, soft_wrap=True)
            notices.clear()  # a budgeted sweep plans several passes
        if ev.status == "failed":
            first_error.append(ev.message)
        if log is not None:
            return log(ev)
        if ev.phase == "begin":
            err_console.print(ev.message, style="dim", markup=False, highlight=False)
            return
        if ev.phase == "plan":
            err_console.print(f"[dim]{ev.message}[/]")
            task = progress.add_task(name, total=ev.total, cell="")
            return
        if task is None:
            return
        label = f"BS {ev.cell.batch_size:>4} K {ev.cell.num_spec_tokens} {ev.cell.mode}" if ev.cell else ""
        if ev.phase == "start":
            progress.update(task, cell=label)
        elif ev.phase in ("done", "skip"):
            progress.update(task, completed=ev.index, cell=label)
            if ev.status == "failed":
                progress.console.print(f"[red]cell {ev.cell.cell_id} failed:[/] {ev.message[:300]}")

    return (progress if log is None else log), on_progress
