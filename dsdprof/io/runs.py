"""What a results path holds, from its run manifests: the run kind, the runs pooled, the grid covered.

``analyze``, ``export`` and ``plot`` take a run directory, a Parquet file or a directory of runs.
This module answers, before any decision is made from the rows:

* :func:`run_kind` -- ``sweep`` or ``validate`` (a validate run is no sweep: it has no K grid), from the
  manifest, the files' metadata or the rows alone (:func:`validate_rows`);
* :func:`pooled_runs` / :func:`check_pooled_runs` -- the runs (manifests with their spec hashes)
  under a path, refused when they differ unless the caller allows mixing;
* :func:`coverage` -- the grid the manifest planned against the cells that produced a number, so
  a table never silently covers batch sizes that never produced one.

:func:`open_run` reads a results path once into a :class:`Run` (rows, provenance, manifests)
that answers all of these without reading a file again; ``decide``, ``export``, ``report`` and
``fleet`` take it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from dsdprof.errors import InputError
from dsdprof.formats.measurements import CONTEXT_COLUMN, MODE_ADAPTIVE, MODE_DSD, MODE_FIXED
from dsdprof.io.manifest import MANIFEST_NAME, first_difference

RUN_KIND_SWEEP = "sweep"
RUN_KIND_VALIDATE = "validate"  # key in a validate run's manifest spec (dsdprof.jobs.validate)


def _manifest(run_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((run_dir / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("spec"), dict) else None


def manifests_under(path: str | Path) -> dict[Path, dict[str, Any]]:
    """Run directory -> manifest, for the run at ``path`` (or the one holding a Parquet file) and
    every run below it."""
    path = Path(path)
    base = path if path.is_dir() else path.parent
    found: dict[Path, dict[str, Any]] = {}
    if (doc := _manifest(base)) is not None:
        found[base] = doc
    if path.is_dir():
        for m in sorted(path.rglob(MANIFEST_NAME)):
            rel = m.parent.relative_to(path).parts
            if m.parent != base and not any(p.startswith((".", "_")) for p in rel):
                if (doc := _manifest(m.parent)) is not None:
                    found[m.parent] = doc
    return found


def validate_rows(rows: Any) -> str:
    """Why ``rows`` (a DataFrame) are a validate run's, from the rows alone; "" when they may be a
    sweep's. A sweep runs in one speculation mode (``dsd``: vanilla + every K of the grid per batch
    size; ``fixed``: vanilla + one engine per K) and never writes ``adaptive`` rows. ``dsdprof
    validate`` writes ``adaptive`` rows (the plugin's arm), and beside fixed-K rows one ``dsd`` row
    per batch size and repeat: the table's K, served by vLLM's schedule."""
    if rows is None or "mode" not in rows.columns or not len(rows):
        return ""
    modes = rows["mode"].astype(str)
    if (modes == MODE_ADAPTIVE).any():
        return f"rows of mode {MODE_ADAPTIVE!r}, which no sweep writes"
    dsd, fixed = rows[modes == MODE_DSD], rows[modes == MODE_FIXED]
    if dsd.empty or fixed.empty or "batch_size" not in rows.columns or "num_spec_tokens" not in rows.columns:
        return ""
    keys = [c for c in ("batch_size", "repeat", CONTEXT_COLUMN.name) if c in rows.columns]

    def units(part: Any) -> list[tuple]:  # (batch size, repeat, context) of each row, as plain values
        return [tuple(str(v) for v in u) for u in part[keys].itertuples(index=False, name=None)]

    dsd_ks: dict[tuple, set] = {}
    for u, k in zip(units(dsd), dsd["num_spec_tokens"]):
        dsd_ks.setdefault(u, set()).add(str(k))
    if all(len(ks) == 1 for ks in dsd_ks.values()) and not dsd_ks.keys().isdisjoint(units(fixed)):
        return "fixed-K rows beside one dsd K per batch size, as validate writes them"
    return ""


def _kind_columns(path: str | Path) -> Any:
    """The columns :func:`validate_rows` reads, of every Parquet file under ``path`` (None if unreadable)."""
    from dsdprof.io.readers import read_columns

    try:
        return read_columns(path, ("mode", "batch_size", "num_spec_tokens", "repeat", CONTEXT_COLUMN.name))
    except Exception:  # noqa: BLE001 - unreadable rows: the reader that follows names the file
        return None


def validate_evidence(path: str | Path, rows: Any = None) -> str:
    """Why ``path`` holds a validate run ("" when it is a sweep): a manifest written by ``dsdprof
    validate``, the rows' provenance, or the rows themselves (:func:`validate_rows`; ``rows``: all
    rows when the caller has read them), whatever the files' metadata says."""
    from dsdprof.io.readers import read_provenance

    try:
        provenance = read_provenance(path)
    except InputError:
        provenance = {}
    return kind_evidence(manifests_under(path), provenance,
                         lambda: rows if rows is not None else _kind_columns(path))


def kind_evidence(manifests: dict[Path, dict[str, Any]], provenance: dict[str, Any], rows: Any) -> str:
    """Why a run of these manifests, provenance and rows (a DataFrame, or a callable returning
    it, read only when needed) is a validate run ("" when it is a sweep): the one test."""
    if any(RUN_KIND_VALIDATE in doc["spec"] for doc in manifests.values()):
        return "its manifest says so"
    if provenance.get("extra_run_kind") == RUN_KIND_VALIDATE:
        return "its files' metadata says so"
    return validate_rows(rows() if callable(rows) else rows)


def run_kind(path: str | Path, rows: Any = None) -> str:
    """``validate`` when ``path`` (a run directory, a Parquet file or a directory of runs) holds a
    validate run (:func:`validate_evidence`), else ``sweep``. The one test of a run's kind."""
    return RUN_KIND_VALIDATE if validate_evidence(path, rows) else RUN_KIND_SWEEP


def _refuse_validate(path: str | Path, command: str, why: str) -> None:
    if why:
        raise InputError("measurements", str(path), f"is a validate run, not a sweep ({why}); {command} "
                         "needs a sweep: read it with `dsdprof validate-report`")


@dataclass(frozen=True)
class PooledRuns:
    """The runs under one path: directory and spec hash of each; ``differences`` names the
    first spec field that differs from the first run (``spec.workload.input_len``)."""

    runs: tuple[tuple[str, str], ...]
    differences: tuple[tuple[str, str], ...] = ()

    def provenance(self) -> dict[str, str]:
        """What a pooled analysis records: each differing field's values and every run pooled."""
        if len(self.runs) < 2:
            return {}
        out = {f"pooled_{field.removeprefix('spec.')}": values for field, values in self.differences}
        out["pooled_runs"] = " | ".join(f"{d} ({h[:19]})" for d, h in self.runs)
        return out


def pooled_runs(path: str | Path, manifests: dict[Path, dict[str, Any]] | None = None) -> PooledRuns:
    """The runs under ``path`` (``manifests``: :func:`manifests_under` when read already)."""
    manifests = manifests_under(path) if manifests is None else manifests
    runs = tuple((str(d), str(doc.get("spec_hash", ""))) for d, doc in manifests.items())
    docs = list(manifests.values())
    diffs: dict[str, list[str]] = {}
    for doc in docs[1:]:
        diff = first_difference(docs[0]["spec"], doc["spec"], "spec")
        if diff is not None:
            vals = diffs.setdefault(diff[0], [json.dumps(diff[1], default=str)])
            vals.append(json.dumps(diff[2], default=str))
    return PooledRuns(runs, tuple((f, " | ".join(dict.fromkeys(v))) for f, v in diffs.items()))


def check_pooled_runs(path: str | Path, allow_mixed: bool,
                      manifests: dict[Path, dict[str, Any]] | None = None) -> PooledRuns:
    """The runs under ``path``; runs of different specs are refused (first difference named)
    unless ``allow_mixed``."""
    pooled = pooled_runs(path, manifests)
    if not allow_mixed and len({h for _, h in pooled.runs}) > 1:
        field, values = pooled.differences[0] if pooled.differences else ("spec_hash", "")
        raise InputError(field, values, f"runs with different specs under {path}; analyze one run at a "
                         "time, or pass --allow-mixed to pool them (the result records what it pooled)")
    return pooled


@dataclass(frozen=True)
class Coverage:
    """The planned grid (from the manifests; else the rows) against the cells with a number.

    ``missing_batch_sizes``: grid batch sizes with no ok speculative cell; ``missing_cells``:
    (batch size, K) grid cells with no ok row at batch sizes that have some."""

    batch_sizes: tuple[int, ...]
    ks: tuple[int, ...]
    missing_batch_sizes: tuple[int, ...] = ()
    missing_cells: tuple[tuple[int, int], ...] = ()
    grid_from: str = "manifest"
    first_error: str = ""  # the first failed cell's error at a missing batch size or cell
    complete: bool = field(init=False)  # no gap (plain data: derived when made)
    summary: str = field(init=False)  # :meth:`describe`'s line
    gap_summary: str = field(init=False)  # ... without the first error

    def __post_init__(self) -> None:
        object.__setattr__(self, "complete", not self.missing_batch_sizes and not self.missing_cells)
        object.__setattr__(self, "summary", self._describe(self.first_error))
        object.__setattr__(self, "gap_summary", self._describe(""))

    def record(self) -> dict[str, Any]:
        """The fields it was made of (what ``analyze --json`` writes; the others derive from them)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    def describe(self) -> str:
        """One line naming the gaps ("" when complete): :attr:`summary`."""
        return self.summary

    def _describe(self, first_error: str) -> str:
        parts = []
        if self.missing_batch_sizes:
            parts.append("no ok cell at batch size " + ", ".join(map(str, self.missing_batch_sizes)))
        if self.missing_cells:
            by_bs: dict[int, list[int]] = {}
            for b, k in self.missing_cells:
                by_bs.setdefault(b, []).append(k)
            parts.append("missing " + "; ".join(f"BS {b} K={','.join(map(str, ks))}"
                                                for b, ks in by_bs.items()))
        if parts and first_error:
            parts.append(f"first error: {' '.join(first_error.split())[:120]}")
        return "; ".join(parts)


def coverage(path: str | Path, rows: Any, manifests: dict[Path, dict[str, Any]] | None = None) -> Coverage:
    """Gaps of ``rows`` (all rows read from ``path``, failed ones included) against the grid
    (``manifests``: :func:`manifests_under` of ``path`` when read already)."""
    bss: set[int] = set()
    ks: set[int] = set()
    grid_from = "manifest"
    for doc in (manifests_under(path) if manifests is None else manifests).values():
        sweep = doc["spec"].get("sweep") or {}
        bss.update(int(b) for b in sweep.get("batch_sizes") or [])
        ks.update(int(k) for k in sweep.get("num_spec_tokens") or [])
    if not bss or not ks:
        grid_from = "rows"
        bss = {int(b) for b in rows["batch_size"]}
        ks = {int(k) for k in rows["num_spec_tokens"]}
    ok = rows
    if "status" in rows.columns:
        ok = rows[rows["status"].astype(str) == "ok"]
    spec_rows = ok[ok["mode"].astype(str) != "vanilla"] if "mode" in ok.columns else ok
    have_bs = {int(b) for b in spec_rows["batch_size"]}
    # a vanilla row is the K=0 candidate where no speculative K=0 ran (fixed speculation mode)
    have = {(int(b), int(k)) for b, k in zip(ok["batch_size"], ok["num_spec_tokens"])}
    missing_bs = tuple(sorted(b for b in bss if b not in have_bs))
    missing_cells = tuple(sorted((b, k) for b in bss if b in have_bs for k in ks if (b, k) not in have))
    gaps = set(missing_bs) | {b for b, _ in missing_cells}
    first_error = ""
    if "error" in rows.columns and "status" in rows.columns:
        failed = rows[(rows["status"].astype(str) != "ok") & rows["batch_size"].isin(gaps)]
        errors = [str(e) for e in failed["error"] if str(e or "").strip()]
        first_error = errors[0] if errors else ""
    return Coverage(tuple(sorted(bss)), tuple(sorted(ks)), missing_bs, missing_cells, grid_from, first_error)


def has_contexts(df: Any) -> bool:
    """Whether rows carry a context axis (the optional ``context_len`` column, not all null)."""
    return CONTEXT_COLUMN.name in df.columns and df[CONTEXT_COLUMN.name].notna().any()


def context_slices(df: Any) -> dict[int, Any] | None:
    """Rows per context, or None when the rows have no context axis. A row without a context in
    a context sweep is an error naming the cell."""
    import pandas as pd

    name = CONTEXT_COLUMN.name
    if not has_contexts(df):
        return None
    missing = df[name].isna()
    if missing.any():
        where = df.loc[missing, "cell_id"].iloc[0] if "cell_id" in df.columns else int(missing.idxmax())
        raise InputError(name, where, "a row of a context sweep has no context")
    ctx = pd.to_numeric(df[name], errors="coerce")
    bad = ctx.isna() | (ctx < 1) | (ctx != ctx.round())
    if bad.any():
        raise InputError(name, df.loc[bad, name].iloc[0], "must be an integer >= 1")
    return {int(c): part.drop(columns=[name]) for c, part in df.groupby(ctx.astype("int64"))}


ROW_PROVENANCE = ("engine", "model", "draft_model", "method", "hardware", "dtype")


@dataclass(frozen=True)
class Run:
    """A results path (a run directory, a Parquet file or a directory of runs) read once.

    ``rows``: every row of every Parquet file, failed ones included, unvalidated; ``provenance``:
    the dsdprof metadata of the first file that has it ({} if none); ``manifests``: run
    directory -> manifest; ``mixed``: provenance fields (and schema versions) with more than one
    value. Everything else is derived from these, without reading a file again."""

    path: Path
    rows: Any  # pandas.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)
    manifests: dict[Path, dict[str, Any]] = field(default_factory=dict)
    mixed: dict[str, list[str]] = field(default_factory=dict)

    @cached_property
    def kind_evidence(self) -> str:
        """Why this is a validate run ("" for a sweep): :func:`kind_evidence`."""
        return kind_evidence(self.manifests, self.provenance, self.rows)

    @property
    def kind(self) -> str:
        """``validate`` or ``sweep`` (:data:`RUN_KIND_VALIDATE`, :data:`RUN_KIND_SWEEP`)."""
        return RUN_KIND_VALIDATE if self.kind_evidence else RUN_KIND_SWEEP

    def refuse_validate(self, command: str) -> None:
        """The one-line refusal of a validate run by ``command`` (``export``, ``analyze``)."""
        _refuse_validate(self.path, command, self.kind_evidence)

    def check_mixed(self, allow_mixed: bool) -> None:
        """Refuse rows of different provenance unless ``allow_mixed``."""
        from dsdprof.io.readers import check_mixed

        if not allow_mixed:
            check_mixed(self.path, self.mixed)

    def pooled(self, allow_mixed: bool) -> PooledRuns:
        """The runs pooled (:func:`check_pooled_runs`: different specs refused unless ``allow_mixed``)."""
        return check_pooled_runs(self.path, allow_mixed, self.manifests)

    @cached_property
    def coverage(self) -> Coverage:
        """The grid against the cells with a number (:func:`coverage`)."""
        return coverage(self.path, self.rows, self.manifests)

    @cached_property
    def contexts(self) -> dict[int, Any] | None:
        """Rows per context of a context sweep (:func:`context_slices`); None without a context axis."""
        return context_slices(self.rows)

    @cached_property
    def context_coverage(self) -> dict[int, Coverage]:
        """Each context's coverage ({} without a context axis)."""
        return {c: coverage(self.path, part, self.manifests) for c, part in (self.contexts or {}).items()}

    def run_provenance(self) -> dict[str, Any]:
        """The stored provenance (else the rows' own), mixed row fields as ``"A | B"``."""
        from dsdprof.io.readers import mixed_provenance

        df = self.rows
        prov = dict(self.provenance)
        if not prov:
            cols = [c for c in ROW_PROVENANCE if c in df.columns]
            prov = {c: str(df[c].dropna().iloc[0]) for c in cols if not df[c].dropna().empty}
        for name, values in mixed_provenance(df).items():
            prov[name] = " | ".join(values)
        return prov


def open_run(path: str | Path | Run) -> Run:
    """Read ``path`` once: every Parquet file (:func:`dsdprof.io.readers.read_files`) and every
    manifest (:func:`manifests_under`). Unreadable files and cells stored twice are refused here;
    mixed provenance is recorded (:meth:`Run.check_mixed` refuses it)."""
    import pandas as pd

    from dsdprof.io.readers import mixed_provenance, read_files

    if isinstance(path, Run):
        return path
    files = read_files(path)
    rows = pd.concat([f.rows for f in files], ignore_index=True) if len(files) > 1 else files[0].rows
    provenance = next((dict(f.meta) for f in files if f.meta), {})
    mixed = mixed_provenance(rows, {f.meta["schema_version"] for f in files if f.meta})
    return Run(Path(path), rows, provenance, manifests_under(path), mixed)
