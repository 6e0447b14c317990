"""CLI of the fleet: ``dsdprof fleet`` and ``dsdprof fleet-export`` (registered on the main typer
app by dsdprof.cli.app), and the index listing ``dsdprof show`` delegates to."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer

from dsdprof.cli.common import Tolerance, fail, guarded, make_console
from dsdprof.config.defaults import DEFAULT_TOLERANCE


def _fleet(
    fleet_path: Path = typer.Argument(..., metavar="FLEET",
                                      help="Fleet file (TOML): \\[fleet] out, and \\[\\[runs]] or base + "
                                           "\\[matrix]."),
    address: str | None = typer.Argument(None, metavar="[ADDRESS]",
                                         help="With --ray: the cluster to join (e.g. ray://head:10001 or "
                                              "auto). Default: RAY_ADDRESS or a cluster started on this "
                                              "machine, else a new local one."),
    use_ray: bool = typer.Option(False, "--ray",
                                 help="Run each run as a Ray task (asking for its GPUs) instead of one after "
                                      "another here."),
    out: str | None = typer.Option(None, "--out", "-o",
                                   help="Override \\[fleet] out (a directory or a pyarrow URL)."),
    export: bool = typer.Option(True, "--export/--no-export",
                                help="Write the K tables and their index when the runs finish."),
) -> None:
    """Run every sweep of a fleet (resuming unfinished ones; finished ones do no work), then write
    one K table per (model, draft, hardware, TP) and an index."""

    from dsdprof.fleet.orchestrate import run_fleet
    from dsdprof.fleet.plan import load_fleet

    if address is not None and not use_ray:
        raise fail(f"ADDRESS={address!r}: a cluster address needs --ray")
    plan = load_fleet(fleet_path, out=out)
    err = make_console(stderr=True)
    if any(r.spec.engine.name == "sim" for r in plan.runs):
        err.print("[yellow]engine 'sim' runs: rows are analytic predictions, not measurements[/]")
    err.print(f"[dim]{len(plan.runs)} runs -> {plan.settings.out}"
              f"{' on Ray' if use_ray else ' one after another'}[/]")

    def on_event(ev) -> None:
        style = {"skip": "dim", "submit": "cyan", "done": "green", "error": "red",
                 "shard": "dim"}.get(ev.kind, "")
        text = {"skip": "finished earlier, no work", "submit": "started", "done": "done",
                "shard": "shard done", "error": f"failed: {ev.message}"}.get(ev.kind, ev.kind)
        err.print(f"{ev.run}: {text}", style=style or None, markup=False, highlight=False)

    report = run_fleet(plan, use_ray=use_ray, address=address, on_event=on_event, export=export)
    _print_report(report)
    if not report.complete:
        raise typer.Exit(1)


def _print_report(report) -> None:
    from rich.console import JustifyMethod
    from rich.table import Table

    t = Table(title=f"fleet {report.out}")
    for col, just in (("run", "left"), ("hardware", "left"), ("TP", "right"), ("shards", "right"),
                      ("state", "left"), ("cells ok", "right"), ("failed", "right"), ("K table", "left")):
        t.add_column(col, justify=cast(JustifyMethod, just), overflow="fold")
    for o in report.outcomes:
        state = {"skipped": "done earlier (no work)"}.get(o.state, o.state)
        if o.error:
            state += f": {o.error[:120]}"
        table = f"tables/{o.table}" if o.table else (f"no ({o.table_note[:80]})" if o.table_note else "-")
        t.add_row(o.run.name, o.run.hardware or "-", str(o.run.spec.engine.tensor_parallel_size),
                  str(o.run.shards),
                  state, str(o.ok), str(max(o.cells - o.ok, 0)), table)
    make_console().print(t)
    if report.index:
        make_console().print(f"index: {report.index}")


def _fleet_export(
    fleet_out: str = typer.Argument(..., metavar="FLEET_OUT",
                                    help="A fleet's output: a directory or a pyarrow URL."),
    tolerance: Tolerance = DEFAULT_TOLERANCE,
    staging: str | None = typer.Option(None, "--staging",
                                       help="Local directory for a URL's tables (default: a temp dir)."),
) -> None:
    """Write one K table per finished run of a fleet (per model, draft, hardware, TP) and an index."""

    from dsdprof.errors import InputError
    from dsdprof.fleet.export import export_fleet

    if not (0.0 <= tolerance < 1.0):
        raise InputError("--tolerance", tolerance, "must be in [0, 1)")
    if "://" not in fleet_out and not Path(fleet_out).is_dir():
        raise InputError("FLEET_OUT", fleet_out, "no such directory")
    index = export_fleet(fleet_out if "://" in fleet_out else str(Path(fleet_out).resolve()), staging,
                         tolerance)
    con = make_console()
    con.print(f"{len(index.doc['tables'])} tables, {len(index.doc['skipped'])} runs skipped -> {index.path}")
    for s in index.doc["skipped"]:
        con.print(f"[yellow]{s['run']}: {s['reason']}[/]")


def print_index(path: Path) -> None:
    """``dsdprof show`` on a fleet index: one line per table."""
    from rich.table import Table

    from dsdprof.fleet.export import load_index

    doc = load_index(path)
    t = Table(title=f"{path}  ({doc['schema']}, {doc.get('fleet', '')})")
    for col in ("model", "draft", "method", "hardware", "TP", "engine", "K ranges", "table"):
        t.add_column(col, overflow="fold")
    for e in doc["tables"]:
        ranges = ", ".join(f"{a}{'+' if b >= (1 << 20) else ('' if a == b else f'-{b}')}: {k}"
                           for a, b, k in e["ranges"])
        t.add_row(str(e["model"]), str(e.get("draft_model") or "-"), str(e.get("method") or ""),
                  str(e.get("hardware") or "-"),
                  str(e.get("tensor_parallel_size")), str(e.get("engine") or ""), ranges, str(e["table"]))
    con = make_console()
    con.print(t)
    for s in doc["skipped"]:
        con.print(f"[yellow]no table for {s['run']}: {s['reason']}[/]")


def register(app: typer.Typer) -> None:
    """Add ``fleet`` and ``fleet-export`` to ``app``."""
    app.command("fleet")(guarded(_fleet))
    app.command("fleet-export")(guarded(_fleet_export))
