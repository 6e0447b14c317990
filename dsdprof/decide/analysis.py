"""Goodput analysis: pure functions over measurement DataFrames.

Input contract: ``batch_size`` (int), ``num_spec_tokens`` (int), ``acceptance_length`` (float, 1.0
at K=0) and ``itl_s`` (float, seconds per engine step). Optional ``status`` (rows not ``ok`` are
ignored), ``mode`` (``vanilla`` rows are the baseline; ``dsd``/``fixed`` rows are the
candidates, DSD-mode K=0 being the K=0 candidate; without a ``mode`` column the K=0 rows serve as
both), ``sample_acceptance_length``/``sample_itl_s`` (per-wave samples, schema v2) and
``acceptance_per_pos``. Repeated cells are aggregated as mean AL / mean ITL over repeats.

goodput = acceptance_length / itl_s (tokens per second per request). The K at a batch size comes
from the decision rule in :mod:`dsdprof.decide.bootstrap`: start from the best K; a smaller K replaces it
only when, at the stated confidence (bootstrap over waves and repeats), it is within
``tolerance`` of the best. Each point says whether the data decided it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from dsdprof.decide.chain import CHAIN_METHODS, chain_check, fractions_at, with_chain_acceptance
from dsdprof.decide.bootstrap import (
    DEFAULT_CONFIDENCE, DEFAULT_REPLICATES, DEFAULT_SEED, SHAPE_DENSE, SHAPE_MOE, batch_replicates,
    check_confidence, contenders, curve, decide_batch, margin, regret_bound,
)
from dsdprof.errors import InputError
from dsdprof.formats.schema import (
    CONTRACT_COLUMNS, MODE_DSD, MODE_FIXED, MODE_VANILLA, MODES, PARQUET_METADATA_KEY,
    READABLE_MEASUREMENT_VERSIONS, STATUS_OK,
)

DEFAULT_TOLERANCE = 0.02


@dataclass(frozen=True)
class Analysis:
    """Result of :func:`analyze`.

    ``cells``: one row per (batch_size, num_spec_tokens) candidate: acceptance_length (the one used,
    chain-predicted when ``acceptance == "chain"``), acceptance_length_measured, itl_s, goodput
    (mean AL / mean ITL over repeats), samples (repeats), ratio_to_best with its interval
    ratio_low/ratio_high (NaN when unknown) and, when rows carry it, acceptance_per_pos (median per
    position). ``baseline``: per batch size, the baseline (vanilla, else K=0) goodput.
    ``optimal``: per batch size, the chosen k with its goodput, acceptance_length, itl_s,
    ``speedup_vs_baseline`` and one ``speedup_vs_k<K>`` column per candidate K, then ``decided``,
    ``runner_up``, ``margin`` (goodput of k / runner-up) with ``ci_low``/``ci_high``, ``best_k``
    (highest point goodput), ``k_rule`` (the rule's K before the non-increasing constraint),
    ``admissible`` (the K* the data still allow), ``interval_known``, ``regret_bound`` (upper
    confidence bound of the chosen K's shortfall against any other K) and ``contenders`` (the Ks
    more data could still make the answer).
    """

    cells: pd.DataFrame
    baseline: pd.DataFrame
    optimal: pd.DataFrame
    tolerance: float
    monotonic: bool
    provenance: dict[str, Any] = field(default_factory=dict)
    confidence: float = DEFAULT_CONFIDENCE
    curve: str = ""  # moe-like | dense-like | flat ("" = derived from monotonic)
    acceptance: str = "measured"  # measured | chain: where each K's AL came from
    chain_check: Optional[pd.DataFrame] = None

    @property
    def shape(self) -> str:
        """``moe-like`` when K* rises with batch size beyond its intervals, ``flat`` when one K
        serves every batch size, else ``dense-like`` (non-increasing)."""
        if self.curve:
            return self.curve
        return SHAPE_DENSE if self.monotonic else SHAPE_MOE

    @property
    def candidate_ks(self) -> list[int]:
        return sorted(int(k) for k in self.cells["num_spec_tokens"].unique())

    @property
    def undecided(self) -> list[int]:
        """Batch sizes whose K the data do not separate at the stated confidence."""
        if "decided" not in self.optimal.columns:
            return []
        return [int(b) for b, d in zip(self.optimal["batch_size"], self.optimal["decided"]) if not d]

    @property
    def intervals_known(self) -> bool:
        return "interval_known" in self.optimal.columns and bool(self.optimal["interval_known"].all())


# ----------------------------------------------------------------------------- loading

# Provenance that must agree across every row analyzed together (unless allow_mixed).
MIXABLE_PROVENANCE = ("hardware", "model", "draft_model", "method", "dtype", "engine", "engine_version")


def _parquet_files(path: Path) -> list[Path]:
    """Parquet files of a run directory (skipping ``_``/``.`` names and folders) or one file."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet")
                       if not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts))
        if not files:
            raise InputError("measurements", str(path), "directory holds no .parquet files")
        return files
    if path.is_file():
        return [path]
    raise InputError("measurements", str(path), "no such file or directory")


def _file_metadata(f: Path) -> dict[str, Any] | None:
    """The dsdprof key-value metadata of one Parquet file (None for files dsdprof did not write)."""
    import pyarrow.parquet as pq

    raw = (pq.read_schema(f).metadata or {}).get(PARQUET_METADATA_KEY)
    if not raw:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise InputError("measurements", str(f), "its dsdprof metadata is not a JSON object")
    version = meta.get("schema_version")
    if version not in READABLE_MEASUREMENT_VERSIONS:
        raise InputError("schema_version", version, f"{f} has a measurement schema this dsdprof cannot read "
                         f"(it reads {', '.join(READABLE_MEASUREMENT_VERSIONS)})")
    return meta


def read_provenance(path: str | Path) -> dict[str, Any]:
    """Provenance stored in the first dsdprof Parquet file under ``path`` (empty if none)."""
    for f in _parquet_files(Path(path)):
        try:
            meta = _file_metadata(f)
        except Exception:  # noqa: BLE001 - unreadable file or metadata: no provenance from it
            continue
        if meta:
            return meta
    return {}


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


def read_measurements(path: str | Path, allow_mixed: bool = False) -> pd.DataFrame:
    """All rows of a sweep directory or Parquet file, unvalidated.

    Files written by dsdprof must carry a readable measurement schema version. Rows of different
    provenance (:data:`MIXABLE_PROVENANCE`, or schema versions) are refused unless ``allow_mixed``.
    """
    files = _parquet_files(Path(path))
    frames = []
    versions: set[str] = set()
    for f in files:
        try:
            meta = _file_metadata(f)
            frames.append(pd.read_parquet(f))
        except InputError:
            raise
        except Exception as err:  # noqa: BLE001 - report which file is unreadable
            raise InputError("measurements", str(f), f"not a readable Parquet file ({type(err).__name__})") from None
        if meta is not None:
            versions.add(meta["schema_version"])
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if not allow_mixed:
        mixed = mixed_provenance(df, versions)
        if mixed:
            name, values = next(iter(mixed.items()))
            raise InputError(name, values, f"rows of different provenance under {path}; analyze one run "
                             "at a time, or pass --allow-mixed to pool them")
    return df


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


def load_measurements(path: str | Path) -> pd.DataFrame:
    """Read and validate measurements (ok rows only) from a sweep dir or Parquet file."""
    return validate_measurements(read_measurements(path))


# ----------------------------------------------------------------------------- analysis

def _per_pos_median(lists: list) -> list[float]:
    rows = [np.asarray(v, dtype=float).ravel() for v in lists if v is not None and np.size(v) > 0]
    if not rows:
        return []
    width = max(r.size for r in rows)
    stack = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        stack[i, :r.size] = r
    return [float(x) for x in np.nanmedian(stack, axis=0)]


def _mean_cells(df: pd.DataFrame) -> pd.DataFrame:
    """Per (batch_size, K): mean AL and mean ITL over repeats, goodput = their ratio."""
    g = df.groupby(["batch_size", "num_spec_tokens"], as_index=False)
    out = g.agg(acceptance_length=("acceptance_length", "mean"), itl_s=("itl_s", "mean"),
                samples=("itl_s", "size"))
    out["goodput"] = out["acceptance_length"] / out["itl_s"]
    return out


def check_baseline(df: pd.DataFrame) -> None:
    """A vanilla baseline that was run but failed is an error, never a silent switch to K=0."""
    if "mode" not in df.columns or "status" not in df.columns:
        return
    modes = df["mode"].astype(str)
    ok = df["status"].astype(str) == STATUS_OK
    for b in sorted(set(df.loc[modes == MODE_VANILLA, "batch_size"])):
        at_b = df["batch_size"] == b
        rows = df[(modes == MODE_VANILLA) & at_b]
        # only where other rows at this batch size are ok would K=0 silently become the baseline
        if not (ok & (modes == MODE_VANILLA) & at_b).any() and (ok & at_b).any():
            err = str(rows["error"].iloc[0]) if "error" in rows.columns else ""
            raise InputError("baseline", f"vanilla bs{int(b)}",
                             f"every vanilla cell at this batch size failed ({err[:200]}); re-run them with "
                             "dsdprof sweep SPEC --out OUT --resume")


def split_baseline_candidates(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(baseline rows, candidate rows) following the ``mode`` rules in the module docstring."""
    if "mode" not in df.columns:
        return df[df["num_spec_tokens"] == 0], df
    vanilla = df[df["mode"] == MODE_VANILLA]
    spec = df[df["mode"].isin([MODE_DSD, MODE_FIXED])]  # adaptive rows (validate) have no one K
    # A cell measured in DSD mode is what the table is served in: prefer it over fixed mode.
    if not spec.empty and (spec["mode"] == MODE_DSD).any() and (spec["mode"] == MODE_FIXED).any():
        dsd_keys = set(zip(spec.loc[spec["mode"] == MODE_DSD, "batch_size"],
                           spec.loc[spec["mode"] == MODE_DSD, "num_spec_tokens"]))
        keep = [(m == MODE_DSD) or ((b, k) not in dsd_keys)
                for m, b, k in zip(spec["mode"], spec["batch_size"], spec["num_spec_tokens"])]
        spec = spec[keep]
    if vanilla.empty:
        vanilla = spec[spec["num_spec_tokens"] == 0]
    candidates = spec
    # Batch sizes with no K=0 candidate (fixed mode has none) take vanilla as their K=0.
    have_k0 = set(spec.loc[spec["num_spec_tokens"] == 0, "batch_size"])
    extra_k0 = vanilla[~vanilla["batch_size"].isin(have_k0)]
    if not extra_k0.empty:
        candidates = pd.concat([spec, extra_k0], ignore_index=True)
    return vanilla, candidates


def choose_k(goodput_by_k: dict[int, float], tolerance: float) -> int:
    """Smallest K whose point goodput is within ``tolerance`` (relative) of the best (no intervals)."""
    best = max(goodput_by_k.values())
    return min(k for k, g in goodput_by_k.items() if g >= best * (1.0 - tolerance))


def is_non_increasing(values: list[int]) -> bool:
    return all(a >= b for a, b in zip(values, values[1:]))


def _method(df: pd.DataFrame, provenance: dict[str, Any]) -> str:
    if provenance.get("method"):
        return str(provenance["method"])
    if "method" in df.columns and not df["method"].dropna().empty:
        return str(df["method"].dropna().iloc[0])
    return ""


def analyze(df: pd.DataFrame, tolerance: float = DEFAULT_TOLERANCE,
            provenance: dict[str, Any] | None = None, confidence: float = DEFAULT_CONFIDENCE,
            acceptance: str = "auto", replicates: int = DEFAULT_REPLICATES,
            seed: int = DEFAULT_SEED) -> Analysis:
    """Optimal K per batch size from (validated or raw) measurement rows, with intervals.

    ``acceptance``: ``measured`` (each cell's own AL), ``chain`` (AL of every K from the largest
    K's per-position acceptance where rows carry it) or ``auto`` (chain for chain drafters whose
    measured AL agrees with the prediction within its interval, else measured).
    """
    if not (0.0 <= tolerance < 1.0) or math.isnan(tolerance):
        raise InputError("tolerance", tolerance, "must be in [0, 1)")
    confidence = check_confidence(confidence)
    if acceptance not in ("measured", "chain", "auto"):
        raise InputError("acceptance", acceptance, "must be measured, chain or auto")
    if int(replicates) < 100:
        raise InputError("replicates", replicates, "must be >= 100")
    prov = dict(provenance or {})
    check_baseline(df)
    df = validate_measurements(df)
    baseline_rows, candidate_rows = split_baseline_candidates(df)
    if candidate_rows.empty:
        raise InputError("rows", 0, "no speculative or K=0 candidate rows")
    cells = _mean_cells(candidate_rows).rename(columns={"acceptance_length": "acceptance_length_measured"})
    baseline = _mean_cells(baseline_rows)[["batch_size", "acceptance_length", "itl_s", "goodput"]]
    per_pos = pd.DataFrame(columns=["batch_size", "num_spec_tokens", "acceptance_per_pos"])
    if "acceptance_per_pos" in candidate_rows.columns:
        lists: dict[tuple[int, int], list] = {}
        for b, k, v in zip(candidate_rows["batch_size"], candidate_rows["num_spec_tokens"],
                           candidate_rows["acceptance_per_pos"]):
            lists.setdefault((int(b), int(k)), []).append(v)
        per_pos = pd.DataFrame([{"batch_size": b, "num_spec_tokens": k, "acceptance_per_pos": _per_pos_median(v)}
                                for (b, k), v in sorted(lists.items())])
        cells = cells.merge(per_pos, on=["batch_size", "num_spec_tokens"], how="left")
    reps = batch_replicates(candidate_rows, replicates, seed, confidence)
    check = chain_check(reps, per_pos, confidence)
    use_chain = acceptance == "chain" or (
        acceptance == "auto" and _method(df, prov) in CHAIN_METHODS and not check.empty
        and check["consistent"].notna().any() and bool(check["consistent"].dropna().all()))
    if use_chain:
        for b, rep in list(reps.items()):
            fr = fractions_at(per_pos, b, rep.ks)
            if fr is not None:
                reps[b] = with_chain_acceptance(rep, fr)

    decisions = [decide_batch(reps[b], tolerance, confidence) for b in sorted(reps)]
    shape, path = curve(decisions, tolerance, reps, confidence)
    ratio_rows = [{"batch_size": d.batch_size, "num_spec_tokens": k,
                   "acceptance_length": float(reps[d.batch_size].point_al[i]),
                   "ratio_to_best": d.ratio[k], "ratio_low": d.ratio_low.get(k, math.nan),
                   "ratio_high": d.ratio_high.get(k, math.nan)}
                  for d in decisions for i, k in enumerate(int(x) for x in reps[d.batch_size].ks)]
    cells = cells.merge(pd.DataFrame(ratio_rows), on=["batch_size", "num_spec_tokens"], how="left")
    cells["goodput"] = cells["acceptance_length"] / cells["itl_s"]
    front = ["batch_size", "num_spec_tokens", "acceptance_length", "itl_s", "goodput", "samples"]
    cells = cells[front + [c for c in cells.columns if c not in front]]
    base_goodput = dict(zip(baseline["batch_size"], baseline["goodput"]))
    ks = sorted(int(k) for k in cells["num_spec_tokens"].unique())

    records = []
    for d, k in zip(decisions, path):
        b = d.batch_size
        group = cells[cells["batch_size"] == b]
        by_k = dict(zip(group["num_spec_tokens"].astype(int), group["goodput"]))
        row = group[group["num_spec_tokens"] == k].iloc[0]
        runner_up, m, m_lo, m_hi = margin(reps[b], k, confidence)
        rec: dict[str, Any] = {
            "batch_size": int(b), "k": int(k), "goodput": float(row["goodput"]),
            "acceptance_length": float(row["acceptance_length"]), "itl_s": float(row["itl_s"]),
            "baseline_goodput": float(base_goodput.get(b, np.nan)),
        }
        rec["speedup_vs_baseline"] = rec["goodput"] / rec["baseline_goodput"]
        for kk in ks:
            rec[f"speedup_vs_k{kk}"] = rec["goodput"] / by_k[kk] if kk in by_k else np.nan
        rec.update(decided=bool(d.decided and k == d.k), runner_up=runner_up, margin=m, ci_low=m_lo, ci_high=m_hi,
                   best_k=d.best_k, k_rule=d.k, admissible=list(d.admissible), interval_known=d.known,
                   regret_bound=regret_bound(reps[b], k, confidence),
                   contenders=sorted(set(contenders(reps[b], d, tolerance, confidence)) | {int(k)}))
        records.append(rec)
    optimal = pd.DataFrame.from_records(records)
    optimal["runner_up"] = optimal["runner_up"].astype("Int64")
    return Analysis(
        cells=cells, baseline=baseline, optimal=optimal, tolerance=tolerance,
        monotonic=shape != SHAPE_MOE, provenance=prov, confidence=confidence, curve=shape,
        acceptance="chain" if use_chain else "measured", chain_check=check,
    )


def analyze_path(path: str | Path, tolerance: float = DEFAULT_TOLERANCE,
                 allow_mixed: bool = False, **options: Any) -> Analysis:
    """:func:`analyze` on a sweep directory or Parquet file, with its stored provenance.

    Inputs of mixed provenance are refused unless ``allow_mixed``; then the provenance names
    every value of a mixed field (``"A100 | H100"``). ``options`` go to :func:`analyze`.
    """
    df = read_measurements(path, allow_mixed=allow_mixed)
    prov = read_provenance(path)
    if not prov:
        cols = [c for c in ("engine", "model", "draft_model", "method", "hardware", "dtype") if c in df.columns]
        prov = {c: str(df[c].dropna().iloc[0]) for c in cols if not df[c].dropna().empty}
    for name, values in mixed_provenance(df).items():
        prov[name] = " | ".join(values)
    return analyze(df, tolerance=tolerance, provenance=prov, **options)


def fixed_k_summary(analysis: Analysis) -> pd.DataFrame:
    """Per fixed K: geometric-mean speedup of the DSD choice over always running that K."""
    rows = []
    for k in analysis.candidate_ks:
        col = analysis.optimal[f"speedup_vs_k{k}"].dropna()
        if len(col):
            rows.append({"k": k, "geomean_speedup": float(np.exp(np.log(col).mean())),
                         "max_speedup": float(col.max()), "batch_sizes": int(len(col))})
    return pd.DataFrame(rows)
