"""An advisory lock on a run directory, so that one OUT is written by one process at a time.

The lock is an OS file lock (``filelock``: ``flock`` on POSIX) on ``OUT/_dsdprof.lock``; the
kernel drops it when its process dies, so a ``kill -9``'d sweep never blocks the next one. Who
holds it (pid, host, command, start time) is written beside it in ``OUT/_dsdprof.holder.json``;
that file is only read to explain a lock that is actually held, never trusted on its own.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, TypedDict

from dsdprof.errors import InputError
from dsdprof.io.atomic import write_bytes_atomic

LOCK_NAME = "_dsdprof.lock"
HOLDER_NAME = "_dsdprof.holder.json"
LOCK_FILES = (LOCK_NAME, HOLDER_NAME)


class _Holder(TypedDict):
    """The holder file: who holds a run directory's lock."""

    pid: int
    host: str
    command: str
    started_at: str


def _holder_info(started_at: str) -> _Holder:
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if prog in ("cli.py", "__main__.py"):  # python -m dsdprof.cli.app
        prog = "dsdprof"
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join([prog, *sys.argv[1:]]),
            "started_at": started_at}


def describe_holder(out: Path) -> str:
    """Who holds ``out``'s lock, as far as the holder file says (it may lag behind)."""
    try:
        info = json.loads((out / HOLDER_NAME).read_text())
        if not isinstance(info, dict):
            raise ValueError
    except (OSError, ValueError):
        return "another process (holder not recorded yet)"
    return (f"pid {info.get('pid')} on {info.get('host')} ({info.get('command')!s:.400}) "
            f"since {info.get('started_at')}")


class RunLock:
    """Exclusive, non-blocking lock on a run directory that already exists."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._lock: Any = None  # a filelock.FileLock while held

    def acquire(self, started_at: str) -> None:
        """Take the lock or raise :class:`InputError` naming the holder; write the holder file."""
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.out / LOCK_NAME), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise InputError("out", str(self.out), f"is in use by {describe_holder(self.out)}; "
                             "wait for it to finish or choose another --out") from None
        except OSError as err:
            raise InputError("out", str(self.out), "is not writable: cannot create its lock file "
                                                   f"({err.strerror or err})") from None
        self._lock = lock
        try:
            write_bytes_atomic(self.out / HOLDER_NAME, json.dumps(_holder_info(started_at)).encode())
        except OSError as err:
            self.release()
            raise InputError("out", str(self.out), f"is not writable ({err.strerror or err})") from None

    def release(self, remove_files: bool = False) -> None:
        """Drop the lock; ``remove_files`` also deletes the lock files (a directory we created)."""
        if self._lock is None:
            return
        try:
            (self.out / HOLDER_NAME).unlink(missing_ok=True)
            if remove_files:
                (self.out / LOCK_NAME).unlink(missing_ok=True)
        except OSError:
            pass
        finally:
            lock, self._lock = self._lock, None
            lock.release(force=True)
