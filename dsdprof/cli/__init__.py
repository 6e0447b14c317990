"""The ``dsdprof`` command (``dsdprof.cli:main``): each command parses, calls the library once, renders."""

from dsdprof.cli.app import main

__all__ = ["main"]
