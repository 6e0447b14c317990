"""Reading a results path into one checked :class:`dsdprof.config.run.Run`.

``analyze``, ``export``, ``plot``, ``validate-report`` and ``calibrate`` take a run directory, a
Parquet file or a directory of runs. :func:`open_run` reads it once -- every Parquet file, every
manifest -- and hands what it read to :func:`dsdprof.config.run.checked_run`, which raises every
refusal of the command in one order (a validate run, mixed provenance, a context sweep's
malformed contexts, runs of different specs) and derives the rest: the run kind, the grid the
manifest planned against the cells that produced a number (so a table never silently covers
batch sizes that never produced one), the rows per context, the rows validated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from dsdprof.config.run import PooledRuns, ReadRun, Run, checked_run
from dsdprof.formats.jsontypes import JSONObject
from dsdprof.io.manifest import MANIFEST_NAME, first_difference
from dsdprof.io.readers import read_files

__all__ = ["open_run", "read_run"]


def _manifest_doc(run_dir: Path) -> JSONObject | None:
    try:
        doc = json.loads((run_dir / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("spec"), dict) else None


def manifest_docs(path: str | Path) -> tuple[tuple[Path, JSONObject], ...]:
    """(run directory, manifest document) of the run at ``path`` (or the one holding a Parquet
    file) and of every run below it."""
    path = Path(path)
    base = path if path.is_dir() else path.parent
    found: list[tuple[Path, JSONObject]] = []
    if (doc := _manifest_doc(base)) is not None:
        found.append((base, doc))
    if path.is_dir():
        for m in sorted(path.rglob(MANIFEST_NAME)):
            rel = m.parent.relative_to(path).parts
            if m.parent != base and not any(p.startswith((".", "_")) for p in rel):
                if (doc := _manifest_doc(m.parent)) is not None:
                    found.append((m.parent, doc))
    return tuple(found)


def pooled_runs(docs: tuple[tuple[Path, JSONObject], ...]) -> PooledRuns:
    """The runs of these manifests, and the first spec field where each differs from the first."""
    runs = tuple((str(d), str(doc.get("spec_hash", ""))) for d, doc in docs)
    diffs: dict[str, list[str]] = {}
    for _, doc in docs[1:]:
        diff = first_difference(docs[0][1]["spec"], doc["spec"], "spec")
        if diff is not None:
            vals = diffs.setdefault(diff[0], [json.dumps(diff[1], default=str)])
            vals.append(json.dumps(diff[2], default=str))
    return PooledRuns(runs, tuple((f, " | ".join(dict.fromkeys(v))) for f, v in diffs.items()))


def read_run(path: str | Path, data: bytes | None = None) -> ReadRun:
    """Read ``path`` once -- every Parquet file (:func:`dsdprof.io.readers.read_files`; ``data``: the
    bytes of ``path``, a file the caller has read) and every manifest -- before any check;
    unreadable files and cells stored twice are refused here, always.
    :func:`dsdprof.config.run.checked_run` checks what was read, as often as a caller needs it
    (``dsdprof report`` checks one read as ``report``, ``export`` and ``analyze`` do)."""
    files = read_files(path, data)
    rows = pd.concat([f.rows for f in files], ignore_index=True) if len(files) > 1 else files[0].rows
    docs = manifest_docs(path)
    return ReadRun(Path(path), rows, next((dict(f.meta) for f in files if f.meta), {}),
                   {str(f.meta["schema_version"]) for f in files if f.meta}, docs, pooled_runs(docs))


def open_run(path: str | Path, command: str = "", allow_mixed: bool = False) -> Run:
    """:func:`read_run`, checked into one :class:`dsdprof.config.run.Run`:
    :func:`dsdprof.config.run.checked_run` raises the refusals of ``command`` (``analyze``,
    ``export``, ``plot``, ``validate-report``, ``calibrate``; "" none) in one order."""
    return checked_run(read_run(path), command, allow_mixed)
