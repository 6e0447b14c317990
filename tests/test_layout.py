"""The package layout is the pipeline: imports only go down, no cycles, small modules.

Layers, lowest first (a module may import its own layer and the ones below, never above):

    errors < formats < config < io < serve < plugins < measure < decide < export < jobs
    < report < fleet < cli

Every import counts, including the ones inside functions (lazy imports keep start-up cheap,
they do not make an upward dependency acceptable). ``dsdprof.runtime`` and ``dsdprof.engines``
are public re-export paths (serving configs name them) and sit outside the layers.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "dsdprof"
LAYERS = ("errors", "formats", "config", "io", "serve", "plugins", "measure", "decide", "export", "jobs",
          "report", "fleet", "cli")
COMPAT = ("runtime", "engines")  # public paths that only re-export
MAX_TOP_LEVEL_MODULES = 8
# Sizes are guidance, not a limit to pack against: split a module by concept long before it grows
# large (docs/architecture.md). The test is only a backstop far above that, against a runaway file.
RUNAWAY_MODULE_LINES = 800
RUNAWAY_FUNCTION_LINES = 160
# Modules the serving path loads: stdlib, and below them only what they need of dsdprof.
STDLIB_ONLY = ("serve", "formats", "errors")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of a dsdprof module in ``path``, lazy ones included."""
    tree = ast.parse(path.read_text(), str(path))
    here = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "dsdprof"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: -node.level]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "dsdprof":
                continue
            for alias in node.names:  # "from dsdprof.x import y" may name the submodule x.y
                sub = f"{mod}.{alias.name}"
                out.append((node.lineno, sub if sub in MODULES else mod))
    return out


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _third_party(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append((node.lineno, node.module.split(".")[0]))
    return [(ln, n) for ln, n in names if n != "dsdprof" and n not in sys.stdlib_module_names
            and n != "__future__"]


def test_every_package_is_a_layer():
    top = {m.split(".")[1] for m in MODULES if m.count(".") >= 1}
    assert top <= set(LAYERS) | set(COMPAT), f"not in a layer: {sorted(top - set(LAYERS) - set(COMPAT))}"


def test_imports_only_go_down():
    bad = []
    for module, path in MODULES.items():
        layer = _layer(module)
        if layer is None or layer in COMPAT:
            continue
        for line, target in _imports(path):
            other = _layer(target)
            if other is None or other in COMPAT:
                if other in COMPAT:
                    bad.append(f"{path.relative_to(PKG.parent)}:{line} imports the re-export path {target}")
                continue
            if LAYERS.index(other) > LAYERS.index(layer):
                bad.append(f"{path.relative_to(PKG.parent)}:{line} ({layer}) imports {target} ({other})")
    assert not bad, "imports going up the pipeline:\n" + "\n".join(bad)


def test_no_import_cycles():
    graph = {m: {t for _, t in _imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}
    # a package's __init__ importing its own submodules is not a cycle of the layout
    for m in graph:
        graph[m] = {t for t in graph[m] if not (t.startswith(m + ".") and MODULES[m].name == "__init__.py")}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_serving_path_is_stdlib_only():
    bad = []
    for module, path in MODULES.items():
        if _layer(module) in STDLIB_ONLY or module in ("dsdprof.runtime", "dsdprof"):
            for line, name in _third_party(path):
                if name == "pyarrow" and _layer(module) == "formats":
                    continue  # lazily, inside the function that builds the Arrow schema
                bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {name}")
            for line, target in _imports(path):
                if _layer(target) not in STDLIB_ONLY and target != "dsdprof":
                    bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}")
    assert not bad, "the serving path must load nothing but the standard library:\n" + "\n".join(bad)


def test_few_top_level_modules():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_no_runaway_module_or_function():
    bad = []
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        if len(lines) > RUNAWAY_MODULE_LINES:
            bad.append(f"{path.relative_to(PKG.parent)}: {len(lines)} lines")
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > RUNAWAY_FUNCTION_LINES:
                    bad.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name}: {n} lines")
    assert not bad, "split these by concept (docs/architecture.md, Sizes):\n" + "\n".join(bad)


@pytest.mark.parametrize("path",
                         ["dsdprof.runtime", "dsdprof.engines.vllm_scheduler",
                          "dsdprof.engines.vllm_adaptive"])
def test_public_paths_are_re_exports(path):
    """Public paths serving configs name stay importable and hold no code of their own."""
    src = MODULES[path].read_text()
    tree = ast.parse(src)
    assert not [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))], path
