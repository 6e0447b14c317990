"""``dsdprof serve``: vLLM's OpenAI-compatible server on a table (registered on the main typer app
by dsdprof.cli.app). The command line is built by :mod:`dsdprof.jobs.serve`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import typer

from dsdprof.cli.common import guarded


def _options(pairs: list[str]) -> dict:
    from dsdprof.errors import InputError

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError("--option", pair, "must be KEY=VALUE (VALUE as JSON: 0.05, [0, 2, 4])")
        try:
            out[key] = json.loads(value)
        except ValueError:
            raise InputError("--option", pair, "VALUE must be JSON (0.05, 1024, [0, 2, 4])") from None
    return out


def _serve(
    table: Path = typer.Argument(..., metavar="TABLE",
                                 help="A dsdprof K table (dsdprof.ktable/v1 or v2; v2 for --adaptive)."),
    vllm_args: list[str] | None = typer.Argument(None, metavar="[-- VLLM_ARGS]",
                                                 help="Further flags for vLLM's server, after --: --port "
                                                      "8000 --max-model-len 512 ..."),
    model: str | None = typer.Option(None, "--model",
                                     help="Target model (path or Hugging Face id). Default: the table's "
                                          "provenance.model."),
    adaptive: bool = typer.Option(False, "--adaptive",
                                  help="Serve with the adaptive scheduler plugin (docs/adaptive.md): K "
                                       "follows live acceptance and step times."),
    option: list[str] | None = typer.Option(None, "--option", metavar="KEY=VALUE",
                                            help="An adaptive plugin option (margin, half_life, "
                                                 "explore_every, probe_every, ...); repeatable."),
    metrics: bool = typer.Option(True, "--metrics/--no-metrics",
                                 help="dsdprof's metrics on vLLM's /metrics (docs/observability.md); "
                                 "--no-metrics: vLLM's own scheduler for a static table."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the server's command line and exit."),
) -> None:
    """Start vLLM's OpenAI-compatible server on a K table (--adaptive: the adaptive plugin).

    The server (python -m vllm.entrypoints.openai.api_server) gets the table's speculative config
    (vLLM's dynamic-SD schedule). A local model or draft path is passed absolute; a local
    tokenizer without a chat template gets a plain one. Exit codes: the server's; 2 bad input."""
    from dsdprof.jobs.serve import exec_server, serve_argv

    argv = serve_argv(table, model=model, adaptive=adaptive, adaptive_options=_options(option or []),
                      extra=vllm_args or [], metrics=metrics)
    if dry_run:
        print(shlex.join(argv))
        return
    exec_server(argv)


def register(app: typer.Typer) -> None:
    app.command(name="serve", context_settings={"allow_interspersed_args": True})(guarded(_serve))
