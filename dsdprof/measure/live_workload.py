"""Workloads of live use: heavy-tailed output lengths (an RL rollout) and Poisson arrivals (serving).

Pure and seeded (stdlib ``random``): the same spec and seed give the same lengths and arrival
times on every machine and Python version.

Length specs (``--lengths``)::

    lognormal:median=16,sigma=1.0     exp(N(ln median, sigma^2)), rounded
    pareto:alpha=1.5,min=4            min * U^(-1/alpha) (Pareto type I), rounded
    fixed:len=32                      every request the same
    PATH.jsonl | PATH.json            lengths logged by a trainer: one int per line, or objects with
                                      ``output_len`` (or ``num_output_tokens``, ``output_tokens``,
                                      ``length``), or one JSON array of those

Every length is clipped to ``[min_len, max_len]`` (the model's context bounds it).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from dsdprof.errors import InputError

DISTRIBUTIONS = {"lognormal": ("median", "sigma"), "pareto": ("alpha", "min"), "fixed": ("len",)}
LENGTH_KEYS = ("output_len", "num_output_tokens", "output_tokens", "length")


@dataclass(frozen=True)
class LengthSpec:
    kind: str  # lognormal | pareto | fixed | file
    params: tuple[tuple[str, float], ...] = ()
    path: str = ""

    def describe(self) -> str:
        if self.kind == "file":
            return self.path
        return f"{self.kind}:" + ",".join(f"{k}={v:g}" for k, v in self.params)


def parse_length_spec(text: str, field: str = "--lengths") -> LengthSpec:
    """A :class:`LengthSpec` from ``kind:key=value,...`` or a path to a JSON/JSONL file."""
    kind, sep, rest = text.partition(":")
    if kind in DISTRIBUTIONS and sep:
        params: dict[str, float] = {}
        for part in filter(None, rest.split(",")):
            key, eq, value = part.partition("=")
            if not eq or key not in DISTRIBUTIONS[kind]:
                raise InputError(
                    field, text, f"{kind} takes {', '.join(k + '=X' for k in DISTRIBUTIONS[kind])}"
                )
            try:
                params[key] = float(value)
            except ValueError:
                raise InputError(field, text, f"{key} must be a number") from None
            if not math.isfinite(params[key]) or params[key] <= 0:
                raise InputError(field, text, f"{key} must be > 0")
        missing = [k for k in DISTRIBUTIONS[kind] if k not in params]
        if missing:
            raise InputError(field, text, f"missing {', '.join(missing)}")
        return LengthSpec(kind, tuple((k, params[k]) for k in DISTRIBUTIONS[kind]))
    if text.endswith((".json", ".jsonl")):
        return LengthSpec("file", path=text)
    raise InputError(
        field,
        text,
        "must be lognormal:median=M,sigma=S | pareto:alpha=A,min=M | fixed:len=L "
        "| a .json/.jsonl file of lengths",
    )


def _length_of(value, where: str) -> int:
    if isinstance(value, dict):
        value = next((value[k] for k in LENGTH_KEYS if k in value), None)
    if type(value) is not int or value < 1:
        raise InputError(
            "--lengths",
            where,
            f"each record must be a positive int or an object with {' | '.join(LENGTH_KEYS)}",
        )
    return value


def read_lengths_file(path: str) -> list[int]:
    """Lengths from a JSON array or JSONL file (see the module docstring)."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError("--lengths", path, f"cannot read it ({type(err).__name__})") from None
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json.loads(text)
        except ValueError:
            raise InputError("--lengths", path, "not valid JSON") from None
        out = [_length_of(r, f"{path}[{i}]") for i, r in enumerate(records)]
    else:
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise InputError("--lengths", f"{path}:{n}", "not valid JSON") from None
            out.append(_length_of(rec, f"{path}:{n}"))
    if not out:
        raise InputError("--lengths", path, "holds no lengths")
    return out


def draw_lengths(spec: LengthSpec, n: int, seed: int, min_len: int = 2, max_len: int = 10**9) -> list[int]:
    """``n`` output lengths. A file gives its first ``n`` lengths (cycled when shorter)."""
    if n < 1:
        raise InputError("--num-requests", n, "must be >= 1")
    if not 1 <= min_len <= max_len:
        raise InputError("--max-len", max_len, f"must be >= {min_len}")
    p = dict(spec.params)
    rng = random.Random(seed)
    if spec.kind == "file":
        src = read_lengths_file(spec.path)
        raw = [float(src[i % len(src)]) for i in range(n)]
    elif spec.kind == "lognormal":
        raw = [math.exp(rng.gauss(math.log(p["median"]), p["sigma"])) for _ in range(n)]
    elif spec.kind == "pareto":
        raw = [p["min"] * (1.0 - rng.random()) ** (-1.0 / p["alpha"]) for _ in range(n)]
    else:
        raw = [p["len"]] * n
    return [int(min(max_len, max(min_len, round(x)))) for x in raw]


def poisson_arrivals(rate: float, n: int, seed: int) -> list[float]:
    """Arrival times (seconds) of ``n`` requests at ``rate`` per second: the first at 0, then
    exponential gaps of mean ``1 / rate``."""
    if not (math.isfinite(rate) and rate > 0):
        raise InputError("--rates", rate, "must be > 0 requests/s")
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


def lengths_from_batch_sizes(batch_sizes: list[int]) -> list[int]:
    """Output lengths of a rollout from its batch size per decode step *without speculation* (one
    token per request per step, every request from step 0): ``b[s] - b[s + 1]`` requests finished
    after ``s + 1`` steps. A trace that grows is refused."""
    if not batch_sizes or any(b < 0 for b in batch_sizes):
        raise InputError("batch_size", batch_sizes[:8], "need a non-empty trace of batch sizes >= 0")
    lens: list[int] = []
    for s, b in enumerate(batch_sizes):
        nxt = batch_sizes[s + 1] if s + 1 < len(batch_sizes) else 0
        if nxt > b:
            raise InputError(
                "batch_size",
                f"step {s + 1}: {b} -> {nxt}",
                "a vanilla rollout's batch only shrinks (arrivals: use a lengths file)",
            )
        lens += [s + 1] * (b - nxt)
    return lens


def read_trace_or_lengths(path: str) -> list[int]:
    """A replay's requests from a file: a batch-size trace (JSONL objects with ``batch_size``, one per
    step of a vanilla rollout, :func:`lengths_from_batch_sizes`) or a lengths file."""
    p = Path(path)
    try:
        first = next((ln for ln in p.read_text().splitlines() if ln.strip()), "")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError("SOURCE", path, f"cannot read it ({type(err).__name__})") from None
    try:
        head = json.loads(first) if first else None
    except ValueError:
        head = None
    if isinstance(head, dict) and "batch_size" in head:
        sizes = []
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if line.strip():
                try:
                    b = json.loads(line)["batch_size"]
                except (ValueError, KeyError, TypeError):
                    raise InputError(
                        "SOURCE", f"{path}:{n}", 'each line must be {"batch_size": B}'
                    ) from None
                if type(b) is not int:
                    raise InputError("SOURCE", f"{path}:{n}", "batch_size must be an int")
                sizes.append(b)
        return lengths_from_batch_sizes(sizes)
    return read_lengths_file(path)
