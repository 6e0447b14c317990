"""The suite's tiers: `make test-fast` (no vLLM, nothing slow, every package reached) and `make test`
(everything, with the slowest tests listed). The reach check must be able to fail."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import dsdprof_packages, imported_packages, unreached_packages

ROOT = Path(__file__).resolve().parents[1]


def _recipe(target: str) -> str:
    make = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", make, re.MULTILINE)
    assert m, target
    return m.group(1)


def test_make_test_fast_leaves_out_vllm_and_slow_and_requires_every_package():
    fast = _recipe("test-fast")
    assert '-m "not vllm and not slow"' in fast and "--require-packages" in fast
    full = _recipe("test")
    assert "-m pytest" in full and " -m \"" not in full and "--durations=" in full  # every test, slowest listed


def test_packages_are_the_folders_with_an_init():
    packages = dsdprof_packages()
    assert {"dsdprof", "dsdprof.formats", "dsdprof.serve", "dsdprof.measure.vllm", "dsdprof.cli"} <= packages
    assert all(p == "dsdprof" or p.startswith("dsdprof.") for p in packages)
    assert "dsdprof.cli.app" not in packages  # a module, not a package


def test_imports_and_dotted_strings_reach_a_package_and_its_parents():
    packages = {"dsdprof", "dsdprof.measure", "dsdprof.measure.vllm", "dsdprof.serve", "dsdprof.engines"}
    src = ("import dsdprof.measure.vllm.trace\nfrom dsdprof.serve import runtime\n"
           "CLS = 'dsdprof.engines.vllm_adaptive.make_scheduler'\nfrom . import x\n")
    assert imported_packages(src, packages) == packages
    assert imported_packages("import json\nX = 'dsdprof is fast'\n", packages) == set()


def test_a_tier_that_reaches_no_test_of_a_package_fails(tmp_path):
    packages = {"dsdprof", "dsdprof.serve", "dsdprof.report"}
    a = tmp_path / "test_a.py"
    a.write_text("from dsdprof.serve.runtime import KSelector\n")
    assert unreached_packages({a}, packages) == {"dsdprof.report"}
    b = tmp_path / "test_b.py"
    b.write_text("from dsdprof.report import compare\n")
    assert unreached_packages({a, b}, packages) == set()
    assert unreached_packages(set(), packages) == packages
