"""Crash-safe run output: Parquet part files, one visible row per cell.

Layout of ``OUT``::

    OUT/_sweep.json                  run manifest: spec, its hash, versions, provenance (dsdprof.io.manifest)
    OUT/_dsdprof.lock                advisory OS lock: one writer per OUT (dsdprof.io.runlock)
    OUT/_dsdprof.holder.json         pid, host, command and start time of the lock's holder
    OUT/part-00000-dsd-bs1-k3-r0.parquet   rows of finished cells (ok or failed)
    OUT/_attempts/part-00000-....<ns>.parquet  earlier versions of part files whose rows were superseded

``pandas.read_parquet(OUT)`` returns exactly one row per cell (pyarrow skips names starting with
``_`` or ``.``). Invariants, kept at every instant so that a ``kill -9`` anywhere leaves a
readable run:

* every file is written to a hidden temp name, fsynced and renamed (``os.replace``), so a visible
  part file is always complete;
* a cell's first row goes into a new part file: before the rename the cell has no visible row,
  after it one;
* a retried cell's row replaces its earlier (failed) row *inside the file that holds it*: the old
  file is first hard-linked under ``_attempts/``, then replaced by a copy with that row swapped, in
  one rename. The cell has one visible row before and after.

Rows are written one file per cell by default. With ``flush_rows > 1`` (the analytic engine)
rows are buffered and written together every ``flush_rows`` rows or ``flush_interval_s`` seconds,
at the end, and on interrupt; a kill loses at most the buffer, which ``--resume`` redoes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from dsdprof.errors import InputError
from dsdprof.formats.jsontypes import JSONObject, ManifestDoc, ProvenanceRecord
from dsdprof.formats.measurements import (
    COLUMN_NAMES,
    CONTEXT_COLUMN,
    OPTIONAL_COLUMN_NAMES,
    STATUS_OK,
    Provenance,
    arrow_schema,
    row_values,
)
from dsdprof.formats.versions import MEASUREMENT_SCHEMA_VERSION, PARQUET_METADATA_KEY
from dsdprof.io.atomic import fsync_dir, signals_held, write_bytes_atomic
from dsdprof.io.manifest import (
    MANIFEST_NAME,
    build_manifest,
    check_same_provenance,
    check_same_run,
    measurement_versions,
    parse_manifest,
)
from dsdprof.io.runlock import LOCK_FILES, LOCK_NAME, RunLock

SWEEP_META = MANIFEST_NAME
ParquetRow = dict[str, object]  # column -> value, checked by the arrow schema when written
ATTEMPTS_DIR = "_attempts"
_PART_RE = re.compile(r"^part-(\d+)-.+\.parquet$")


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _is_scratch(name: str) -> bool:
    """Files a run directory may hold before its first manifest: lock files, dsdprof temp files."""
    return name in LOCK_FILES or (name.startswith(".") and name.endswith(".tmp"))


class SweepWriter:
    """Owns one run directory while it is open: locks it, checks a resume, writes rows.

    Use as a context manager (or call :meth:`close`): buffered rows are flushed and the lock is
    released on exit, also on ``KeyboardInterrupt``.
    """

    def __init__(self, out_dir: str | Path, spec_dump: JSONObject, resume: bool = False, *,
                 flush_rows: int = 1, flush_interval_s: float | None = None) -> None:
        self.out = Path(out_dir)
        self.spec_dump = spec_dump
        self.versions = measurement_versions(spec_dump)
        self.done: set[str] = set()
        self.provenance: ProvenanceRecord = {}
        self.flush_rows = max(1, int(flush_rows))
        self.flush_interval_s = flush_interval_s
        self._buffer: dict[str, ParquetRow] = {}  # cell_id -> row, in arrival order
        self._last_flush = time.monotonic()
        self._visible: dict[str, str] = {}  # cell_id -> name of the part file holding its row
        self._torn: list[Path] = []
        self._duplicates: dict[str, set[int]] = {}  # part name -> row positions to drop
        self._next_index = 0
        self._stored: ManifestDoc | None = None
        self._started = False
        self._claimed_at = utc_now()
        self._claimed = False  # this writer wrote a provenance-less manifest into an empty OUT
        self._created: list[Path] = []  # directories this writer created (removed if left empty)
        self._lock = RunLock(self.out)
        self._prepare_dir()
        self._lock_existed = (self.out / LOCK_NAME).exists()
        try:
            self._lock.acquire(utc_now())
            if any(not _is_scratch(p.name) for p in self.out.iterdir()):
                if not resume:
                    raise InputError("out", str(self.out), "exists and is not empty; pass --resume to "
                                     "continue it or choose another --out")
                self._load_existing()
            else:  # claim the directory for this run before the engine writes logs into it
                self._claimed = True
                self._write_manifest(build_manifest(self.spec_dump, self.versions, None, utc_now()))
        except BaseException:
            self._release()
            raise

    # ------------------------------------------------------------------ opening

    def _prepare_dir(self) -> None:
        out = self.out
        try:
            if out.exists() and not out.is_dir():
                raise InputError("out", str(out), "exists and is not a directory")
        except OSError as err:
            raise InputError("out", str(out), f"cannot be inspected ({err.strerror or err})") from None
        missing = []
        p = out
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        if not missing:
            return
        if p.exists() and not p.is_dir():
            raise InputError("out", str(out), f"lies under {str(p)!r}, which is a file, not a directory")
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                if not d.is_dir():
                    raise InputError("out", str(out), f"{str(d)!r} exists and is not a directory") from None
                continue  # created concurrently by another process: the lock decides who runs
            except NotADirectoryError:
                raise InputError("out", str(out), "lies under a file, not a directory") from None
            except OSError as err:
                self._remove_created_dirs()
                raise InputError("out", str(out), f"cannot be created ({err.strerror or err})") from None
            self._created.append(d)

    def _load_existing(self) -> None:
        """Check the stored run against this one (refusing touches nothing), then read its rows."""
        meta_path = self.out / SWEEP_META
        if not meta_path.is_file():
            raise InputError("out", str(self.out), f"is not a dsdprof run (no {SWEEP_META}); refusing to "
                                                   "resume into it")
        try:
            text = meta_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(SWEEP_META, str(meta_path), f"unreadable ({err})") from None
        stored = parse_manifest(text, str(meta_path))
        check_same_run(stored, self.spec_dump, self.versions, self.out)
        self._stored = stored
        self._scan_parts()

    def _scan_parts(self) -> None:
        """Which cells have a visible row (read only: repairs wait for :meth:`start`)."""
        import pyarrow.parquet as pq

        seen: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
        for part in sorted(self.out.glob("part-*.parquet")):
            m = _PART_RE.match(part.name)
            if m:
                self._next_index = max(self._next_index, int(m.group(1)) + 1)
            try:
                table = pq.read_table(part, columns=["cell_id", "status"])
            except Exception:  # noqa: BLE001 - not written by this protocol (disk fault): set aside
                self._torn.append(part)
                continue
            for i, (cid, status) in enumerate(zip(table.column("cell_id").to_pylist(),
                                                  table.column("status").to_pylist())):
                seen[cid].append((part.name, i, status))
        for cid, rows in seen.items():
            oks = [r for r in rows if r[2] == STATUS_OK]
            keep = (oks or rows)[-1]
            self._visible[cid] = keep[0]
            if keep[2] == STATUS_OK:
                self.done.add(cid)
            for name, i, _ in rows:
                if (name, i) != keep[:2]:
                    self._duplicates.setdefault(name, set()).add(i)

    # ------------------------------------------------------------------ starting

    def start(self, provenance: ProvenanceRecord) -> None:
        """Write the manifest (after checking a resumed run's provenance); repair leftovers."""
        if self._stored is not None:
            check_same_provenance(self._stored, provenance, self.out)
        self.provenance = provenance
        for tmp in self.out.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        for part in self._torn:
            part.rename(part.with_name("_corrupt-" + part.name))
        for name, rows in self._duplicates.items():
            self._rewrite(name, {}, drop=rows)
        self._torn, self._duplicates = [], {}
        if self._stored is not None:
            doc = build_manifest(self.spec_dump, self.versions, provenance,
                                 self._stored.get("started_at") or utc_now(), resumed_at=utc_now())
        else:
            doc = build_manifest(self.spec_dump, self.versions, provenance, self._claimed_at)
        self._write_manifest(doc)
        self._started = True

    def _write_manifest(self, doc: ManifestDoc) -> None:
        self._claimed_at = doc["started_at"]
        self._guard_io(SWEEP_META, lambda: write_bytes_atomic(
            self.out / SWEEP_META, json.dumps(doc, indent=2, default=str).encode()))

    # ------------------------------------------------------------------ writing

    def write_row(self, row: Mapping[str, object]) -> None:
        """Record one cell's row; durable now (``flush_rows == 1``) or at the next flush."""
        row_values(row)  # a key no column stores is a ValueError naming it
        if not self._started:
            raise RuntimeError("SweepWriter.start() must be called before write_row()")
        cell_id = str(row["cell_id"])
        self._buffer.pop(cell_id, None)
        self._buffer[cell_id] = {c: row.get(c) for c in COLUMN_NAMES + tuple(
            c for c in OPTIONAL_COLUMN_NAMES if c in row)}
        if row.get("status") == STATUS_OK:
            self.done.add(cell_id)
        else:
            self.done.discard(cell_id)
        due = (self.flush_interval_s is not None
               and time.monotonic() - self._last_flush >= self.flush_interval_s)
        if len(self._buffer) >= self.flush_rows or due:
            self.flush()

    def flush(self) -> None:
        """Write buffered rows: new cells into one new part file, retried cells in place. Ctrl-C and
        SIGTERM are held until the rows taken from the buffer are on disk."""
        with signals_held():
            self._flush()

    def _flush(self) -> None:
        rows, self._buffer = list(self._buffer.items()), {}
        self._last_flush = time.monotonic()
        if not rows:
            return
        fresh = [(cid, r) for cid, r in rows if cid not in self._visible]
        retried: dict[str, dict[str, ParquetRow]] = defaultdict(dict)
        for cid, r in rows:
            if cid in self._visible:
                retried[self._visible[cid]][cid] = r
        if fresh:
            first = fresh[0][0]
            more = f"+{len(fresh) - 1}" if len(fresh) > 1 else ""
            name = f"part-{self._next_index:05d}-{first}{more}.parquet"
            self._next_index += 1
            self._write_table(name, [r for _, r in fresh])
            self._visible.update({cid: name for cid, _ in fresh})
        for name, replace in retried.items():
            self._rewrite(name, replace)
        fsync_dir(self.out)

    def _rewrite(self, name: str, replace: dict[str, ParquetRow],
                 drop: frozenset[int] | set[int] = frozenset()) -> None:
        """Swap rows of part file ``name`` (archived under ``_attempts/`` first) in one rename."""
        import pyarrow.parquet as pq

        path = self.out / name
        old = pq.read_table(path).to_pylist()
        merged = []
        for i, r in enumerate(old):
            if i not in drop:
                merged.append(replace.pop(r["cell_id"]) if r["cell_id"] in replace else r)
        merged.extend(replace.values())  # not expected: a retried cell always has its row here
        tmp = self._write_tmp(name, merged) if merged else None  # a full disk fails here, before any change
        self._archive(path)
        if tmp is None:
            path.unlink()
        else:
            self._guard_io(name, lambda: os.replace(tmp, path))

    def _archive(self, path: Path) -> None:
        attempts = self.out / ATTEMPTS_DIR
        dest = attempts / f"{path.stem}.{time.time_ns()}.parquet"

        def archive() -> None:
            attempts.mkdir(exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:  # no hard links on this filesystem: copy, then rename into place
                tmp = attempts / f".{dest.name}.tmp"
                shutil.copyfile(path, tmp)
                os.replace(tmp, dest)

        self._guard_io(f"{ATTEMPTS_DIR}/{dest.name}", archive)

    def _write_table(self, name: str, rows: list[ParquetRow]) -> None:
        tmp = self._write_tmp(name, rows)
        self._guard_io(name, lambda: os.replace(tmp, self.out / name))

    def _write_tmp(self, name: str, rows: list[ParquetRow]) -> Path:
        """``rows`` as a complete, fsynced Parquet file under a hidden temp name (or nothing)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        with_context = any(CONTEXT_COLUMN.name in r for r in rows)  # a context sweep's rows only
        schema = arrow_schema(with_context).with_metadata(file_metadata(self.provenance))
        table = pa.Table.from_pylist(rows, schema=schema)
        tmp = self.out / f".{name}.tmp"

        def write() -> None:
            try:
                pq.write_table(table, tmp)
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise

        self._guard_io(name, write)
        return tmp

    def _guard_io(self, name: str, action) -> None:
        try:
            action()
        except OSError as err:
            raise InputError("out", str(self.out), f"cannot write {name} ({err.strerror or err}); "
                             "fix the disk or permissions and rerun with --resume") from None

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Flush buffered rows and release the lock."""
        try:
            self.flush()
        finally:
            self._release()

    def __enter__(self) -> SweepWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.flush()  # also on KeyboardInterrupt: keep what is measured
        except Exception:  # noqa: BLE001 - the exception in flight matters more; resume redoes these
            pass
        finally:
            self._release()

    def _release(self) -> None:
        """Unlock. A directory this writer claimed but never started a run in is emptied again
        (and removed if it created it), unless something else (engine logs of a failed start) was
        written into it."""
        unused = self._claimed and not self._started
        if unused:
            try:
                unused = all(_is_scratch(p.name) or p.name == SWEEP_META for p in self.out.iterdir())
            except OSError:
                unused = False
        if unused:
            (self.out / SWEEP_META).unlink(missing_ok=True)
        # A lock file this writer created in a directory it never ran in goes again (a refused
        # resume or a foreign directory keeps exactly the files it had).
        self._lock.release(remove_files=not self._started and not self._lock_existed)
        if unused:
            self._remove_created_dirs()

    def _remove_created_dirs(self) -> None:
        for d in reversed(self._created):
            try:
                d.rmdir()
            except OSError:
                break
        self._created = []


def file_metadata(provenance: ProvenanceRecord,
                  version: str = MEASUREMENT_SCHEMA_VERSION) -> dict[bytes, bytes]:
    """The Parquet key-value metadata of a measurement file: its schema version and the run's
    provenance (what :func:`dsdprof.io.readers.read_provenance` reads back)."""
    meta = {"schema_version": version, **provenance}
    return {PARQUET_METADATA_KEY: json.dumps(meta, default=str).encode()}


def provenance_dict(prov: Provenance) -> ProvenanceRecord:
    """An engine's provenance as one flat record: the columns, then ``extra_<key>`` for each extra."""
    d = cast("ProvenanceRecord", {k: v for k, v in prov.items() if k != "extra"})
    d.update({f"extra_{k}": v for k, v in (prov.get("extra") or {}).items()})
    return d
