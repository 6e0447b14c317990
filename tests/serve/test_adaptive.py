"""AdaptiveKSelector on synthetic acceptance counts (vLLM's per-position counter layout)."""

import json
import random
import subprocess
import sys

import pytest

from dsdprof.formats.ktable import TableError, ranges_from_points
from dsdprof.runtime import AdaptiveKSelector as ReExported
from dsdprof.runtime import KSelector
from dsdprof.serve.adaptive import AdaptiveKSelector

SIZES = (1, 2, 4, 8, 16, 32, 64)
KS = range(0, 8)
MARGIN = 0.02


def itl(b, k):
    return 0.010 + 0.0005 * k + 0.00008 * b * (k + 1)  # fixed + draft + verify cost


def al(alpha, k):
    return sum(alpha**i for i in range(k + 1))


def goodputs(alpha, b):
    return {k: al(alpha, k) / itl(b, k) for k in KS}


def static_k(alpha, b, tolerance=0.02):
    g = goodputs(alpha, b)
    best = max(g.values())
    return min(k for k, v in g.items() if v >= best * (1 - tolerance))


def make_table(alpha=0.8):
    """A v2 table profiled at chain acceptance alpha (p_i = alpha^i)."""
    points = [(b, static_k(alpha, b)) for b in SIZES]
    return {
        "schema": "dsdprof.ktable/v2", "num_speculative_tokens": max(KS), "tolerance": 0.02,
        "ranges": ranges_from_points(points),
        "points": [{"batch_size": b, "k": k} for b, k in points],
        "cells": [{"batch_size": b, "k": k, "itl_s": itl(b, k), "acceptance_length": al(alpha, k),
                   "goodput": al(alpha, k) / itl(b, k)} for b in SIZES for k in KS],
        "acceptance_per_pos": [alpha**i for i in range(1, max(KS) + 1)],
    }


def counts(alpha, n, k, rng):
    """One step of n drafts of length k with conditional acceptance alpha: vLLM's per-position counts."""
    per_pos = [0] * k
    for _ in range(n):
        for i in range(k):
            if rng.random() >= alpha:
                break
            per_pos[i] += 1
    return per_pos


def serve(sel, alpha, steps, rng, sizes=SIZES):
    """Steps at random profiled batch sizes, each drafting the K the selector serves there."""
    for _ in range(steps):
        b = rng.choice(sizes)
        k = sel.select(b)
        if k:
            sel.observe(b, counts(alpha, b, k, rng))
    sel.rebuild()


def assert_near_optimal(sel, alpha):
    for b in SIZES:
        g = goodputs(alpha, b)
        assert g[sel.ks[b]] * (1 + MARGIN + 0.01) >= max(g.values()), (b, sel.ks, alpha)


def test_starts_as_the_static_table():
    table = make_table()
    sel = AdaptiveKSelector(table)
    static = KSelector.from_dict(table)
    assert sel.ks == {b: static_k(0.8, b) for b in SIZES}
    assert [sel.select(b) for b in range(-2, 300)] == [static.select(b) for b in range(-2, 300)]
    assert sel.lookup_list(256) == static.lookup_list(256) and sel.version == 0
    assert sel.acceptance() == pytest.approx([0.8**i for i in range(1, 8)])
    assert ReExported is AdaptiveKSelector


@pytest.mark.parametrize("live_alpha", [0.5, 0.95])
def test_k_moves_to_the_shifted_optimum(live_alpha):
    rng = random.Random(0)
    sel = AdaptiveKSelector(make_table(0.8))
    before = sel.ks
    serve(sel, live_alpha, 1500, rng)
    assert sel.acceptance()[0] == pytest.approx(live_alpha, abs=0.03)
    assert_near_optimal(sel, live_alpha)
    moved = [b for b in SIZES if sel.ks[b] != before[b]]
    # the static table is more than the margin off at these batch sizes; the adaptive one is not
    stale = [b for b in SIZES if goodputs(live_alpha, b)[before[b]]
             * (1 + MARGIN) < max(goodputs(live_alpha, b).values())]
    assert stale and set(stale) <= set(moved)
    direction = (lambda new, old: new < old) if live_alpha < 0.8 else (lambda new, old: new > old)
    assert all(direction(sel.ks[b], before[b]) for b in moved)
    assert sel.version >= 1
    # serving follows the re-derived K, between profiled sizes by the nearest-log rule
    assert sel.select(3) == sel.ks[4] and sel.select(5) == sel.ks[4] and sel.select(6) == sel.ks[8]
    assert sel.select(10**9) == sel.ks[64] and sel.select(0) == sel.ks[1]


def test_stays_put_under_noise():
    rng = random.Random(1)
    sel = AdaptiveKSelector(make_table(0.8))
    before = sel.ks
    for _ in range(4):
        serve(sel, 0.8, 500, rng)
        assert sel.ks == before
    assert sel.version == 0


def test_few_samples_barely_move_it():
    sel = AdaptiveKSelector(make_table(0.8), rebuild_every=1)
    before = sel.ks
    for _ in range(2):  # two single drafts, both rejected at the first position
        sel.observe(1, [0, 0, 0])
    assert sel.acceptance()[0] > 0.7 and sel.ks == before


def test_deeper_positions_follow_the_shallower_ratio_when_not_drafted():
    sel = AdaptiveKSelector(make_table(0.8), rebuild_every=10**9)
    for _ in range(200):
        sel.observe(100, [50])  # only K=1 drafted: position 1 accepted half the time (0.625 of the profile)
    p = sel.acceptance()
    assert p[0] == pytest.approx(0.5, abs=0.02)
    # a position never drafted is shrunk toward the one before: the same ratio to its profile
    assert p[1] / p[0] == pytest.approx(0.8 * 0.625, abs=0.02) and p[6] / p[5] == pytest.approx(0.5, abs=0.02)


def test_drafted_per_pos_handles_mixed_draft_lengths():
    sel = AdaptiveKSelector(make_table(0.8), rebuild_every=10**9, prior_weight=1e-6)
    # 100 drafts, 60 of length 1 and 40 of length 2; conditional acceptance 0.5 at both positions
    for _ in range(60):  # one step weighs at most what the estimate holds: repeat it
        sel.observe(100, [50, 10], drafted_per_pos=[100, 40])
    p = sel.acceptance()
    assert p[0] == pytest.approx(0.5, rel=1e-3) and p[1] == pytest.approx(0.25, rel=1e-3)


def test_constraints_max_k_and_allowed_ks():
    table = make_table(0.95)
    capped = AdaptiveKSelector(table, max_k=3)
    assert max(capped.ks.values()) <= 3 and capped.select(1) <= 3
    allowed = AdaptiveKSelector(table, allowed_ks=[0, 2, 4])
    assert set(allowed.ks.values()) <= {0, 2, 4}
    assert {allowed.select(b) for b in range(1, 200)} <= {0, 2, 4}
    serve(allowed, 0.5, 800, random.Random(2))
    assert set(allowed.ks.values()) <= {0, 2, 4}


def test_lookup_list_feeds_vllm():
    vllm_utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    sel = AdaptiveKSelector(make_table(0.8))
    serve(sel, 0.5, 800, random.Random(3))
    ranges = [list(r) for r in sel.ranges]
    expected = vllm_utils.build_dynamic_sd_schedule_lookup(ranges, 256, sel.max_k)
    assert sel.lookup_list(256) == expected == [0] + [sel.select(b) for b in range(1, 257)]


def test_v1_and_incomplete_tables_are_refused(tmp_path):
    v2 = make_table()
    v1 = {k: v for k, v in v2.items() if k not in ("cells", "acceptance_per_pos")}
    v1["schema"] = "dsdprof.ktable/v1"
    with pytest.raises(TableError, match="needs a dsdprof.ktable/v2 table"):
        AdaptiveKSelector(v1)
    with pytest.raises(TableError, match="acceptance_per_pos"):
        AdaptiveKSelector({**v2, "acceptance_per_pos": None})
    p = tmp_path / "v1.json"
    p.write_text(json.dumps(v1))
    with pytest.raises(TableError, match="v2"):
        AdaptiveKSelector.from_file(p)
    assert KSelector.from_file(p).select(1) == v2["points"][0]["k"]  # v1 still serves statically
    p.write_bytes(b"\xff")
    with pytest.raises(TableError, match="UTF-8"):
        AdaptiveKSelector.from_file(p)
    for kwargs in ({"margin": 1.5}, {"half_life": 0}, {"prior_weight": -1}, {"rebuild_every": 0}):
        with pytest.raises(ValueError):
            AdaptiveKSelector(v2, **kwargs)
    with pytest.raises(TableError):
        AdaptiveKSelector(v2, allowed_ks=[200])


def test_bad_counts_are_ignored_and_counted():
    sel = AdaptiveKSelector(make_table())
    assert sel.observe(0, [1, 2]) is False and sel.rejected == 0  # no drafts: nothing to learn
    assert sel.observe(10, [-1]) is False and sel.rejected == 1
    assert sel.observe(10, [20, 30]) is False and sel.rejected == 2  # more accepted than drafted
    assert sel.acceptance() == pytest.approx([0.8**i for i in range(1, 8)])


def test_import_adaptive_is_light():
    code = ("import sys, dsdprof.runtime; dsdprof.runtime.AdaptiveKSelector; "
            "heavy = [m for m in ('pandas', 'pyarrow', 'torch', 'vllm', 'numpy', 'pydantic', 'typer', "
            "'rich') if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
