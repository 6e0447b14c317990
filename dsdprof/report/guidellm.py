"""guidellm's JSON report, read: what a serving engineer's load generator measured.

guidellm (the benchmark client the vLLM project maintains, 0.8.x: ``guidellm run ... --output
kind=json,path=FILE``) writes one report per invocation: ``{"metadata": {"guidellm_version"},
"benchmarks": [...]}``, one benchmark per strategy (``concurrent@N`` for ``--profile
kind=concurrent,streams=[...]``). :func:`read_guidellm` turns a report into one
:class:`ClientPoint` per benchmark (its concurrency, output tokens/s, ITL, TTFT, the request
counts). Bad input is an :class:`~dsdprof.errors.InputError` naming the field and the value.

Stdlib only: the guidellm package itself is not needed to read its reports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError

__all__ = ["ClientPoint", "read_guidellm", "parse_guidellm", "t90"]

# two-sided 90 % Student t quantiles by degrees of freedom (1..30); beyond: the normal's 1.645
_T90 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761,
        1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701,
        1.699, 1.697)


@dataclass(frozen=True)
class ClientPoint:
    """One guidellm benchmark (one concurrency) as the client measured it."""

    concurrency: int  # the concurrent profile's streams (the batch size the client holds in flight)
    output_tok_s: float  # output tokens/s over the benchmark, all requests (guidellm's headline)
    itl_ms: float  # mean inter-token latency of the successful requests, ms
    itl_ms_median: float
    ttft_ms: float  # mean time to first token of the successful requests, ms
    ttft_ms_median: float
    successful: int
    incomplete: int
    errored: int
    duration_s: float  # the benchmark's measured seconds (guidellm's own start..end)
    itl_ms_requests: tuple[float, ...] = ()  # per successful request: its mean ITL, ms


def _get(doc: Any, path: str) -> Any:
    cur = doc
    for key in path.split("."):
        if isinstance(cur, list):
            try:
                cur = cur[int(key)]
            except (ValueError, IndexError):
                raise InputError(path, key, "missing in the guidellm report") from None
        elif isinstance(cur, Mapping) and key in cur:
            cur = cur[key]
        else:
            raise InputError(path, None, "missing in the guidellm report (guidellm 0.8.x JSON expected)")
    return cur


def _num(doc: Any, path: str, lo: float = 0.0) -> float:
    v = _get(doc, path)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < lo:
        raise InputError(path, v, f"must be a finite number >= {lo}")
    return float(v)


def _request_itls(bench: Mapping[str, Any], where: str) -> tuple[float, ...]:
    reqs = bench.get("requests")
    if not isinstance(reqs, Mapping) or not isinstance(reqs.get("successful"), list):
        return ()
    out = []
    for r in reqs["successful"]:
        v = r.get("inter_token_latency_ms") if isinstance(r, Mapping) else None
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            out.append(float(v))
    return tuple(out)


def parse_guidellm(doc: Any, source: str = "report") -> list[ClientPoint]:
    """The benchmarks of a parsed guidellm 0.8.x JSON report, one :class:`ClientPoint` each, in
    the report's order. Only the concurrent profile is read (its streams are the batch size)."""
    if not isinstance(doc, Mapping):
        raise InputError(source, type(doc).__name__, "a guidellm JSON report must be an object")
    benches = doc.get("benchmarks")
    if not isinstance(benches, list) or not benches:
        raise InputError(f"{source}.benchmarks", _short(benches), "need a non-empty list of benchmarks")
    out = []
    for i, b in enumerate(benches):
        where = f"benchmarks.{i}"
        strategy = _get(doc, f"{where}.config.strategy")
        kind = strategy.get("type_") if isinstance(strategy, Mapping) else None
        if kind != "concurrent":
            raise InputError(f"{where}.config.strategy.type_", kind,
                             "only guidellm's concurrent profile is read (--profile kind=concurrent)")
        streams = strategy.get("streams")
        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise InputError(f"{where}.config.strategy.streams", streams, "must be an integer >= 1")
        m = f"{where}.metrics"
        successful = int(_num(doc, f"{m}.request_totals.successful"))
        if successful < 1:
            raise InputError(f"{m}.request_totals.successful", successful, "no request completed")
        out.append(ClientPoint(
            concurrency=streams,
            output_tok_s=_num(doc, f"{m}.output_tokens_per_second.total.mean"),
            itl_ms=_num(doc, f"{m}.inter_token_latency_ms.successful.mean"),
            itl_ms_median=_num(doc, f"{m}.inter_token_latency_ms.successful.median"),
            ttft_ms=_num(doc, f"{m}.time_to_first_token_ms.successful.mean"),
            ttft_ms_median=_num(doc, f"{m}.time_to_first_token_ms.successful.median"),
            successful=successful,
            incomplete=int(_num(doc, f"{m}.request_totals.incomplete")),
            errored=int(_num(doc, f"{m}.request_totals.errored")),
            duration_s=_num(doc, f"{where}.duration"),
            itl_ms_requests=_request_itls(b, where),
        ))
    return out


def read_guidellm(path: str | Path) -> list[ClientPoint]:
    """:func:`parse_guidellm` of a file; a missing or unparsable file is one InputError."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as err:
        raise InputError("guidellm report", str(p), err.strerror or str(err)) from None
    except ValueError as err:
        raise InputError("guidellm report", str(p), f"not JSON: {err}") from None
    return parse_guidellm(doc, str(p))


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def t90(n: int) -> float:
    """The two-sided 90 % Student t quantile for the mean of ``n >= 2`` values (n - 1 degrees of
    freedom; the normal's 1.645 beyond 31)."""
    return _T90[n - 2] if n - 1 <= len(_T90) else 1.645
