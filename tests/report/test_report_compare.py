"""dsdprof.report.compare: regret, speedup and below-vanilla flags over synthetic rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dsdprof.errors import InputError
from dsdprof.report.compare import (
    K0_NOTE,
    below_vanilla_ranges,
    compare,
    fixed_k_columns,
    regret_exceeds,
    user_speed,
)


def rows(spec: dict, repeats: int = 1, jitter: float = 0.0) -> pd.DataFrame:
    """spec: {bs: {"vanilla": tops, "fixed": {k: tops}, "dsd": (k, tops)}}."""
    out = []
    for r in range(repeats):
        f = 1.0 + (jitter if r % 2 else -jitter) if repeats > 1 else 1.0
        for b, s in spec.items():
            out.append({"mode": "vanilla", "batch_size": b, "num_spec_tokens": 0,
                        "tokens_per_s_per_user": s["vanilla"] * f, "status": "ok"})
            for k, t in s["fixed"].items():
                out.append({"mode": "fixed", "batch_size": b, "num_spec_tokens": k,
                            "tokens_per_s_per_user": t * f, "status": "ok"})
            k, t = s["dsd"]
            out.append({"mode": "dsd", "batch_size": b, "num_spec_tokens": k, "tokens_per_s_per_user": t * f,
                        "status": "ok", "num_drafts": 10 if k else 0, "num_draft_tokens": 10 * k})
    return pd.DataFrame(out)


SPEC = {
    1: {"vanilla": 50.0, "fixed": {1: 70.0, 3: 100.0}, "dsd": (3, 98.0)},
    4: {"vanilla": 40.0, "fixed": {1: 55.0, 3: 60.0}, "dsd": (3, 61.0)},
    16: {"vanilla": 30.0, "fixed": {1: 33.0, 3: 28.0}, "dsd": (1, 30.0)},
    64: {"vanilla": 20.0, "fixed": {1: 18.0, 3: 12.0}, "dsd": (0, 15.0)},
}


def test_regret_and_speedup_per_batch_size():
    c = compare(rows(SPEC)).set_index("batch_size")
    assert fixed_k_columns(c.reset_index()) == [1, 3]
    assert c.loc[1, "best_fixed_k"] == 3
    assert c.loc[1, "regret"] == pytest.approx(0.02)
    assert c.loc[4, "regret"] == pytest.approx(1 - 61 / 60)  # DSD beat every fixed K: negative
    assert c.loc[16, "best_fixed_k"] == 1 and c.loc[16, "regret"] == pytest.approx(1 - 30 / 33)
    assert c.loc[1, "speedup_vs_vanilla"] == pytest.approx(98 / 50)
    assert c.loc[64, "regret_vs_oracle"] == pytest.approx(1 - 15 / 20)  # vanilla is the oracle there
    assert c.loc[1, "dsd_k_observed"] == pytest.approx(3.0)
    assert c.reset_index()["regret"].max() == pytest.approx(1 - 15 / 18)
    assert regret_exceeds(c.reset_index(), 3.0) == [16, 64]
    assert regret_exceeds(c.reset_index(), 10.0) == [64]
    assert regret_exceeds(c.reset_index(), 20.0) == []


def test_below_vanilla_flag_uses_noise_floor_and_names_k0():
    c = compare(rows(SPEC), noise_floor=0.05).set_index("batch_size")
    assert not c.loc[16, "below_vanilla"]  # 30 vs 30: equal
    assert c.loc[64, "below_vanilla"] and c.loc[64, "note"] == K0_NOTE
    assert not c.loc[1, "below_vanilla"]
    relaxed = compare(rows(SPEC), noise_floor=0.30).set_index("batch_size")
    assert not relaxed.loc[64, "below_vanilla"]  # 0.75x is inside a 30 % band


def test_noise_band_widens_with_repeat_spread():
    spec = {8: {"vanilla": 100.0, "fixed": {3: 120.0}, "dsd": (3, 92.0)}}
    tight = compare(rows(spec, repeats=2, jitter=0.0), noise_floor=0.05).iloc[0]
    assert tight["below_vanilla"]  # 0.92x, 5 % floor
    noisy = compare(rows(spec, repeats=2, jitter=0.10), noise_floor=0.05).iloc[0]
    assert noisy["noise"] == pytest.approx(0.10)
    assert not noisy["below_vanilla"]
    assert noisy["repeats"] == 2


def test_flagged_ranges_group_consecutive_batch_sizes():
    spec = {b: {"vanilla": 100.0, "fixed": {3: 90.0},
                "dsd": (0 if b >= 16 else 3, 80.0 if b >= 16 else 120.0)}
            for b in (1, 4, 16, 32, 64)}
    spec[4]["dsd"] = (2, 70.0)
    ranges = below_vanilla_ranges(compare(spec_frame := rows(spec)))
    assert [(r.first_bs, r.last_bs) for r in ranges] == [(4, 4), (16, 64)]
    assert ranges[1].note == K0_NOTE and ranges[1].worst_speedup == pytest.approx(0.8)
    assert "BS 16-64" in ranges[1].label()
    assert len(spec_frame) == 5 * 3


def test_failed_rows_ignored_and_medians_used():
    df = rows(SPEC)
    bad = df.iloc[[0]].assign(status="failed", tokens_per_s_per_user=math.nan)
    extra = df[(df["batch_size"] == 1) & (df["mode"] == "dsd")].assign(tokens_per_s_per_user=10.0)
    extra2 = extra.assign(tokens_per_s_per_user=99.0)
    c = compare(pd.concat([df, bad, extra, extra2], ignore_index=True)).set_index("batch_size")
    assert c.loc[1, "tops_dsd"] == pytest.approx(98.0)  # median of 98, 10, 99


def test_user_speed_fallbacks():
    assert user_speed(pd.DataFrame({"tpot_s": [0.02]})).iloc[0] == pytest.approx(50.0)
    assert user_speed(pd.DataFrame({"acceptance_length": [3.0],
                                    "itl_s": [0.03]})).iloc[0] == pytest.approx(100.0)
    with pytest.raises(InputError):
        user_speed(pd.DataFrame({"x": [1]}))


def test_bad_inputs_name_the_field():
    with pytest.raises(InputError, match="mode"):
        compare(rows(SPEC).drop(columns=["mode"]))
    with pytest.raises(InputError, match="mode"):
        compare(rows(SPEC).assign(mode="weird"))
    with pytest.raises(InputError, match="no batch size"):
        compare(rows(SPEC).query("mode != 'dsd'"))
    with pytest.raises(InputError, match="tokens_per_s_per_user"):
        compare(rows(SPEC).assign(tokens_per_s_per_user=-1.0))
    with pytest.raises(InputError, match="noise_floor"):
        compare(rows(SPEC), noise_floor=1.5)
