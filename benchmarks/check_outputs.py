"""Byte-for-byte outputs of the run-reading commands on a corpus, to compare two trees.

    python benchmarks/check_outputs.py corpus CORPUS            # write the sim runs once
    python benchmarks/check_outputs.py run TREE CORPUS OUT      # every command's output, from TREE
    python benchmarks/check_outputs.py diff OUT_A OUT_B         # compare two outputs, file by file

The corpus (docs/lab/run-once.md): every Parquet file in ``docs/lab/data/``, ``notebooks/sample_run``
and the analytic engine's (``sim``) runs written by ``corpus``: a sweep, a context sweep, a partial
run (its manifest plans a batch size that never ran) and two runs of different specs under one
directory. ``run`` imports dsdprof from TREE and runs, in-process, ``analyze`` (text, ``--json``,
``--wide``, ``--csv``), ``export`` (table, vllm, trtllm, vllm-compilation; ``--context``,
``--allow-partial``, ``--allow-mixed``), ``show`` of the exported table, ``validate-report`` and
``calibrate --json`` (with the profile it writes). Each output file holds the exit code, stdout and
stderr; ``diff`` blanks ``created_at`` values. This measures nothing about speculative decoding: it
checks that a refactor leaves every output as it was.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_CREATED = re.compile(r'(created_at"?\s*[:=]\s*)"?[0-9-][0-9T:.+\-Z]*"?')


def _sim(out: Path, **sweep: object) -> None:
    from dsdprof.config.spec import parse_spec
    from dsdprof.measure.runner import run_sweep

    grid = {"batch_sizes": [1, 4, 16], "num_spec_tokens": [0, 1, 2, 4], "waves": 4, "repeats": 2, **sweep}
    run_sweep(parse_spec({"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3",
                                     "max_model_len": 70000},
                          "sweep": grid, "sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.9}}), out)


def corpus(base: Path) -> None:
    """The sim runs (written once, read by both trees)."""
    sys.path.insert(0, str(ROOT))
    base.mkdir(parents=True)
    _sim(base / "sweep")
    _sim(base / "ctx", context_lens=[1024, 4096])
    shutil.copytree(base / "sweep", base / "partial")
    manifest = base / "partial" / "_sweep.json"
    doc = json.loads(manifest.read_text())
    doc["spec"]["sweep"]["batch_sizes"].append(64)
    manifest.write_text(json.dumps(doc))
    _sim(base / "mixed" / "a")
    _sim(base / "mixed" / "b", waves=5)


def _cases(corpus_dir: Path) -> list[tuple[str, list[str]]]:
    data = sorted((ROOT / "docs/lab/data").glob("*.parquet"))
    sims = [corpus_dir / n for n in ("sweep", "ctx", "partial", "mixed")]
    sources = data + [ROOT / "notebooks/sample_run"] + sims
    cases: list[tuple[str, list[str]]] = []
    for src in sources:
        name = src.stem if src.suffix == ".parquet" else src.name
        s = str(src)
        cases += [(f"{name}.analyze", ["analyze", s]), (f"{name}.analyze-json", ["analyze", s, "--json"]),
                  (f"{name}.analyze-wide", ["analyze", s, "--wide"])]
        cases += [(f"{name}.export-{f}", ["export", s, "--format", f])
                  for f in ("table", "vllm", "trtllm", "vllm-compilation")]
        cases.append((f"{name}.validate-report", ["validate-report", s]))
    profile = str(corpus_dir / "check_outputs_profile.toml")  # per corpus: two users never share it
    few = [ROOT / "docs/lab/data/toy-dense-cpu.parquet", ROOT / "notebooks/sample_run", corpus_dir / "sweep"]
    for src in few:
        name = src.stem if src.suffix == ".parquet" else src.name
        cases += [(f"{name}.analyze-csv", ["analyze", str(src), "--csv"]),
                  (f"{name}.analyze-measured", ["analyze", str(src), "--acceptance", "measured",
                                                "--tolerance", "0.05"]),
                  (f"{name}.calibrate", ["calibrate", str(src), "--out", profile,
                                         "--force", "--json"])]
    ctx, partial, mixed = str(corpus_dir / "ctx"), str(corpus_dir / "partial"), str(corpus_dir / "mixed")
    cases += [(f"ctx.export-{f}-context{c}", ["export", ctx, "--format", f, "--context", str(c)])
              for f in ("table", "vllm", "trtllm") for c in (1024, 4096, 3000)]
    cases += [("partial.export-table-allow-partial", ["export", partial, "--allow-partial"]),
              ("partial.export-vllm-allow-partial", ["export", partial, "-f", "vllm", "--allow-partial"]),
              ("mixed.analyze-allow-mixed", ["analyze", mixed, "--allow-mixed", "--json"]),
              ("mixed.export-allow-mixed", ["export", mixed, "--allow-mixed"]),
              ("sweep.export-context", ["export", str(corpus_dir / "sweep"), "--context", "1024"]),
              ("sweep.export-badformat", ["export", str(corpus_dir / "sweep"), "--format", "bogus"]),
              ("sweep.analyze-badtol", ["analyze", str(corpus_dir / "sweep"), "--tolerance", "1.5"])]
    return cases


def run(tree: Path, corpus_dir: Path, out: Path) -> None:
    os.environ["COLUMNS"] = "80"
    os.environ.pop("FORCE_COLOR", None)
    sys.path.insert(0, str(tree))
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    assert Path(sys.modules["dsdprof"].__file__ or "").resolve().is_relative_to(tree.resolve())
    out.mkdir(parents=True)
    runner = CliRunner()
    show_path = corpus_dir / "check_outputs_table.json"  # per corpus: two users never share it
    for name, args in _cases(corpus_dir):
        res = runner.invoke(app, args)
        text = f"exit {res.exit_code}\n--- stdout\n{res.stdout}--- stderr\n{res.stderr}"
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            text += f"--- exception\n{type(res.exception).__name__}: {res.exception}\n"
        if args[0] == "calibrate" and res.exit_code == 0:
            text += "--- profile\n" + Path(args[3]).read_text()
        (out / name).write_text(text)
        if name.endswith(".export-table") and res.exit_code == 0:
            show_path.write_text(res.stdout)
            res = runner.invoke(app, ["show", str(show_path)])
            (out / (name.removesuffix("export-table") + "show")).write_text(
                f"exit {res.exit_code}\n--- stdout\n{res.stdout}--- stderr\n{res.stderr}")
    print(f"{len(list(out.iterdir()))} outputs in {out}")


def diff(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    differ = [n for n in names if not (a / n).exists() or not (b / n).exists()
              or _CREATED.sub(r"\1-", (a / n).read_text()) != _CREATED.sub(r"\1-", (b / n).read_text())]
    print(f"{len(names)} outputs compared, {len(names) - len(differ)} identical, {len(differ)} differ")
    for n in differ:
        print(f"  differs: {n}")
    return 1 if differ else 0


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "corpus":
        corpus(Path(rest[0]))
    elif cmd == "run":
        run(Path(rest[0]), Path(rest[1]), Path(rest[2]))
    else:
        sys.exit(diff(Path(rest[0]), Path(rest[1])))
