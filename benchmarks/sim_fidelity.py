"""The analytic engine against published GPU step times: whole sources held out, and one point out.

    python benchmarks/sim_fidelity.py [benchmarks/fidelity_points.toml]
    python benchmarks/sim_fidelity.py --separate OTHER.toml   # a separate published set (same format)
    python benchmarks/sim_fidelity.py --band [--flat]   # the band: stated inputs vs defaults only

With --band: the whole-source figure twice, each point predicted as a user would (catalog model and
GPU, TP, batch, K, context, dtype) with the inputs its publication states, and with defaults only
(nothing stated; the band widens to the plausible values): MAPE of the point prediction, the share
of published figures inside the band, the band's width, per category; then the category spreads
that dsdprof/measure/sim/band.py ships (CATEGORY_ERRORS), as a Python literal. --flat: the band's
spreads from the one-level leave-one-source-out (what the test checks; faster).

With --separate, priors fitted on every scored point of the suite predict each scored point of
OTHER.toml (never fitted on), with the error and the MAPE.

The headline is leave-one-SOURCE-out: every publication predicted by priors fitted on the others
only (per source and per point). Then for every scored point: the published step time, the
prediction of priors fitted on all the *other* points, and the error; the LOO MAPE, the share
predicted low, the
priors fitted on all points (what ``dsdprof/measure/sim/hardware.py`` ships) and their in-sample error,
the BS-1 K* of the published EAGLE K sweep against the K the source found best, and the
unscored points with the reason. The numbers are quoted in docs/sim.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

from dsdprof.measure.sim.hardware import HARDWARE, OVERLAP_STEP_OVERHEAD_S
from tests.support import fidelity as fid


def main(path: str) -> None:
    pts = fid.load_points(path)
    r = fid.leave_one_out(pts)
    loso = fid.leave_one_source_out(pts) / r.published_s - 1.0
    src = np.array([p.source for p in pts])
    print(f"HEADLINE: whole source held out ({len(set(src))} sources, {len(pts)} points): MAPE "
          f"{np.mean(np.abs(loso)) * 100:.1f} %, median {np.median(np.abs(loso)) * 100:.1f} %, "
          f"predicted low at {np.mean(loso < 0) * 100:.0f} %\n")
    print(f"{'MAPE':>6s} {'n':>3s}  source (each predicted by a fit on the other sources)")
    for s in sorted(set(src), key=lambda s: -np.mean(np.abs(loso[src == s]))):
        e = loso[src == s]
        print(f"{np.mean(np.abs(e)) * 100:5.1f}% {len(e):3d}  {s[:68]}")
    print(f"\n{len(pts)} scored points; LOO = predicted by priors fitted on the other {len(pts) - 1}; "
          "source out = by priors fitted on the other sources\n")
    print(f"{'id':44s} {'hw':>13s} {'TP':>2s} {'BS':>3s} {'K':>2s} {'published':>9s} {'LOO pred':>9s} "
          f"{'err':>7s} {'src out':>7s}")
    for p, pred, err, e2 in zip(pts, r.predicted_s, r.errors, loso):
        print(f"{p.id:44s} {p.hardware:>13s} {p.tp:2d} {p.batch:3d} {p.k:2d} {p.step_ms:8.2f}ms "
              f"{pred * 1e3:8.2f}ms {err * 100:+6.1f}% {e2 * 100:+6.1f}%")
    print(f"\nLOO MAPE {r.mape:.1f} %  (predicted low at {r.low_share * 100:.0f} % of points; "
          f"median |err| {np.median(np.abs(r.errors)) * 100:.1f} %)")
    t = fid.terms(pts)
    shipped = fid.theta_of(HARDWARE["B200"])  # a GPU without points: carries the shared values
    ins = np.mean(np.abs(fid.predict(t, r.theta_all) / t.y_s - 1)) * 100
    print(f"fit on all points (in-sample MAPE {ins:.1f} %); shared values shipped in "
          "dsdprof/measure/sim/hardware.py:")
    for name, fit, ship in zip(fid.PARAMS, r.theta_all, shipped):
        unit, scale = ("", 1.0) if name == "bandwidth" else ("us", 1e6)
        print(f"  {name:24s} fit {fit * scale:9.3f} {unit:2s}  shipped {ship * scale:9.3f} {unit}")
    ov = r.theta_all[fid.FIT_PARAMS.index("overlap_step_overhead_s")]
    print(f"  overlap_step_overhead_s  fit {ov * 1e6:9.3f} us  (SGLang points; shipped as "
          f"OVERLAP_STEP_OVERHEAD_S {OVERLAP_STEP_OVERHEAD_S * 1e6:.0f} us)")
    print("  bandwidth per GPU (shared x fitted multiplier):",
          ", ".join(f"{g} {fid.gpu_theta(r.theta_all, g)[0]:.3f} "
                    f"(shipped {HARDWARE[g].efficiency.bandwidth:.3f})"
                    for g in fid.GPUS if g in {p.hardware for p in pts}))
    for source in sorted({p.source for p in pts if p.method != "none" and p.batch == 1}):
        sweep = sorted((p for p in pts if p.source == source and p.method != "none" and p.batch == 1),
                       key=lambda p: p.k)
        if len(sweep) < 2:
            continue
        st = fid.terms(sweep)
        al = np.array([p.al for p in sweep])
        best = sweep[int(np.argmin(st.y_s / al))].k
        for label, step in (("shipped priors", fid.predict(st, r.theta_all)),
                            ("LOO", np.array([r.predicted_s[pts.index(p)] for p in sweep]))):
            tpot = step / al
            print(f"BS-1 K* ({source}), TPOT at the published AL, {label}: "
                  + " ".join(f"K{p.k} {x * 1e3:.2f}" for p, x in zip(sweep, tpot))
                  + f" ms -> K* = {sweep[int(np.argmin(tpot))].k}; the source's best K = {best}")
    skipped = [p for p in fid.load_points(path, scored_only=False) if not p.scored]
    if skipped:
        print("\nnot scored:")
        for p in skipped:
            print(f"  {p.id}: {p.conversion}")


def separate(path: str) -> None:
    test = fid.load_points(path)
    pred = fid.predict_separate(fid.load_points(), test)
    err = pred / np.array([p.step_ms / 1e3 for p in test]) - 1.0
    print(f"separate set {path}: {len(test)} scored points, predicted by priors fitted on the suite only\n")
    for p, y, e in zip(test, pred, err):
        print(f"{p.id[:44]:44s} {p.hardware[:13]:>13s} {p.step_ms:8.2f}ms {y * 1e3:8.2f}ms {e * 100:+6.1f}%")
    print(f"\nMAPE {np.mean(np.abs(err)) * 100:.1f} %, median {np.median(np.abs(err)) * 100:.1f} %, "
          f"predicted low at {np.mean(err < 0) * 100:.0f} %")


def band(nested: bool) -> None:
    from dsdprof.measure.sim.band import CATEGORY_ERRORS, MIN_POINTS, QUANTILES
    from dsdprof.measure.sim.inputs import engine_family
    from tests.support import fidelity_band as fb

    pts = fid.load_points()
    checks = fb.band_checks(pts, nested=nested)
    how = "nested (spreads from a leave-one-source-out of the other sources)" if nested else "flat"
    print(f"band: {len(pts)} scored points, {len({p.source for p in pts})} sources, each source held out "
          f"whole; band spreads {how}; quantiles {QUANTILES}, categories with < {MIN_POINTS} points "
          "take all points'\n")
    print(f"{'inputs':14s} {'MAPE':>6s} {'covered':>8s} {'width med':>9s} {'width p90':>9s} {'low':>5s}")
    for c in checks:
        print(f"{'stated' if c.stated else 'defaults only':14s} {c.mape:5.1f}% {c.coverage * 100:7.1f}% "
              f"{np.median(c.width) * 100:8.0f}% {np.quantile(c.width, 0.9) * 100:8.0f}% "
              f"{np.mean(c.errors < 0) * 100:4.0f}%")
    stated, defaults = checks
    cats = [fb.categories(p, (engine_family(p.engine),)) for p in stated.points]
    print(f"\nper category{'':7s} {'n':>3s} {'MAPE stated':>11s} "
          f"{'covered':>7s} {'MAPE defaults':>13s} {'covered':>7s}")
    for name in fb.CATEGORY_NAMES:
        sel = np.array([name == "all" or name in c for c in cats])
        if sel.any():
            s_mape, d_mape = (np.mean(np.abs(c.errors[sel])) * 100 for c in checks)
            print(f"  {name:16s} {sel.sum():3d} {s_mape:10.1f}% {np.mean(stated.covered[sel]) * 100:6.0f}% "
                  f"{d_mape:12.1f}% {np.mean(defaults.covered[sel]) * 100:6.0f}%")
    for c in checks:
        print(f"\n{'stated inputs' if c.stated else 'defaults only'}, per point (err: nominal vs published):")
        print(f"{'id':44s} {'published':>9s} {'pred':>8s} {'err':>7s} {'band':>19s}")
        for p, y, e, lo, hi, ok in zip(c.points, c.published_s, c.errors, c.low_s, c.high_s, c.covered):
            print(f"{p.id[:44]:44s} {y * 1e3:8.2f}ms {y * (1 + e) * 1e3:7.2f}ms {e * 100:+6.1f}% "
                  f"[{lo * 1e3:7.2f}, {hi * 1e3:7.2f}]{'' if ok else ' MISS'}")
    print("\npublished BS-1 K sweeps, whole source held out (K* by the 2 % rule; one-level spreads):")
    for stated_inputs in (True, False):
        for sp in fb.k_sweep_spans(pts, stated_inputs):
            inside = "inside" if sp.k_low <= sp.best <= sp.k_high else "OUTSIDE"
            print(f"  {'stated' if stated_inputs else 'defaults'}: {sp.source[:60]}: published K* {sp.best}, "
                  f"predicted {sp.k} ({sp.k_low}-{sp.k_high}): {inside}")
    table = fb.shipped_table(pts)
    print("\ncategory spreads over all sources (published / predicted, whole source out):")
    for c in table:
        print(f"  {c.name:15s} n={c.points:3d} sources={c.sources:2d} MAPE {c.mape_pct:5.1f}%  "
              f"band x{c.low:.3f} .. x{c.high:.3f}")
    print("\nCATEGORY_ERRORS: tuple[CategoryError, ...] = (")
    for c in table:
        print(f"    CategoryError({c.name!r}, {c.points}, {c.sources}, {c.mape_pct}, {c.low}, {c.high}),")
    print(")")
    print("shipped table " + ("matches" if table == CATEGORY_ERRORS else "DIFFERS: paste the literal above"))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--band":
        band(nested="--flat" not in sys.argv)
    elif len(sys.argv) > 2 and sys.argv[1] == "--separate":
        separate(sys.argv[2])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else str(fid.POINTS_FILE))
