"""The paired design's standard error includes the replay chain's fitting noise (jackknife over wave
blocks, :func:`dsdprof.measure.vllm.replay.replay_acceptance`).

Simulated synthetic paired traces (vLLM's walk, K 1-4 held PAIRED_HOLD steps each in the waves'
order): the row's samples centre on its AL, and over independent runs their standard error is
the spread of the row's AL, where the blocks' ALs under one fit understate it
(docs/lab/synthetic-truth.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dsdprof.measure.vllm.replay import replay_acceptance, request_matches
from dsdprof.measure.vllm.worker import PAIRED_HOLD, k_sequence

KS = (1, 2, 3, 4)
RATES = [0.8, 0.6, 0.45, 0.3]
COND = np.array([RATES[0]] + [RATES[i] / RATES[i - 1] for i in range(1, len(RATES))])


def paired_trace(rng: np.random.Generator, waves: int, bs: int, length: int):
    """The requests' match sequences of a simulated paired run under the rates."""
    records, wave_of = [], {}
    for w in range(waves):
        seq = k_sequence(KS, w, PAIRED_HOLD)
        pos, step = np.ones(bs, dtype=int), 0
        while (pos < length).any():
            k = seq[step % len(seq)]
            step += 1
            live = np.flatnonzero(pos < length)
            acc = np.cumprod(rng.random((len(live), k)) < COND[:k], axis=1).sum(axis=1)
            for r, a in zip(live, acc):
                records.append((f"{w}-{r}", (k, int(a), int(a) + 1)))
                wave_of[f"{w}-{r}"] = w
                pos[r] += a + 1
    return request_matches(records, {rid: length for rid in wave_of}, wave_of)


def _se(samples: dict[int, float]) -> float:
    v = np.array(list(samples.values()))
    return float(v.std(ddof=1) / math.sqrt(len(v)))


def test_jackknife_samples_centre_on_the_row_and_leave_its_point_alone():
    reqs = paired_trace(np.random.default_rng(3), waves=4, bs=4, length=20)
    block = {w: w for w in range(4)}
    jk = replay_acceptance(reqs, (0, *KS), block)
    plain = replay_acceptance(reqs, (0, *KS), block, jackknife=False)
    assert jk.acceptance_length == plain.acceptance_length
    assert plain.by_block == plain.plain_by_block == jk.plain_by_block
    for k in KS:
        assert set(jk.by_block[k]) == set(range(4))
        assert np.mean(list(jk.by_block[k].values())) == pytest.approx(jk.acceptance_length[k], abs=1e-12)
        assert jk.by_block[k] != plain.by_block[k]  # refitted without each block
    assert jk.by_block[0] == {b: 1.0 for b in range(4)}
    one = replay_acceptance(reqs, (0, *KS), {0: 0})  # one block: nothing to leave out
    assert one.by_block == one.plain_by_block


@pytest.mark.slow
def test_jackknife_error_is_the_spread_over_runs_at_short_requests():
    """Over 24 independent simulated runs (8 waves x BS 16 x 32 tokens, the chain fitted on 48 of
    the 128 requests, as a BS-64 run of 10 waves fits it on 256 of 640) the samples' standard
    error (rms over the runs, pooled over K 1-4) is 0.85-1.33 times the spread of the row's AL
    (1.11 when written); the blocks' ALs under one fit give under 0.8 of it (0.77; 1.3-1.75 times
    too small in the lab's runs), so this fails without the refit."""
    runs, waves = 24, 8
    al = {k: [] for k in KS}
    se = {k: [] for k in KS}
    plain = {k: [] for k in KS}
    for seed in range(runs):
        rep = replay_acceptance(paired_trace(np.random.default_rng(seed), waves, 16, 32), (0, *KS),
                                {w: w for w in range(waves)}, fit_rows=48)
        for k in KS:
            al[k].append(rep.acceptance_length[k])
            se[k].append(_se(rep.by_block[k]))
            plain[k].append(_se(rep.plain_by_block[k]))
    spread2 = np.array([np.var(al[k], ddof=1) for k in KS])
    ratio = math.sqrt(np.mean([np.mean(np.square(se[k])) for k in KS] / spread2))
    ratio_plain = math.sqrt(np.mean([np.mean(np.square(plain[k])) for k in KS] / spread2))
    assert 0.85 <= ratio <= 1.33, (ratio, ratio_plain)
    assert ratio_plain < 0.8, (ratio, ratio_plain)
