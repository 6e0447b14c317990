"""``dsdprof watch URL``: a live terminal view of what a dsdprof-served vLLM engine does, from
its ``/metrics`` (registered on the main typer app by dsdprof.cli.app). The numbers come from
:func:`dsdprof.report.watch.snapshot`; this module parses the flags and renders."""

from __future__ import annotations

import json
import time
from typing import Any

import typer

from dsdprof.cli.common import guarded, make_console
from dsdprof.report.watch import Rates, Snapshot


def _fmt(x: Any, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _view(snap: Snapshot, rate: Rates | None):
    """One screen: schedule, acceptance, ratios and alarms as rich tables (<= 80 columns)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text(f"{snap['url']}  mode {snap['mode'] or '-'}  engines {','.join(snap['engines']) or '-'}")
    if rate:
        head.append(f"\nlast {rate['seconds']:.1f} s: {rate['steps_per_s']:.1f} steps/s, "
                    f"{rate['drafts_per_s']:.1f} drafts/s, AL {_fmt(rate['acceptance_length'])}")
    sched = Table(title="K per batch-size bucket", title_justify="left")
    for col in ("bucket", "K now", "K table", "steps by K", "steps K=0"):
        sched.add_column(col, justify="right" if col != "steps by K" else "left")
    for r in snap["schedule"]:
        by_k = " ".join(f"{k}:{n}" for k, n in sorted(r["steps"].items(), key=lambda kv: int(kv[0])))
        sched.add_row(r["bucket"], _fmt(r["k"]), _fmt(r["table_k"]), by_k or "-", str(r["steps_k0"]))
    acc, vllm = snap["acceptance"], snap["vllm"]
    pos = Table(title=f"acceptance: AL {_fmt(acc['acceptance_length'])} (vLLM's counters: "
                f"{_fmt(vllm['acceptance_length'])}, {'agree' if snap['agree'] else 'DIFFER'})",
                title_justify="left")
    for col in ("position", "drafted", "accepted", "rate"):
        pos.add_column(col, justify="right")
    for p in acc["per_position"]:
        pos.add_row(str(p["position"] + 1), str(p["drafted"]), str(p["accepted"]), _fmt(p["rate"], 3))
    parts: list[Any] = [head, sched, pos]
    if snap["ratios"]:
        ratio = Table(title="live / table at the K served (95 % interval)", title_justify="left")
        for col in ("batch size", "acceptance length", "step time"):
            ratio.add_column(col, justify="right")
        for q in snap["ratios"]:
            a, s = q["acceptance_length"], q["step_time"]
            ratio.add_row(str(q["batch_size"]), f"{a[0]:.3f} [{a[1]:.3f}, {a[2]:.3f}]",
                          f"{s[0]:.3f} [{s[1]:.3f}, {s[2]:.3f}]")
        parts.append(ratio)
    parts.append(Text("  ".join(f"{k} {v}" for k, v in snap["alarms"].items())))
    parts += [Text(f"WARNING: {w}", style="bold red") for w in snap["warnings"]]
    return Group(*parts)


def _watch(
    url: str = typer.Argument(..., metavar="URL", help="The server (http://HOST:PORT) or its /metrics URL."),
    as_json: bool = typer.Option(False, "--json", help="Print one snapshot as JSON and exit."),
    interval: float = typer.Option(2.0, "--interval", min=0.1, help="Seconds between refreshes."),
    count: int | None = typer.Option(None, "--count", min=1,
                                     help="Stop after this many refreshes (default: until Ctrl-C)."),
) -> None:
    """Watch dsdprof's metrics on a vLLM server's /metrics, live.

    Shown (docs/observability.md): K served per batch-size bucket, steps at K=0, acceptance per
    position against vLLM's own counters, the adaptive plugin's live / table ratios, switches
    and alarms. Exit codes: 0; 2 bad or unreachable URL."""
    from dsdprof.report.watch import interval as rates
    from dsdprof.report.watch import snapshot

    if as_json:
        print(json.dumps(snapshot(url), indent=1))
        return
    from rich.live import Live

    console = make_console()
    prev = snap = snapshot(url)
    n = 1
    with Live(_view(snap, None), console=console, auto_refresh=False) as live:
        while count is None or n < count:
            time.sleep(interval)
            prev, snap = snap, snapshot(url)
            n += 1
            live.update(_view(snap, rates(prev, snap)), refresh=True)


def register(app: typer.Typer) -> None:
    app.command(name="watch")(guarded(_watch))
