import numpy as np
import pandas as pd
import pytest

from dsdprof.config.run import validate_measurements
from dsdprof.decide.analysis import analyze, fixed_k_summary
from dsdprof.errors import InputError
from dsdprof.formats.ktable import choose_k
from dsdprof.io.readers import load_measurements
from tests.conftest import make_rows


def test_goodput_and_optimal_k_by_brute_force(dense_like_frame):
    res = analyze(dense_like_frame, tolerance=0.0)
    df = dense_like_frame.assign(goodput=dense_like_frame.acceptance_length / dense_like_frame.itl_s)
    for b, g in df.groupby("batch_size"):
        best = g.loc[g.goodput.idxmax()]
        row = res.optimal[res.optimal.batch_size == b].iloc[0]
        assert row.k == best.num_spec_tokens
        assert row.goodput == pytest.approx(best.goodput)
        k0 = g[g.num_spec_tokens == 0].goodput.iloc[0]
        assert row.speedup_vs_baseline == pytest.approx(best.goodput / k0)
        for k in range(6):
            gk = g[g.num_spec_tokens == k].goodput.iloc[0]
            assert row[f"speedup_vs_k{k}"] == pytest.approx(best.goodput / gk)


def test_dense_like_curve_is_monotonic(dense_like_frame):
    res = analyze(dense_like_frame)
    ks = res.optimal.k.tolist()
    assert ks[0] > ks[-1]
    assert res.monotonic and res.shape == "dense-like"


def test_tolerance_prefers_smaller_k():
    assert choose_k({0: 100.0, 1: 150.0, 2: 151.0, 3: 152.0}, 0.02) == 1
    assert choose_k({0: 100.0, 1: 150.0, 2: 151.0, 3: 152.0}, 0.0) == 3


def _repeats(itl, al, n=3, spread=0.01, **kw):
    """``n`` repeats of the same cells with a small known spread (so intervals are known)."""
    return pd.concat([make_rows({key: t * (1 + spread * (r - (n - 1) / 2)) for key, t in itl.items()}, al,
                                repeat=r, **kw)
                      for r in range(n)], ignore_index=True)


def test_non_monotonic_curve_is_moe_like_when_the_rise_exceeds_its_intervals():
    itl = {(1, 0): 1.0, (1, 2): 1.0, (4, 0): 1.0, (4, 2): 3.5, (16, 0): 1.0, (16, 2): 1.0,
           (64, 0): 1.0, (64, 2): 4.0}
    al = {key: (3.0 if key[1] == 2 else 1.0) for key in itl}
    res = analyze(_repeats(itl, al))
    assert res.optimal.k.tolist() == [2, 0, 2, 0]
    assert res.optimal.decided.all() and res.intervals_known
    assert not res.monotonic and res.shape == "moe-like"


def test_one_sample_per_cell_exports_the_points_with_a_warning():
    itl = {(1, 0): 1.0, (1, 2): 1.0, (4, 0): 1.0, (4, 2): 3.5, (16, 0): 1.0, (16, 2): 1.0,
           (64, 0): 1.0, (64, 2): 4.0}
    al = {key: (3.0 if key[1] == 2 else 1.0) for key in itl}
    res = analyze(make_rows(itl, al))
    opt = res.optimal
    assert not opt.interval_known.any() and not opt.decided.any() and not res.intervals_known
    assert opt.ci_low.isna().all() and res.cells.ratio_low.isna().all()
    assert opt.k_rule.tolist() == [2, 0, 2, 0]  # the point rule
    # unknown intervals are not noise: the points are exported as they are, never forced monotone,
    # and the shape is read from them, with a warning saying so
    assert opt.k.tolist() == [2, 0, 2, 0]
    assert res.shape == "moe-like" and not res.monotonic
    assert len(res.warnings) == 1 and "intervals unknown at batch size 1, 4, 16, 64" in res.warnings[0]
    assert "read from the points" in res.warnings[0]
    assert res.undecided == [1, 4, 16, 64]
    known = analyze(pd.concat([make_rows(itl, al, repeat=r) for r in range(3)], ignore_index=True))
    assert known.warnings == ()


def test_means_over_repeats_and_status_filter():
    rows = pd.concat([
        make_rows({(1, 0): 1.0, (1, 1): 1.0}, {(1, 0): 1.0, (1, 1): 1.5}, status="ok"),
        make_rows({(1, 0): 1.0, (1, 1): 1.2}, {(1, 0): 1.0, (1, 1): 1.5}, status="ok", repeat=1),
        make_rows({(1, 0): 1.0, (1, 1): 9.0}, {(1, 0): 1.0, (1, 1): 1.5}, status="ok", repeat=2),
        make_rows({(1, 0): 1.0, (1, 1): 0.01}, {(1, 0): 1.0, (1, 1): 2.0}, status="failed", repeat=3),
    ])
    res = analyze(rows)
    cell = res.cells[(res.cells.batch_size == 1) & (res.cells.num_spec_tokens == 1)].iloc[0]
    assert cell.itl_s == pytest.approx((1.0 + 1.2 + 9.0) / 3)  # failed row ignored
    assert cell.goodput == pytest.approx(1.5 / cell.itl_s)
    assert cell.samples == 3
    # the disturbed repeat shows: K=1's interval spans both sides of K=0 (ratios are to each
    # replicate's best K, so the top end is 1: K=1 is the best in some replicates)
    assert cell.ratio_low < 0.5 and cell.ratio_high == pytest.approx(1.0) and not res.optimal.decided.iloc[0]


def test_mode_column_vanilla_is_baseline_dsd_k0_is_candidate():
    van = make_rows({(1, 0): 1.0}, {(1, 0): 1.0}, mode="vanilla")
    dsd = make_rows({(1, 0): 1.3, (1, 1): 1.4}, {(1, 0): 1.0, (1, 1): 1.5}, mode="dsd")
    res = analyze(pd.concat([van, dsd]))
    row = res.optimal.iloc[0]
    assert row.k == 1
    assert row.baseline_goodput == pytest.approx(1.0)
    assert row.speedup_vs_baseline == pytest.approx((1.5 / 1.4) / 1.0)
    assert row.speedup_vs_k0 == pytest.approx((1.5 / 1.4) / (1 / 1.3))
    # K=0 in DSD mode is a real candidate: here it loses to vanilla but K=1 beats both
    assert set(res.cells.num_spec_tokens) == {0, 1}


def test_fixed_mode_uses_vanilla_as_k0_candidate():
    van = make_rows({(1, 0): 1.0, (8, 0): 1.0}, {(1, 0): 1.0, (8, 0): 1.0}, mode="vanilla")
    fixed = make_rows({(1, 2): 1.2, (8, 2): 4.0}, {(1, 2): 2.4, (8, 2): 2.4}, mode="fixed")
    res = analyze(pd.concat([van, fixed]))
    assert res.optimal.k.tolist() == [2, 0]


def test_no_mode_column_uses_k0_for_both():
    res = analyze(make_rows({(2, 0): 0.5, (2, 3): 1.0}, {(2, 0): 1.0, (2, 3): 3.0}))
    assert res.optimal.iloc[0].speedup_vs_baseline == pytest.approx(1.5)


@pytest.mark.parametrize("col, value, field", [
    ("batch_size", 0, "batch_size"),
    ("batch_size", 1.5, "batch_size"),
    ("num_spec_tokens", -1, "num_spec_tokens"),
    ("itl_s", 0.0, "itl_s"),
    ("itl_s", np.nan, "itl_s"),
    ("itl_s", "fast", "itl_s"),
    ("acceptance_length", 0.5, "acceptance_length"),
    ("acceptance_length", 9.0, "acceptance_length"),
])
def test_bad_values_name_the_column(dense_like_frame, col, value, field):
    df = dense_like_frame.astype({col: object})
    df.loc[3, col] = value
    with pytest.raises(InputError) as e:
        validate_measurements(df)
    assert e.value.field == field


def test_missing_columns_and_empty():
    with pytest.raises(InputError, match="columns"):
        validate_measurements(pd.DataFrame({"batch_size": [1]}))
    df = make_rows({(1, 0): 1.0}, {(1, 0): 1.0}, status="failed")
    with pytest.raises(InputError, match="status 'ok'"):
        validate_measurements(df)


def test_load_from_plain_parquet_and_dir(tmp_path, dense_like_frame):
    f = tmp_path / "m.parquet"
    dense_like_frame.to_parquet(f)
    assert len(load_measurements(f)) == len(dense_like_frame)
    d = tmp_path / "d"
    d.mkdir()
    dense_like_frame.iloc[:10].to_parquet(d / "a.parquet")
    dense_like_frame.iloc[10:].to_parquet(d / "b.parquet")
    (d / "_meta.parquet").write_text("not parquet")
    assert len(load_measurements(d)) == len(dense_like_frame)
    with pytest.raises(InputError):
        load_measurements(tmp_path / "missing")
    (tmp_path / "junk.parquet").write_text("junk")
    with pytest.raises(InputError, match="Parquet"):
        load_measurements(tmp_path / "junk.parquet")


def test_fixed_k_summary(dense_like_frame):
    s = fixed_k_summary(analyze(dense_like_frame))
    assert (s.geomean_speedup >= 1.0 - 1e-12).all()


def test_failed_baseline_is_an_error_not_a_switch_to_k0(dense_like_frame):
    import pandas as pd

    from dsdprof.decide.analysis import analyze
    from dsdprof.errors import InputError

    dsd = dense_like_frame.assign(mode="dsd", status="ok", error="")
    van = dense_like_frame[dense_like_frame["num_spec_tokens"] == 0].assign(mode="vanilla", status="ok",
                                                                            error="")
    analyze(pd.concat([dsd, van], ignore_index=True))
    van_failed = van.assign(status="failed", error="EngineFailure: out of memory")
    van_failed.loc[van_failed["batch_size"] != 8, "status"] = "ok"
    with pytest.raises(InputError, match="baseline.*bs8.*out of memory"):
        analyze(pd.concat([dsd, van_failed], ignore_index=True))
