"""The replay's vectorized chain (:mod:`dsdprof.measure.vllm.replay_chain`: fits stacked, positions
time-major) and fixed-K replay against the pure-Python loops they replaced
(:mod:`tests.measure.replay_reference`): the same numbers within float tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from dsdprof.measure.vllm import replay as new
from dsdprof.measure.vllm.replay_chain import Stack, posterior
from tests.measure import replay_reference as ref
from tests.replay_sets import CASES, KS, paired_run, sample_matches

BY_NAME = {c.name: c for c in CASES}


@pytest.mark.parametrize("case,fit_rows", [("sticky-depth", None), ("long", 12)])
def test_replay_acceptance_is_the_loops_result(case, fit_rows):
    """Point, jackknife samples, plain block samples and the chosen model of a small simulated
    paired run (4 waves x BS 4 x 40 tokens; sticky-depth with rates falling by depth, long with one rate,
    the latter fitted on 12 of the 16 requests) equal the old loops' to 1e-9."""
    run = paired_run(BY_NAME[case], 3, waves=4, batch_size=4, length=40)
    block = {w: w for w in range(4)}
    got = new.replay_acceptance(run.reqs, KS, block, fit_rows=fit_rows)
    want = ref.replay_acceptance(run.reqs, KS, block, fit_rows=fit_rows)
    assert got.model == want.model and got.unknown_share == want.unknown_share
    for k in KS:
        assert got.acceptance_length[k] == pytest.approx(want.acceptance_length[k], rel=1e-9, abs=0)
        for b in range(4):
            assert got.by_block[k][b] == pytest.approx(want.by_block[k][b], rel=1e-9, abs=0), (k, b)
            assert got.plain_by_block[k][b] == pytest.approx(want.plain_by_block[k][b], rel=1e-9, abs=0)
    moved = new.replay_acceptance(run.reqs, KS, block, imputations=1, fit_rows=fit_rows)
    assert moved.acceptance_length[4] != got.acceptance_length[4]  # the comparison can tell draws apart


def test_stacked_forward_backward_is_each_fits_own():
    """Three fits with their own chains, stacked: each fit's posterior, expected transitions and
    log-likelihood equal the loop's over its requests alone."""
    rng = np.random.default_rng(7)
    kmax, width = 3, 50
    x = rng.choice(np.array([-1, 0, 1], dtype=np.int8), size=(30, width), p=[0.3, 0.3, 0.4])
    depth = rng.integers(1, kmax + 1, size=x.shape).astype(np.int8)
    rows = [np.arange(0, 12), np.arange(8, 30), np.arange(0, 30, 3)]
    pi = rng.dirichlet([1, 1], size=3)
    a = rng.dirichlet([5, 1], size=(3, 2))
    e = rng.uniform(0.1, 0.9, size=(3, 2, kmax))
    g0, g1, xi, ll = posterior(Stack.of(x, depth, rows, kmax), (pi, a, e))
    start = 0
    for f, r in enumerate(rows):
        gamma, xi_f, ll_f, _ = ref._forward_backward(ref._emissions(x[r], depth[r], e[f]), pi[f], a[f])
        sl = slice(start, start + len(r))
        assert np.allclose(g0[:, sl].T, gamma[..., 0], rtol=1e-12, atol=1e-14)
        assert np.allclose(g1[:, sl].T, gamma[..., 1], rtol=1e-12, atol=1e-14)
        assert np.allclose(xi[f], xi_f, rtol=1e-12) and ll[f] == pytest.approx(ll_f, rel=1e-12)
        start += len(r)


def test_replay_of_every_k_at_once_is_each_ks_own():
    """The fixed-K replay of K 1-5 at once (given out of order) over uneven lengths equals the
    loop's per K."""
    rng = np.random.default_rng(2)
    m = rng.uniform(size=(9, 40, 5)).astype(np.float32)
    lengths = rng.integers(5, 34, size=9).astype(float)
    ks = (3, 1, 5, 2, 4)
    tokens, steps = new.replay_ks(np.ascontiguousarray(m.transpose(1, 2, 0)), lengths, ks)
    for i, k in enumerate(ks):
        tk, sk = ref.replay_one_k(m, lengths, k)
        assert np.allclose(tokens[i], tk, rtol=1e-12) and np.allclose(steps[i], sk, rtol=1e-12)


def test_match_probabilities_take_the_loops_random_numbers():
    """One imputation from the same generator: the same state paths and match probabilities."""
    run = paired_run(BY_NAME["mild-depth"], 1, waves=2, batch_size=4, length=50)
    x = np.array([np.pad(r.x, (0, 80 - len(r.x)), constant_values=-1) for r in run.reqs], dtype=np.int8)
    depth = np.array([np.pad(r.depth, (0, 80 - len(r.depth))) for r in run.reqs], dtype=np.int8)
    chain = (np.array([0.4, 0.6]), np.array([[0.9, 0.1], [0.2, 0.8]]),
             np.array([[0.9, 0.8, 0.7, 0.6], [0.5, 0.4, 0.3, 0.2]]))
    got = sample_matches(x, depth, chain, np.random.default_rng(5))
    want = ref.sample_matches(x, depth, chain, np.random.default_rng(5))
    assert got.shape == want.shape and np.array_equal(got, want)
