"""``dsdprof serve``: vLLM's OpenAI-compatible server on a dsdprof table.

:func:`serve_argv` builds vLLM's own command line (``python -m vllm.entrypoints.openai.api_server``,
the module ``vllm serve`` runs) from the table: ``--model`` (the table's target unless given),
``--speculative-config`` (``export --format vllm``), ``--compilation-config`` when the table
records the CUDA-graph settings it was measured under, ``--scheduler-cls`` (the adaptive plugin
with its ``--additional-config``, or the static scheduler with metrics), a plain
``--chat-template`` for a local tokenizer without one, then every further argument as given.
:func:`server_env` sets a fresh ``PROMETHEUS_MULTIPROC_DIR`` so ``/metrics`` also serves the
engine core's metrics. The user's account: docs/adaptive.md ("In vLLM") and docs/observability.md.
Bad input is an :class:`InputError` before anything starts.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from dsdprof.errors import InputError
from dsdprof.export.table import (
    COMPILATION_PROVENANCE,
    load_table,
    vllm_compilation_config,
    vllm_speculative_config,
)
from dsdprof.serve.settings import ADAPTIVE_SCHEDULER_QUALNAME

__all__ = ["PLAIN_CHAT_TEMPLATE", "serve_argv", "server_env", "needs_chat_template", "local_path",
           "exec_server"]

STATIC_SCHEDULER_QUALNAME = "dsdprof.engines.vllm_static.make_scheduler"

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# role: content lines, then the assistant's turn: enough to serve a base model's tokenizer
PLAIN_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                       "{% if add_generation_prompt %}assistant: {% endif %}")
_OWN_FLAGS = ("--model", "--speculative-config", "--scheduler-cls", "--additional-config")


def local_path(name: str) -> str:
    """``name`` absolute when it is a path that exists here, else as given (a Hugging Face id)."""
    p = Path(name).expanduser()
    return str(p.resolve()) if p.exists() else name


def needs_chat_template(model: str) -> bool:
    """True when ``model`` is a local directory whose tokenizer carries no chat template."""
    d = Path(model)
    if not d.is_dir() or (d / "chat_template.jinja").exists() or (d / "chat_template.json").exists():
        return False
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and not cfg.get("chat_template")


def serve_argv(table_path: str | Path, *, model: str | None = None, adaptive: bool = False,
               adaptive_options: Mapping[str, object] | None = None,
               extra: Sequence[str] = (), metrics: bool = True) -> list[str]:
    """The server's command line (``sys.executable -m SERVER_MODULE ...``) for this table."""
    table_path = Path(table_path)
    table = load_table(table_path)
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in _OWN_FLAGS:
            raise InputError("vllm_args", arg, "dsdprof serve sets it from the table: use --model, "
                             "--adaptive or --option, or run vLLM's server directly")
    if model is None:
        stored = (table.get("provenance") or {}).get("model")
        if not stored:
            raise InputError("--model", None,
                             f"the table {str(table_path)!r} records no target model: give --model")
        model = str(stored)
    model = local_path(model)
    cfg = vllm_speculative_config(table)
    argv = [sys.executable, "-m", SERVER_MODULE, "--model", model, "--speculative-config", json.dumps(cfg)]
    if ((table.get("provenance") or {}).get(COMPILATION_PROVENANCE)
            and not any(a.split("=", 1)[0] in ("--compilation-config", "-cc") for a in extra)):
        argv += ["--compilation-config", json.dumps(vllm_compilation_config(table))]  # the graphs measured
    if adaptive:
        settings = {"table": str(table_path.resolve()), **(adaptive_options or {})}
        _check_adaptive(settings, cfg["num_speculative_tokens"])
        additional: dict[str, object] = {"dsdprof_adaptive": settings}
        if not metrics:
            additional["dsdprof_metrics"] = False
        argv += ["--scheduler-cls", ADAPTIVE_SCHEDULER_QUALNAME,
                 "--additional-config", json.dumps(additional)]
    elif adaptive_options:
        raise InputError("--option", adaptive_options, "options of the adaptive plugin: add --adaptive")
    elif metrics:
        argv += ["--scheduler-cls", STATIC_SCHEDULER_QUALNAME]
    if not any(a.split("=", 1)[0] == "--chat-template" for a in extra) and needs_chat_template(model):
        argv += ["--chat-template", PLAIN_CHAT_TEMPLATE]
    return argv + list(extra)


def _check_adaptive(settings: Mapping[str, object], max_k: int) -> None:
    """The plugin's settings, resolved as the engine core will (a bad one fails here, in one line)."""
    from dsdprof.formats.ktable import TableError
    from dsdprof.serve.settings import resolve_settings

    try:
        resolve_settings({"dsdprof_adaptive": settings}, {}).selector(max_k=max_k)
    except TableError:
        raise
    except ValueError as err:  # AdaptiveSettingError and the selector's option checks: field=value: reason
        raise TableError(str(err)) from None


def server_env(environ=None) -> dict[str, str]:
    """The server's environment: ``environ`` (default ``os.environ``) with a fresh, empty
    ``PROMETHEUS_MULTIPROC_DIR`` unless one is set: vLLM's ``/metrics`` then reads every process's
    metrics there, the engine core's dsdprof metrics included (a few KB per start, left in the
    temporary directory: the server replaces this process and cannot remove it)."""
    env = dict(os.environ if environ is None else environ)
    if not env.get("PROMETHEUS_MULTIPROC_DIR"):
        env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="dsdprof-metrics-")
    return env


def exec_server(argv: list[str], env: dict[str, str] | None = None) -> None:
    """Replace this process with the server (signals and exit status are the server's)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, server_env() if env is None else env)
