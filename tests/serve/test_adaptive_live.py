"""AdaptiveKSelector as a controller: hostile input, the table's own K, live step times, recovery.

Closed loops run through tests/support/simulate.py (a stdlib engine with known truth)."""

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from dsdprof.formats.ktable import ranges_from_points
from dsdprof.serve.adaptive import PROBE_STEPS, AdaptiveKSelector
from tests.support.simulate import (
    Phase,
    best_fixed,
    chain_al,
    first_within,
    reach_step,
    served_goodput,
    simulate,
    synthetic_table,
)

SIZES = (1, 2, 4, 8, 16)
P0 = (0.8,) * 4


def _interp(v0, v2, v4):
    return {0: v0, 1: (v0 + v2) / 2, 2: v2, 3: (v2 + v4) / 2, 4: v4}


def _by_bs(row):
    """Step times at every batch size: a row at BS 1, verification growing with BS * (K + 1)."""
    return {b: {k: t * (1 + 0.03 * (b - 1) * (1 + k) / 5) for k, t in row.items()} for b in SIZES}


FAR_TABLE = _by_bs(_interp(0.015, 0.021, 0.025))  # the table: 15/21/25 ms at K 0/2/4
FAR_TRUE = _by_bs(_interp(0.033, 0.088, 0.140))  # ... served on a pair that runs 33/88/140 ms
SPEC = _by_bs(_interp(0.030, 0.036, 0.040))  # a pair where speculation pays


def state(sel):
    return (sel.ks, sel.version, sel.acceptance(), sel.acceptance_interval(),
            {b: {k: sel.step_time(b, k) for k in range(5)} for b in SIZES}, sel.lookup_list(64))


# ---------------------------------------------------------------- sound statistics

HOSTILE_COUNTS = [
    (math.inf, [1]), (math.nan, [1]), (-3, [1]), (10**18, [1]), (1 << 30, [1]), (2.0, [1]), ("4", [1]),
    (True, [1]), (None, [1]), (4, [5]), (4, [1, 2]), (4, [-1]), (4, [math.inf]), (4, [math.nan]),
    (4, [1.5]), (4, ["1"]), (4, None), (4, "11"), (4, []), (4, [10**18]), (4, {0: 1}), (4, [0] * 129),
]
HOSTILE_DRAFTED = [([2, 1], [4]), ([2, 1], [4, 1, 1]), ([2, 1], [4, 5]), ([2, 1], [4, 0]), ([2], [5]),
                   ([2, 1], [math.nan, 1]), ([2, 1], "41")]
HOSTILE_STEPS = [(1, 2, math.nan), (1, 2, math.inf), (1, 2, -0.01), (1, 2, 0.0), (1, 2, 1e9), (1, 2, "0.1"),
                 (0, 2, 0.1), (-1, 2, 0.1), (True, 2, 0.1), (1.0, 2, 0.1), (1, 2.0, 0.1), (1, None, 0.1),
                 (0, 2, None), (1, 2, True)]


def test_hostile_counts_are_rejected_before_any_state_changes():
    sel = AdaptiveKSelector(synthetic_table(SPEC, P0), rebuild_every=1)
    for _ in range(50):  # some honest evidence first, so a partial update would show
        sel.observe(4, [3, 2, 2, 1], batch_size=4)
        sel.observe_step(4, 4, 0.05)
    sel.rebuild()
    before = state(sel)
    n = 0
    for num, acc in HOSTILE_COUNTS:
        assert sel.observe(num, acc) is False
        n += 1
    for acc, drafted in HOSTILE_DRAFTED:
        assert sel.observe(4, acc, drafted) is False
        n += 1
    for args in HOSTILE_STEPS:
        assert sel.observe_step(*args) is False
        n += 1
    assert sel.observe(4, [1], batch_size="4") is False
    assert sel.rejected == n + 1
    assert state(sel) == before


def test_one_step_cannot_capture_the_estimate():
    sel = AdaptiveKSelector(synthetic_table(SPEC, P0), rebuild_every=10**9)
    fresh = sel.acceptance()[0]
    sel.observe((1 << 24), [0], batch_size=1)  # the largest valid step, every draft rejected
    assert sel.acceptance()[0] >= 0.5 * fresh  # weighs at most what the estimate held (the prior)
    for _ in range(400):
        sel.observe(8, [6, 5, 4, 3], batch_size=8)
    settled = sel.acceptance()[0]
    sel.observe((1 << 24), [0], batch_size=8)
    assert sel.acceptance()[0] >= 0.85 * settled  # at most half_life / 8 drafts: <= ~12 % of a settled one


def _table_with_undecided_point():
    """The SPEC table, but BS 4 serves K=2 though K=4 is ~5 % faster there (an undecided point)."""
    table = synthetic_table(SPEC, P0)
    points = [(p["batch_size"], 2 if p["batch_size"] == 4 else p["k"]) for p in table["points"]]
    table["points"] = [{"batch_size": b, "k": k, "decided": b != 4} for b, k in points]
    table["ranges"] = ranges_from_points(points)
    return table


@pytest.mark.parametrize("make", [lambda: synthetic_table(SPEC, P0), _table_with_undecided_point,
                                  lambda: synthetic_table(FAR_TABLE, P0, tolerance=0.05)])
def test_the_table_k_is_kept_at_the_profile(make):
    table = make()
    sel = AdaptiveKSelector(table, rebuild_every=1, explore_every=0)
    table_ks = {p["batch_size"]: p["k"] for p in table["points"]}
    assert sel.ks == table_ks and sel.table_ks == table_ks
    assert sel.rebuild() is False and sel.ks == table_ks
    itl = {(c["batch_size"], c["k"]): c["itl_s"] for c in table["cells"]}
    for _ in range(300):  # the profile: acceptance (to the count) and step times as in the table
        for b, k in table_ks.items():
            if k:
                sel.observe(1000, [round(1000 * 0.8**i) for i in range(1, k + 1)], batch_size=b)
            sel.observe_step(b, k, itl[(b, k)])
    assert sel.ks == table_ks and sel.version == 0


def test_a_batch_size_profiled_below_the_pooled_acceptance_is_not_shifted_twice():
    """BS 1 was profiled at 0.5 per position (the pool: 0.8). Live BS-1 traffic at 0.5 is its
    profile: K stays. (Shifting by live - pooled on top of BS 1's own AL drove K to 0.)"""
    low = synthetic_table({1: SPEC[1]}, (0.5,) * 4)
    high = synthetic_table({b: SPEC[b] for b in SIZES[1:]}, P0)
    table = dict(high, cells=low["cells"] + high["cells"],
                 points=low["points"] + high["points"],
                 ranges=ranges_from_points([(p["batch_size"], p["k"])
                                            for p in low["points"] + high["points"]]))
    sel = AdaptiveKSelector(table, explore_every=0)
    kt = sel.ks[1]
    assert kt >= 1
    res = simulate(sel, 1, [Phase(3000, (0.5,) * 4)], SPEC[1], seed=3)
    assert set(res.ks) == {kt} and sel.ks[1] == kt


# ---------------------------------------------------------------- live step times and exploration

@pytest.mark.parametrize("accept", [P0, (0.55, 0.45, 0.4, 0.35)], ids=["profiled", "low"])
@pytest.mark.parametrize("b", SIZES)
def test_far_shifted_pair_reaches_the_best_fixed_k_or_vanilla_within_2000_steps(b, accept):
    """Reach: every later step within 3 % of the best fixed K -- the selector's margin (2 %) plus
    its allowance for a thinly observed K (margin / 2): at BS 2 K=1 is 2.4 % behind vanilla, and
    in about 1 seed in 12 (before issue 31's machine factor too: 6 of seeds 40-139 both ways) a
    probe that makes K=1 look faster moves it there late, where the hysteresis keeps it."""
    table = synthetic_table(FAR_TABLE, P0)
    best_k, best = best_fixed(accept, FAR_TRUE[b])
    assert best_k == 0 and table["points"][SIZES.index(b)]["k"] >= 3  # vanilla wins; the table says 3-4
    for seed in range(2):
        sel = AdaptiveKSelector(table)
        res = simulate(sel, b, [Phase(4000, accept)], FAR_TRUE[b], seed=seed)
        reach = reach_step(res, accept, FAR_TRUE[b], 0, 4000, tolerance=0.03)
        assert reach is not None and reach <= 2000, (b, seed, reach)
        assert served_goodput(res, accept, FAR_TRUE[b], 2000, 4000) >= 0.98 * best
        assert abs(sel.step_time(b, 0) / FAR_TRUE[b][0] - 1) < 0.05  # vanilla's step time was learnt


@pytest.mark.parametrize("factor", [2.0, 0.5])
def test_a_table_whose_speculative_step_times_are_wrong_by_2x(factor):
    """Within 2 % of the best fixed K; where the table's own K is within 6 % of it, within 2 % of
    the table's K (never below the table). That is BS 16 at 0.5x: K=4 is 5.6 % better than the
    table's K=3, and only the probes show it (one timed K=4 step per 512 steps, the evidence
    decaying at half-life 256: never more than ~1.3 steps). The selector leaves the table's K on
    step times only beyond 2 standard errors of their contrast (tests/serve/test_selector_load.py);
    at 3 % step noise that is a gain above ~6 %, and a move on less is the move on noise that took
    rollout A's BS 1 from K=4 to K=0 on a loaded host. (Before that rule this case reached K=4.)"""
    true = {b: {k: r[0] + factor * (t - r[0]) for k, t in r.items()} for b, r in SPEC.items()}
    table = synthetic_table(SPEC, P0)
    for b in SIZES:
        sel = AdaptiveKSelector(table)
        kt = sel.ks[b]
        res = simulate(sel, b, [Phase(3000, P0)], true[b], seed=b)
        _, best = best_fixed(P0, true[b])
        at_table = chain_al(P0, kt) / true[b][kt]
        floor = best if at_table < 0.94 * best else at_table
        assert served_goodput(res, P0, true[b], 1000, 3000) >= 0.98 * floor, b


def test_exploration_is_bounded_and_probes_neighbours():
    sel = AdaptiveKSelector(synthetic_table(SPEC, P0))
    res = simulate(sel, 4, [Phase(10_000, P0)], SPEC[4], seed=1)
    assert sum(res.probe) / len(res.probe) <= 0.01
    assert sum(res.probe) == PROBE_STEPS * (10_000 // sel.explore_every)
    k = sel.ks[4]
    assert {kk for kk, p in zip(res.ks, res.probe) if p} == ({k - 1} if k == 4 else {k - 1, k + 1})
    assert AdaptiveKSelector(synthetic_table(SPEC, P0), explore_every=0).explore(8) is None
    with pytest.raises(ValueError, match="explore_every"):
        AdaptiveKSelector(synthetic_table(SPEC, P0), explore_every=50)


def test_every_position_has_an_estimate_with_uncertainty_that_shrinks_with_evidence():
    sel = AdaptiveKSelector(synthetic_table(SPEC, P0), explore_every=0)
    wide = [hi - lo for lo, hi in sel.acceptance_interval()]
    assert len(wide) == 4
    for _ in range(200):
        sel.observe(16, [13, 10, 8, 6], batch_size=16)
    narrow = [hi - lo for lo, hi in sel.acceptance_interval()]
    assert all(n < w / 3 for n, w in zip(narrow, wide))


# ---------------------------------------------------------------- symmetric recovery

@pytest.mark.slow  # long simulated closed loops, 2-5 s each
@pytest.mark.parametrize("low", [0.3, 0.1])
@pytest.mark.parametrize("b", [1, 4])
def test_recovery_takes_no_longer_than_leaving(b, low):
    """Profile, then acceptance drops, then it returns: drafts until K is within 2 % of the best
    (the shifted optimum, then the table's own K) -- coming back is not slower than leaving."""
    table = synthetic_table(SPEC, P0)
    shifted = (low,) * 4
    leave, back, kept = [], [], []
    for seed in range(3):
        sel = AdaptiveKSelector(table)
        res = simulate(sel, b, [Phase(2000, P0), Phase(4000, shifted), Phase(30_000, P0)], SPEC[b], seed=seed)
        _, s1, s2 = res.phase_start
        leave.append(first_within(res, shifted, SPEC[b], s1, s2))
        back.append(first_within(res, P0, SPEC[b], s2, len(res.ks)))
        kept.append(res.ks[-1])
    assert None not in leave and None not in back
    assert statistics.median(back) <= 1.5 * statistics.median(leave), (leave, back)
    assert statistics.median(leave) <= 1000
    assert set(kept) == {table["points"][SIZES.index(b)]["k"]}


def test_chain_al_and_best_fixed():
    assert chain_al((0.5, 0.5), 2) == pytest.approx(1.75)
    assert best_fixed((0.0,) * 4, {0: 1.0, 1: 1.1})[0] == 0


@pytest.mark.parametrize("slow", [1.0, 1.3])
def test_a_k_seen_off_the_table_at_one_batch_size_moves_another_off_k0(slow):
    """The table's speculative step times are all 2x too slow (issue 18's run c), and the machine
    may run everything ``slow`` x slower than when profiled: BS 4, which the table serves K=0,
    never runs a speculative step by itself (it ran 300 steps at K=0 first), but BS 1 (served K=4),
    interleaved with it in the same time window as batch sizes are in serving (8 steps each, in
    turn), shows K=4 at half the table's time against BS 4's K=0 as profiled: BS 4 leaves K=0
    within 64 of its own steps and serves within 5 % of the best fixed K. (Without a K effect
    shared across batch sizes it stays at K=0. Blocks far apart in time would not do: the machine
    may have changed between them, issue 31.)"""
    true = {1: _interp(0.030, 0.033, 0.036), 4: _interp(0.030, 0.045, 0.060)}
    wrong = {b: {k: t * (2.0 if k else 1.0) for k, t in row.items()} for b, row in true.items()}
    table = synthetic_table(wrong, P0)
    assert [p["k"] for p in table["points"]] == [4, 0]
    live = {b: {k: slow * t for k, t in row.items()} for b, row in true.items()}
    best_k, best = best_fixed(P0, live[4])
    assert best_k >= 2 and best >= 1.5 / live[4][0]  # speculation pays 1.5x at BS 4 in truth
    for seed in range(3):
        sel = AdaptiveKSelector(table, explore_every=0)  # no probe: only the other batch size can tell
        simulate(sel, 4, [Phase(300, P0)], live[4], seed=seed)
        assert sel.ks[4] == 0
        ks4 = []
        for i in range(75):
            simulate(sel, 1, [Phase(8, P0)], live[1], seed=1000 * seed + 2 * i)
            ks4 += simulate(sel, 4, [Phase(8, P0)], live[4], seed=1000 * seed + 2 * i + 1).ks
        left = next((i for i, k in enumerate(ks4) if k), None)
        assert left is not None and left <= 64, (seed, left)
        goodput = sum(chain_al(P0, k) for k in ks4[200:]) / sum(live[4][k] for k in ks4[200:])
        assert goodput >= 0.95 * best, seed


@pytest.mark.parametrize("slow", [1.5, 0.67])
@pytest.mark.parametrize("b", SIZES[:4])
def test_a_slowdown_common_to_every_k_changes_no_k(b, slow):
    """Issue 31: the machine runs every K ``slow`` x for 2000 steps (a minute at 30 ms), then as
    before. The selector serves the same K throughout, probes included (the ratio of the K served
    to its neighbours is what decides, and a common factor leaves it). Before the machine factor
    the same loops changed K 0-12 times per run (0 in only 2 of the 24). (BS 16 is left
    out: its K=3 is within 1.5 % of K=4, so it moves on noise on a quiet machine too.)"""
    table = synthetic_table(SPEC, P0)
    moved = []
    for seed in range(3):
        sel = AdaptiveKSelector(table)
        res = simulate(sel, b, [Phase(1000, P0), Phase(2000, P0, slow=slow), Phase(2000, P0)],
                       SPEC[b], seed=seed)
        served = [k for k, probe in zip(res.ks, res.probe) if not probe]
        moved.append(sum(x != y for x, y in zip(served, served[1:])))
        k = sel.ks[b]
        assert abs(math.log(sel.step_time(b, k) / SPEC[b][k])) < 0.05  # back at the table's time
    assert moved == [0, 0, 0], moved


# ---------------------------------------------------------------- no flip-flop after a K change

def _far_shift_run(table, seed, steps=40, accept=0.4):
    """tests/engines/test_vllm_adaptive.py without vLLM: the demo table (K=4 at BS 1) served where each
    draft token is accepted with probability ``accept`` (the table: ~0.85), the machine 1.0-1.5x
    slower than the table throughout, 7 % step-time noise; the test's options. A step after a K
    change is mixed (no time; it verifies the old K's drafts), as the plugin reports it."""
    rng = random.Random(seed)
    itl = {c["k"]: c["itl_s"] for c in table["cells"] if c["batch_size"] == 1}
    sel = AdaptiveKSelector(table, prior_weight=2, half_life=32, rebuild_every=1)
    slow, ks, prev = rng.uniform(1.0, 1.5), [], None
    for _ in range(steps):
        k = sel.select(1)
        seconds = itl[k] * slow * rng.lognormvariate(0.0, 0.07)
        sel.observe_step(1, k, seconds if prev in (None, k) else None)
        drafted, n, accepted = k if prev is None else prev, 1, []
        for _ in range(drafted):
            n = n if n and rng.random() < accept else 0
            accepted.append(n)
        if drafted:
            sel.observe(1, accepted, batch_size=1)
        ks.append(k)
        prev = k
    return ks


def test_a_far_shift_leaves_the_tables_k_early_and_does_not_come_back():
    """Issue 31 follow-up: at BS 1 on low acceptance K left 4 and came back (4 -> 1 -> 4 -> 2 -> 4)
    in 15 of 100 seeds, on acceptance and step-time noise of the first steps after a change. A K
    left in the last SETTLE_STEPS steps now needs a wider band to return to."""
    table = json.loads((Path(__file__).parents[1] / "data" / "toy-dense-cpu-2026-11-29.json").read_text())
    bad = []
    for seed in range(100):
        ks = _far_shift_run(table, seed)
        first = next((i for i, k in enumerate(ks) if k != 4), len(ks))
        if first >= 15 or 4 in ks[first:]:
            bad.append((seed, "".join(map(str, ks))))
    assert len(bad) <= 1, bad
    # the check can disagree: at the table's own acceptance K=4 stays (it is the table's K there)
    assert all(_far_shift_run(table, seed, accept=0.885)[-10:] == [4] * 10 for seed in range(5))
