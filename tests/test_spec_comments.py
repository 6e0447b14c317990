"""The commands quoted in the comments of sweeps/*.toml run as written: each ``dsdprof`` command is
parsed by the CLI itself (every option must exist and take its value; nothing is run), and one
that has ``--dry-run`` (sweep, compare-drafts) is run with it, in-process, its outputs redirected
to a temporary directory. A spec's comment that names a spec file names its own. No engine starts
and no model is built."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dsdprof.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "sweeps").glob("*.toml"))
OUT_FLAGS = ("--out", "-o", "--output", "--md", "--text", "--plot", "--ranking-plot", "--table", "--plots")


def quoted_commands(text: str) -> list[str]:
    """The commands in a spec's comments: a comment line indented as code (``#   dsdprof ...``),
    continued by a trailing backslash; each ``&&`` part that runs ``dsdprof`` on its own. Prose that
    mentions a command (``the `dsdprof validate` runs``) is not a command."""
    lines = [ln[1:] for ln in text.splitlines() if ln.startswith("#")]
    out = []
    while lines:
        line = lines.pop(0)
        if not re.match(r"\s{2,}\S", line):
            continue
        line = line.strip()
        while line.endswith("\\") and lines:
            line = line[:-1].rstrip() + " " + lines.pop(0).strip()
        out += [part.strip() for part in line.split("&&") if part.strip().startswith("dsdprof ")]
    return out


def parse_error(args: list[str]) -> str | None:
    """What the CLI's own parser says of ``dsdprof ARGS`` (unknown command or option, a missing or
    malformed value), without running it; None when it parses."""
    sub = typer.main.get_command(app).commands.get(args[0])
    if sub is None:
        return f"no command {args[0]!r}"
    try:
        sub.make_context(args[0], list(args[1:]))
    except Exception as err:  # typer's own click: UsageError, NoSuchOption, BadParameter; Exit (--help)
        if type(err).__name__ == "Exit":
            return None
        if hasattr(err, "format_message"):
            return str(err.format_message())
        raise
    return None


def _cases() -> list[tuple[str, str]]:
    return [(spec.name, cmd) for spec in SPECS for cmd in quoted_commands(spec.read_text())]


def test_the_specs_quote_commands():
    names = {n for n, _ in _cases()}
    assert {"toy-dense-drafts-cpu.toml", "toy-dense-drafts-small-cpu.toml", "sim-llama8b-eagle3-h100.toml",
            "toy-moe-demo-cpu.toml", "toy-context-cpu.toml"} <= names


def _redirected(args: list[str], tmp: Path) -> list[str]:
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a in OUT_FLAGS:
            out[i + 1] = str(tmp / out[i + 1].replace("/", "_"))
    return out


@pytest.mark.parametrize("spec, command", _cases())
def test_a_quoted_command_runs_as_written(spec, command, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = shlex.split(command)[1:]
    for path in (a for a in args if a.startswith("sweeps/") and a.endswith(".toml")):
        if path != f"sweeps/{spec}":
            pytest.fail(f"{spec}: its comment runs another spec: {command}")
    sub = typer.main.get_command(app).commands.get(args[0])
    problem = parse_error(args)
    if problem:
        pytest.fail(f"{spec}: `{command}`: {problem}")
    if sub is not None and any("--dry-run" in p.opts for p in sub.params):
        res = CliRunner().invoke(app, [*_redirected(args, tmp_path), "--dry-run"])
        assert res.exit_code == 0, f"{spec}: `{command} --dry-run`:\n{res.output}"


def test_the_check_fails_on_what_the_issue_found(tmp_path):
    """``drafts-report ... --out`` (no such option) and a spec comment running another spec."""
    text = ("#   dsdprof compare-drafts sweeps/toy-dense-drafts-cpu.toml --out runs/drafts-small\n"
            "#   dsdprof drafts-report runs/drafts-small --out docs/lab\n")
    first, second = quoted_commands(text)
    assert parse_error(shlex.split(second)[1:]).startswith("No such option: --out")
    assert parse_error(["drafts-report", "runs/x", "--md", "r.md"]) is None
    assert "no command" in parse_error(["drafts-reprot", "runs/x"])
    with pytest.raises(pytest.fail.Exception, match="runs another spec"), pytest.MonkeyPatch.context() as mp:
        test_a_quoted_command_runs_as_written("toy-dense-drafts-small-cpu.toml", first, tmp_path, mp)
    assert quoted_commands("# Build it with `dsdprof validate --design steps`: see\n#   dsdprof show \\\n"
                           "#     t.json && mv a b\n") == ["dsdprof show t.json"]
