"""Where a fleet's runs go: a local directory, or any filesystem URL pyarrow opens (``s3://``,
``gs://``, ``hdfs://``, ``file://``).

Under ``OUT``: each run's ordinary sweep directory (a sharded run's part files named
``part-s<i>-...``), ``_fleet/runs/<run>.json`` (the fleet's record of a run), ``_fleet/shards/<run>/
s<i>/`` (a shard's own sweep directory) and ``tables/`` (docs/fleet.md, "Where things go"). Sweeps
always write to a local directory with the crash-safe part files of :mod:`dsdprof.io.store`; for a
URL that directory is a staging copy and every file is uploaded as soon as it is durable locally,
so a run retried on another machine downloads what was done and resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from dsdprof.errors import InputError
from dsdprof.io.atomic import write_bytes_atomic

FLEET_DIR = "_fleet"
TABLES_DIR = "tables"


class WorkerRecord(TypedDict):
    shard: int
    host: str
    pid: int
    measured: int
    skipped: int
    wall_s: float


class RunState(TypedDict, total=False):
    """What a run's record says beyond its name: when it ran and how it ended."""

    started_at: str
    finished_at: str
    error: str
    cells: int
    ok: int
    failed: int
    speculation_mode: str
    workers: list[WorkerRecord]


class RunRecord(RunState, total=False):
    """``_fleet/runs/<run>.json``: the run, its spec's hash and engine, and its :class:`RunState`."""

    schema: str
    run: str
    state: str
    spec_hash: str
    engine: str
    model: str
    draft_model: str
    method: str
    hardware: str
    tensor_parallel_size: int
    shards: int


def is_url(out: str) -> bool:
    return "://" in out


def run_record_rel(run: str) -> str:
    return f"{FLEET_DIR}/runs/{run}.json"


def shard_rel(run: str, shard: int) -> str:
    return f"{FLEET_DIR}/shards/{run}/s{shard}"


def default_staging(out: str) -> Path:
    digest = hashlib.sha1(out.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "dsdprof-fleet" / digest


def write_local_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data)


def _link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` replaced by a hard link to ``src`` (both on this machine's disk), else by a copy."""
    dst.unlink(missing_ok=True)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        write_local_atomic(dst, src.read_bytes())


class FleetStore:
    """Read and write files of a fleet output, local or remote, by path relative to ``out``."""

    def __init__(self, out: str, staging: str | None = None) -> None:
        self.out = out
        self.remote = is_url(out)
        if self.remote:
            import pyarrow.fs as pafs

            try:
                self.fs, root = pafs.FileSystem.from_uri(out)
            except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds for a bad URL
                raise InputError("fleet.out", out, f"not a filesystem URL pyarrow can open ({err})") from None
            self.root = root.rstrip("/")
            self._atomic_rename = isinstance(self.fs, pafs.LocalFileSystem)
            self.staging = Path(staging) if staging else default_staging(out)
        else:
            self.root = str(Path(out))
            self.staging = Path(out)

    # -- paths
    def local_path(self, rel: str) -> Path:
        """Path of ``rel`` for a local OUT (only)."""
        assert not self.remote
        return Path(self.root) / rel

    def work_dir(self, rel: str) -> Path:
        """The local directory a sweep writes for ``rel``: in OUT itself, or in the staging copy."""
        return (self.staging / rel) if self.remote else self.local_path(rel)

    def _remote(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def describe(self, rel: str) -> str:
        return f"{self.out.rstrip('/')}/{rel}"

    # -- files
    def exists(self, rel: str) -> bool:
        if not self.remote:
            return self.local_path(rel).exists()
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self._remote(rel)).type != pafs.FileType.NotFound

    def read_bytes(self, rel: str) -> bytes | None:
        if not self.remote:
            p = self.local_path(rel)
            return p.read_bytes() if p.is_file() else None
        if not self.exists(rel):
            return None
        with self.fs.open_input_stream(self._remote(rel)) as fh:
            return fh.read()

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Replace ``rel`` as a whole (temp + rename where the filesystem can; objects are atomic)."""
        if not self.remote:
            write_local_atomic(self.local_path(rel), data)
            return
        target = self._remote(rel)
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        if self._atomic_rename:
            tmp = f"{target.rsplit('/', 1)[0]}/.{target.rsplit('/', 1)[1]}.tmp"
            with self.fs.open_output_stream(tmp) as fh:
                fh.write(data)
            self.fs.move(tmp, target)
        else:
            with self.fs.open_output_stream(target) as fh:
                fh.write(data)

    def read_json(self, rel: str) -> dict[str, Any] | None:
        raw = self.read_bytes(rel)
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
        except ValueError as err:
            raise InputError(rel, self.describe(rel), f"unreadable JSON ({err})") from None
        return doc if isinstance(doc, dict) else None

    def write_json(self, rel: str, doc: Mapping[str, object]) -> None:
        self.write_bytes(rel, (json.dumps(doc, indent=2, default=str) + "\n").encode())

    def list_files(self, rel: str) -> dict[str, tuple[int, int]]:
        """File name -> (size, mtime ns) of the plain files directly in ``rel`` (none if absent)."""
        if not self.remote:
            d = self.local_path(rel)
            if not d.is_dir():
                return {}
            return {p.name: (st.st_size, st.st_mtime_ns) for p in d.iterdir() if p.is_file()
                    for st in [p.stat()]}
        import pyarrow.fs as pafs

        sel = pafs.FileSelector(self._remote(rel), recursive=False, allow_not_found=True)
        return {i.base_name: (i.size, i.mtime_ns or 0) for i in self.fs.get_file_info(sel)
                if i.type == pafs.FileType.File}

    def same_file(self, local: Path, rel: str, size: int, mtime_ns: int) -> bool:
        """Whether the store's ``rel`` (of ``size`` / ``mtime_ns``) is an up-to-date copy of ``local``."""
        st = local.stat()
        if not self.remote:
            try:
                return os.path.samefile(local, self.local_path(rel))
            except OSError:
                return False
        return size == st.st_size and mtime_ns >= st.st_mtime_ns

    def delete(self, rel: str) -> None:
        if not self.remote:
            self.local_path(rel).unlink(missing_ok=True)
        elif self.exists(rel):
            self.fs.delete_file(self._remote(rel))

    def put_file(self, local: Path, rel: str) -> None:
        """Copy a durable local file to ``rel`` (a hard link when both are on this machine's disk)."""
        if not self.remote:
            _link_or_copy(local, self.local_path(rel))
        else:
            self.write_bytes(rel, local.read_bytes())

    def get_file(self, rel: str, local: Path) -> None:
        """Copy ``rel`` to a local path (temp + rename)."""
        if not self.remote:
            _link_or_copy(self.local_path(rel), local)
        elif (data := self.read_bytes(rel)) is not None:
            write_local_atomic(local, data)

    def tables_dir(self) -> Path:
        """Local directory to write tables in (uploaded afterwards for a URL)."""
        return self.work_dir(TABLES_DIR)
