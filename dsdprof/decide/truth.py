"""A known truth under synthetic acceptance: measured AL(K) beside the AL the rates imply.

With ``[engine] synthetic_acceptance_rates`` u (vLLM's synthetic rejection sampler; u[i] = P(the
first i+1 drafts of a request-step are all accepted)) a request-step drafting K yields
``A = min(accepted, K)`` extra tokens with ``P(A > i) = u[i]``, independently of every other
request-step. So

* ``AL(K) = 1 + u[0] + ... + u[K-1]`` (:func:`implied_acceptance_length`);
* ``Var(A) = sum_{i<K} (2i + 1) u[i] - (sum_{i<K} u[i])^2`` (``E[A^2] = sum_i (2i+1) P(A > i)``);
* over ``n`` independent request-steps, the standard error of AL(K) is ``sqrt(Var(A) / n)``.

A cells row's standard error is that model's over ``n = num_drafts`` (``se_from = "model"``). A
paired row's AL is replayed over every position of the group (``measure/vllm/replay.py``), with no
closed form for its error: its standard error is its samples' (``"samples"``, a delete-a-block
jackknife, ``replay_acceptance``) when it has at least :data:`MIN_SAMPLES`, else the model's over
its own request-steps (``"own steps"``: conservative). ``dispersion``: the samples' standard error
over the model's. ``waves_needed``: the waves that bring the row's relative standard error to
``tolerance / z``, scaled as 1 / sqrt(waves). Why, and the simulations behind it:
docs/measurement.md ("The known truth in analyze") and docs/lab/synthetic-truth.md.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

MIN_SAMPLES = 8  # a paired row's standard error from its samples' spread from this many on
TOLERANCE = 0.005  # |AL / truth - 1| the truth check is sized for
Z = 3.0  # ... at this many standard errors

COLUMNS = ("design", "batch_size", "k", "acceptance_length", "truth", "error", "n", "se", "se_from", "z",
           "dispersion", "samples", "waves", "waves_needed")


def implied_acceptance_length(rates: list[float], k: int) -> float:
    """AL(k) the rates imply: 1 + rates[0] + ... + rates[k-1]."""
    return 1.0 + sum(rates[:k])


def step_variance(rates: list[float], k: int) -> float:
    """Variance of the tokens one request-step drafting ``k`` yields under the rates."""
    u = list(rates[:k])
    return max(0.0, sum((2 * i + 1) * p for i, p in enumerate(u)) - sum(u) ** 2)


def _sample_se(samples: Any) -> float:
    vals = [float(v) for v in (samples if samples is not None else []) if not math.isnan(float(v))]
    if len(vals) < 2:
        return math.nan
    mean = sum(vals) / len(vals)
    return math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1) / len(vals))


def _z(al: float, truth: float, se: float) -> float:
    if math.isnan(se):
        return math.nan
    return (al - truth) / se if se > 0 else (0.0 if al == truth else math.copysign(math.inf, al - truth))


def truth_rows(df: pd.DataFrame, rates: list[float], tolerance: float = TOLERANCE,
               z: float = Z) -> pd.DataFrame:
    """Per (design, batch size, K > 0) of the speculative rows that succeeded (repeats pooled,
    weighted by their request-steps): measured AL, the implied ``truth``, ``error`` (AL / truth -
    1), ``n`` request-steps, ``se`` (relative standard error) and where it came from
    (``se_from``), ``z`` ((AL - truth) / absolute standard error), ``dispersion`` (see the module),
    ``samples``, ``waves`` and ``waves_needed`` (for ``tolerance`` at ``z`` standard errors)."""
    rows = df[(df["status"] == "ok") & (df["mode"] != "vanilla") & (df["num_spec_tokens"] > 0)]
    out = []
    design = rows["design"] if "design" in rows.columns else pd.Series("cells", index=rows.index)
    for (d, b, k), group in rows.assign(design=design.fillna("cells")).groupby(
            ["design", "batch_size", "num_spec_tokens"], sort=True):
        k = int(k)
        truth = implied_acceptance_length(rates, k)
        n_each = [float(r["num_drafts"]) for _, r in group.iterrows()]
        n = sum(n_each)
        weights = n_each if n > 0 else [1.0] * len(n_each)  # no request-step counted: a plain mean
        values = [float(r["acceptance_length"]) for _, r in group.iterrows()]
        al = sum(v * w for v, w in zip(values, weights)) / sum(weights)
        model = math.sqrt(step_variance(rates, k) / n) if n > 0 else math.nan
        samples = [v for s in group.get("sample_acceptance_length", pd.Series(dtype=object))
                   if s is not None for v in s]
        emp = _sample_se(samples)
        se, se_from = model, "model"
        if d == "paired":
            few = len(samples) < MIN_SAMPLES
            se, se_from = (model, "own steps") if few else (emp, "samples")
        waves = int(sum(int(r["num_requests"]) // max(1, int(b)) for _, r in group.iterrows()))
        rel = se / truth
        out.append({
            "design": str(d), "batch_size": int(b), "k": k, "acceptance_length": al, "truth": truth,
            "error": al / truth - 1, "n": int(n), "se": rel, "se_from": se_from,
            "z": _z(al, truth, se),
            "dispersion": emp / model if model > 0 and not math.isnan(emp) else math.nan,
            "samples": len(samples), "waves": waves,
            "waves_needed": math.ceil(waves * (rel * z / tolerance) ** 2) if waves and rel == rel else 0,
        })
    return pd.DataFrame(out, columns=list(COLUMNS))
