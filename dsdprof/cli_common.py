"""Shared CLI plumbing: one-line errors with exit code 2, a shared console."""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

import typer

from dsdprof.errors import InputError
from dsdprof.schema import TableError

F = TypeVar("F", bound=Callable)
EXIT_BAD_INPUT = 2


def fail(message: str) -> "typer.Exit":
    """Print ``error: message`` on one line to stderr and return Exit(2) to raise."""
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(EXIT_BAD_INPUT)


def guarded(fn: F) -> F:
    """Turn InputError/TableError/FileNotFoundError into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InputError, TableError) as err:
            raise fail(str(err)) from None
        except FileNotFoundError as err:
            raise fail(f"path={err.filename!r}: file not found") from None

    return wrapper  # type: ignore[return-value]
