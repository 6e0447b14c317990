"""docs/reference.md's command reference names every command of the CLI and, in that command's
row, every option it takes (hidden ones aside): the README links it as "every command"."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from dsdprof.cli.app import app

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def _rows() -> dict[str, str]:
    """Command name -> its row in the command reference table."""
    text = REFERENCE.read_text()
    section = text[text.index("## Command reference"):]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `dsdprof ([a-z][a-z-]*)", line)
        if m:
            rows[m.group(1)] = line
    return rows


def _options(cmd) -> list[str]:
    return [o for p in cmd.params if p.param_type_name == "option" and not getattr(p, "hidden", False)
            for o in (*p.opts, *p.secondary_opts) if o != "--help"]


def missing_from_reference(rows: dict[str, str]) -> list[str]:
    out = []
    for name, cmd in typer.main.get_command(app).commands.items():
        if getattr(cmd, "hidden", False):
            continue
        if name not in rows:
            out.append(f"dsdprof {name}: no row")
            continue
        out += [f"dsdprof {name} {opt}" for opt in _options(cmd)
                if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", rows[name])]
    return out


def test_every_command_and_option_is_in_the_reference():
    rows = _rows()
    assert not missing_from_reference(rows), "\n".join(missing_from_reference(rows))


def test_the_check_sees_a_missing_option():
    rows = _rows()
    rows["export"] = rows["export"].replace("--mix", "")
    rows.pop("replay")
    assert set(missing_from_reference(rows)) == {"dsdprof export --mix", "dsdprof replay: no row"}
