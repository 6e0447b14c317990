"""The dsdprof keys of a request the profiling scheduler (:mod:`dsdprof.plugins.vllm_profiling`)
honours, and the run's settings from the environment. Stdlib only: importable without vLLM."""

from __future__ import annotations

import hmac
import os
import re
from dataclasses import dataclass
from typing import Any

from dsdprof.plugins.names import (
    GATE_ARG,
    K_EXTRA_ARG,
    K_SEQ_ARG,
    MAX_K_SEQ,
    MIN_ARM,
    MIN_TOKEN_CHARS,
    RUN_ARG,
    RUN_TOKEN_ENV,
    TRACE_ARG,
    TRACE_DIR_ENV,
    WAVE_ARG,
)

_TRACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_MAX_WAVE = 1 << 31


@dataclass(frozen=True, slots=True)
class Profiled:
    """The dsdprof keys of one request of this engine's run, parsed and bounded."""

    k: int | None
    gate: int
    trace: str  # absolute path of the trace file ("" = not traced)
    wave: int
    k_seq: tuple[int, ...] = ()  # paired design: K (or arm, < 0) per step of the wave, cycled


def _int(value: Any, lo: int, hi: int) -> int | None:
    """``value`` when it is an int (not a bool) in lo..hi, else None."""
    if type(value) is int and lo <= value <= hi:
        return value
    return None


def parse_keys(extra: Any, token: str, trace_dir: str, max_k: int,
               max_gate: int) -> tuple[Profiled | None, bool]:
    """(the request's profile, whether dsdprof keys were present but ignored). Never raises."""
    if not token or type(extra) is not dict or not extra:
        return None, False
    secret = extra.get(RUN_ARG)
    if type(secret) is not str or not secret.isascii() or not hmac.compare_digest(secret, token):
        return None, any(type(key) is str and key.startswith("dsdprof_") for key in extra)
    bad = False
    k = extra.get(K_EXTRA_ARG)
    k_ok = _int(k, 0, max_k)
    bad |= k is not None and k_ok is None
    seq = extra.get(K_SEQ_ARG)
    seq_ok: tuple[int, ...] = ()
    if seq is not None:
        if (type(seq) is list and 0 < len(seq) <= MAX_K_SEQ
                and all(_int(x, MIN_ARM, max_k) is not None for x in seq)):
            seq_ok = tuple(seq)
        else:
            bad = True
    gate = extra.get(GATE_ARG)
    gate_ok = _int(gate, 1, max_gate)
    bad |= gate is not None and gate_ok is None
    wave = extra.get(WAVE_ARG)
    wave_ok = _int(wave, -_MAX_WAVE, _MAX_WAVE)
    bad |= wave is not None and wave_ok is None
    name = extra.get(TRACE_ARG)
    path = ""
    if name is not None:
        if trace_dir and type(name) is str and _TRACE_NAME.match(name):
            path = os.path.join(trace_dir, name + ".jsonl")
        else:
            bad = True
    return Profiled(k_ok, gate_ok or 0, path, wave_ok or 0, seq_ok), bad


def _run_settings(environ=None) -> tuple[str, str]:
    env = os.environ if environ is None else environ
    token = env.get(RUN_TOKEN_ENV, "")
    if len(token) < MIN_TOKEN_CHARS or not token.isascii():
        return "", ""
    trace_dir = env.get(TRACE_DIR_ENV, "")
    return token, (os.path.realpath(trace_dir) if trace_dir and os.path.isdir(trace_dir) else "")
