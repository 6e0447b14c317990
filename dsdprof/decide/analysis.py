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

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dsdprof.config.defaults import DEFAULT_CONFIDENCE, DEFAULT_REPLICATES, DEFAULT_SEED, DEFAULT_TOLERANCE
from dsdprof.config.run import Checked, Coverage, Run, validate_measurements
from dsdprof.decide.bootstrap import batch_replicates, check_confidence
from dsdprof.decide.chain import (
    CHAIN_METHODS,
    chain_check,
    fractions_at,
    share_replicates,
    with_chain_acceptance,
)
from dsdprof.decide.decision import BatchDecision, decisions_frame
from dsdprof.decide.rule import (
    SHAPE_DENSE,
    SHAPE_MOE,
    contenders,
    curve,
    decide_batch,
    decision_family,
    margin,
    regret_bound,
)
from dsdprof.decide.speedup import speedup_estimate
from dsdprof.decide.vanilla import vanilla_columns, vanilla_records  # vanilla_gain*, vanilla_faster
from dsdprof.errors import InputError
from dsdprof.formats.jsontypes import ProvenanceRecord, ProvenanceView
from dsdprof.formats.ktable_types import VanillaRecord
from dsdprof.formats.measurements import CONTEXT_COLUMN, MODE_DSD, MODE_FIXED, MODE_VANILLA, STATUS_OK


@dataclass(frozen=True)
class Analysis:
    """Result of :func:`analyze`.

    ``cells``: one row per (batch_size, num_spec_tokens) candidate: acceptance_length (the one used,
    chain-predicted when ``acceptance == "chain"``), acceptance_length_measured, itl_s, goodput
    (mean AL / mean ITL over repeats), samples (repeats), ratio_to_best with its interval
    ratio_low/ratio_high (NaN when unknown) and, when rows carry it, acceptance_per_pos (median per
    position). ``baseline``: per batch size, the baseline (vanilla, else K=0) goodput.
    ``decisions``: per batch size, one :class:`dsdprof.decide.decision.BatchDecision` -- K*, its
    goodput, AL and ITL, the speedup over the baseline and over each candidate K, whether the data
    decided it, the runner-up with the margin's interval, the Ks still admissible, the speedup's
    interval and whether vanilla beat every K. ``optimal`` (:meth:`to_frame`): the same as a
    DataFrame, one column per field (``speedup_vs_k<K>`` per candidate K), what ``--json`` prints.
    """

    cells: pd.DataFrame
    baseline: pd.DataFrame
    decisions: tuple[BatchDecision, ...]
    tolerance: float
    monotonic: bool
    provenance: ProvenanceRecord = field(default_factory=dict)
    confidence: float = DEFAULT_CONFIDENCE
    curve: str = ""  # moe-like | dense-like | flat ("" = derived from monotonic)
    acceptance: str = "measured"  # measured | chain: where each K's AL came from
    chain_check: pd.DataFrame | None = None
    coverage: Coverage | None = None  # the planned grid against what produced a number (analyze_path)
    warnings: tuple[str, ...] = ()  # what a reader must know about these numbers (e.g. unknown intervals)
    family: int = 1  # batch sizes decided together: each at 1 - (1 - confidence) / family (Bonferroni)
    truth: pd.DataFrame | None = None  # synthetic acceptance: measured AL vs the rates' (decide/truth.py)
    # derived when made (plain data: a reader such as export calls nothing back here)
    optimal: pd.DataFrame = field(init=False)  # the decisions as a DataFrame (:meth:`to_frame`)
    shape: str = field(init=False)  # moe-like (K* rises beyond its intervals) | flat | dense-like
    candidate_ks: list[int] = field(init=False)
    undecided: list[int] = field(init=False)  # batch sizes whose K the data do not separate
    intervals_known: bool = field(init=False)
    points: list[tuple[int, int]] = field(init=False)  # (batch size, K served) per decision
    vanilla_faster: list[VanillaRecord] = field(init=False)  # the table's records (decide/vanilla.py)

    def __post_init__(self) -> None:
        optimal = decisions_frame(self.decisions)
        derived: dict[str, object] = {"optimal": optimal,
                                   "shape": self.curve or (SHAPE_DENSE if self.monotonic else SHAPE_MOE)}
        derived["candidate_ks"] = sorted(int(k) for k in self.cells["num_spec_tokens"].unique())
        derived["undecided"] = [d.batch_size for d in self.decisions if not d.decided]
        derived["intervals_known"] = all(d.interval_known for d in self.decisions)
        derived["points"] = [(d.batch_size, d.k) for d in self.decisions]
        derived["vanilla_faster"] = vanilla_records(optimal)
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def to_frame(self) -> pd.DataFrame:
        """The per-batch-size decisions as a DataFrame (a copy of :attr:`optimal`)."""
        return self.optimal.copy()


def _per_pos_median(lists: list[Any]) -> list[float]:
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


def _robust_points(cells: pd.DataFrame, reps: dict[int, Any]) -> pd.DataFrame:
    """Each cell's AL and ITL as the bootstrap's point (heavy-tailed waves winsorized, see
    :func:`dsdprof.decide.bootstrap.robust_units`), so the table, the rule and the intervals agree."""
    point = {(b, int(k)): (float(rep.point_al[i]), float(rep.point_itl[i]))
             for b, rep in reps.items() for i, k in enumerate(rep.ks)}
    keys = list(zip(cells["batch_size"].astype(int), cells["num_spec_tokens"].astype(int)))
    cells = cells.copy()
    cells["acceptance_length_measured"] = [point.get(key, (a, 0))[0] for key, a in
                                           zip(keys, cells["acceptance_length_measured"])]
    cells["itl_s"] = [point.get(key, (0, t))[1] for key, t in zip(keys, cells["itl_s"])]
    return cells


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


def _pooled(rows: pd.DataFrame) -> bool:
    """Paired rows whose acceptance comes from their group's shared steps (v6: the K's own value
    moved to ``acceptance_length_own``): the chain prediction adds nothing to them."""
    if "design" not in rows.columns or "acceptance_length_own" not in rows.columns:
        return False
    paired = rows["design"].astype(str) == "paired"
    return bool((paired & rows["acceptance_length_own"].notna() & (rows["num_spec_tokens"] > 0)).any())


def _method(df: pd.DataFrame, provenance: ProvenanceView) -> str:
    if provenance.get("method"):
        return str(provenance["method"])
    if "method" in df.columns and not df["method"].dropna().empty:
        return str(df["method"].dropna().iloc[0])
    return ""


def _check_options(tolerance: float, confidence: float, acceptance: str, replicates: int) -> float:
    if not (0.0 <= tolerance < 1.0) or math.isnan(tolerance):
        raise InputError("tolerance", tolerance, "must be in [0, 1)")
    confidence = check_confidence(confidence)
    if acceptance not in ("measured", "chain", "auto"):
        raise InputError("acceptance", acceptance, "must be measured, chain or auto")
    if int(replicates) < 100:
        raise InputError("replicates", replicates, "must be >= 100")
    return confidence


def _per_pos_table(candidate_rows: pd.DataFrame) -> pd.DataFrame:
    """Median per-position acceptance of each (batch size, K) over its rows."""
    if "acceptance_per_pos" not in candidate_rows.columns:
        return pd.DataFrame(columns=["batch_size", "num_spec_tokens", "acceptance_per_pos"])
    lists: dict[tuple[int, int], list[Any]] = {}
    for b, k, v in zip(candidate_rows["batch_size"], candidate_rows["num_spec_tokens"],
                       candidate_rows["acceptance_per_pos"]):
        lists.setdefault((int(b), int(k)), []).append(v)
    return pd.DataFrame([{"batch_size": b, "num_spec_tokens": k, "acceptance_per_pos": _per_pos_median(v)}
                         for (b, k), v in sorted(lists.items())])


def _optimal_record(d: Any, k: int, cells: pd.DataFrame, rep: Any, base_goodput: dict[Any, float],
                    ks: list[int],
                    tolerance: float, confidence: float, family: int = 1) -> dict[str, object]:
    """One row of ``Analysis.optimal``: the K served at ``d.batch_size`` and how sure it is."""
    b = d.batch_size
    group = cells[cells["batch_size"] == b]
    by_k = dict(zip(group["num_spec_tokens"].astype(int), group["goodput"]))
    row = group[group["num_spec_tokens"] == k].iloc[0]
    runner_up, m, m_lo, m_hi = margin(rep, k, confidence)
    goodput, base = float(row["goodput"]), float(base_goodput.get(b, np.nan))
    rec: dict[str, object] = {
        "batch_size": int(b), "k": int(k), "goodput": goodput,
        "acceptance_length": float(row["acceptance_length"]), "itl_s": float(row["itl_s"]),
        "baseline_goodput": base,
    }
    rec["speedup_vs_baseline"] = goodput / base
    for kk in ks:
        rec[f"speedup_vs_k{kk}"] = goodput / by_k[kk] if kk in by_k else np.nan
    rec.update(decided=bool(d.decided and k == d.k), runner_up=runner_up, margin=m, ci_low=m_lo, ci_high=m_hi,
               best_k=d.best_k, k_rule=d.k, admissible=list(d.admissible), interval_known=d.known,
               regret_bound=regret_bound(rep, k, confidence, family),
               contenders=sorted(set(contenders(rep, d, tolerance, confidence, family)) | {int(k)}))
    return rec


def analyze(df: pd.DataFrame, tolerance: float = DEFAULT_TOLERANCE,
            provenance: ProvenanceView | None = None, confidence: float = DEFAULT_CONFIDENCE,
            acceptance: str = "auto", replicates: int = DEFAULT_REPLICATES,
            seed: int = DEFAULT_SEED, valid: Checked | None = None) -> Analysis:
    """Optimal K per batch size from (validated or raw) measurement rows, with intervals.

    ``acceptance``: ``measured`` (each cell's own AL), ``chain`` (AL of every K from the largest
    K's per-position acceptance where rows carry it) or ``auto`` (chain for chain drafters whose
    measured AL agrees with the prediction within its interval and whose rows measured each K's
    acceptance on its own steps -- not v6 paired rows, already pooled over their group -- at the
    batch sizes where the largest K has >= 2 rows to resample its per-position shares over; else
    measured). Each batch size is decided at ``1 - (1 - confidence) / family`` with ``family``
    the batch sizes with known intervals (Bonferroni, ``Analysis.family``). ``valid``: the rows
    validated already (:attr:`dsdprof.config.run.Run.valid`), raising here what validating them raised."""
    confidence = _check_options(tolerance, confidence, acceptance, replicates)
    prov = dict(provenance or {})
    _one_context(df)
    check_baseline(df)
    if valid is not None and valid.error is not None:  # Run.valid: validating failed, raised in this order
        raise valid.error
    df = validate_measurements(df) if valid is None else valid.rows
    baseline_rows, candidate_rows = split_baseline_candidates(df)
    if candidate_rows.empty:
        raise InputError("rows", 0, "no speculative or K=0 candidate rows")
    cells = _mean_cells(candidate_rows).rename(columns={"acceptance_length": "acceptance_length_measured"})
    baseline = _mean_cells(baseline_rows)[["batch_size", "acceptance_length", "itl_s", "goodput"]]
    per_pos = _per_pos_table(candidate_rows)
    if len(per_pos):
        cells = cells.merge(per_pos, on=["batch_size", "num_spec_tokens"], how="left")
    reps = batch_replicates(candidate_rows, replicates, seed, confidence)
    cells = _robust_points(cells, reps)
    check = chain_check(reps, per_pos, confidence)
    shares = {b: share_replicates(candidate_rows, rep, seed) for b, rep in reps.items()}
    # auto: chain only where it adds information (each K measured its own acceptance, not pooled over
    # its paired group) and at batch sizes where its shares' noise is measured (>= 2 rows of K_max)
    use_chain = acceptance == "chain" or (
        acceptance == "auto" and _method(df, prov) in CHAIN_METHODS and not check.empty
        and check["consistent"].notna().any() and bool(check["consistent"].dropna().all())
        and not _pooled(candidate_rows))
    chained = []
    for b, rep in list(reps.items()) if use_chain else []:
        fr = fractions_at(per_pos, b, rep.ks)
        if fr is not None and (acceptance == "chain" or shares[b] is not None or not rep.known):
            reps[b] = with_chain_acceptance(rep, fr, shares[b])
            chained.append(b)
    use_chain = bool(chained)

    family = decision_family(reps)
    decisions = [decide_batch(reps[b], tolerance, confidence, family) for b in sorted(reps)]
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

    records = [_optimal_record(d, k, cells, reps[d.batch_size], base_goodput, ks, tolerance, confidence,
                               family)
               for d, k in zip(decisions, path)]
    optimal = pd.DataFrame.from_records(records)
    optimal = _speedup_intervals(optimal, candidate_rows, baseline_rows, replicates, seed, confidence)
    optimal = vanilla_columns(optimal, cells, candidate_rows, baseline_rows, replicates, seed, confidence)
    answers = tuple(BatchDecision.from_record(r) for r in optimal.to_dict("records"))
    return Analysis(
        cells=cells, baseline=baseline, decisions=answers, tolerance=tolerance,
        monotonic=shape != SHAPE_MOE, provenance=prov, confidence=confidence, curve=shape,
        acceptance="chain" if use_chain else "measured", chain_check=check,
        warnings=_unknown_warning(decisions) + one_block_warning(baseline_rows), family=family,
    )


def _speedup_intervals(optimal: pd.DataFrame, candidate_rows: pd.DataFrame, baseline_rows: pd.DataFrame,
                       replicates: int, seed: int, confidence: float) -> pd.DataFrame:
    """``speedup_vs_baseline`` (slow steps weighed alike on both sides), ``speedup_low``/
    ``speedup_high`` and ``speedup_interval`` (how: ``paired`` blocks of vanilla and the K's waves
    resampled jointly, ``independent``, or ``""`` unknown), see :mod:`dsdprof.decide.speedup`."""
    out = []
    for b, k, point in zip(optimal["batch_size"], optimal["k"], optimal["speedup_vs_baseline"]):
        at_b = candidate_rows["batch_size"] == b
        k_rows = candidate_rows[at_b & (candidate_rows["num_spec_tokens"] == k)]
        base = baseline_rows[baseline_rows["batch_size"] == b]
        group = candidate_rows[at_b]  # paired: the K's slow steps read from its whole group
        est = (speedup_estimate(k_rows, base, replicates, seed, confidence, group)
               if math.isfinite(point) else ())
        out.append(est if est and math.isfinite(est[0]) else (point, math.nan, math.nan, ""))
    optimal = optimal.copy()
    optimal["speedup_vs_baseline"] = [o[0] for o in out]
    optimal["speedup_low"] = [o[1] for o in out]
    optimal["speedup_high"] = [o[2] for o in out]
    optimal["speedup_interval"] = [o[3] for o in out]
    return optimal


def _one_context(df: pd.DataFrame) -> None:
    """Rows of several contexts (a context sweep) are never pooled into one K per batch size."""
    if CONTEXT_COLUMN.name in df.columns:
        contexts = sorted(int(c) for c in df[CONTEXT_COLUMN.name].dropna().unique())
        if len(contexts) > 1:
            raise InputError(CONTEXT_COLUMN.name, contexts, "rows of several contexts: analyse each context "
                             "(dsdprof.decide.context.analyze_contexts), never pool them")


def one_block_warning(baseline_rows: pd.DataFrame) -> tuple[str, ...]:
    """One line (<= 80 columns up to four batch sizes) naming the batch sizes where a paired vanilla
    row ran a single wave, so one block wholly before or after its group's waves (runs before
    vanilla's waves bracketed the group, :func:`dsdprof.measure.engine.unit_layout`): the drift
    between them is in its speedups."""
    if baseline_rows.empty or "sample_block" not in baseline_rows or "design" not in baseline_rows:
        return ()
    van = baseline_rows[(baseline_rows["mode"] == MODE_VANILLA) & (baseline_rows["design"] == "paired")]
    one = sorted({int(b) for b, x in zip(van["batch_size"], van["sample_block"])
                  if x is not None and not (isinstance(x, float) and math.isnan(x)) and len(x) == 1})
    if not one:
        return ()
    return (f"warning: one vanilla block at BS {', '.join(map(str, one))}: speedups over it carry "
            "drift",)


def _unknown_warning(decisions: list[Any]) -> tuple[str, ...]:
    unknown = [d.batch_size for d in decisions if not d.known]
    if not unknown:
        return ()
    return (f"intervals unknown at batch size {', '.join(map(str, unknown))}: one sample per cell (one "
            "repeat without per-wave samples). K there is the best point estimate (smallest K within "
            "tolerance of the "
            "best point goodput), nothing there is decided, and the curve's shape there is read from the "
            "points, which noise alone can bend. Use repeats >= 2 or schema-v2 rows.",)


def analyze_path(run: Run, tolerance: float = DEFAULT_TOLERANCE, **options: Any) -> Analysis:
    """:func:`analyze` on a run opened and checked by :func:`dsdprof.io.runs.open_run` (with the
    ``analyze`` or ``export`` command: a validate run, mixed provenance and runs of different specs
    refused there unless allowed), with its provenance (every value of a mixed field, ``"A100 |
    H100"``, and the runs pooled) and its ``coverage`` (the grid cells with no number).
    ``options`` go to :func:`analyze`."""
    from dsdprof.decide.truth import truth_rows  # synthetic acceptance: the rates' AL beside the measured

    result = analyze(run.rows, tolerance=tolerance, provenance=run.provenance, valid=run.valid, **options)
    rates = run.synthetic_rates
    truth = truth_rows(run.rows, rates) if rates is not None and not run.rows.empty else None
    return dataclasses.replace(result, coverage=run.coverage, truth=truth)


def fixed_k_summary(analysis: Analysis) -> pd.DataFrame:
    """Per fixed K: geometric-mean speedup of the DSD choice over always running that K."""
    rows = []
    for k in analysis.candidate_ks:
        col = analysis.optimal[f"speedup_vs_k{k}"].dropna()
        if len(col):
            rows.append({"k": k, "geomean_speedup": float(np.exp(np.log(col).mean())),
                         "max_speedup": float(col.max()), "batch_sizes": int(len(col))})
    return pd.DataFrame(rows)
