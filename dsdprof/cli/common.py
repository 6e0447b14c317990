"""Shared CLI plumbing: one-line errors with exit code 2, consoles that never cut a table."""

from __future__ import annotations

import functools
import inspect
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable
from typing import Annotated, TypeVar, cast

import typer
from rich.console import Console
from rich.table import Table

from dsdprof.errors import InputError
from dsdprof.formats.ktable import TableError

F = TypeVar("F", bound=Callable)

# Options several commands take, declared once (typer reads the Annotated metadata; each command
# gives the default).
Tolerance = Annotated[float, typer.Option(
    "--tolerance", help="Relative goodput tolerance for choosing K: a smaller K replaces the best when its "
                        "goodput is within this fraction of the best (at --confidence where intervals are "
                        "known).")]
Force = Annotated[bool, typer.Option("--force", help="Replace existing output files.")]
AllowMixed = Annotated[bool, typer.Option(
    "--allow-mixed", help="Pool rows of different provenance (hardware, model, draft, method, dtype, engine "
                          "version) or runs of different specs (workload, grid); the result records what "
                          "it pooled.")]
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM
# prose width off a terminal when COLUMNS is unset (wider tables print at their natural width)
PIPE_WIDTH = 80


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: it unwinds like Ctrl-C (buffered rows are flushed, the
    run lock released, engines stopped), then exits 143."""


def _raise_terminated(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise Terminated()


def handle_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C (see :class:`Terminated`). Main thread only."""
    signal.signal(signal.SIGTERM, _raise_terminated)


class WrappingConsole(Console):
    """A rich console that never cuts a table cell with "…".

    Cells that do not fit fold onto the next line. Off a terminal (a pipe, a file, CI logs) the
    console is :data:`PIPE_WIDTH` wide unless ``COLUMNS`` says otherwise, and a table wider than
    that is printed at its natural width rather than squeezed (rich would shrink columns down to
    nothing)."""

    def on_broken_pipe(self) -> None:
        """``dsdprof ... | head``: stop quietly with exit 0 (rich's default exits 1)."""
        self.quiet = True
        raise quiet_broken_pipe()

    def print(self, *objects, **kwargs) -> None:  # noqa: D401 - rich's signature
        from rich.measure import Measurement

        needed = 0
        for obj in objects:
            if isinstance(obj, Table):
                for column in obj.columns:
                    column.overflow = "fold"
                    column.no_wrap = False
                if not self.is_terminal:
                    needed = max(needed, Measurement.get(self, self.options.update(width=10**4), obj).maximum)
        if needed <= self.width:
            super().print(*objects, **kwargs)
            return
        saved = self._width  # rich caps print(width=) at the console's width: widen it for this table
        self.width = needed
        try:
            super().print(*objects, **kwargs)
        finally:
            self._width = saved


def plain_flags_in_help() -> None:
    """Show on/off flags (``--resume``, ``--force``, ``--help``) without a value in ``--help``,
    and a number's range compactly (``<int> [2..64]``, not ``<int range> [2<=x<=64]``).

    This typer shows ``<bool>`` after every flag, which reads as if ``--resume true`` were the
    syntax (it is refused). A flag takes no value: show none. The type column is as wide as its
    widest entry and the help column gets what is left at 80 columns: keep it narrow."""
    try:
        from typer.core import TyperOption
    except ImportError:  # pragma: no cover - typer without its core module
        return
    original = getattr(TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "_dsdprof_plain_flags", False):
        return

    def display_type_rich(self, ctx):
        plain_flag = getattr(self, "is_flag", False) and not getattr(self, "count", False)
        if plain_flag:
            return None
        shown = original(self, ctx)  # "<int range>": the range follows it anyway, as [>=1]
        return shown.replace(" range>", ">") if isinstance(shown, str) else shown

    def range_help(self):  # "[2<=x<=64]" as "[2..64]", "[x>=1]" as "[>=1]": a narrower type column
        shown = range_original(self)
        if not shown:
            return shown
        lo_hi = re.fullmatch(r"(\S+?)<=x<=(\S+)", shown)
        return f"{lo_hi[1]}..{lo_hi[2]}" if lo_hi else shown.replace("x", "", 1)

    display_type_rich._dsdprof_plain_flags = True  # type: ignore[attr-defined]  # our marker: patched once
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]  # typer's class, patched
    range_original = getattr(TyperOption, "_get_number_range_help_str", None)
    if range_original is not None:
        TyperOption._get_number_range_help_str = range_help  # type: ignore[method-assign]  # typer's class


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not (hasattr(stream, "isatty") and stream.isatty()) and not os.environ.get("COLUMNS"):
        width = PIPE_WIDTH
    return WrappingConsole(stderr=stderr, width=width)


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` on one line to stderr and return Exit(2) to raise."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return typer.Exit(EXIT_BAD_INPUT)


def interrupted(resume_command: list[str] | None = None) -> typer.Exit:
    """Print one line (how to resume, when there is something to resume) and return Exit(130), or
    Exit(143) when the interrupt in flight is a SIGTERM (:class:`Terminated`)."""
    hint = f": resume with {shlex.join(resume_command)}" if resume_command else ""
    if isinstance(sys.exc_info()[1], Terminated):
        print(f"terminated{hint}", file=sys.stderr)
        return typer.Exit(EXIT_TERMINATED)
    print(f"interrupted{hint}", file=sys.stderr)
    return typer.Exit(EXIT_INTERRUPTED)


def quiet_broken_pipe() -> typer.Exit:
    """Point stdout at /dev/null (so the interpreter's last flush cannot fail) and return Exit(0)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a descriptor (tests)
        pass
    return typer.Exit(0)


def help_paragraphs(doc: str | None) -> str | None:
    """A docstring as ``--help`` text: each paragraph on one line, for rich to wrap at the
    terminal's width (this typer keeps a docstring's line breaks, which render as half-empty
    lines). A paragraph that starts with ``\\b`` keeps its lines."""
    if doc is None:
        return None
    paras = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(ln.strip() for ln in p.splitlines())
                       for p in paras)


def guarded(fn: F) -> F:
    """Turn InputError/TableError/OSError into one line on stderr and exit code 2; Ctrl-C into
    one line and exit code 130; a closed stdout (``| head``) into a quiet exit 0. The command's
    help is its docstring, reflowed (:func:`help_paragraphs`)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InputError, TableError) as err:
            raise fail(str(err)) from None
        except BrokenPipeError:  # `dsdprof ... | head`: the reader has what it wanted
            raise quiet_broken_pipe() from None
        except FileNotFoundError as err:
            raise fail(f"path={err.filename!r}: file not found") from None
        except OSError as err:
            raise fail(f"path={err.filename!r}: {err.strerror or err}") from None
        except KeyboardInterrupt:
            raise interrupted() from None

    wrapper.__doc__ = help_paragraphs(fn.__doc__)
    return cast(F, wrapper)  # functools.wraps: fn's signature
