"""What a rollout run says: per variant makespan, tokens/s and tail with paired intervals against
vanilla and the best fixed K (rollouts), latency percentiles and goodput per rate (serving), the
batch size vLLM looked K up with, and the replay's prediction checked against each measured
makespan. Pure pandas over the rows of :mod:`dsdprof.formats.rollouts`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dsdprof.decide.live_stats import paired_ratio
from dsdprof.errors import InputError
from dsdprof.formats.rollouts import KIND_ROLLOUT, KIND_SERVING


def _ok(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    return df[(df["kind"] == kind) & (df["status"] == "ok")]


def _by_repeat(d: pd.DataFrame, variant: str, col: str) -> dict[int, float]:
    sub = d[d["variant"] == variant]
    return {int(r): float(v) for r, v in zip(sub["repeat"], sub[col])}


def best_fixed_variant(d: pd.DataFrame, col: str = "makespan_s") -> str:
    """The fixed-K variant with the smallest median ``col`` ("" when none ran)."""
    fixed = d[d["variant"].str.startswith("fixed-")]
    if fixed.empty:
        return ""
    return str(fixed.groupby("variant")[col].median().idxmin())


def rollout_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per variant: medians over repeats and makespan ratios (variant / vanilla, variant / best
    fixed K) with paired t intervals; a ratio below 1 is faster."""
    d = _ok(df, KIND_ROLLOUT)
    best = best_fixed_variant(d)
    rows = []
    for v in sorted(d["variant"].unique(), key=_variant_key):
        sub = d[d["variant"] == v]
        vs_van = paired_ratio(
            _by_repeat(d, v, "makespan_s"), _by_repeat(d, "vanilla", "makespan_s"), v, "vanilla"
        )
        vs_best = (
            paired_ratio(_by_repeat(d, v, "makespan_s"), _by_repeat(d, best, "makespan_s"), v, best)
            if best
            else None
        )
        rows.append(
            {
                "variant": v,
                "repeats": len(sub),
                "makespan_s": sub["makespan_s"].median(),
                "tokens_per_s": sub["tokens_per_s"].median(),
                "tail_s": sub["tail_s"].median(),
                "mean_k": sub["mean_k"].median(),
                "vs_vanilla": vs_van.ratio,
                "vs_vanilla_lo": vs_van.lo,
                "vs_vanilla_hi": vs_van.hi,
                "vs_best": vs_best.ratio if vs_best else math.nan,
                "vs_best_lo": vs_best.lo if vs_best else math.nan,
                "vs_best_hi": vs_best.hi if vs_best else math.nan,
                "best_fixed": best,
            }
        )
    return pd.DataFrame(rows)


def serving_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per rate and variant: medians over repeats of the latency percentiles, goodput, the K
    served and how often vLLM's lookup batch size differed from the requests decoding."""
    d = _ok(df, KIND_SERVING)
    cols = [
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p90_s",
        "tpot_p99_s",
        "itl_p50_s",
        "itl_p99_s",
        "goodput_req_s",
        "tokens_per_s",
        "mean_k",
        "lookup_differs",
        "table_k_differs",
        "makespan_s",
    ]
    if d.empty:
        return pd.DataFrame(columns=["rate_per_s", "variant", "repeats", *cols])
    g = d.groupby(["rate_per_s", "variant"])
    out = g[cols].median().reset_index()
    out.insert(2, "repeats", g.size().values)
    out["_k"] = out["variant"].map(_variant_key)
    return out.sort_values(["rate_per_s", "_k"]).drop(columns="_k").reset_index(drop=True)


def serving_ratios(df: pd.DataFrame, col: str = "tokens_per_s") -> pd.DataFrame:
    """Per rate and variant: ``col`` (higher is better) against vanilla's and against the best
    fixed K's at that rate (the fixed K with the highest median), paired by repeat: geometric mean
    with a 95 % t interval; above 1 is better."""
    d = _ok(df, KIND_SERVING)
    rows = []
    for rate, g in d.groupby("rate_per_s"):
        fixed = g[g["variant"].str.startswith("fixed-")]
        best = str(fixed.groupby("variant")[col].median().idxmax()) if len(fixed) else ""
        for v in sorted(g["variant"].unique(), key=_variant_key):
            a = paired_ratio(_by_repeat(g, v, col), _by_repeat(g, "vanilla", col), v, "vanilla")
            b = paired_ratio(_by_repeat(g, v, col), _by_repeat(g, best, col), v, best) if best else None
            rows.append({"rate_per_s": float(rate), "variant": v, "best_fixed": best,
                         "vs_vanilla": a.ratio, "vs_vanilla_lo": a.lo, "vs_vanilla_hi": a.hi,
                         "vs_best": b.ratio if b else math.nan, "vs_best_lo": b.lo if b else math.nan,
                         "vs_best_hi": b.hi if b else math.nan})
    return pd.DataFrame(rows)


def with_slo(df: pd.DataFrame, slo_ttft_s: float, slo_tpot_s: float) -> pd.DataFrame:
    """``df`` with goodput recomputed at other SLOs (0 = none) from each row's request series:
    TTFT = first token - arrival, TPOT = (finish - first) / (tokens - 1), as in the run."""
    out = df.copy()
    good = []
    for _, r in out.iterrows():
        arr, first, fin, n = (list(r[c]) if r[c] is not None else [] for c in (
            "request_arrival_s", "request_first_token_s", "request_finish_s", "request_output_len"))
        ok = sum(1 for a, f, e, k in zip(arr, first, fin, n)
                 if (not slo_ttft_s or f - a <= slo_ttft_s)
                 and (not slo_tpot_s or k < 2 or (e - f) / (k - 1) <= slo_tpot_s))
        m = r["makespan_s"]
        good.append(ok / m if fin and m and m > 0 else math.nan)
    out["goodput_req_s"] = good
    out["slo_ttft_s"], out["slo_tpot_s"] = slo_ttft_s, slo_tpot_s
    return out


def _variant_key(v: str) -> tuple[int, int]:
    if v == "vanilla":
        return (0, 0)
    if v.startswith("fixed-"):
        return (1, int(v.split("-", 1)[1]))
    return (2, 0) if v == "dsd" else (3, 0)


def prefill_seconds(row: Any) -> float:
    """End of the rollout's first step run of prefill steps (seconds after the start)."""
    t, pre = list(row["step_t_s"]), list(row["step_prefill_tokens"])
    end = math.nan
    for ti, p in zip(t, pre):
        if p <= 0:
            break
        end = ti
    return end


def decode_steps(row: Any) -> list[tuple[int, int, float]]:
    """(requests decoding, K drafted, seconds) of a rollout's decode steps (after its prefill)."""
    t = [0.0, *(float(x) for x in row["step_t_s"])]
    out = []
    for i, (dec, k, pre) in enumerate(zip(row["step_decoding"], row["step_drafted"],
                                          row["step_prefill_tokens"])):
        if int(pre) == 0 and int(dec) > 0:
            out.append((int(dec), int(round(float(k))), t[i + 1] - t[i]))
    return out


def fit_step_model(df: pd.DataFrame, table: Mapping[str, Any], runs: int = 100):
    """A :class:`~dsdprof.decide.step_model.StepModel` fitted on every ok rollout of ``df``: each
    variant's decode step seconds, prefill seconds, the K it scheduled per lookup batch size (the
    adaptive plugin's own schedule), and the factor on the table's rejection probabilities that
    gives its measured number of decode steps."""
    from dsdprof.decide.makespan import grid_from_table, variant_schedules
    from dsdprof.decide.step_model import StepModel, StepSample

    d = _ok(df, KIND_ROLLOUT)
    if d.empty:
        raise InputError("--fit", "0 rollouts", "the fitted run has no ok rollout rows")
    samples: list[StepSample] = []
    prefill: dict[str, list[float]] = {}
    cases: dict[str, list[tuple[list[int], int]]] = {}
    served: dict[str, list[tuple[int, int]]] = {}
    for _, row in d.iterrows():
        v = str(row["variant"])
        steps = decode_steps(row)
        pairs = zip(row["step_batch_size"], row["step_k"])
        served.setdefault(v, []).extend((int(b), int(k)) for b, k in pairs if int(k) >= 0)
        samples += [StepSample(v, b, k, sec) for b, k, sec in steps]
        cases.setdefault(v, []).append(([int(x) for x in row["request_output_len"]], len(steps)))
        pre = prefill_seconds(row)
        if not math.isnan(pre):
            prefill.setdefault(v, []).append(pre)
    grid = grid_from_table(table)
    model = StepModel(grid, samples, prefill, int(d["num_requests"].median()), served)
    scheds = variant_schedules(table, grid, [int(v.split("-")[1]) for v in cases if v.startswith("fixed-")])
    for v, cs in cases.items():
        if v != "vanilla" and v in scheds:
            model.fit_reject(v, model.schedule(v, scheds[v]), cs, runs)
    return model


@dataclass(frozen=True)
class RepeatSpread:
    """How much a run's rollouts move from repeat to repeat: the pooled standard deviation of log
    makespan, each variant around its own mean (acceptance luck and the machine's drift together)."""

    sd: float  # log SD (0.05 ~ 5 %); NaN with one repeat
    dof: int  # sum over variants of (repeats - 1)


def repeat_spread(df: pd.DataFrame) -> RepeatSpread:
    """The :class:`RepeatSpread` of a run's ok rollouts."""
    d = _ok(df, KIND_ROLLOUT)
    ss, dof = 0.0, 0
    for _, g in d.groupby("variant"):
        logs = [math.log(float(x)) for x in g["makespan_s"] if float(x) > 0]
        if len(logs) > 1:
            m = sum(logs) / len(logs)
            ss += sum((x - m) ** 2 for x in logs)
            dof += len(logs) - 1
    return RepeatSpread(math.sqrt(ss / dof) if dof else math.nan, dof)


BAND_CONFIDENCE = 0.90


def band_half(fit: RepeatSpread, run: RepeatSpread | None = None) -> float:
    """The replay band's half-width in log makespan: the two runs' repeat-to-repeat spreads added
    in quadrature, times the two-sided 90 % t quantile (the smaller run's degrees of freedom).

    A run's level is not a mean that averages out: the machine's load holds for minutes, so a whole
    run sits where one of its repeats would, and the fitted run's level carries into every
    prediction. Without the measured run (a lengths file; one repeat) it counts the fitted run's
    spread twice. NaN when the fitted run had one repeat."""
    from scipy.stats import t

    other = run if run is not None and run.dof > 0 else fit
    if not fit.dof or math.isnan(fit.sd) or math.isnan(other.sd):
        return math.nan
    q = float(t.ppf(0.5 + BAND_CONFIDENCE / 2, min(fit.dof, other.dof)))
    return q * math.sqrt(fit.sd**2 + other.sd**2)


def band(point: float, lo: float, hi: float, half: float, n: int = 1) -> tuple[float, float]:
    """(low, high) around a predicted makespan ``point``: the wider of the machine band
    (``point * exp(+-half)``) and the replays' acceptance spread (``lo``..``hi``, a single rollout's;
    a mean over ``n`` rollouts: shrunk by sqrt(n)). ``half`` NaN: the acceptance spread alone."""
    acc_lo = point - (point - lo) / math.sqrt(n)
    acc_hi = point + (hi - point) / math.sqrt(n)
    if math.isnan(half):
        return acc_lo, acc_hi
    return min(acc_lo, point * math.exp(-half)), max(acc_hi, point * math.exp(half))


@dataclass(frozen=True)
class ReplayCheck:
    rows: pd.DataFrame  # per measured rollout: measured, predicted (raw, calibrated, fitted), errors
    scale: dict[int, float]  # per repeat: the machine factor fitted on that repeat's vanilla row
    spread_run: RepeatSpread | None = None  # the checked run's repeat-to-repeat spread
    spread_fit: RepeatSpread | None = None  # the fitted run's (``replay --fit``)
    band_half: float = math.nan  # the band's half-width in log makespan (:func:`band_half`)
    band_on: str = "fit"  # the prediction the band is centred on: "fit", or "fitcal" (:func:`band_center`)
    vanilla_fit_err: float = math.nan  # vanilla's mean fit / mean measured - 1: the machine's move
    prefill_scale: float = math.nan  # fitcal's factor on prefill (:func:`prefill_factor`)


MOVED = 0.10  # vanilla's fit off by more than this: the machine's speed moved between the two runs


def band_center(vanilla_fit_err: float) -> str:
    """``fitcal`` when vanilla's own fitted makespan misses its measured mean by more than
    :data:`MOVED`, else ``fit``. Vanilla's work is the same whatever the acceptance, so its miss is
    the machine's speed moving between the two runs (another load), which neither run's repeats
    show; ``fitcal`` takes it out, per repeat, by vanilla's decode time. On the pairs of 2026-12-03
    and 2026-12-06 vanilla missed by 2-9 % (quiet or alike) or 12-31 % (loads 9-13 against 5-7)."""
    return "fitcal" if not math.isnan(vanilla_fit_err) and abs(vanilla_fit_err) > MOVED else "fit"


def replay_check(df: pd.DataFrame, table: Mapping[str, Any], runs: int = 200,
                 seed: int = 0, model=None, fit_spread: RepeatSpread | None = None) -> ReplayCheck:
    """The replay's makespan for every measured rollout, from its own lengths:

    * ``raw``: the table's step times; every row takes its repeat's vanilla prefill;
    * ``cal``: the same with step times scaled by the factor that makes the repeat's vanilla
      prediction exact (the machine today against the table's day; vanilla exact by construction);
    * ``fit`` (with ``model``, a :class:`~dsdprof.decide.step_model.StepModel` fitted on *another*
      run): the model's step and prefill seconds, acceptance and (adaptive) K schedule per variant,
      nothing of this run but its lengths;
    * ``fitcal``: ``fit`` with step seconds times one factor per repeat, the repeat's vanilla decode
      seconds over the model's, and prefill seconds times one factor for the run
      (:func:`prefill_factor`): the machine's move taken out of decode and prefill separately (a
      loaded CPU slowed prefill more than decode on 2026-12-06: scaled by the decode factor, fitcal
      missed by 11.5 % on average over 36 replay directions, 7.6 % with its own factor);
    * the band around ``fit`` (``fit_spread``: the fitted run's :class:`RepeatSpread`): the machine's
      repeat-to-repeat noise of both runs (:func:`band_half`), at least the replays' acceptance
      spread; without ``fit_spread``, the acceptance spread alone."""
    from dsdprof.decide.makespan import grid_from_table, predict, variant_schedules

    d = _ok(df, KIND_ROLLOUT)
    grid = grid_from_table(table)
    scheds = variant_schedules(
        table, grid, sorted({int(v.split("-")[1]) for v in d["variant"] if v.startswith("fixed-")})
    )
    scale: dict[int, float] = {}
    out = []
    spread = repeat_spread(d)
    half = band_half(fit_spread, spread) if fit_spread is not None else math.nan
    pre_scale = prefill_factor(d, model) if model is not None else math.nan
    for rep in sorted(d["repeat"].unique()):
        r = d[d["repeat"] == rep]
        van = r[r["variant"] == "vanilla"]
        pre = prefill_seconds(van.iloc[0]) if len(van) else math.nan
        pre = 0.0 if math.isnan(pre) else pre
        fit_scale = math.nan
        if len(van):
            lens = [int(x) for x in van.iloc[0]["request_output_len"]]
            m = float(van.iloc[0]["makespan_s"])
            p = predict(lens, scheds["vanilla"], grid, pre, "vanilla", 1.0, runs, seed)
            scale[int(rep)] = float((m - pre) / (p.makespan_s - pre))
            if model is not None:
                dec = sum(x[2] for x in decode_steps(van.iloc[0]))
                pv = predict(lens, scheds["vanilla"], model.engine("vanilla"), 0.0, "vanilla", 1.0, 1, seed)
                fit_scale = dec / pv.makespan_s
        for _, row in r.iterrows():
            sched = scheds.get(row["variant"])
            if sched is not None:
                out.append(_check_row(row, sched, grid, pre, scale.get(int(rep), math.nan), model,
                                      fit_scale, runs, seed, half, pre_scale))
    rows = pd.DataFrame(out)
    van_err, on = math.nan, "fit"
    if model is not None and len(rows) and (rows["variant"] == "vanilla").any():
        v = rows[rows["variant"] == "vanilla"]
        van_err = float(v["predicted_fit_s"].mean() / v["measured_s"].mean() - 1)
        on = band_center(van_err)
        if on == "fitcal":  # the band around fitcal: the acceptance spread scaled with the point
            f = rows["predicted_fitcal_s"] / rows["predicted_fit_s"]
            lo, hi = rows["fit_lo_s"] * f, rows["fit_hi_s"] * f
            b = [band(p, a, z, half) for p, a, z in zip(rows["predicted_fitcal_s"], lo, hi)]
            rows["band_lo_s"], rows["band_hi_s"] = [x[0] for x in b], [x[1] for x in b]
            rows["in_band"] = [bool(a <= m <= z) for m, (a, z) in zip(rows["measured_s"], b)]
    return ReplayCheck(rows, scale, spread, fit_spread, half, on, van_err, pre_scale)


def prefill_factor(d: pd.DataFrame, model) -> float:
    """The median over a run's vanilla rollouts of measured prefill seconds over the fitted model's
    (NaN with none): ``fitcal``'s factor on every variant's prefill. One factor for the run, not
    per repeat: a burst in one repeat's prefill (12.96 s against 3.1-3.2 s in the others, run C
    of 2026-12-06) would otherwise carry into every variant of that repeat."""
    van = _ok(d, KIND_ROLLOUT)
    van = van[van["variant"] == "vanilla"]
    pairs = [(prefill_seconds(x), model.prefill_s("vanilla", len(x["request_output_len"])))
             for _, x in van.iterrows()]
    r = [a / b for a, b in pairs if b > 0 and not math.isnan(a) and a > 0]
    return statistics.median(r) if r else math.nan


def _fitted(model, lens, sched, variant: str, runs: int, seed: int, scale: float = 1.0,
            pre_scale: float = math.nan):
    from dsdprof.decide.makespan import predict

    ps = scale if math.isnan(pre_scale) else pre_scale
    return predict(lens, model.schedule(variant, sched), model.engine(variant),
                   model.prefill_s(variant, len(lens)) * ps, variant, scale, runs, seed)


def _check_row(row: Any, sched, grid, pre: float, s: float, model, fit_scale: float, runs: int,
               seed: int, half: float = math.nan, pre_scale: float = math.nan) -> dict[str, Any]:
    """One measured rollout against its predictions (see :func:`replay_check`)."""
    from dsdprof.decide.makespan import predict

    v = str(row["variant"])
    lens = [int(x) for x in row["request_output_len"]]
    raw = predict(lens, sched, grid, pre, v, 1.0, runs, seed)
    cal = predict(lens, sched, grid, pre, v, s, runs, seed).makespan_s if not math.isnan(s) else math.nan
    f = _fitted(model, lens, sched, v, runs, seed) if model is not None else None
    fit, lo, hi = (f.makespan_s, f.lo, f.hi) if f else (math.nan, math.nan, math.nan)
    fitcal = _fitted(model, lens, sched, v, runs, seed, fit_scale, pre_scale).makespan_s if f else math.nan
    m = float(row["makespan_s"])
    b_lo, b_hi = band(fit, lo, hi, half) if f else (math.nan, math.nan)
    return {
        "repeat": int(row["repeat"]),
        "variant": v,
        "measured_s": m,
        "predicted_raw_s": raw.makespan_s,
        "error_raw": raw.makespan_s / m - 1,
        "predicted_cal_s": cal,
        "error_cal": cal / m - 1,
        "predicted_fit_s": fit,
        "error_fit": fit / m - 1,
        "fit_in_90": bool(lo <= m <= hi),  # inside the replays' 5-95 % (acceptance luck)
        "fit_lo_s": lo,
        "fit_hi_s": hi,
        "band_lo_s": b_lo,  # the band: acceptance luck and the two runs' repeat noise
        "band_hi_s": b_hi,
        "in_band": bool(b_lo <= m <= b_hi),
        "predicted_fitcal_s": fitcal,
        "error_fitcal": fitcal / m - 1,
        "steps_measured": len(decode_steps(row)),
        "steps_predicted": raw.steps,
        "mean_k_measured": float(row["mean_k"]),
        "mean_k_predicted": raw.mean_k,
        "steps_fit": f.steps if f else math.nan,
        "mean_k_fit": f.mean_k if f else math.nan,
    }


QUIET_SPREAD = 0.05  # repeats spreading less than this: the fitted point is read to 5 %


def trust_note(chk: ReplayCheck) -> str:
    """Which of a replay check's columns to read, from the two runs' repeat-to-repeat spreads."""
    run = chk.spread_run.sd if chk.spread_run is not None else math.nan
    if chk.spread_fit is None:
        return ("read cal (the table's grid scaled by each repeat's vanilla): raw is the table's own "
                "day and machine; --fit RUN gives a fitted point and a band with the machine's noise")
    fit = chk.spread_fit.sd
    pair = f"repeats spread {_pct(fit)} (fitted run) and {_pct(run)} (this run)"
    if chk.band_on == "fitcal":
        return (f"vanilla's fit is off by {_pct(chk.vanilla_fit_err)} (more than {MOVED:.0%}): the "
                f"machine's speed moved between the runs, which their repeats ({_pct(fit)}, {_pct(run)})"
                " do not show. Read fitcal, and the band around it; fit's point is off by that move "
                "(more on the speculative engines, which a loaded CPU slows more)")
    if max(fit, run) < QUIET_SPREAD:
        head = f"{pair}, both < 5 %: read fit, the point"
    else:
        head = (f"{pair}: the machine moved, so read fit's band ({band_pct(chk.band_half)}), "
                "not its point (only when both spread < 5 %)")
    moved = _pct(abs(chk.vanilla_fit_err))
    return (head + f". fitcal takes vanilla's move out (fit's vanilla off by {moved}), per repeat: closer "
            "than fit when the runs' level or a whole repeat moved, farther when only vanilla's own "
            "rollouts are noisy; raw and cal are the table's grid, not the engines'")


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 100:.1f} %"


def band_pct(half: float) -> str:
    """A band's log half-width as its two sides in percent: ``-13/+15 %``."""
    if math.isnan(half):
        return "-"
    return f"-{-math.expm1(-half) * 100:.0f}/+{math.expm1(half) * 100:.0f} %"


def replay_summary(rows: pd.DataFrame, half: float = math.nan, on: str = "fit") -> pd.DataFrame:
    """Per variant over repeats (a :class:`ReplayCheck`'s rows): mean measured makespan, the mean
    prediction of each kind and its error (the mean's: acceptance luck averages out), the largest
    single-rollout error, the share of rollouts inside the fitted replays' 5-95 % (acceptance luck
    alone), and the band around the mean ``on`` prediction (``fit`` or ``fitcal``,
    :attr:`ReplayCheck.band_on`; :func:`band`, ``half`` from :attr:`ReplayCheck.band_half`) with
    whether it holds the mean measured makespan."""
    out = []
    for v, g in rows.groupby("variant", sort=False):
        m = g["measured_s"].mean()
        rec: dict[str, Any] = {"variant": v, "rollouts": len(g), "measured_s": m}
        for kind in ("raw", "cal", "fit", "fitcal"):
            pred = g[f"predicted_{kind}_s"].mean()
            rec[f"{kind}_s"] = pred
            rec[f"{kind}_err"] = pred / m - 1
            rec[f"{kind}_max_err"] = g[f"error_{kind}"].abs().max()
        rec["fit_in_90"] = g["fit_in_90"].mean() if "fit_in_90" in g else math.nan
        lo, hi = math.nan, math.nan
        if "fit_lo_s" in g and not math.isnan(rec[f"{on}_s"]):
            f = rec[f"{on}_s"] / rec["fit_s"]
            lo, hi = band(rec[f"{on}_s"], g["fit_lo_s"].mean() * f, g["fit_hi_s"].mean() * f, half, len(g))
        rec["band_lo_s"], rec["band_hi_s"] = lo, hi
        rec["in_band"] = bool(lo <= m <= hi) if not math.isnan(lo) else math.nan
        out.append(rec)
    return pd.DataFrame(out).sort_values("variant", key=lambda c: c.map(_variant_key)).reset_index(drop=True)


def k_timeline(
    df: pd.DataFrame, kind: str = KIND_ROLLOUT, repeat: int = 0, rate: float = 0.0
) -> dict[str, pd.DataFrame]:
    """Per variant, one run's steps: time, lookup batch size, requests decoding, K scheduled."""
    d = _ok(df, kind)
    d = d[(d["repeat"] == repeat) & ((d["rate_per_s"] - rate).abs() < 1e-9)]
    out = {}
    for _, row in d.iterrows():
        out[row["variant"]] = pd.DataFrame(
            {
                "t_s": list(row["step_t_s"]),
                "batch_size": list(row["step_batch_size"]),
                "decoding": list(row["step_decoding"]),
                "k": list(row["step_k"]),
                "drafted": list(row["step_drafted"]),
            }
        )
    return dict(sorted(out.items(), key=lambda kv: _variant_key(kv[0])))


def k_segments(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Consecutive steps that scheduled the same K, as segments: start and end time, the batch size
    at the first and the last step, the steps, and the K (one run's :func:`k_timeline` frame)."""
    out: list[dict[str, Any]] = []
    prev_t = 0.0
    for t, b, k in zip(steps["t_s"], steps["batch_size"], steps["k"]):
        if out and out[-1]["k"] == k:
            seg = out[-1]
            seg.update(t_end=float(t), bs_last=int(b), steps=seg["steps"] + 1)
        else:
            out.append({"t_start": prev_t, "t_end": float(t), "bs_first": int(b), "bs_last": int(b),
                        "steps": 1, "k": int(k)})
        prev_t = float(t)
    return out
