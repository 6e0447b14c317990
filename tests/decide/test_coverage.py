"""Honest intervals on synthetic paired sweeps with a known truth (issue 30, part 3).

Pure Python, seeded: :mod:`tests.coverage_sets` builds paired-design rows step by step (drift
between waves, AR(1) within waves, outlier steps; acceptance pooled by draft position as v6 rows
are; a vanilla engine beside each group) and ``analyze`` decides. ``benchmarks/bench_coverage.py``
has the full tables (docs/decisions.md). The unit tests below are fast; the coverage runs over
many datasets are ``slow``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsdprof.decide import bootstrap
from dsdprof.decide.analysis import analyze
from dsdprof.decide.bootstrap import batch_replicates, bootstrap_batch, huber_factor, interval, robust_paired
from dsdprof.decide.speedup import speedup_estimate
from tests.coverage_sets import (
    BATCH_SIZES,
    BOUNDARY_BATCH_SIZES,
    GPU_LIKE,
    KS,
    SCENARIOS,
    VARIATIONS,
    dataset,
    score,
    timed_steps,
    truth_goodput,
    truth_vanilla,
)

SC = {s.name: s for s in (*SCENARIOS, *VARIATIONS, *GPU_LIKE)}


def _paired_cells(x: np.ndarray) -> list:
    """(K x waves) ITL waves as paired cells of one repeat (AL 1)."""
    return [(k, [(1.0, float(row.mean()), np.ones(row.size), row.copy())]) for k, row in enumerate(x)]


def _noise(ks: int, waves: int) -> np.ndarray:
    """+-1 % by wave and K, alternating: no wave beyond 3 robust scales."""
    return 1.0 + 0.01 * (-1.0) ** np.add.outer(np.arange(ks), np.arange(waves))


def test_paired_winsorizing_reads_drift_from_the_block_and_clips_what_one_k_alone_saw():
    drift = np.exp(np.random.default_rng(0).normal(0.0, 0.05, 20))
    x = np.array([1.0, 1.1, 1.2, 1.3])[:, None] * drift * _noise(4, 20)
    x[:, 3] *= 1.4  # a slow wave for every K: drift, not an outlier
    x[2, 7] *= 1.3  # one K's slow wave: an outlier
    out = robust_paired(_paired_cells(x))
    after = np.stack([reps[0][3] for _, reps in out])
    assert after[2, 7] < x[2, 7] / 1.2  # the K's own slow wave is clipped
    after[2, 7] = x[2, 7]
    assert np.array_equal(after, x)  # nothing else, the shared slow wave included
    # per cell (the unpaired rule), the shared slow wave is a tail of every K and is clipped
    assert all(reps[0][3][3] < x[i, 3] for i, (_, reps) in enumerate(
        (k, bootstrap.robust_units(r)) for k, r in _paired_cells(x)))


def test_clipped_waves_widen_their_cell_by_the_unclipped_share(monkeypatch):
    x = _noise(4, 20)
    x[1, 5] *= 2.0
    raw = _paired_cells(x)
    assert huber_factor(raw, robust_paired(raw), 3).tolist() == pytest.approx([1.0, 20 / 19, 1.0, 1.0])
    rep = bootstrap_batch(1, raw, paired=True)
    monkeypatch.setattr(bootstrap, "huber_factor", lambda raw, robust, j: np.ones(len(raw)))
    bare = bootstrap_batch(1, raw, paired=True)  # the same seeded draw, clipped values resampled alone
    spread = np.std(np.log(rep.itl / rep.point_itl),
                    axis=0) / np.std(np.log(bare.itl / bare.point_itl), axis=0)
    assert spread.tolist() == pytest.approx([1.0, 20 / 19, 1.0, 1.0])


def test_a_rows_point_is_its_winsorized_samples_mean_not_its_step_mean():
    """A row's ``itl_s`` is the mean over its timed steps; where its waves timed different numbers of
    steps (waves of non-whole K cycles), one slow step weighs more in the row than in its wave's
    mean, and clipping the wave left most of it in the point. The point is the mean of the row's
    (winsorized) wave samples, the estimator its replicates resample."""
    x = _noise(4, 20) * 0.01
    x[1, 5] *= 1.5  # one K's slow wave (a 3x step in a wave that timed 4 of its steps)
    raw = _paired_cells(x)
    raw[1] = (1, [(1.0, float(x[1].mean()) * 1.02, *raw[1][1][0][2:])])  # the step mean: 2 % slow
    rep = bootstrap_batch(1, raw, paired=True)
    clipped = robust_paired(raw)[1][1][0][3]
    assert clipped[5] < x[1, 5] and rep.point_itl[1] == pytest.approx(clipped.mean(), rel=1e-12)
    assert np.median(rep.itl[:, 1]) == pytest.approx(rep.point_itl[1], rel=0.002)  # replicates centre there
    plain = bootstrap_batch(1, [(k, [(1.0, float(x[i].mean()) * 1.02, *r[0][2:])]) for i, (k, r)
                                in enumerate(_paired_cells(x))], paired=True)
    assert plain.point_itl == pytest.approx(rep.point_itl, rel=1e-12)  # the rows' own ITL plays no part


def test_timed_steps_skip_the_first_pure_step_of_each_hold():
    seq = np.array([0, 0, 0, 0, 1, 1, 1, 1, 0])
    verified, proposed = seq[:-1], seq[1:]
    assert timed_steps(verified, proposed, 0).tolist() == [1, 1, 1, 0, 1, 1, 1, 0]
    assert timed_steps(verified, proposed, 1).tolist() == [0, 1, 1, 0, 0, 1, 1, 0]


def _ratio_errors(sc, datasets: int) -> tuple[float, float, float]:
    """rms error of log(goodput ratio) of neighbouring Ks, the rms width the bootstrap implies, and
    the coverage of their 90 % intervals, over ``datasets`` seeded boundary sets."""
    g = truth_goodput(sc, BOUNDARY_BATCH_SIZES, KS)
    err, var, cov = [], [], []
    for seed in range(datasets):
        rows = dataset(sc, seed, BOUNDARY_BATCH_SIZES, KS)
        for b, rep in batch_replicates(rows[rows["mode"] != "vanilla"]).items():
            for i in range(1, len(KS)):
                r = rep.goodput[:, i] / rep.goodput[:, i - 1]
                true = g[b][KS[i]] / g[b][KS[i - 1]]
                lo, hi = interval(r, 0.9)
                err.append(math.log(rep.point_goodput[i] / rep.point_goodput[i - 1] / true))
                var.append(np.var(np.log(r)))
                cov.append(lo <= true <= hi)
    return float(np.sqrt(np.mean(np.square(err)))), float(np.sqrt(np.mean(var))), float(np.mean(cov))


def test_intervals_are_as_wide_as_the_error_with_outlier_steps():
    """1 % of steps 3x slow: the bootstrap's spread of the ratios between neighbouring Ks matches
    their real error (before: 0.91-0.95 of it, 86-87 % coverage) and the block winsorizing keeps
    the error small (1.0 % before, 0.65 % now)."""
    rmse, width, cov = _ratio_errors(SC["outliers"], 40)
    assert rmse < 0.0075
    assert 0.97 <= width / rmse <= 1.2, (rmse, width)
    assert cov >= 0.87


def test_speedup_over_vanilla_weighs_slow_steps_alike():
    """Vanilla's waves cannot be winsorized (a slow step is part of a whole wave's mean), so the
    speedup weighs slow steps alike on both sides (2 % of vanilla's time here): plain means of the
    K alone, or -- with its paired group -- the K winsorized x the group's slow-step factor, which
    is as unbiased and less noisy. A winsorized K against plain vanilla overstated it by ~4 %."""
    sc = dataclasses.replace(SC["outliers"], outliers=0.02, step_sd=0.02, drift=0.005, waves=40)
    g, v = truth_goodput(sc, (64,), KS), truth_vanilla(sc, (64,))
    plain, grouped = [], []
    for seed in range(30):
        df = dataset(sc, seed, (64,), KS)
        cand = df[df["mode"] == "dsd"]
        k_rows, base = cand[cand["num_spec_tokens"] == 3], df[df["mode"] == "vanilla"]
        for errs, group in ((plain, None), (grouped, cand)):
            point, lo, hi, how = speedup_estimate(k_rows, base, group=group)
            assert how == "paired" and lo <= point <= hi
            errs.append(math.log(point / (g[64][3] / v[64])))
    assert abs(np.mean(plain)) < 0.006 and abs(np.mean(grouped)) < 0.006, (np.mean(plain), np.mean(grouped))
    assert np.std(grouped) < np.std(plain)


def test_speedup_high_side_carries_vanillas_rare_slow_steps():
    """On ``gpu5`` vanilla's 4 waves draw 1.1 slow steps on average (none in a third of batch sizes:
    the speedup then reads ~2 % low, its blocks showing no spread), the K side their expectation:
    the high side is widened to the slow steps' share spread (``speedup._vanilla_slow_var``).
    Intervals wholly below the truth: 16 of 240 without it, 4 with it; above: 2 either way."""
    sc, bs = SC["gpu5"], (48, 200)
    g, v = truth_goodput(sc, bs, KS), truth_vanilla(sc, bs)
    below = above = 0
    for seed in range(9000, 9060):
        df = dataset(sc, seed, bs, KS)
        for b in bs:
            cand = df[(df["mode"] == "dsd") & (df["batch_size"] == b)]
            base = df[(df["mode"] == "vanilla") & (df["batch_size"] == b)]
            for k in (2, 4):
                _, lo, hi, how = speedup_estimate(cand[cand["num_spec_tokens"] == k], base, replicates=400,
                                                  group=cand)
                assert how == "paired"
                below += hi < g[b][k] / v[b]
                above += lo > g[b][k] / v[b]
    assert below <= 8 and above <= 8, (below, above)  # 5 % of 240 is 12


def _run(sc, batch_sizes, datasets, seed0=0):
    goodput, vanilla = truth_goodput(sc, batch_sizes, KS), truth_vanilla(sc, batch_sizes)
    tot: dict = {}
    wrong = {b: 0 for b in batch_sizes}
    for seed in range(seed0, seed0 + datasets):
        s = score(analyze(dataset(sc, seed, batch_sizes, KS)), goodput, vanilla=vanilla)
        for key, val in s.items():
            if isinstance(val, (int, float)):
                tot[key] = tot.get(key, 0) + val
        for b in s["wrong_bs"]:
            wrong[b] += 1
    cov = {n: tot[f"{n}_covered"] / tot[f"{n}_s"] for n in ("margin", "speedup", "vanilla")}
    cov["ratio"] = tot["covered"] / tot["intervals"]
    return cov, tot["decided"], wrong


@pytest.mark.slow  # ~13 s idle, ~80 s on the busy 2 cores
def test_ratio_intervals_cover_the_truth_on_the_grid():
    """90 % intervals of goodput vs the best K, every batch size and K, 1-256 x 0-5, 5 % drift
    between waves: >= 87 % hold the truth (91 % on 150 datasets; the method before issue 30: 84 %)."""
    cov, decided, wrong = _run(SC["drift"], BATCH_SIZES, 50)
    assert cov["ratio"] >= 0.87
    assert decided > 0 and max(wrong.values()) <= 1  # 2 % of 50


@pytest.mark.slow  # ~20-25 s each idle, 70-100 s on the busy 2 cores
@pytest.mark.parametrize("name", ["drift", "all"])
def test_no_batch_size_decided_wrongly_in_more_than_2_percent(name):
    """Batch sizes where a K sits within 0.5 % of the 2 % tolerance: no batch size decided wrongly
    in more than 3 of 100 datasets, every interval analyze reports covering >= 86 % of the truth.
    A rate of 2 % gives 3 or more of 100 in a third of samples, 5 or more in 5 %; the method before
    issue 30 had 5-6 of 100 at its worst batch size. ``drift`` has 3 here (BS 200, where K=1 sits
    0.05 % below the tolerance: the estimate 2.7-3.2 sd above the truth), 3 of 150 = 2.0 % in the
    benchmark; ``all`` 1."""
    cov, decided, wrong = _run(SC[name], BOUNDARY_BATCH_SIZES, 100)
    assert decided > 0
    assert max(wrong.values()) <= 3, wrong
    assert min(cov.values()) >= 0.86, cov


@pytest.mark.slow  # ~11 s idle, ~50 s busy
def test_held_out_heavier_outliers_are_covered():
    """A variation the method was not tuned on (2 % of steps 5x slow, other seeds): every interval
    analyze reports holds the truth >= 87 % (the speedup's and vanilla gain's: 69 % with the method
    before, 85 % with plain means alone; docs/decisions.md)."""
    cov, _, wrong = _run(SC["heavy"], BOUNDARY_BATCH_SIZES, 60, seed0=5000)
    assert min(cov.values()) >= 0.87, cov
    assert max(wrong.values()) <= 1, wrong


@pytest.mark.slow  # 23-36 s each at load ~5 (12:17 UTC, 2026-12-06)
@pytest.mark.parametrize("name", ["gpu3", "gpu5"])
def test_gpu_like_quiet_steps_with_rare_slow_ones_are_covered(name):
    """Issue 45: GPU-like step noise (1.2 %, 1 % drift), 0.5 % of steps 3x or 5x slow, 56-step
    waves (not a whole number of 12-step K cycles). The 90 % ratio and margin intervals hold the
    truth >= 88 % and no batch size is decided wrongly in more than 1 of 40 datasets. With the
    point from the row's step mean (rescaled by its clipped wave mean, not its samples' estimator):
    83.2 / 71.5 % ratio coverage, one batch size wrong in 3 / 18 % of 100 datasets; now 91.3 %,
    2 % (benchmarks/bench_coverage.py, docs/decisions.md)."""
    cov, decided, wrong = _run(SC[name], BOUNDARY_BATCH_SIZES, 40, seed0=7000)
    assert decided > 0
    assert min(cov["ratio"], cov["margin"]) >= 0.88, cov
    assert min(cov["speedup"], cov["vanilla"]) >= 0.85, cov  # not the point's estimator: 88 % on 100
    assert max(wrong.values()) <= 1, wrong


def test_speedup_falls_back_to_independent_when_vanilla_shares_no_wave_block():
    """A paired K whose vanilla rows share no wave block with it takes the independent interval
    from the K's own waves (it crashed when the group's slow-step columns, waves x 3, reached that
    path: analyze on docs/lab/data/sweep-cost-paired-budget.parquet)."""
    root = Path(__file__).resolve().parents[2]
    result = analyze(pd.read_parquet(root / "docs" / "lab" / "data" / "sweep-cost-paired-budget.parquet"))
    rows = result.optimal.to_dict("records")
    spans = [(o["speedup_vs_baseline"], o["speedup_low"], o["speedup_high"]) for o in rows]
    assert len(spans) == 3 and all(lo <= s <= hi for s, lo, hi in spans if math.isfinite(lo)), spans
