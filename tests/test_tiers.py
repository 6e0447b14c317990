"""The suite's tiers: `make test-fast` (no vLLM, nothing slow, every package reached) and `make test`
(everything, with the slowest tests listed). The reach check must be able to fail."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import (
    dsdprof_packages,
    imported_packages,
    pytest_collection_modifyitems,
    unreached_packages,
)

ROOT = Path(__file__).resolve().parents[1]


def _recipe(target: str) -> str:
    make = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", make, re.MULTILINE)
    assert m, target
    return m.group(1)


def test_make_test_fast_leaves_out_vllm_and_slow_and_requires_every_package():
    fast = _recipe("test-fast")
    assert '-m "not vllm and not slow"' in fast and "--require-packages" in fast


def test_make_test_runs_every_test_once_in_its_two_sessions():
    make = (ROOT / "Makefile").read_text()
    full = _recipe("test")
    assert "$(PYTEST_FULL)" in full
    assert re.search(r"^PYTEST_FULL := .*-m pytest .*--durations=\d+", make, re.M)
    exprs = re.findall(r'\$\(PYTEST_FULL\)[^\n]*?-m "([^"]+)"', full)
    assert len(exprs) == 2, exprs
    for marks in ({"vllm"}, {"ray"}, {"vllm", "ray"}, {"slow"}, set()):  # every test in exactly one session
        env = {m: m in marks for m in ("vllm", "ray", "slow")}
        assert sum(bool(eval(e, {}, env)) for e in exprs) == 1, (marks, exprs)
    assert re.search(r"else \\\n\s*\$\(PYTEST_FULL\); \\", full)  # TEST_JOBS=1: one session, no -m


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


def test_tests_on_the_ray_cluster_are_marked_ray():
    class Item:
        def __init__(self, *fixtures):
            self.fixturenames, self.marks = fixtures, []

        def add_marker(self, mark):
            self.marks.append(mark.name)

    on_ray, plain = Item("ray_cluster", "tmp_path"), Item("tmp_path")
    pytest_collection_modifyitems(None, [on_ray, plain])
    assert on_ray.marks == ["ray"] and plain.marks == []


def mirror_mismatches(root: Path) -> list[str]:
    """Test modules under tests/ whose folder names no package of dsdprof/ (tests/ mirrors the
    package tree; test modules of the whole project, and helpers, sit at its top)."""
    tests = root / "tests"
    bad = []
    for path in sorted(tests.rglob("test_*.py")):
        rel = path.parent.relative_to(tests)
        if rel.parts and not (root / "dsdprof" / rel / "__init__.py").is_file():
            bad.append(str(path.relative_to(root)))
    return bad


def test_tests_mirror_the_package_tree(tmp_path):
    assert mirror_mismatches(ROOT) == []
    assert len(list((ROOT / "tests" / "decide").glob("test_*.py"))) >= 3  # the mirror is used
    (tmp_path / "dsdprof" / "serve").mkdir(parents=True)
    (tmp_path / "dsdprof" / "serve" / "__init__.py").write_text("")
    for folder in ("serve", "servve"):
        (tmp_path / "tests" / folder).mkdir(parents=True)
        (tmp_path / "tests" / folder / "test_x.py").write_text("")
    assert mirror_mismatches(tmp_path) == ["tests/servve/test_x.py"]


def test_only_tests_put_vllms_engine_core_in_process(monkeypatch):
    """The vLLM tier's switch (tests/conftest.py, ``inproc_engine_core``) is the tests' own: nothing in
    the package or the Makefile sets VLLM_ENABLE_V1_MULTIPROCESSING, so users' sweeps and servers keep
    vLLM's layout; and DSDPROF_TEST_ENGINE_LAYOUT=served turns it off for the whole tier."""
    from tests.conftest import LAYOUT_ENV, inproc_engine_env

    name = "VLLM_ENABLE_V1_MULTIPROCESSING"
    # setting it: os.environ[...] = / setdefault / putenv, an env mapping's key, a Makefile assignment
    # (reading it is allowed: a sweep's provenance records it when set)
    sets = re.compile(rf"""environ\[\s*["']{name}["']\s*\]\s*=|(setdefault|putenv)\(\s*["']{name}"""
                      rf"""|["']{name}["']\s*:|\b{name}\s*[:?+]?=""")
    assert sets.search(f'os.environ["{name}"] = "0"') and sets.search(f"export {name} ?= 0")
    assert not sets.search(f'os.environ.get("{name}")')
    hits = [p for p in [*(ROOT / "dsdprof").rglob("*.py"), ROOT / "Makefile"] if sets.search(p.read_text())]
    assert hits == []
    monkeypatch.delenv(LAYOUT_ENV, raising=False)
    env = inproc_engine_env()
    assert env[name] == "0" and int(env["OMP_NUM_THREADS"]) >= 1 and env["OMP_PROC_BIND"] == "true"
    monkeypatch.setenv(LAYOUT_ENV, "served")
    assert inproc_engine_env() == {}
