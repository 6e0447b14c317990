"""The paired design's replayed AL across seeds, on correlated acceptance held out from its model.

:mod:`tests.replay_sets` simulates paired runs (16 waves x BS 8 x 300 tokens, the sweep's K
sequence) over a three-state hidden chain along each request's positions; the truth is a server
held at K over the same requests. One seed can land anywhere in the error's spread (the 0.27 % once
claimed rested on one); these tests read the spread and the mean over seeds.
``benchmarks/bench_replay_seeds.py`` has 20 seeds of every case, at 128 and 512 requests, and the
oracle (the replay given the truth's own chain) beside the fit (docs/lab/precision-replay.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.replay_sets import CASES, SYNTHETIC, paired_run, replay_errors

BY_NAME = {c.name: c for c in CASES}


def test_the_truth_is_a_fixed_k_server_and_the_trace_is_untrimmed():
    """A paired run's records give every request its full length, the last step untrimmed (a
    trimmed last step read as a rejection at the request's end and biased the AL low by ~0.2 %);
    the truth at K is 1 + the rates' sum for independent positions."""
    run = paired_run(SYNTHETIC, 0, waves=4, batch_size=8, length=400)
    assert all(r.length == 400 and len(r.x) >= 400 for r in run.reqs)
    cond = np.cumprod(SYNTHETIC.depth_rates)
    for k in (1, 2, 3, 4):
        assert run.truth[k] == pytest.approx(1 + cond[:k].sum(), rel=0.02)
    assert abs(run.lag1) < 0.05


@pytest.mark.slow  # 32 simulated runs replayed: ~13 CPU-s (fewer seeds: within chance of 0.1 %)
def test_replay_given_the_true_chain_is_centred_over_seeds():
    """The replay's method, the fit left out: a two-state truth (rates 0.95 and 0.4 falling 15 % per
    depth, stretches of about 100 and 200 positions: the three-state set with two hard states alike,
    which a two-state chain represents exactly), imputed and replayed given that chain. Over seeds
    0-31 the mean error is within +-0.1 % at every K 1-4 (+0.02 / -0.00 / +0.01 / -0.02 % when
    written, SE 0.02-0.03 %; 80 seeds with 64 paths: -0.00 / -0.00 / -0.01 / -0.03 %). A method bias
    fails it: a trimmed last step read as a rejection (-0.2 %), a wrong carry between depths."""
    from dsdprof.measure.vllm.replay import _replay_all
    from tests.replay_sets import Case

    case = Case("two-state", stay=0.99, decay=0.85, rates=(0.95, 0.4, 0.4))
    move = 1 - case.stay
    chain = (np.array([1 / 3, 2 / 3]), np.array([[1 - move, move], [move / 2, 1 - move / 2]]),
             np.array([[r * case.decay ** j for j in range(4)] for r in (0.95, 0.4)]))
    errs = []
    for seed in range(32):
        run = paired_run(case, seed)
        x = np.full((len(run.reqs), 310), -1, dtype=np.int8)
        depth = np.zeros_like(x)
        for i, r in enumerate(run.reqs):
            x[i, :len(r.x)], depth[i, :len(r.x)] = r.x, r.depth
        tokens, steps = _replay_all(x, depth, chain, np.full(len(x), 300.0), [1, 2, 3, 4], 8)
        errs.append(tokens.sum(1) / steps.sum(1) / np.array([run.truth[k] for k in (1, 2, 3, 4)]) - 1)
    assert (np.abs(np.mean(errs, axis=0)) <= 0.001).all(), np.mean(errs, axis=0)


def _errors(name: str) -> np.ndarray:
    return replay_errors(BY_NAME[name], range(100, 110))[0]


@pytest.mark.slow  # 22 s at load ~5 (10 replays)
def test_replay_is_centred_over_seeds_with_one_rate_at_every_depth():
    """Lag-1 0.4, one rate at every depth, 10 seeds: the mean error within +-0.1 % at every K 1-4
    (issue 45's bar; here -0.04 to +0.09 %, the benchmark's 20 seeds -0.01 to +0.03 %). A trimmed
    last step read as a rejection (-0.2 % at every K) fails it. The spread is a guard, not the
    issue's bar: 95th percentile <= 1 % (0.18-0.81 % here; 0.20-0.59 % on seeds 0-19). Issue 45's
    0.5 % cannot hold at K=4 at this size: the truth's own chain, unfitted, leaves 0.58 %; at 512
    requests it holds (docs/lab/precision-replay.md)."""
    errs = _errors("long")
    assert (np.abs(errs.mean(axis=0)) <= 0.001).all(), errs.mean(axis=0)
    assert (np.quantile(np.abs(errs), 0.95, axis=0) <= 0.01).all(), np.quantile(np.abs(errs), 0.95, axis=0)


@pytest.mark.slow  # 26 s at load ~5 (10 replays)
def test_replay_reads_at_most_a_little_low_with_rates_falling_by_depth():
    """Lag-1 0.3, rates falling 15 % per depth, 10 seeds: the mean error within +-0.25 % at every K
    1-4 and the 95th percentile of |error| <= 1 %. A guard on the state issue 45 left open: the
    benchmark's seeds 0-19 read -0.12 to -0.16 % on average (the issue asks +-0.1 %); seeds 100-109
    -0.09 to +0.03 %. Most of seeds 0-19's low reading is those seeds' draw (the truth's own chain
    reads -0.03 to -0.13 % there, -0.01 to -0.04 % over 100 seeds); the fit's own part, paired
    against that oracle over 60 seeds, is -0.07 / -0.06 / -0.02 / +0.05 % at K 1-4 (SE 0.01-0.02 %):
    a two-state chain fitted to three states (docs/lab/precision-replay.md, third pass)."""
    errs = _errors("sticky-depth")
    assert (np.abs(errs.mean(axis=0)) <= 0.0025).all(), errs.mean(axis=0)
    assert (np.quantile(np.abs(errs), 0.95, axis=0) <= 0.01).all(), np.quantile(np.abs(errs), 0.95, axis=0)


def test_imputation_is_the_conditional_match_probability_given_the_state_path():
    """Given a state path a position's match at depth j is P(u < e_j | what was seen there): the
    replay takes that expectation instead of drawing u. One state's rates 0.8 / 0.6 (both chain
    states alike, so the path does not matter): seen matched at depth 2, depth 1 matches surely;
    seen rejected at depth 2, depth 1 matches with (0.8 - 0.6) / 0.4; unseen, with the rates; and
    the draws of the old imputation average to the same numbers."""
    from dsdprof.measure.vllm.replay import UNKNOWN
    from tests.replay_sets import sample_matches

    chain = (np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.1, 0.9]]), np.array([[0.8, 0.6], [0.8, 0.6]]))
    x = np.array([[1, 0, UNKNOWN, 1, 0]], dtype=np.int8)
    depth = np.array([[2, 2, 0, 1, 1]], dtype=np.int8)
    m = sample_matches(x, depth, chain, np.random.default_rng(0))[0]
    expect = [[1.0, 1.0], [0.5, 0.0], [0.8, 0.6], [1.0, 0.75], [0.0, 0.0]]
    assert m.shape == (5, 2) and np.allclose(m, expect, atol=1e-6), m
    rng = np.random.default_rng(1)  # one uniform per position, conditioned on what was seen, drawn
    u = rng.random((200_000, 5))
    obs = np.array([0.6, 0.6, 1.0, 0.8, 0.8])
    u = np.where(x[0] == 1, u * obs, np.where(x[0] == 0, obs + u * (1 - obs), u))
    drawn = (u[..., None] < np.array([0.8, 0.6])).mean(axis=0)
    assert np.allclose(drawn, expect, atol=0.005), drawn


def test_the_chain_is_fitted_on_every_request_of_a_group_past_the_old_cap():
    """320 requests (past the old cap of 256): the default fit is the fit on every request, not on
    256 of them (which read sticky-depth 0.01-0.03 % lower at 512 requests; docs/lab/
    precision-replay.md, fourth pass); a cap of 256 gives other ALs here."""
    from dsdprof.measure.vllm.replay import FIT_ROWS, replay_acceptance

    run = paired_run(BY_NAME["sticky-depth"], 0, waves=40, batch_size=8, length=40)
    block = {w: w for w in range(40)}

    def al(**kw) -> list[float]:
        rep = replay_acceptance(run.reqs, (0, 1, 2, 3, 4), block, imputations=2, jackknife=False, **kw)
        return [rep.acceptance_length[k] for k in (1, 2, 3, 4)]

    assert len(run.reqs) == 320 and (FIT_ROWS is None or FIT_ROWS >= 512)
    assert al() == al(fit_rows=None)
    assert al() != al(fit_rows=256)
