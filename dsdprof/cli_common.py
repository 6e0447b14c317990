"""Shared CLI plumbing: one-line errors with exit code 2, consoles that never cut a table."""

from __future__ import annotations

import functools
import os
import shlex
import sys
from typing import Callable, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from dsdprof.errors import InputError
from dsdprof.schema import TableError

F = TypeVar("F", bound=Callable)
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
PIPE_WIDTH = 200  # console width when the output is not a terminal and COLUMNS is unset


class WrappingConsole(Console):
    """A rich console whose tables wrap (fold) a cell that does not fit instead of cutting it
    with "…". Off a terminal it is :data:`PIPE_WIDTH` wide unless ``COLUMNS`` says otherwise."""

    def print(self, *objects, **kwargs) -> None:  # noqa: D401 - rich's signature
        for obj in objects:
            if isinstance(obj, Table):
                for column in obj.columns:
                    column.overflow = "fold"
                    column.no_wrap = False
        super().print(*objects, **kwargs)


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not (hasattr(stream, "isatty") and stream.isatty()) and not os.environ.get("COLUMNS"):
        width = PIPE_WIDTH
    return WrappingConsole(stderr=stderr, width=width)


def fail(message: str) -> "typer.Exit":
    """Print ``error: message`` on one line to stderr and return Exit(2) to raise."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return typer.Exit(EXIT_BAD_INPUT)


def interrupted(resume_command: list[str] | None = None) -> "typer.Exit":
    """Print one line (how to resume, when there is something to resume) and return Exit(130)."""
    hint = f": resume with {shlex.join(resume_command)}" if resume_command else ""
    print(f"interrupted{hint}", file=sys.stderr)
    return typer.Exit(EXIT_INTERRUPTED)


def guarded(fn: F) -> F:
    """Turn InputError/TableError/OSError into one line on stderr and exit code 2; Ctrl-C into
    one line and exit code 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InputError, TableError) as err:
            raise fail(str(err)) from None
        except FileNotFoundError as err:
            raise fail(f"path={err.filename!r}: file not found") from None
        except OSError as err:
            raise fail(f"path={err.filename!r}: {err.strerror or err}") from None
        except KeyboardInterrupt:
            raise interrupted() from None

    return wrapper  # type: ignore[return-value]
