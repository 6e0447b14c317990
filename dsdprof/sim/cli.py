"""CLI commands of this subpackage (registered on the main typer app by dsdprof.cli)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this subpackage's commands to ``app``."""
