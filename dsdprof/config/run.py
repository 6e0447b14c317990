"""A results path as the analysis reads it, typed and checked: :class:`Run`, the
:class:`Manifest` of each run pooled (the :class:`~dsdprof.config.spec.SweepSpec` that ran), the
:class:`Coverage` of the planned grid, and the rows' contract the analysis relies on
(:func:`validate_measurements`).

:func:`dsdprof.io.runs.open_run` reads the files once and hands what it read to
:func:`checked_run`, which raises every refusal in one order and derives the rest (kind, context
slices, coverage, validated rows) without reading anything. These live below ``io`` so that
``decide``, ``export`` and ``report`` take a :class:`Run` without importing the reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
from pydantic import ValidationError

from dsdprof.config.spec import SweepSpec
from dsdprof.errors import InputError
from dsdprof.formats.jsontypes import JSON, JSONObject, ProvenanceRecord
from dsdprof.formats.measurements import (
    CONTEXT_COLUMN,
    CONTRACT_COLUMNS,
    MODE_ADAPTIVE,
    MODE_DSD,
    MODE_FIXED,
    MODE_VANILLA,
    MODES,
    STATUS_OK,
)
from dsdprof.formats.provenance import is_synthetic, rates_from_provenance

RUN_KIND_SWEEP = "sweep"
RUN_KIND_VALIDATE = "validate"  # key in a validate run's manifest spec (dsdprof.jobs.validate)
# the commands that analyse a run as a sweep: a validate run is refused, mixed provenance and
# runs of different specs too (unless allowed), and the rows are validated for the analysis
ANALYSIS_COMMANDS = ("analyze", "export")
# the commands that read a run's rows as one run's: mixed provenance refused (unless allowed)
ONE_RUN_COMMANDS = (*ANALYSIS_COMMANDS, "plot", "validate-report", "calibrate")
MIXABLE_PROVENANCE = ("hardware", "model", "draft_model", "method", "dtype", "engine", "engine_version")
ROW_PROVENANCE = ("engine", "model", "draft_model", "method", "hardware", "dtype")


@dataclass(frozen=True)
class Manifest:
    """One run directory's manifest (``_sweep.json``): the spec as stored (``spec_dump``, what
    ``spec_hash`` hashes) and, typed, the :class:`SweepSpec` that ran (None for a validate run's
    spec, or one this version no longer parses)."""

    directory: Path
    spec_dump: JSONObject
    spec_hash: str = ""
    spec: SweepSpec | None = None

    @property
    def validate(self) -> bool:
        """Written by ``dsdprof validate`` (its spec holds a ``validate`` section)."""
        return RUN_KIND_VALIDATE in self.spec_dump

    def grid(self) -> tuple[list[int], list[int]]:
        """(batch sizes, Ks) the spec planned ([] where it names none)."""
        if self.spec is not None:
            return list(self.spec.sweep.batch_sizes), list(self.spec.sweep.num_spec_tokens)
        sweep = self.spec_dump.get("sweep")
        sweep = sweep if isinstance(sweep, dict) else {}
        return _ints(sweep.get("batch_sizes")), _ints(sweep.get("num_spec_tokens"))


def _ints(values: JSON) -> list[int]:
    """A stored spec's list of integers ([] where it names none)."""
    return [int(cast(int, v)) for v in values] if isinstance(values, list) else []


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
    summary: str = field(init=False)  # one line naming the gaps ("" when complete)
    gap_summary: str = field(init=False)  # ... without the first error

    def __post_init__(self) -> None:
        object.__setattr__(self, "complete", not self.missing_batch_sizes and not self.missing_cells)
        object.__setattr__(self, "summary", self._describe(self.first_error))
        object.__setattr__(self, "gap_summary", self._describe(""))

    def record(self) -> dict[str, object]:
        """The fields it was made of (what ``analyze --json`` writes; the others derive from them)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

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


@dataclass(frozen=True)
class Checked:
    """A run's ok rows, validated once when it was opened (:func:`validate_measurements`): ``rows``,
    or, where validating them failed, the InputError it raised in ``error`` (``rows`` then empty),
    which the analysis raises where it checks its rows, so a command's refusals keep their order."""

    rows: pd.DataFrame = field(default_factory=pd.DataFrame)
    error: InputError | None = None

    @classmethod
    def of(cls, rows: pd.DataFrame) -> Checked:
        try:
            return cls(validate_measurements(rows))
        except InputError as err:
            return cls(error=err)


@dataclass(frozen=True)
class Run:
    """A results path (a run directory, a Parquet file or a directory of runs), read and checked
    once by :func:`dsdprof.io.runs.open_run`.

    ``rows``: every row of every Parquet file, failed ones included; ``stored_provenance``: the
    dsdprof metadata of the first file that has it ({} if none); ``manifests``: one per run
    pooled; ``mixed``: provenance fields (and schema versions) with more than one value;
    ``kind_evidence``: why this is a validate run ("" for a sweep); ``provenance``: what an
    analysis records (the stored provenance, else the rows', mixed fields as ``"A | B"``, and the
    runs pooled on the batch-size path); ``coverage``: the grid against the cells with a number
    (None for a context sweep, whose ``context_coverage`` has one per context); ``contexts``: rows
    per context (None without a context axis). ``valid`` / ``context_valid``: the ok rows
    validated (:class:`Checked`: the rows, or the InputError validating them raised, which the
    analysis raises in its own order; None where the command opened no analysis)."""

    path: Path
    rows: pd.DataFrame
    stored_provenance: ProvenanceRecord = field(default_factory=dict)
    manifests: tuple[Manifest, ...] = ()
    mixed: dict[str, list[str]] = field(default_factory=dict)
    kind_evidence: str = ""
    provenance: ProvenanceRecord = field(default_factory=dict)
    coverage: Coverage | None = None
    contexts: dict[int, pd.DataFrame] | None = None
    context_coverage: dict[int, Coverage] = field(default_factory=dict)
    valid: Checked | None = None
    context_valid: dict[int, Checked] = field(default_factory=dict)
    kind: str = field(init=False)  # validate | sweep (derived when made)
    synthetic: bool = field(init=False)  # the provenance says acceptance was synthetic
    synthetic_rates: list[float] | None = field(init=False)  # ... and names these rates

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", RUN_KIND_VALIDATE if self.kind_evidence else RUN_KIND_SWEEP)
        object.__setattr__(self, "synthetic", is_synthetic(self.provenance))
        object.__setattr__(self, "synthetic_rates", rates_from_provenance(self.provenance))

    @property
    def spec(self) -> SweepSpec | None:
        """The spec that ran (the first run's, typed; None without a readable manifest)."""
        return next((m.spec for m in self.manifests if m.spec is not None), None)


def _check_int_column(df: pd.DataFrame, name: str, minimum: int) -> pd.Series:
    col = df[name]
    values = pd.to_numeric(col, errors="coerce")
    bad = values.isna() | (values != np.floor(values.fillna(0))) | (values < minimum)
    if bad.any():
        raise InputError(name, col[bad].iloc[0], f"must be an integer >= {minimum}")
    return values.astype("int64")


def _check_float_column(df: pd.DataFrame, name: str, minimum: float, strict: bool) -> pd.Series:
    col = df[name]
    values = pd.to_numeric(col, errors="coerce").astype("float64")
    bad = ~np.isfinite(values) | ((values <= minimum) if strict else (values < minimum))
    if bad.any():
        op = ">" if strict else ">="
        raise InputError(name, col[bad].iloc[0], f"must be a finite number {op} {minimum}")
    return values


def validate_measurements(df: pd.DataFrame) -> pd.DataFrame:
    """Keep ok rows and check the contract columns; raises InputError naming column and value."""
    missing = [c for c in CONTRACT_COLUMNS if c not in df.columns]
    if missing:
        raise InputError("columns", missing, f"measurements need {list(CONTRACT_COLUMNS)}")
    if "status" in df.columns:
        df = df[df["status"].astype(str) == STATUS_OK]
    if df.empty:
        raise InputError("rows", 0, "no measurement rows with status 'ok'")
    df = df.copy()
    df["batch_size"] = _check_int_column(df, "batch_size", 1)
    df["num_spec_tokens"] = _check_int_column(df, "num_spec_tokens", 0)
    df["acceptance_length"] = _check_float_column(df, "acceptance_length", 1.0 - 1e-9, strict=False)
    df["itl_s"] = _check_float_column(df, "itl_s", 0.0, strict=True)
    too_long = df["acceptance_length"] > df["num_spec_tokens"] + 1 + 1e-6
    if too_long.any():
        row = df[too_long].iloc[0]
        raise InputError("acceptance_length", float(row["acceptance_length"]),
                         f"exceeds K+1={int(row['num_spec_tokens']) + 1}")
    if "mode" in df.columns:
        modes = df["mode"].astype(str)
        bad = ~modes.isin(MODES)
        if bad.any():
            raise InputError("mode", modes[bad].iloc[0], f"must be one of {', '.join(MODES)}")
        df["mode"] = modes
        spec_vanilla = (modes == MODE_VANILLA) & (df["num_spec_tokens"] != 0)
        if spec_vanilla.any():
            raise InputError("num_spec_tokens", int(df[spec_vanilla]["num_spec_tokens"].iloc[0]),
                             "vanilla rows must have K=0")
    return df


def has_contexts(df: pd.DataFrame) -> bool:
    """Whether rows carry a context axis (the optional ``context_len`` column, not all null)."""
    return CONTEXT_COLUMN.name in df.columns and df[CONTEXT_COLUMN.name].notna().any()


def context_slices(df: pd.DataFrame) -> dict[int, pd.DataFrame] | None:
    """Rows per context, or None when the rows have no context axis. A row without a context in
    a context sweep is an error naming the cell."""
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


def mixed_provenance(df: pd.DataFrame, versions: set[str] | None = None) -> dict[str, list[str]]:
    """Provenance fields with more than one value in ``df`` (and more than one schema version)."""
    mixed: dict[str, list[str]] = {}
    for name in MIXABLE_PROVENANCE:
        if name in df.columns:
            values = sorted({str(v) for v in df[name].dropna().unique()})
            if len(values) > 1:
                mixed[name] = values
    if versions and len(versions) > 1:
        mixed["schema_version"] = sorted(versions)
    return mixed


def check_mixed(path: str | Path, mixed: dict[str, list[str]]) -> None:
    """Refuse rows of different provenance (``mixed``: :func:`mixed_provenance` of them)."""
    if mixed:
        name, values = next(iter(mixed.items()))
        raise InputError(name, values, f"rows of different provenance under {path}; analyze one run "
                         "at a time, or pass --allow-mixed to pool them")


def validate_rows(rows: pd.DataFrame | None) -> str:
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

    def units(part: pd.DataFrame) -> list[tuple]:  # (batch size, repeat, context) of each row, plain values
        return [tuple(str(v) for v in u) for u in part[keys].itertuples(index=False, name=None)]

    dsd_ks: dict[tuple, set] = {}
    for u, k in zip(units(dsd), dsd["num_spec_tokens"]):
        dsd_ks.setdefault(u, set()).add(str(k))
    if all(len(ks) == 1 for ks in dsd_ks.values()) and not dsd_ks.keys().isdisjoint(units(fixed)):
        return "fixed-K rows beside one dsd K per batch size, as validate writes them"
    return ""


def kind_evidence(manifests: tuple[Manifest, ...], provenance: ProvenanceRecord, rows: pd.DataFrame) -> str:
    """Why a run of these manifests, provenance and rows is a validate run ("" when it is a
    sweep): the one test."""
    if any(m.validate for m in manifests):
        return "its manifest says so"
    if provenance.get("extra_run_kind") == RUN_KIND_VALIDATE:
        return "its files' metadata says so"
    return validate_rows(rows)


def _refuse_validate(path: str | Path, command: str, why: str) -> None:
    if why:
        raise InputError("measurements", str(path), f"is a validate run, not a sweep ({why}); {command} "
                         "needs a sweep: read it with `dsdprof validate-report`")


def _check_pooled(path: Path, pooled: PooledRuns) -> None:
    """Runs of different specs are refused (first difference named)."""
    if len({h for _, h in pooled.runs}) > 1:
        field, values = pooled.differences[0] if pooled.differences else ("spec_hash", "")
        raise InputError(field, values, f"runs with different specs under {path}; analyze one run at a "
                         "time, or pass --allow-mixed to pool them (the result records what it pooled)")


def coverage(rows: pd.DataFrame, manifests: tuple[Manifest, ...]) -> Coverage:
    """Gaps of ``rows`` (all rows of a run, failed ones included) against the grid its manifests
    planned (else the rows' own)."""
    bss: set[int] = set()
    ks: set[int] = set()
    grid_from = "manifest"
    for m in manifests:
        planned_bs, planned_k = m.grid()
        bss.update(planned_bs)
        ks.update(planned_k)
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


def _provenance(rows: pd.DataFrame, stored: ProvenanceRecord) -> ProvenanceRecord:
    """The stored provenance (else the rows' own), mixed row fields as ``"A | B"``."""
    prov = dict(stored)
    if not prov:
        cols = [c for c in ROW_PROVENANCE if c in rows.columns]
        prov = {c: str(rows[c].dropna().iloc[0]) for c in cols if not rows[c].dropna().empty}
    for name, values in mixed_provenance(rows).items():
        prov[name] = " | ".join(values)
    return prov


def parse_manifest(directory: Path, doc: JSONObject) -> Manifest:
    """A run directory's manifest as read (``doc``, with a ``spec`` object), its spec typed."""
    spec_doc = doc["spec"]
    dump = spec_doc if isinstance(spec_doc, dict) else {}  # a dict: the readers keep only manifests with one
    try:
        spec = None if RUN_KIND_VALIDATE in dump else SweepSpec.model_validate(dump)
    except ValidationError:  # a spec this version no longer parses: its stored form still counts
        spec = None
    return Manifest(directory, dump, str(doc.get("spec_hash", "")), spec)


@dataclass(frozen=True)
class ReadRun:
    """What :func:`dsdprof.io.runs.open_run` read of a results path, before any check: every row,
    the first file's stored provenance, the schema versions of the files, each run directory's
    manifest document, and the runs' first spec differences (``pooled``)."""

    path: Path
    rows: pd.DataFrame
    stored_provenance: ProvenanceRecord
    versions: set[str]
    manifests: tuple[tuple[Path, JSONObject], ...]
    pooled: PooledRuns


def checked_run(read: ReadRun, command: str = "", allow_mixed: bool = False) -> Run:
    """The :class:`Run` of what was read, every refusal raised in one order.

    ``command``: what reads the run. ``analyze`` and ``export`` (:data:`ANALYSIS_COMMANDS`) refuse
    a validate run, mixed provenance (unless ``allow_mixed``), a context sweep's malformed
    contexts, then, without a context axis, runs of different specs (unless ``allow_mixed``);
    their rows are validated for the analysis. ``plot``, ``validate-report`` and ``calibrate``
    (:data:`ONE_RUN_COMMANDS`) refuse mixed provenance (unless ``allow_mixed``) and malformed
    contexts; any other (``report``, ``compare-drafts``: "") reads the run as it is, refusing only
    malformed contexts."""
    path, rows, stored = read.path, read.rows, read.stored_provenance
    manifests = tuple(parse_manifest(d, doc) for d, doc in read.manifests)
    mixed = mixed_provenance(rows, read.versions)
    why = kind_evidence(manifests, stored, rows)
    analysis = command in ANALYSIS_COMMANDS
    if analysis:
        _refuse_validate(path, command, why)
    if command in ONE_RUN_COMMANDS and not allow_mixed:
        check_mixed(path, mixed)
    contexts = context_slices(rows)
    provenance = _provenance(rows, stored)
    if contexts is not None:
        return Run(path, rows, stored, manifests, mixed, why, provenance, contexts=contexts,
                   context_coverage={c: coverage(part, manifests) for c, part in contexts.items()},
                   context_valid={c: Checked.of(part) for c, part in contexts.items()} if analysis else {})
    if analysis:
        if not allow_mixed:
            _check_pooled(path, read.pooled)
        provenance.update(read.pooled.provenance())
    return Run(path, rows, stored, manifests, mixed, why, provenance, coverage(rows, manifests),
               valid=Checked.of(rows) if analysis else None)
