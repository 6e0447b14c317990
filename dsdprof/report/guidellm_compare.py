"""guidellm's figures beside dsdprof's step-trace figures, per batch size and variant.

``dsdprof validate`` / ``validate-report --guidellm VARIANT=REPORT.json`` (repeatable: one guidellm
report per repeat; ``VARIANT`` is ``vanilla``, ``fixed-K``, ``dsd`` or ``adaptive``, the servers the
reports were measured on; guidellm's ``concurrent`` streams are the batch size). Per batch size and
variant this shows:

* dsdprof (the step trace of the validate run): tokens/s per user (AL / step ITL) and its
  per-token latency 1000 / tokens/s (ms);
* guidellm (the client): output tokens/s of the whole server, ITL (ms per token) and TTFT;
* each side's **speedup over vanilla** with a 90 % interval (the mean over repeats, the interval
  propagated from both means' standard errors), and a flag where the two intervals do not overlap:
  the client and the step trace disagree on what the variant is worth. With fewer than two values
  on a side there is no interval and nothing is flagged (``n/a``).

Speedups are compared, not absolute speeds: the step trace times steady decode steps, the client
times whole requests through the HTTP server (tokenizer, detokenizer, streaming, prefills mixed in);
the absolute figures are shown beside each other for reading, not judged.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dsdprof.errors import InputError
from dsdprof.formats.measurements import MODE_ADAPTIVE, MODE_DSD, MODE_FIXED, MODE_VANILLA
from dsdprof.report.compare import _clean
from dsdprof.report.guidellm import ClientPoint, read_guidellm, t90

__all__ = ["ClientRow", "parse_labels", "load_client", "client_beside_steps", "client_lines"]

_VARIANT = re.compile(r"^(vanilla|dsd|adaptive|fixed-(\d+))$")


@dataclass(frozen=True)
class ClientRow:
    batch_size: int
    variant: str
    steps_tops: float  # dsdprof: tokens/s per user, mean over the validate rows
    steps_ms: float  # 1000 / steps_tops: ms per token by the step trace
    client_tok_s: float  # guidellm: output tokens/s of the server, mean over reports
    client_itl_ms: float
    client_ttft_ms: float
    steps_speedup: tuple[float, float, float] | None  # vs vanilla (mean, lo, hi); None for vanilla
    client_speedup: tuple[float, float, float] | None
    n_steps: int
    n_client: int

    @property
    def disagrees(self) -> bool | None:
        """True when both speedup intervals exist and do not overlap; None when one has no interval."""
        a, b = self.steps_speedup, self.client_speedup
        if a is None or b is None or a[1] == a[2] or b[1] == b[2]:
            return None
        return a[2] < b[1] or b[2] < a[1]


def parse_labels(items: Sequence[str]) -> dict[str, list[Path]]:
    """``VARIANT=PATH`` items (``--guidellm``) by variant; one InputError for a malformed one."""
    out: dict[str, list[Path]] = {}
    for item in items:
        variant, sep, path = item.partition("=")
        if not sep or not path or not _VARIANT.match(variant):
            raise InputError("--guidellm", item, "must be VARIANT=REPORT.json, VARIANT one of vanilla, "
                             "fixed-K, dsd, adaptive")
        out.setdefault(variant, []).append(Path(path))
    return out


def load_client(items: Sequence[str]) -> dict[str, list[list[ClientPoint]]]:
    """The guidellm reports named by ``--guidellm`` items, read: variant -> one point list per report."""
    return {v: [read_guidellm(p) for p in paths] for v, paths in parse_labels(items).items()}


def _mean_se(xs: Sequence[float]) -> tuple[float, float, int]:
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return m, se, len(xs)


def _ratio(v: tuple[float, float, int], base: tuple[float, float, int]) -> tuple[float, float, float]:
    """v / base with a 90 % interval from both relative standard errors (t at the smaller n)."""
    r = v[0] / base[0]
    n = min(v[2], base[2])
    if n < 2:
        return r, r, r
    rel = math.hypot(v[1] / v[0], base[1] / base[0])
    t = t90(n)
    return r, r * (1 - t * rel), r * (1 + t * rel)


def _variant_of(mode: str, k: int) -> str:
    return f"fixed-{k}" if mode == MODE_FIXED else mode


def client_beside_steps(rows: pd.DataFrame, client: Mapping[str, Sequence[Sequence[ClientPoint]]]
                        ) -> list[ClientRow]:
    """One :class:`ClientRow` per batch size and variant measured by both dsdprof's validate run
    (``rows``) and guidellm (``client``); InputError when they share no batch size and variant, or
    when a variant has no vanilla to compare with."""
    df = _clean(rows)
    steps: dict[tuple[int, str], list[float]] = {}
    for (b, mode, k), g in df.groupby(["batch_size", "mode", "num_spec_tokens"]):
        if mode in (MODE_VANILLA, MODE_DSD, MODE_FIXED, MODE_ADAPTIVE):
            steps[(int(b), _variant_of(str(mode), int(k)))] = [float(x) for x in g["tops"]]
    cl: dict[tuple[int, str], list[ClientPoint]] = {}
    for variant, reports in client.items():
        for pts in reports:
            for p in pts:
                cl.setdefault((p.concurrency, variant), []).append(p)
    both = sorted(set(steps) & set(cl))
    if not both:
        raise InputError("--guidellm", sorted(f"{v}@BS{b}" for b, v in cl),
                         f"no batch size and variant in common with the validate run "
                         f"({sorted(f'{v}@BS{b}' for b, v in steps)})")
    out = []
    for b, variant in both:
        s, c = steps[(b, variant)], cl[(b, variant)]
        s_ms, c_ms = _mean_se(s), _mean_se([p.output_tok_s for p in c])
        sp_s = sp_c = None
        if variant != MODE_VANILLA:
            if (b, MODE_VANILLA) not in steps or (b, MODE_VANILLA) not in cl:
                raise InputError("--guidellm", f"vanilla@BS{b}", "missing on one side: the speedups need "
                                 "vanilla in both the validate run and the guidellm reports")
            sp_s = _ratio(s_ms, _mean_se(steps[(b, MODE_VANILLA)]))
            sp_c = _ratio(c_ms, _mean_se([p.output_tok_s for p in cl[(b, MODE_VANILLA)]]))
        out.append(ClientRow(b, variant, s_ms[0], 1000.0 / s_ms[0], c_ms[0],
                             statistics.fmean(p.itl_ms for p in c), statistics.fmean(p.ttft_ms for p in c),
                             sp_s, sp_c, len(s), len(c)))
    return out


def _sp(x: tuple[float, float, float] | None) -> str:
    if x is None:
        return "(reference)"
    if x[1] == x[2]:
        return f"{x[0]:.2f} (n<2)"
    return f"{x[0]:.2f} [{x[1]:.2f},{x[2]:.2f}]"


def client_lines(rows: Sequence[ClientRow]) -> list[str]:
    """The side-by-side as plain lines (<= 80 columns), one block per batch size, then the flags
    (``!`` marks a row whose two speedup intervals do not overlap)."""
    out = ["guidellm beside the step trace; speedup over vanilla [90 % interval]",
           " variant    steps  guidellm ITL ms TTFT ms  speedup: steps | guidellm",
           "           tok/s/u  tok/s"]
    for b in sorted({r.batch_size for r in rows}):
        out.append(f" BS {b}")
        for r in (r for r in rows if r.batch_size == b):
            flag = " !" if r.disagrees else ""
            out.append(f" {r.variant:9s}{r.steps_tops:7.2f} {r.client_tok_s:8.2f} {r.client_itl_ms:6.0f} "
                       f"{r.client_ttft_ms:7.0f}  {_sp(r.steps_speedup)} | {_sp(r.client_speedup)}{flag}")
    bad = [r for r in rows if r.disagrees]
    for r in bad:
        out.append(f"flag: BS {r.batch_size} {r.variant}: step trace {_sp(r.steps_speedup)} x vanilla,")
        out.append(f"      guidellm {_sp(r.client_speedup)}: the intervals do not overlap")
    if not bad:
        out.append("no disagreement beyond the intervals" if any(r.disagrees is False for r in rows)
                   else "no interval on one side (need >= 2 repeats on both): nothing judged")
    return out
