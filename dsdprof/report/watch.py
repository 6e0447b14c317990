"""``dsdprof watch``: read a server's ``/metrics`` and summarise what dsdprof serves.

:func:`snapshot` fetches the Prometheus text of a vLLM server (``URL`` or ``URL/metrics``), parses
it (:func:`parse_metrics`, the text exposition format; stdlib only) and returns one JSON-ready
dict (:func:`summarize`): the schedule per batch-size bucket (K served now, the table's K, steps
run at each K, steps at K=0), acceptance per position and the acceptance length from dsdprof's
counters next to vLLM's own ``vllm:spec_decode_*`` counters (and whether they agree), the adaptive
plugin's live / table ratios with their 95 % intervals, the switch and alarm counters, and
``warnings`` an operator must not miss (silent no-op steps, counters that disagree, no dsdprof
metrics at all). Counters are summed over engines; gauges are engine 0's (or the first seen).
:func:`interval` turns two snapshots into rates over the time between them.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from typing import Any, NotRequired, TypedDict

from dsdprof.errors import InputError

__all__ = ["parse_metrics", "fetch", "summarize", "snapshot", "interval"]

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
ALARMS = ("k_switches", "shift_alarms", "silent_noop_steps", "ignored_requests")


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in Prometheus text format; comments and lines that do
    not parse are skipped."""
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line.strip())
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], v)
                  for k, v in _LABEL.findall(m.group(2) or "")}
        out.append((m.group(1), labels, value))
    return out


def fetch(url: str, timeout: float = 5.0) -> str:
    """The text at ``url`` (``/metrics`` appended to a bare server address)."""
    if not re.match(r"^https?://", url):
        raise InputError("URL", url, "must start with http:// or https:// (the server's address)")
    if not url.rstrip("/").endswith("/metrics"):
        url = url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise InputError("URL", url, f"cannot read it: {getattr(err, 'reason', err)}") from None


class BucketRow(TypedDict):
    """One batch-size bucket of the schedule: the K served now, the table's K, steps by K."""

    bucket: str
    k: int | None
    table_k: int | None
    steps: dict[str, int]  # K -> steps
    steps_k0: int


class PositionRow(TypedDict):
    position: int
    drafted: int
    accepted: int
    rate: float | None


class SpecCounters(TypedDict):
    """dsdprof's (or vLLM's) spec-decode counters."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_pos: list[int]
    acceptance_length: float | None
    per_position: NotRequired[list[PositionRow]]  # dsdprof's only


class RatioRow(TypedDict):
    """Live / table ratios at one batch size: (estimate, lower, upper)."""

    batch_size: int
    acceptance_length: list[float]
    step_time: list[float]


class Snapshot(TypedDict):
    """One scrape, summarised (``dsdprof watch --json`` prints it)."""

    mode: str | None
    table: str | None
    engines: list[str]
    schedule: list[BucketRow]
    steps_k0: int
    acceptance: SpecCounters
    vllm: SpecCounters
    agree: bool
    ratios: list[RatioRow]
    alarms: dict[str, int]
    warnings: list[str]
    url: NotRequired[str]
    time: NotRequired[float]


class Rates(TypedDict):
    """Rates between two snapshots."""

    seconds: float
    steps_per_s: float
    drafts_per_s: float
    acceptance_length: float | None


def _bucket_key(label: str) -> int:
    return int(label.rsplit("-", 1)[-1]) if label.rsplit("-", 1)[-1].isdigit() else 1 << 30


def _labels(key: tuple[Any, ...]) -> dict[str, str]:
    """A sample key's labels: ``(name, (label, value), ...)`` -> ``{label: value}``."""
    return dict(key[1:])


def summarize(samples: list[tuple[str, dict[str, str], float]]) -> Snapshot:
    """The JSON-ready summary of one scrape (module docstring)."""
    total: dict[tuple, float] = {}
    gauges: dict[tuple, float] = {}
    engines: list[str] = []
    for name, labels, value in samples:
        engine = labels.get("engine", "0")
        if engine not in engines:
            engines.append(engine)
        key = (name, *sorted((k, v) for k, v in labels.items() if k not in ("engine", "model_name")))
        if name.endswith("_total"):
            total[key] = total.get(key, 0.0) + value
        elif engine == engines[0]:
            gauges.setdefault(key, value)
    ours = any(k[0].startswith("dsdprof:") for k in (*total, *gauges))
    info = next((dict(k[1:]) for k in gauges if k[0] == "dsdprof:info"), {})
    buckets: dict[str, BucketRow] = {}
    for key, value in (*gauges.items(), *total.items()):
        lab = _labels(key)
        if "batch_size_bucket" not in lab:
            continue
        row = buckets.setdefault(lab["batch_size_bucket"], {"bucket": lab["batch_size_bucket"], "k": None,
                                                            "table_k": None, "steps": {}, "steps_k0": 0})
        if key[0] == "dsdprof:num_speculative_tokens":
            row["k"] = int(value)
        elif key[0] == "dsdprof:table_num_speculative_tokens":
            row["table_k"] = int(value)
        elif key[0] == "dsdprof:steps_total" and value:
            row["steps"][lab["num_speculative_tokens"]] = int(value)
            if lab["num_speculative_tokens"] == "0":
                row["steps_k0"] = int(value)
    schedule = [buckets[b] for b in sorted(buckets, key=_bucket_key)]

    def count(name: str, **labels: str) -> int:
        return int(total.get((name, *sorted(labels.items())), 0))

    def per_pos(name: str) -> list[int]:
        pos = sorted(int(dict(k[1:])["position"]) for k in total if k[0] == name)
        return [count(name, position=str(p)) for p in pos]

    def spec(prefix: str) -> SpecCounters:
        drafts = count(f"{prefix}:spec_decode_num_drafts_total")
        accepted = count(f"{prefix}:spec_decode_num_accepted_tokens_total")
        return {"drafts": drafts, "draft_tokens": count(f"{prefix}:spec_decode_num_draft_tokens_total"),
                "accepted_tokens": accepted,
                "accepted_per_pos": per_pos(f"{prefix}:spec_decode_num_accepted_tokens_per_pos_total"),
                "acceptance_length": 1 + accepted / drafts if drafts else None}

    ours_spec, vllm_spec = spec("dsdprof"), spec("vllm")
    drafted = per_pos("dsdprof:spec_decode_num_draft_tokens_per_pos_total")
    ours_spec["per_position"] = [{"position": i, "drafted": d, "accepted": a, "rate": a / d if d else None}
                                 for i, (d, a) in enumerate(zip(drafted, ours_spec["accepted_per_pos"]))]
    ratios: dict[str, dict[str, list[float]]] = {}
    for key, value in gauges.items():
        if key[0] in ("dsdprof:acceptance_length_ratio", "dsdprof:step_time_ratio"):
            lab = _labels(key)
            r = ratios.setdefault(lab["batch_size"], {"acceptance_length": [0.0] * 3, "step_time": [0.0] * 3})
            i = ("estimate", "lower", "upper").index(lab["bound"])
            r["acceptance_length" if "acceptance" in key[0] else "step_time"][i] = value
    alarms = {a: count(f"dsdprof:{a}_total") for a in ALARMS}
    agree = all(ours_spec[f] == vllm_spec[f] for f in (
        "drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos"))
    warnings = []
    if not ours:
        warnings.append("no dsdprof metrics here: serve with `dsdprof serve` (docs/observability.md)")
    if alarms["silent_noop_steps"]:
        warnings.append(f"silent no-op: {alarms['silent_noop_steps']} steps drafted a K other than the "
                        "K scheduled (the drafter does not get K)")
    if ours and vllm_spec["drafts"] and not agree:
        warnings.append("dsdprof's spec-decode counters differ from vLLM's (a scrape between flushes, "
                        "or a second engine: compare again)")
    return {"mode": info.get("mode"), "table": info.get("table"), "engines": engines,
            "schedule": schedule, "steps_k0": sum(r["steps_k0"] for r in schedule),
            "acceptance": ours_spec, "vllm": vllm_spec, "agree": agree,
            "ratios": [{"batch_size": int(b), "acceptance_length": ratios[b]["acceptance_length"],
                        "step_time": ratios[b]["step_time"]} for b in sorted(ratios, key=int)],
            "alarms": alarms, "warnings": warnings}


def snapshot(url: str, timeout: float = 5.0) -> Snapshot:
    """Fetch, parse and summarise ``url``'s metrics, stamped with the time of the scrape."""
    out = summarize(parse_metrics(fetch(url, timeout)))
    out["url"], out["time"] = url, time.time()
    return out


def interval(prev: Snapshot, cur: Snapshot) -> Rates:
    """Rates between two snapshots: steps/s, drafts/s and the acceptance length over the interval."""
    dt = max(cur["time"] - prev["time"], 1e-9)
    steps = sum(sum(r["steps"].values()) for r in cur["schedule"]) - sum(sum(r["steps"].values())
                                                                        for r in prev["schedule"])
    drafts = cur["acceptance"]["drafts"] - prev["acceptance"]["drafts"]
    accepted = cur["acceptance"]["accepted_tokens"] - prev["acceptance"]["accepted_tokens"]
    return {"seconds": dt, "steps_per_s": steps / dt, "drafts_per_s": drafts / dt,
            "acceptance_length": 1 + accepted / drafts if drafts else None}
