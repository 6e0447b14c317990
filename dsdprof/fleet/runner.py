"""One unit of fleet work: a run (or one shard of a run) as an ordinary resumable sweep.

:func:`execute_shard` is what a Ray task runs (and what the local backend calls in-process). It
is idempotent: it brings back what earlier attempts left (from OUT or, for a URL, by download),
then calls :func:`dsdprof.measure.runner.run_sweep` with ``resume=True``, so finished cells are skipped
and a retry after a killed worker redoes at most the cell in flight.

A sharded run: each shard sweeps its share of the batch sizes into its own sweep directory
(``_fleet/shards/<run>/s<i>``; its own manifest, its own engine) and publishes every finished
part file into the run directory as ``part-s<i>-<name>``. The run directory gets its manifest
once, from the fleet, when every shard has finished.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from dsdprof.config.spec import SweepSpec
from dsdprof.fleet.store import FleetStore, shard_rel
from dsdprof.io.runlock import LOCK_FILES

FAULT_DIR_ENV = "DSDPROF_FLEET_FAULT_DIR"
PART_PREFIX = "part-"
ENGINE_SUBDIRS = ("_logs", "_traces")  # what the vLLM engine writes under its run directory


@dataclass(frozen=True)
class ShardTask:
    """Everything a worker needs, picklable. ``spec`` is already restricted to the shard."""

    run: str
    shard: int
    shards: int
    spec: SweepSpec
    out: str
    staging: str | None
    cwd: str
    spans_nodes: bool = False

    @property
    def label(self) -> str:
        return self.run if self.shards == 1 else f"{self.run}/s{self.shard}"


@dataclass(frozen=True)
class ShardResult:
    run: str
    shard: int
    total: int  # planned cells of this shard
    ok: int  # cells with an ok row after this attempt
    measured: int  # cells measured by this attempt (ok or failed)
    skipped: int  # cells already done before this attempt
    speculation_mode: str
    host: str
    pid: int
    wall_s: float


@dataclass(frozen=True)
class Placement:
    """Where a shard's sweep directory lives and how its files reach the store."""

    work_dir: Path  # local directory run_sweep writes
    files_rel: str | None  # store dir mirroring work_dir's manifest files (None: work_dir is in OUT)
    parts_rel: str | None  # store dir the part files are published to (None: they already are)
    part_tag: str  # "" or "s<i>-": published name = "part-" + tag + name[len("part-"):]


def placement_for(store: FleetStore, task: ShardTask) -> Placement:
    if task.shards == 1:
        rel = task.run
        return Placement(store.work_dir(rel), rel if store.remote else None, rel if store.remote else None,
                         "")
    rel = shard_rel(task.run, task.shard)
    return Placement(store.work_dir(rel), rel if store.remote else None, task.run, f"s{task.shard}-")


def _is_part(name: str) -> bool:
    return name.startswith(PART_PREFIX) and name.endswith(".parquet")


def _published(name: str, tag: str) -> str:
    return PART_PREFIX + tag + name[len(PART_PREFIX):]


class Mirror:
    """Keeps a shard's store copy in step with its local sweep directory."""

    def __init__(self, store: FleetStore, placement: Placement) -> None:
        self.store = store
        self.p = placement
        self._sent: dict[str, tuple[int, int]] = {}  # local name -> (size, mtime) last sent
        self._skip = set(LOCK_FILES)

    def _target(self, name: str) -> str | None:
        """Store path of a local file, or None when it stays local."""
        p = self.p
        if name.startswith(".") or name.endswith(".tmp") or name in self._skip:
            return None
        if _is_part(name):
            return None if p.parts_rel is None else f"{p.parts_rel}/{_published(name, p.part_tag)}"
        if name.endswith(".json") and p.files_rel is not None:
            return f"{p.files_rel}/{name}"
        return None  # _attempts/, quarantined corrupt files, engine logs stay local

    def restore(self) -> None:
        """Bring back files of earlier attempts that the local directory lacks, and remember
        which local files the store already holds up to date (so only the others are sent)."""
        p, store = self.p, self.store
        p.work_dir.mkdir(parents=True, exist_ok=True)
        in_store: dict[str, tuple[str, int, int]] = {}  # local name -> (store path, size, mtime)
        if p.files_rel is not None:
            for name, (size, mtime) in store.list_files(p.files_rel).items():
                if self._target(name) == f"{p.files_rel}/{name}" and not _is_part(name):
                    in_store[name] = (f"{p.files_rel}/{name}", size, mtime)
        if p.parts_rel is not None:
            want = PART_PREFIX + p.part_tag
            for name, (size, mtime) in store.list_files(p.parts_rel).items():
                if _is_part(name) and name.startswith(want):
                    in_store[PART_PREFIX + name[len(want):]] = (f"{p.parts_rel}/{name}", size, mtime)
        for name, (rel, size, mtime) in in_store.items():
            local = p.work_dir / name
            if not local.exists():
                store.get_file(rel, local)
                mtime = max(mtime, local.stat().st_mtime_ns)
            if store.same_file(local, rel, size, mtime):
                st = local.stat()
                self._sent[name] = (st.st_size, st.st_mtime_ns)

    def push(self) -> None:
        """Send every file that changed since it was last sent; drop parts that disappeared."""
        p = self.p
        if (p.files_rel is None and p.parts_rel is None) or not p.work_dir.is_dir():
            return
        present = set()
        for path in sorted(p.work_dir.iterdir()):
            target = self._target(path.name)
            if target is None or not path.is_file():
                continue
            present.add(path.name)
            st = path.stat()
            if self._sent.get(path.name) != (st.st_size, st.st_mtime_ns):
                self.store.put_file(path, target)
                self._sent[path.name] = (st.st_size, st.st_mtime_ns)
        for name in [n for n in self._sent if n not in present]:
            target = self._target(name)
            if target is not None and _is_part(name):
                self.store.delete(target)  # storage merged it away (one visible row per cell)
            del self._sent[name]

    def push_subdirs(self) -> None:
        """At the end of a run: the engine's logs and step traces (``_logs/``, ``_traces/``) too."""
        p = self.p
        if p.files_rel is None or not p.work_dir.is_dir():
            return
        for sub in sorted(d for d in p.work_dir.iterdir() if d.is_dir() and d.name in ENGINE_SUBDIRS):
            for path in sorted(f for f in sub.rglob("*") if f.is_file() and not f.name.startswith(".")):
                self.store.put_file(path, f"{p.files_rel}/{path.relative_to(p.work_dir).as_posix()}")


class _FaultInjection:
    """Testing aid for worker deaths: if ``$DSDPROF_FLEET_FAULT_DIR/<label>.kill`` exists (its text:
    a cell count N), the worker running that run kills itself with SIGKILL after N cells, once
    (the file is renamed to ``.killed`` first). Unset variable: does nothing."""

    def __init__(self, label: str) -> None:
        self.after: int | None = None
        self.cells = 0
        fault_dir = os.environ.get(FAULT_DIR_ENV)
        if not fault_dir:
            return
        self.path = Path(fault_dir) / (label.replace("/", "__") + ".kill")
        if self.path.is_file():
            self.after = int(self.path.read_text().strip() or "1")

    def cell_done(self) -> None:
        if self.after is None:
            return
        self.cells += 1
        if self.cells >= self.after and self.path.is_file():
            self.path.rename(self.path.with_suffix(".killed"))
            os.kill(os.getpid(), signal.SIGKILL)


def count_ok_cells(work_dir: Path) -> set[str]:
    """Cell ids with an ok row among the part files of a sweep directory."""
    import pyarrow.parquet as pq

    ok: set[str] = set()
    for part in sorted(work_dir.glob("*.parquet")) if work_dir.is_dir() else []:
        if part.name.startswith(("_", ".")):
            continue
        table = pq.read_table(part, columns=["cell_id", "status"])
        ok.update(c for c, s in zip(table.column("cell_id").to_pylist(), table.column("status").to_pylist())
                  if s == "ok")
    return ok


def execute_shard(task: ShardTask) -> ShardResult:
    """Run (or resume) one shard; what a Ray task executes. Raises on bad input or a refused resume."""
    from dsdprof.measure.runner import run_sweep

    t0 = time.perf_counter()
    if task.cwd and os.path.isdir(task.cwd):
        os.chdir(task.cwd)  # relative paths in specs mean what they meant where the fleet started
    if task.spans_nodes and "RAY_ADDRESS" not in os.environ:
        import ray

        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address  # the engine joins this cluster
    store = FleetStore(task.out, task.staging)
    placement = placement_for(store, task)
    placement.work_dir.parent.mkdir(parents=True, exist_ok=True)
    mirror = Mirror(store, placement)
    mirror.restore()
    fault = _FaultInjection(task.label)

    def on_progress(event) -> None:
        if event.phase in ("plan", "done"):
            mirror.push()  # "plan" follows the manifest; "done" follows a durable part file
        if event.phase == "done":
            fault.cell_done()

    summary = run_sweep(task.spec, placement.work_dir, resume=True, on_progress=on_progress)
    mirror.push()
    mirror.push_subdirs()
    ok = count_ok_cells(placement.work_dir)
    return ShardResult(task.run, task.shard, summary.total, len(ok), summary.ok + summary.failed,
                       summary.skipped, summary.speculation_mode, socket.gethostname(), os.getpid(),
                       time.perf_counter() - t0)
