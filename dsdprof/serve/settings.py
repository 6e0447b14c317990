"""Where dsdprof's adaptive vLLM scheduler finds its table. Importable without vLLM.

The scheduler (:mod:`dsdprof.plugins.vllm_adaptive`, ``scheduler_cls = ADAPTIVE_SCHEDULER_QUALNAME``)
runs inside vLLM's engine core, which sees two things of the parent's: vLLM's own config and the
environment. Either names the table, first match wins:

1. ``additional_config = {"dsdprof_adaptive": {"table": PATH, ...}}`` -- vLLM's free-form
   ``VllmConfig.additional_config`` (``--additional-config`` of ``vllm serve``, ``additional_config=``
   of ``vllm.LLM``), which reaches the scheduler as ``vllm_config.additional_config``. Optional
   keys tune :class:`dsdprof.serve.adaptive.AdaptiveKSelector`: ``margin``, ``prior_weight``,
   ``half_life``, ``rebuild_every``, ``allowed_ks``, ``explore_every``, ``itl_half_life``; and the
   scheduler: ``probe_every`` (after this many engine steps without a draft -- K=0 wherever the
   engine ran -- one step runs at K=1, so the acceptance estimate can still recover; 0 = never;
   default 1024).
2. ``DSDPROF_ADAPTIVE_TABLE=PATH`` in the environment (inherited by the engine-core process);
   selector defaults.

vLLM's ``speculative_config`` is a strict pydantic model (unknown keys are rejected), so it cannot
carry the setting. The parent process (``dsdprof validate --adaptive``) resolves the same settings
and builds the selector once before any engine starts, so a bad table or option fails there in one
line rather than inside an engine core.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsdprof.formats.ktable_types import KTable
    from dsdprof.serve.adaptive import AdaptiveKSelector

ADAPTIVE_SCHEDULER_QUALNAME = "dsdprof.engines.vllm_adaptive.make_scheduler"
ADAPTIVE_TABLE_ENV = "DSDPROF_ADAPTIVE_TABLE"
ADAPTIVE_CONFIG_KEY = "dsdprof_adaptive"
SELECTOR_OPTIONS = ("margin", "prior_weight", "half_life", "rebuild_every", "allowed_ks", "explore_every",
                    "itl_half_life")
PLUGIN_OPTIONS = ("probe_every",)
DEFAULT_PROBE_EVERY = 1024


class AdaptiveSettingError(ValueError):
    """The adaptive scheduler's setting is missing or malformed (``field=value: reason``)."""


@dataclass(frozen=True)
class AdaptiveSettings:
    table_path: str
    # AdaptiveKSelector keyword arguments, as JSON gave them (its constructor checks each: the edge)
    options: tuple[tuple[str, Any], ...] = ()
    source: str = ""  # where the setting came from, for the engine log
    probe_every: int = DEFAULT_PROBE_EVERY

    def selector(self, max_k: int | None = None, table: KTable | None = None) -> AdaptiveKSelector:
        """The :class:`~dsdprof.serve.adaptive.AdaptiveKSelector` for this table and options
        (``max_k``: the engine's ``num_speculative_tokens``; ``table``: the file's table when the
        caller has read it). Raises ``TableError`` / ``ValueError``."""
        from dsdprof.serve.adaptive import AdaptiveKSelector

        if table is not None:
            return AdaptiveKSelector(table, max_k=max_k, **dict(self.options))
        return AdaptiveKSelector.from_file(self.table_path, max_k=max_k, **dict(self.options))


def adaptive_additional_config(table_path: str,
                               options: Mapping[str, object] | None = None) -> dict[str, dict[str, object]]:
    """The ``additional_config`` entry that points the adaptive scheduler at ``table_path``."""
    doc: dict[str, object] = {"table": str(table_path)}
    doc.update(_check_options(dict(options or {}), f"additional_config.{ADAPTIVE_CONFIG_KEY}"))
    return {ADAPTIVE_CONFIG_KEY: doc}


def _check_options(options: dict[str, object], where: str) -> dict[str, object]:
    for key, value in options.items():
        if key not in SELECTOR_OPTIONS + PLUGIN_OPTIONS:
            raise AdaptiveSettingError(f"{where}.{key}={value!r}: unknown option "
                                       f"(known: {', '.join(SELECTOR_OPTIONS + PLUGIN_OPTIONS)})")
        if key == "allowed_ks" and value is not None and not isinstance(value, (list, tuple)):
            raise AdaptiveSettingError(f"{where}.{key}={value!r}: must be a list of K")
        if key == "probe_every" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise AdaptiveSettingError(f"{where}.{key}={value!r}: must be an integer >= 0 (0: never probe)")
    allowed = options.get("allowed_ks")
    if isinstance(allowed, tuple):
        options["allowed_ks"] = list(allowed)
    return options


def resolve_settings(additional_config: object, environ: Mapping[str, str] | None = None) -> AdaptiveSettings:
    """The setting from vLLM's ``additional_config`` or, failing that, the environment (module doc)."""
    env = os.environ if environ is None else environ
    where = f"additional_config.{ADAPTIVE_CONFIG_KEY}"
    doc = additional_config.get(ADAPTIVE_CONFIG_KEY) if isinstance(additional_config, Mapping) else None
    if doc is not None:
        if not isinstance(doc, Mapping):
            raise AdaptiveSettingError(f"{where}={doc!r}: must be an object {{\"table\": PATH, ...}}")
        doc = dict(doc)
        path = doc.pop("table", None)
        if not isinstance(path, str) or not path:
            raise AdaptiveSettingError(f"{where}.table={path!r}: must be the path of a "
                                       "dsdprof.ktable/v2 file")
        options = _check_options(doc, where)
        probe = options.pop("probe_every", DEFAULT_PROBE_EVERY)
        probe_every = probe if isinstance(probe, int) else DEFAULT_PROBE_EVERY  # an int: _check_options
        return AdaptiveSettings(path, tuple(sorted(options.items())), where, probe_every)
    path = env.get(ADAPTIVE_TABLE_ENV, "")
    if path:
        return AdaptiveSettings(path, (), ADAPTIVE_TABLE_ENV)
    raise AdaptiveSettingError(f"{ADAPTIVE_TABLE_ENV}='': the adaptive scheduler needs a table: set "
                               f"additional_config={{\"{ADAPTIVE_CONFIG_KEY}\": {{\"table\": PATH}}}} "
                               f"or the environment variable {ADAPTIVE_TABLE_ENV}=PATH")
