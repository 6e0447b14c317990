"""The paired design: every K of a batch size inside the same waves, K switched per step.

The K sequence's balance, the planner, the scheduler driving vLLM's real Scheduler/AsyncScheduler
(fake runner of known acceptance: tests/vllm_fakes.py), the per-K rows from a shared trace, and
the paired bootstrap against synthetic sets with a known truth and drift shared by every K."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from dsdprof.measure.engine import MODE_DSD, MODE_VANILLA, plan_cells
from dsdprof.measure.vllm.worker import PAIRED_HOLD, k_sequence

KS = (0, 1, 2, 3, 4)


@pytest.mark.parametrize("ks", [KS, (1, 2, 3, 4), (0, 2)])
def test_k_sequence_is_carry_over_balanced(ks):
    m = len(ks)
    rows = [k_sequence(ks, w, 1) for w in range(m if m % 2 == 0 else 2 * m)]
    assert all(sorted(r) == sorted(ks) for r in rows)
    firsts = Counter(r[0] for r in rows)
    assert len(set(firsts.values())) == 1 and set(firsts) == set(ks)
    follows = Counter((a, b) for r in rows for a, b in zip(r, r[1:]))
    assert len(follows) == m * (m
                                - 1) and len(set(follows.values())) == 1  # each K after each other K equally
    assert k_sequence(ks, 3, 2) == [k for k in k_sequence(ks, 3, 1) for _ in range(2)]


def test_paired_plan_groups_every_k_of_a_batch_size():
    cells = plan_cells([1, 4], [0, 1, 2], 2, MODE_DSD, paired=True)
    assert len(cells) == 2 * 2 * 4
    dsd = [c for c in cells if c.mode == MODE_DSD]
    assert all(c.group == (0, 1, 2) for c in dsd)
    vanilla_first = [cells[i].mode == MODE_VANILLA for i in range(0, len(cells), 4)]
    assert True in vanilla_first and False in vanilla_first  # vanilla before and after the group, rotated
    assert all(c.group == () for c in plan_cells([1], [0, 1], 1, MODE_DSD))  # cells design unchanged


def paired_rows(t, seed, repeats=2, waves=10, shared=0.15, own=0.02, al_noise=0.01):
    """Rows of the paired design over a known truth: wave ``w`` of a repeat is one wave for every K,
    its slowdown (lognormal ``shared``, a drifting machine) hits every K alike; ``own``: each K's
    own noise within the wave."""
    rng = np.random.default_rng(seed)
    rows = []
    for b, by_k in t.items():
        for r in range(repeats):
            drift = rng.lognormal(0.0, shared, waves)
            for k, (al, itl) in by_k.items():
                s_itl = itl * drift * rng.lognormal(0.0, own, waves)
                s_al = (np.ones(waves) if k == 0
                        else np.clip(al * rng.lognormal(0.0, al_noise, waves), 1.0, k + 1.0))
                rows.append({"mode": "dsd", "design": "paired", "batch_size": b, "num_spec_tokens": k,
                             "repeat": r,
                             "status": "ok", "acceptance_length": float(s_al.mean()),
                             "itl_s": float(s_itl.mean()),
                             "sample_acceptance_length": s_al.tolist(), "sample_itl_s": s_itl.tolist()})
    return pd.DataFrame(rows)


def test_paired_bootstrap_cancels_drift_every_k_shares():
    """15 % wave-to-wave drift shared by every K, 2 % of each K's own: resampling the shared waves as
    blocks gives intervals several times narrower than resampling each K on its own, more points
    decided, and every decided point is the truth's."""
    from dsdprof.decide.analysis import analyze
    from tests.synthetic import regret, truth, truth_goodput, truth_k

    t = truth("dense", batch_sizes=(1, 4, 16, 64))
    tk, tg = truth_k(t), truth_goodput(t)
    paired_w, cells_w, paired_dec, cells_dec = [], [], 0, 0
    for seed in range(4):
        rows = paired_rows(t, seed)
        paired = analyze(rows)
        cells = analyze(rows.assign(design="cells"))
        for res, widths in ((paired, paired_w), (cells, cells_w)):
            c = res.cells[res.cells.ratio_to_best < 1.0]
            widths.extend((c.ratio_high - c.ratio_low) / 2)
        paired_dec += int(paired.optimal.decided.sum())
        cells_dec += int(cells.optimal.decided.sum())
        assert all(r.k == tk[r.batch_size] for r in paired.optimal.itertuples() if r.decided)
        assert max(regret(dict(zip(paired.optimal.batch_size, paired.optimal.k)), tg).values()) <= 0.02
    assert np.median(paired_w) < np.median(cells_w) / 3
    assert paired_dec > cells_dec


# ----------------------------------------------------------------------------- the scheduler

vllm = pytest.importorskip("vllm")

from dsdprof.measure.vllm.trace import CellFailure, read_trace, summarize_paired  # noqa: E402
from dsdprof.plugins import vllm_profiling as vs  # noqa: E402
from tests.vllm_fakes import FakeRunner, drive, make_request, make_scheduler, vllm_config  # noqa: E402

TOKEN = "t" * 32  # conftest.RUN_TOKEN: the secret of conftest's run_env fixture


def run_group(tmp_path, mode, batch_size, ks, accept, waves=4, output_len=48, hold=PAIRED_HOLD):
    cls = vs.TracingAsyncScheduler if mode == "async" else vs.TracingScheduler
    sched = make_scheduler(cls, vllm_config(max(ks), 8))
    runner = FakeRunner(accept)
    for w in range(waves):
        for i in range(batch_size):
            extra = {"dsdprof_run": TOKEN, "dsdprof_wave_size": batch_size, "dsdprof_trace": "g",
                     "dsdprof_wave": w, "dsdprof_k_sequence": k_sequence(ks, w, hold)}
            sched.add_request(make_request(f"w{w}-r{i}", 24 + i, output_len, extra))
        drive(sched, runner, mode, True)
    return read_trace(tmp_path / "g.jsonl"), runner, sched


@pytest.mark.parametrize("mode", ["sync", "async", "sync_bq"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_every_k_in_the_same_waves_is_exact(run_env, mode, batch_size):
    """Accepting the first 2 drafts (whatever K): AL(K) = 1 + min(K, 2) exactly, per K, pooled and
    from the K's own steps, from one shared trace; a step verifies the drafts the previous one
    proposed, and pure steps did one K throughout."""
    steps, runner, sched = run_group(run_env, mode, batch_size, KS, lambda r, s, d: min(d, 2))
    assert {s.k_next for s in steps if s.wave >= 0} <= set(KS)
    by_k = summarize_paired(steps, batch_size, KS, max(KS))
    waves = {len(t.sample_itl_s) for t in by_k.values()}
    assert len(waves) == 1 and waves.pop() >= 1  # every K holds the same waves
    for k, t in by_k.items():
        assert t.acceptance_length == pytest.approx(1 + min(k, 2), rel=1e-12)
        assert t.acceptance_length_own == pytest.approx(1 + min(k, 2), rel=1e-12) and not t.acceptance_check
        assert all(x == pytest.approx(1 + min(k, 2), rel=1e-12) for x in t.sample_acceptance_length)
        assert t.steady_steps >= 1 and t.drafted_per_draft == pytest.approx(k if k else 0.0)
    assert sched.dsdprof_ignored == 0


def test_acceptance_that_depends_on_k_fails_the_pooling_check(run_env):
    """Rejecting the last draft whatever K (d - 1 of d accepted): position j's acceptance depends on
    K, so the pooled estimate is wrong for this pair, and the check says so for the Ks it moves."""
    steps, _, _ = run_group(run_env, "sync", 2, KS, lambda r, s, d: d - 1)
    by_k = summarize_paired(steps, 2, KS, max(KS))
    for k, t in by_k.items():
        assert t.acceptance_length_own == pytest.approx(max(k, 1), rel=1e-12)  # the K's own steps: exact
    assert by_k[0].acceptance_check == ""  # K=0 drafts nothing: 1 either way
    assert "acceptance: K=1" in by_k[1].acceptance_check  # pooled: position 1 accepted by K >= 2's drafts
    assert by_k[1].acceptance_length > 1.5


def test_pooled_acceptance_uses_every_k_per_position():
    """Position j's rate pools every request-step that drafted >= j; the K's own steps are kept."""
    from dsdprof.measure.vllm.trace import Step

    def step(wave, t, drafted, accepted, k_next):
        n = len(drafted)
        return Step(wave, t, n, n, 0, 0, tuple(drafted), tuple(a + 1 for a in accepted), {},
                    (False,) * n, tuple(accepted), 0, tuple(str(i) for i in range(n)), k_next)

    # one wave, BS 1: K sequence 1, 1, 2, 2 (a step verifies the previous step's K)
    steps = [step(0, 0.0, [0], [0], 1), step(0, 1.0, [1], [1], 1), step(0, 2.0, [1], [0], 2),
             step(0, 3.0, [2], [2], 2), step(0, 4.0, [2], [1], 2)]
    by_k = summarize_paired(steps, 1, (1, 2), 2, acceptance="pooled", settle=0)
    # position 1: 4 drafts, 3 accepted; position 2: 2 drafts, 1 accepted
    assert by_k[1].acceptance_length == pytest.approx(1 + 3 / 4)
    assert by_k[2].acceptance_length == pytest.approx(1 + 3 / 4 + 1 / 2)
    assert by_k[2].acceptance_per_pos == pytest.approx((3 / 4, 1 / 2))
    assert by_k[1].acceptance_length_own == pytest.approx(1.5)
    assert by_k[2].acceptance_length_own == pytest.approx(2.5)
    assert by_k[2].tpot_s == pytest.approx(by_k[2].itl_s / by_k[2].acceptance_length)


def test_pure_blocks():
    from dsdprof.measure.vllm.trace import pure_blocks

    assert pure_blocks({0: {0, 1, 2}, 1: {0, 1, 2}}) == {0: 0, 1: 1, 2: 2}
    assert pure_blocks({0: {0, 2}, 1: {1, 3}, 2: {1, 4}}, {5}) == {0: 0, 1: 0, 2: 2, 3: 2, 4: 2, 5: 2}
    assert pure_blocks({0: {0}, 1: set()}) == {}


def test_a_k_the_sequence_never_ran_fails_the_group(run_env):
    steps, _, _ = run_group(run_env, "sync", 2, (1, 3), lambda r, s, d: d - 1)
    with pytest.raises(CellFailure, match="paired design"):
        summarize_paired(steps, 2, (1, 2, 3), 3)


def test_bad_k_sequences_are_ignored_and_counted(run_env):
    from dsdprof.plugins.vllm_profiling import parse_keys

    for bad in ([], [9], "1,2", [1, True], [1] * 5000):
        p, was_bad = parse_keys({"dsdprof_run": TOKEN, "dsdprof_k_sequence": bad}, TOKEN, str(run_env), 4, 8)
        assert was_bad and p is not None and p.k_seq == ()
    p, was_bad = parse_keys({"dsdprof_run": "x" * 32, "dsdprof_k_sequence": [1, 2]}, TOKEN,
                            str(run_env), 4, 8)
    assert p is None  # without the run's secret nothing is read
