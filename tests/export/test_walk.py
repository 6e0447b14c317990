"""The export path walked along its calls: ``export_document`` on a small sim run, every call
inside ``dsdprof`` recorded (``sys.setprofile``) as a sequence of module stays, and each move
from a lower layer (docs/architecture.md) back up to a higher one counted as a climb.

Run ``python tests/export/test_walk.py [RUN [FORMAT...]]`` to print the walk (a fresh sim sweep
when no RUN; ``table`` when no FORMAT)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from dsdprof.export.api import export_document

LAYERS = ("errors", "formats", "config", "io", "serve", "plugins", "measure", "decide", "export", "jobs",
          "report", "fleet", "cli")
# issue 32: at most 2 (was 15, then 11; a context sweep's walk 19). The path runs one way:
# export -> io (the run opened and checked into plain data; the provenance's synthetic rates read
# by formats last) -> decide (the analysis, calling no lower layer: the K rule on points is
# decide.rule's own) -> formats (the table's K ranges) -> export (the document built from plain
# fields of the Analysis and Coverage) -> formats (the document validated last).
# So also on a partial run exported with --allow-partial and on a measured run whose table records
# vanilla_faster (the export's vanilla warning).
RUNS = ("sweep", "ctx", "partial", "vanilla")
MAX_CLIMBS = dict.fromkeys(RUNS, 2)
# the same walk by layer, without formats and errors (the vocabulary every layer calls):
# export -> io -> decide -> export
MAX_STAGE_CLIMBS = dict.fromkeys(RUNS, 2)
VANILLA_RUN = Path(__file__).resolve().parents[2] / "docs/lab/data/toy-dense-cpu-itl2x.parquet"
LEAVES = ("formats", "errors")


def layer(module: str) -> int:
    """The layer index of a ``dsdprof.<layer>...`` module (-1 for the top-level re-exports)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else -1


def walk(fn: Any, *args: Any, **kwargs: Any) -> list[str]:
    """The dsdprof modules ``fn(*args, **kwargs)`` calls into, one entry per stay (consecutive
    calls in one module are one stay)."""
    stays: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            mod = frame.f_globals.get("__name__", "")
            if mod.startswith("dsdprof.") and (not stays or stays[-1] != mod):
                stays.append(mod)

    old = sys.getprofile()
    sys.setprofile(tracer)
    try:
        fn(*args, **kwargs)
    finally:
        sys.setprofile(old)
    return stays


def climbs(stays: list[str]) -> list[tuple[str, str]]:
    """Each (from, to) step that returns to a higher layer after a lower one."""
    return [(a, b) for a, b in zip(stays, stays[1:]) if layer(b) > layer(a)]


def stages(stays: list[str]) -> list[str]:
    """The walk by layer, calls into the leaf layers (:data:`LEAVES`) left out."""
    out: list[str] = []
    for s in stays:
        name = LAYERS[layer(s)] if layer(s) >= 0 else "dsdprof"
        if name not in LEAVES and (not out or out[-1] != name):
            out.append(name)
    return out


def stage_climbs(stays: list[str]) -> int:
    by_layer = stages(stays)
    return sum(1 for a, b in zip(by_layer, by_layer[1:]) if LAYERS.index(b) > LAYERS.index(a))


def describe(stays: list[str]) -> str:
    up = climbs(stays)
    return ("by layer: " + " -> ".join(stages(stays)) + f" ({stage_climbs(stays)} climbs)\n"
            f"{len(stays)} stays in {len(set(stays))} modules, {len(up)} climbs back up, io.readers "
            f"entered {stays.count('dsdprof.io.readers')} times\n"
            + " -> ".join(s.removeprefix("dsdprof.") for s in stays)
            + "\nclimbs: " + ", ".join(f"{a.removeprefix('dsdprof.')} -> {b.removeprefix('dsdprof.')}"
                                       for a, b in up))


def _sim_run(out: Path, **sweep: Any) -> Path:
    from dsdprof.config.spec import parse_spec
    from dsdprof.measure.runner import run_sweep

    grid = {"batch_sizes": [1, 4], "num_spec_tokens": [0, 2], "waves": 3, **sweep}
    run_sweep(parse_spec({"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3",
                                     "max_model_len": 70000},
                          "sweep": grid, "sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.9}}), out)
    return out


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory: Any) -> dict[str, Path]:
    import json
    import shutil

    base = tmp_path_factory.mktemp("walk")
    runs = {"sweep": _sim_run(base / "sweep"), "ctx": _sim_run(base / "ctx", context_lens=[1024, 4096]),
            "vanilla": VANILLA_RUN}
    shutil.copytree(runs["sweep"], base / "partial")  # its manifest plans a batch size that never ran
    manifest = base / "partial" / "_sweep.json"
    doc = json.loads(manifest.read_text())
    doc["spec"]["sweep"]["batch_sizes"].append(64)
    manifest.write_text(json.dumps(doc))
    return {**runs, "partial": base / "partial"}


# every format an engine serves too: its config is cut from the table as plain data (a v3 table's
# served slice picked by export.context.served_index), TensorRT-LLM's checked by its validator in
# formats, then the table validated last (was 4 climbs for vllm, 5 for trtllm)
FORMATS = ("table", "vllm", "trtllm")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", RUNS)
def test_the_export_walk_climbs_back_up_at_most_twice(sim_runs, name, fmt):
    out = export_document(sim_runs[name], fmt, allow_partial=True)  # imports done outside the walk
    table = export_document(sim_runs[name], "table", allow_partial=True).doc
    assert ("partial" in table["provenance"]) == (name == "partial")
    assert bool(table.get("vanilla_faster")) == (name == "vanilla")
    assert any("vanilla" in w for w in out.warnings) == (name == "vanilla")
    stays = walk(export_document, sim_runs[name], fmt, allow_partial=True)
    print(describe(stays))
    assert any(layer(s) <= LAYERS.index("io") for s in stays)  # the walk reached the run's files
    assert len(climbs(stays)) <= MAX_CLIMBS[name], describe(stays)
    assert stage_climbs(stays) <= MAX_STAGE_CLIMBS[name], describe(stays)
    # the analysis reads the checked run as plain data: every io stay comes before it starts,
    # none between its start and its return to export
    start = next(i for i, s in enumerate(stays) if layer(s) == LAYERS.index("decide"))
    end = next(i for i, s in enumerate(stays) if i > start and layer(s) == LAYERS.index("export"))
    assert [s for s in stays[start:end] if layer(s) <= LAYERS.index("io")
            and not s.startswith("dsdprof.formats")] == [], describe(stays)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["sweep", "ctx"])
def test_the_export_walk_from_a_table_json_climbs_back_up_at_most_twice(sim_runs, name, fmt, tmp_path):
    import json

    path = tmp_path / "table.json"
    path.write_text(json.dumps(export_document(sim_runs[name], "table").doc))
    def same(doc):  # a table's created_at is when it was written
        return json.loads(json.dumps(doc).replace(doc.get("provenance", {}).get("created_at", "@"), ""))

    # the table read back serves the same document
    assert same(export_document(path, fmt).doc) == same(export_document(sim_runs[name], fmt).doc)
    stays = walk(export_document, path, fmt)
    print(describe(stays))
    assert len(climbs(stays)) <= 2, describe(stays)


def test_the_served_slice_is_the_one_context_slice_takes(sim_runs):
    from dsdprof.export.context import served_index, served_view
    from dsdprof.formats.ktable import context_slice

    table = export_document(sim_runs["ctx"], "table").doc
    edges = [sl["max_context"] for sl in table["contexts"]]
    assert len(edges) == 2
    for c in sorted({1, *edges, *(e + 1 for e in edges), *(e - 1 for e in edges), 10**9} - {0}):
        want = context_slice(table, c)
        view = served_view(table, c)
        assert table["contexts"][served_index(table["contexts"], c)]["ranges"] == want["ranges"]
        assert {k: view[k] for k in view} == {k: want[k] for k in view}


def test_the_walk_counts_a_climb_back_up():
    # the tracer itself can disagree: io -> decide -> io -> export climbs twice
    stays = ["dsdprof.export.api", "dsdprof.io.runs", "dsdprof.decide.analysis", "dsdprof.io.readers",
             "dsdprof.export.table"]
    assert climbs(stays) == [("dsdprof.io.runs", "dsdprof.decide.analysis"),
                             ("dsdprof.io.readers", "dsdprof.export.table")]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(sys.argv[1]) if len(sys.argv) > 1 else _sim_run(Path(tmp) / "sweep")
        for fmt in sys.argv[2:] or ["table"]:
            export_document(run, fmt, allow_partial=True)
            print(f"--format {fmt}:", describe(walk(export_document, run, fmt, allow_partial=True)))


@pytest.mark.parametrize("context", [1, 3000, 100000])
def test_the_sliced_table_export_climbs_back_up_at_most_twice(sim_runs, context, tmp_path):
    """``--format table --context N``: the notice and the vanilla warning read from the served slice
    as plain data, then formats validates and slices last (was 4 climbs from a context run)."""
    import json

    for source in (sim_runs["ctx"], tmp_path / "v3.json"):
        if source.suffix == ".json":
            source.write_text(json.dumps(export_document(sim_runs["ctx"], "table").doc))
        out = export_document(source, "table", context=context)
        assert out.doc["schema"].endswith("/v2") and any("context" in w for w in out.warnings)
        stays = walk(export_document, source, "table", context=context)
        assert len(climbs(stays)) <= 2, describe(stays)
