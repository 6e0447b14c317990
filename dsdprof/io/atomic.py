"""One way to write a file so that a reader sees the old file or the whole new one, never a part."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then deliver the first one to the handler that
    was in place (or its default action). A write that has taken rows out of a buffer finishes
    before the interrupt unwinds, so the rows are on disk rather than lost. Main thread only
    (elsewhere signals are not delivered to Python code, and the block runs unchanged)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in HELD_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if pending:
            handler = previous[signal.Signals(pending[0])]
            if callable(handler):
                handler(pending[0], None)
            elif handler != signal.SIG_IGN:
                os.kill(os.getpid(), pending[0])  # the default action


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (best effort: some filesystems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes, check: Callable[[Path], Any] | None = None) -> None:
    """Write ``data`` to a hidden temp file beside ``path``, fsync, ``check(temp path)`` if given,
    rename, fsync the directory. On any failure the temp file is removed and the error re-raised
    (``path`` unchanged). The one atomic writer: JSON documents, manifests, locks, fleet files."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def check_output_path(path: str | Path, force: bool = False, field: str = "output") -> Path:
    """Refuse, before any work, an output that exists (without ``force``), is a directory, or
    lies under something that is not a directory. Returns the path."""
    p = Path(path)
    if p.is_dir():
        raise InputError(field, str(p), "is a directory")
    if p.exists() and not force:
        raise InputError(field, str(p), "exists; pass --force to replace it")
    for up in p.parents:
        if up.exists():
            if not up.is_dir():
                raise InputError(field, str(p), f"{str(up)!r} is not a directory")
            break
    return p


def write_json_atomic(path: str | Path, doc: Any, force: bool = False,
                      check: Callable[[Any], Any] | None = None) -> Path:
    """Write JSON through a temp file in the target directory, fsync, check, rename.

    ``check`` (e.g. :func:`dsdprof.formats.ktable.validate_table`) runs on the document *as read back
    from the temp file*, before the rename: what lands at ``path`` is always complete and valid.
    Refuses to replace an existing file unless ``force``. Every failure (parent is a file, no
    permission, disk full, invalid document) is an :class:`InputError` naming ``output``, and
    leaves neither ``path`` changed nor a temp file behind.
    """
    p = check_output_path(path, force)
    parent = p.parent
    try:
        text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as err:
        raise InputError("output", str(p), f"document is not JSON-serialisable ({err})") from None
    created = [d for d in (parent, *parent.parents) if not d.exists()]
    done = False
    try:
        parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(p, text.encode("utf-8"), None if check is None else
                           (lambda tmp: check(json.loads(tmp.read_text(encoding="utf-8")))))
        done = True
    except OSError as err:
        raise InputError("output", str(p), f"cannot write ({err.strerror or type(err).__name__})") from None
    finally:
        if not done:
            for d in created:  # directories this call made, innermost first, if still empty
                try:
                    d.rmdir()
                except OSError:
                    break
    return p
