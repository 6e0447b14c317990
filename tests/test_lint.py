"""The lint and type gates: ruff over the package, tests/ and benchmarks/, mypy over the package, with
pyproject.toml's settings.

Each gate is first shown a file it must reject, so a gate that silently checks nothing
(wrong config, wrong paths, a tool that exits 0 on anything) fails here too.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def _tool(name: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    try:
        __import__(name)
    except ImportError:  # a gate that is not installed must not pass quietly
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]'")
    return subprocess.run([sys.executable, "-m", name, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_ruff_rejects_a_long_line_and_an_unused_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nX = " + repr("x" * 120) + "\n")
    r = _tool("ruff", "check", "--no-cache", "--config", str(PYPROJECT), str(bad))
    assert r.returncode != 0
    assert "E501" in r.stdout and "F401" in r.stdout, r.stdout


@pytest.mark.parametrize("tree", ["dsdprof", "tests", "benchmarks"])
def test_ruff_clean(tree):
    """The same rules for the package, its tests and its benchmarks."""
    r = _tool("ruff", "check", "--no-cache", tree)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_strict_in_the_strict_packages(tmp_path):
    # the same module path as the package, so pyproject's per-module strict override applies
    pkg = tmp_path / "dsdprof" / "formats"
    pkg.mkdir(parents=True)
    (tmp_path / "dsdprof" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text("def f(x):\n    return x\n")
    (tmp_path / "dsdprof" / "loose.py").write_text("def f(x):\n    return x\n\n\nY: int = 'a'\n")
    r = _tool("mypy", "--config-file", str(PYPROJECT), "--cache-dir", str(tmp_path / "cache"),
              "dsdprof", cwd=tmp_path)
    assert r.returncode != 0
    assert re.search(r"formats[/\\]probe\.py:1: error: .*\[no-untyped-def\]", r.stdout), r.stdout
    # outside the strict packages an untyped def passes, a wrong type does not
    assert "loose.py:1" not in r.stdout and re.search(r"loose\.py:5: error", r.stdout), r.stdout


def test_mypy_package_clean():
    r = _tool("mypy", "--config-file", str(PYPROJECT))
    assert r.returncode == 0, r.stdout + r.stderr


def test_type_ignores_are_narrow_and_say_why():
    """Every ``type: ignore`` names its error code and gives a reason after it (the files ruff does
    not check yet, pyproject's ``extend-exclude``, are not checked here either)."""
    pending = set(tomllib.loads(PYPROJECT.read_text())["tool"]["ruff"].get("extend-exclude", []))
    bad = []
    for path in sorted((ROOT / "dsdprof").rglob("*.py")):
        if str(path.relative_to(ROOT)) in pending:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "type: ignore" not in line:
                continue
            if not re.search(r"#\s*type:\s*ignore\[[\w\-, ]+\]\s+#\s*\S", line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "type: ignore without an error code and a reason:\n" + "\n".join(bad)


def test_no_package_line_runs_past_110_columns():
    """ruff's E501 lets a line run long when the overflow is a pragma comment (``# noqa``,
    ``# type: ignore``); the package's limit has no such exception."""
    long = [f"{path.relative_to(ROOT)}:{n}: {len(line)} columns"
            for path in sorted((ROOT / "dsdprof").rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 110]
    assert not long, "lines over 110 columns:\n" + "\n".join(long)
