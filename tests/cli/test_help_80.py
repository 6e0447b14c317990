"""Every command's ``--help`` reads at 80 columns: no line wider than 80, nothing cut short with
"…" (a column too narrow for a word), and no line less than half full in the middle of a
paragraph (a docstring's hard line break renders as a half-empty line followed by the rest of its
sentence). Rendered in-process through typer's runner, every command and sub-command of the app,
the top-level listing included."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.cli.common import help_paragraphs

WIDTH = 80
NAME_COLUMNS = 16  # a box row's option or argument name starts left of this; continuations do not


def _commands() -> list[list[str]]:
    out: list[list[str]] = []

    def walk(cmd, path: list[str]) -> None:
        out.append(path)
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


def _segments(text: str) -> list[tuple[int, str]]:
    """(start column, text) of each run of text separated by two or more spaces."""
    return [(m.start(), m.group()) for m in re.finditer(r"\S+(?: \S+)*", text)]


def ragged_lines(rendered: str, width: int = WIDTH) -> list[str]:
    """The lines in the middle of a paragraph (a continuation of it follows) that are less than half
    full, or that the next word would have fitted on (a hard line break: rich wraps greedily)."""
    lines = rendered.splitlines()
    bad = []
    for i, (line, nxt) in enumerate(zip(lines, lines[1:])):
        boxed = line.startswith("│") and line.rstrip().endswith("│")
        if boxed != (nxt.startswith("│") and nxt.rstrip().endswith("│")):
            continue
        inner, inner_next = (line[1:-1], nxt[1:-1]) if boxed else (line, nxt)
        segs, segs_next = _segments(inner), _segments(inner_next)
        if not segs or not segs_next:
            continue  # the paragraph ends here
        col, text = segs[-1]
        if boxed:  # a table row: its description continues on the next line at the same column
            cont = [t for c, t in segs_next if c == col]
            if not cont or inner_next[:min(col, NAME_COLUMNS)].strip():
                continue
            first = cont[0]
        else:  # a paragraph of the command's own help: the next line at the same indent
            col = segs[0][0]
            if segs_next[0][0] != col:
                continue
            first = segs_next[0][1].split()[0]
            text = inner[col:].rstrip()
        if first.startswith("["):  # [default: ...], [required]: typer's own line
            continue
        room = len(inner) - 1 if boxed else width - 1
        word = first.split()[0]
        if len(text) < (room - col) / 2 or len(text) + 1 + len(word) <= room - col:
            bad.append(f"line {i + 1}: {line.rstrip()!r} then {nxt.rstrip()!r}")
    return bad


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    runner = CliRunner()
    out = {}
    for path in _commands():
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "TERM": "dumb"},
                            terminal_width=WIDTH)
        assert res.exit_code == 0, (path, res.output)
        out[" ".join(["dsdprof", *path])] = res.output
    return out


def test_every_command_is_rendered(rendered):
    assert len(rendered) > 20 and "dsdprof drafts-report" in rendered and "dsdprof toy-models" in rendered


def test_help_fits_80_columns_without_ragged_lines(rendered):
    problems = []
    for name, text in rendered.items():
        problems += [f"{name}: line over {WIDTH} columns: {ln!r}" for ln in text.splitlines()
                     if len(ln.rstrip()) > WIDTH]
        problems += [f"{name}: {p}" for p in ragged_lines(text)]
        problems += [f"{name}: cut short: {ln!r}" for ln in text.splitlines() if "…" in ln]
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_hard_line_break():
    """The docstring shape that used to render raggedly is caught, and reflowing fixes it."""
    doc = """Fit a hardware profile
    to a measured sweep (bounded least squares on ITL), say which batch sizes cannot be determined.

    Exit codes: 0 done; 2
    bad input."""

    def cmd() -> None:
        pass

    for fixed, expect in ((False, True), (True, False)):
        one = typer.Typer(add_completion=False)
        cmd.__doc__ = help_paragraphs(doc) if fixed else doc
        one.command("x")(cmd)
        one.command("y")(cmd)
        for args in (["--help"], ["x", "--help"]):
            res = CliRunner().invoke(one, args, env={"COLUMNS": str(WIDTH), "TERM": "dumb"},
                                     terminal_width=WIDTH)
            assert bool(ragged_lines(res.output)) is expect, res.output
