"""The paired design's vanilla baseline: one K's share of waves, interleaved with the DSD group wave
block by wave block, re-measured with its group on resume, and paired with it in the speedup bootstrap.

The orchestration runs :class:`VllmEngine` and the real sweep loop over fake engine workers (no vLLM):
each fake engine measures waves on one shared machine clock whose drift moves every wave's step time."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dsdprof.measure.engine import (
    MODE_DSD,
    MODE_VANILLA,
    Cell,
    CellMeasurement,
    plan_cells,
    unit_layout,
    vanilla_waves,
    wave_blocks,
)

AL = {0: 1.0, 1: 1.8, 2: 2.4}
ITL = {0: 0.0100, 1: 0.0120, 2: 0.0150}
VANILLA_ITL = 0.0095


def fake_measurement(als: list[float], itls: list[float], blocks: tuple[int, ...],
                     run: int) -> CellMeasurement:
    al, itl = float(np.mean(als)), float(np.mean(itls))
    return CellMeasurement(
        acceptance_length=al, acceptance_per_pos=(), num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0,
        itl_s=itl, itl_p50_s=itl, itl_p90_s=itl, itl_p99_s=itl, tpot_s=itl / al, tpot_p50_s=itl / al,
        tpot_p90_s=itl / al, tpot_p99_s=itl / al, tokens_per_s_per_user=al / itl, tokens_per_s_total=1.0,
        num_requests=len(als), num_output_tokens=run, wall_s=0.1, steady_steps=len(als),
        sample_acceptance_length=tuple(als), sample_itl_s=tuple(itls), sample_block=blocks)


class Machine:
    """One clock for every engine: the machine's speed drifts (a random walk of its log, ``walk`` per
    wave: a busy machine whose load changes over minutes), and each wave has its own noise (``own``)."""

    def __init__(self, seed: int = 0, walk: float = 0.05, own: float = 0.01, trend: float = 0.0) -> None:
        self.walk, self.own, self.level, self.trend = walk, own, 0.0, trend  # trend: log speed per wave
        self.rng = np.random.default_rng(seed)
        self.log: list[tuple[str, int, int, int, int]] = []  # (engine, batch size, waves, start, stop)

    def wave(self) -> float:
        self.level += self.rng.normal(0.0, self.walk) + self.trend
        return math.exp(self.level) * self.rng.lognormal(0.0, self.own)


class FakeWorker:
    """What :class:`dsdprof.measure.vllm.pool.EngineWorker` offers, over a :class:`Machine`: spans of a
    cell's measured waves, the cell kept open between them, as the real worker does."""

    def __init__(self, config, timeout_s, machine: Machine, run: int) -> None:
        self.key = MODE_DSD if "speculative_config" in config.llm_kwargs else MODE_VANILLA
        self.machine, self.run_id = machine, run
        self.info = {"engine_version": "fake", "hardware": "fake", "async_scheduling": False}
        self.alive = True
        self.open: dict | None = None

    def run(self, req, timeout_s):
        start, stop = req.span if req.span != (0, 0) else (0, req.waves)
        self.machine.log.append((self.key, req.batch_size, req.waves, start, stop))
        if start == 0:
            for _ in range(req.warmup):
                self.machine.wave()
            self.open = {k: ([], []) for k in (req.group or (0,))}
        assert self.open is not None and len(next(iter(self.open.values()))[0]) == start
        for _ in range(start, stop):
            d = self.machine.wave()
            for k, (als, itls) in self.open.items():
                als.append(AL[k] if self.key == MODE_DSD else 1.0)
                itls.append((ITL[k] if self.key == MODE_DSD else VANILLA_ITL) * d)
        if stop < req.waves:
            return None
        rows = {k: fake_measurement(a, i, tuple(req.wave_block), self.run_id)
                for k, (a, i) in self.open.items()}
        self.open = None
        return rows if req.group else rows[0]

    def stop(self) -> None:
        self.alive = False

    def kill(self) -> None:
        self.alive = False


def make_engine(tmp_path, machine: Machine, run: int = 1, **sweep):
    from dsdprof.config.spec import parse_spec
    from dsdprof.measure.vllm.engine import VllmEngine

    model = tmp_path / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    spec = parse_spec({"engine": {"model": str(model), "method": "ngram", "dsd_mode": "dsd"},
                       "sweep": {"batch_sizes": [1, 4], "num_spec_tokens": [0, 1, 2], "waves": 6, "warmup": 1,
                                 "output_len": 16, **sweep}})
    eng = VllmEngine(spec, out_dir=tmp_path / "out", start_worker=lambda c, t: FakeWorker(c, t, machine, run))
    return spec, eng


def read(out) -> pd.DataFrame:
    from dsdprof.io.readers import read_measurements

    return read_measurements(out)


def test_vanilla_gets_one_k_share_of_the_waves():
    assert [vanilla_waves(w, 5) for w in (25, 24, 26, 10, 4, 1)] == [5, 5, 6, 2, 2, 2]  # never one wave
    assert vanilla_waves(6, 2) == 3 and vanilla_waves(3, 0) == 3
    assert [list(r) for r in wave_blocks(7, 3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert wave_blocks(2, 5) == [range(0, 1), range(1, 2)]  # never an empty block
    cells = plan_cells([1, 4], [0, 1, 2], 2, MODE_DSD, paired=True)
    assert all(c.group == (0, 1, 2) for c in cells)  # vanilla belongs to its batch size's unit
    units = {}
    for c in cells:
        units.setdefault(c.unit, []).append(c)
    assert len(units) == 4 and all(len(v) == 4 for v in units.values())
    assert all(c.unit is None for c in plan_cells([1], [0, 1], 1, MODE_DSD))  # cells design unchanged


def test_vanilla_brackets_its_group_at_any_wave_count():
    """Fewer waves than Ks: vanilla still gets two waves, beside two blocks of the group's waves, in
    the order group-vanilla-vanilla-group (or the reverse): its waves and the group's share their
    mean time. A group of one wave sits between vanilla's two waves."""
    four = unit_layout(4, 5, rot=0)
    assert four.blocks == (range(0, 2), range(2, 4)) and four.vanilla_block == (0, 1)
    assert four.spans == ((True, 0, 2), (False, 0, 1), (False, 1, 2), (True, 2, 4))
    assert unit_layout(4, 5, rot=1).spans == ((False, 0, 1), (True, 0, 2), (True, 2, 4), (False, 1, 2))
    one = unit_layout(1, 5, rot=1)
    assert one.blocks == (range(0, 1),) and one.vanilla_block == (0, 0)
    assert one.spans == ((False, 0, 1), (True, 0, 1), (False, 1, 2))
    # the layout the sweep ran before at >= 2 blocks is unchanged (12 waves, 3 Ks: 4 blocks, alternating)
    twelve = unit_layout(12, 3, rot=0)
    assert [s[0] for s in twelve.spans] == [True, False, False, True, True, False, False, True]
    assert twelve.vanilla_block == (0, 1, 2, 3)


def test_dry_run_counts_the_paired_design():
    from dsdprof.config.spec import parse_spec
    from dsdprof.measure.runner import plan_sweep

    base = {"engine": {"model": "m", "method": "ngram"},
            "sweep": {"batch_sizes": [1, 4], "num_spec_tokens": [0, 1, 2, 3, 4], "waves": 25, "warmup": 1,
                      "output_len": 10, "repeats": 2}}
    paired = plan_sweep(parse_spec(base))
    # per batch size and repeat: 25 + 1 waves shared by the 5 Ks, vanilla ceil(25 / 5) + 1
    assert paired.design == "paired" and paired.engine_waves == 2 * 2 * ((25 + 1) + (5 + 1))
    assert paired.decode_steps == paired.engine_waves * 10 and "vanilla 5 + 1" in paired.assumption
    cells = plan_sweep(parse_spec({**base, "sweep": {**base["sweep"], "design": "cells"}}))
    assert cells.design == "cells" and cells.engine_waves == 2 * 2 * 6 * 26 and cells.cells == paired.cells
    sim = plan_sweep(parse_spec({**base, "engine": {"name": "sim", "model": "m", "method": "ngram"}}))
    assert sim.design == "cells"  # the analytic engine runs cell by cell


def test_vanilla_waves_interleave_with_the_group_block_by_block(tmp_path):
    from dsdprof.measure.runner import run_sweep

    machine = Machine()
    spec, eng = make_engine(tmp_path, machine)
    summary = run_sweep(spec, tmp_path / "out", engine=eng)
    assert summary.failed == 0 and summary.ok == 2 * 4
    runs = [e for e in machine.log if e[1] == 1]
    # waves 6, 3 Ks: vanilla runs 2 waves, the group's 6 waves in 2 blocks; DSD first, then alternating
    assert runs == [(MODE_DSD, 1, 6, 0, 3), (MODE_VANILLA, 1, 2, 0, 1), (MODE_VANILLA, 1, 2, 1, 2),
                    (MODE_DSD, 1, 6, 3, 6)]
    assert [e[0] for e in machine.log
            if e[1] == 4] == [MODE_VANILLA, MODE_DSD, MODE_DSD, MODE_VANILLA]  # rotated
    df = read(tmp_path / "out")
    assert (df["design"] == "paired").all()
    van = df[df["mode"] == MODE_VANILLA]
    assert all(tuple(b) == (0, 1) for b in van["sample_block"])
    assert van["sample_itl_s"].map(len).eq(2).all()
    dsd = df[df["mode"] == MODE_DSD]
    assert all(tuple(b) == (0, 0, 0, 1, 1, 1) for b in dsd["sample_block"])


def test_a_failed_engine_ends_its_own_rows_only(tmp_path):
    from dsdprof.measure.runner import run_sweep
    from dsdprof.measure.vllm.pool import EngineFailure

    machine = Machine()
    spec, eng = make_engine(tmp_path, machine)

    class Dies(FakeWorker):
        def run(self, req, timeout_s):
            if self.key == MODE_DSD and req.span[0] > 0:
                raise EngineFailure("engine process died during cell")
            return super().run(req, timeout_s)

    eng.pool._start = lambda c, t: Dies(c, t, machine, 1)
    run_sweep(spec, tmp_path / "out", engine=eng)
    df = read(tmp_path / "out")
    assert (df.loc[df["mode"] == MODE_DSD, "status"] == "failed").all()
    assert df.loc[df["mode"] == MODE_DSD, "error"].str.contains("died").all()
    assert (df.loc[df["mode"] == MODE_VANILLA, "status"] == "ok").all()  # its waves went on
    assert (df.loc[df["mode"] == MODE_VANILLA, "sample_itl_s"].map(len) == 2).all()


def test_resume_after_a_kill_mid_unit_remeasures_the_whole_unit(tmp_path):
    """Killed after the first row of the second unit: a resumed run measures that unit again, the
    vanilla row included, and overwrites the row already on disk; the finished unit is kept."""
    from dsdprof.measure.runner import run_sweep

    machine = Machine()
    spec, eng = make_engine(tmp_path, machine, run=1)
    measure, seen = eng.measure, []

    def killed(cell: Cell):
        if cell.batch_size == 4 and any(c.batch_size == 4 for c in seen):
            raise KeyboardInterrupt
        seen.append(cell)
        return measure(cell)

    eng.measure = killed
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path / "out", engine=eng)
    first = read(tmp_path / "out")
    assert len(first) == 5 and (first["batch_size"] == 4).sum() == 1
    machine2 = Machine(seed=1)
    spec, eng2 = make_engine(tmp_path, machine2, run=2)
    summary = run_sweep(spec, tmp_path / "out", resume=True, engine=eng2)
    assert summary.skipped == 4 and summary.ok == 4
    assert {e[1] for e in machine2.log} == {4}  # only the unfinished unit ran again, as a unit
    df = read(tmp_path / "out")
    assert len(df) == 8 and (df["status"] == "ok").all()
    runs = df.groupby("batch_size")["num_output_tokens"].agg(set).to_dict()
    assert runs == {1: {1}, 4: {2}}  # every row of the bs-4 unit from the resumed run


def _speedup_errors(tmp_path, waves: int, warmup: int, **machine) -> list[float]:
    from dsdprof.decide.analysis import analyze
    from dsdprof.measure.runner import run_sweep

    spec, eng = make_engine(tmp_path, Machine(**machine), waves=waves, warmup=warmup)
    run_sweep(spec, tmp_path / "out", engine=eng)
    opt = analyze(read(tmp_path / "out"), replicates=200).optimal
    return [p.speedup_vs_baseline / (AL[p.k] / ITL[p.k] * VANILLA_ITL) - 1.0 for p in opt.itertuples()]


@pytest.mark.parametrize("waves", [3, 4])
def test_a_machine_slowing_down_leaves_vanilla_s_ratio_unbiased(tmp_path, monkeypatch, waves):
    """Fewer waves than Ks on a machine slowing 4 % a wave (the load rising), no noise: vanilla's
    two waves and the group's share their centre in time, so the speedup over vanilla holds the
    truth within 0.6 % (without warm-ups); one vanilla wave wholly before or after the group's (the
    rule before) is off by 4-10 %. A warm-up wave of the engine that runs second sits between the
    two: half its drift stays, its sign flipping between batch sizes (the rotation)."""
    import dsdprof.measure.engine as engine_mod

    flat = dict(walk=0.0, own=0.0, trend=0.04)
    errors = _speedup_errors(tmp_path / "new", waves, 0, **flat)
    assert max(abs(e) for e in errors) < 0.006, errors  # exact for a linear drift; exp(trend) is convex
    warm = _speedup_errors(tmp_path / "warm", waves, 1, **flat)
    assert max(abs(e) for e in warm) < 0.04 and min(warm) < 0 < max(warm), warm  # BS 1 and 4 opposite
    monkeypatch.setattr(engine_mod, "vanilla_waves", lambda w, group_size: 1)  # the rule before
    old = _speedup_errors(tmp_path / "old", waves, 0, **flat)
    assert min(abs(e) for e in old) > 0.04, old


@pytest.mark.slow  # many simulated runs, ~3-10 s
def test_paired_speedup_interval_cancels_drift_and_covers_the_truth(tmp_path):
    """A drifting machine (log speed a random walk, 2 % per wave, about +-17 % over a run): vanilla
    waves beside their DSD block give speedup intervals about 3x narrower than resampling vanilla and
    the K each on its own, and they hold the truth as often as they claim (90 %); 8 runs x 2 batch
    sizes (20 runs: 90 % covered, median width ratio 0.35)."""
    from dsdprof.decide.analysis import analyze
    from dsdprof.measure.runner import run_sweep

    covered, ratios = 0, []
    for seed in range(8):
        machine = Machine(seed=seed, walk=0.02)
        spec, eng = make_engine(tmp_path / str(seed), machine, waves=12, repeats=2)
        run_sweep(spec, tmp_path / str(seed) / "out", engine=eng)
        df = read(tmp_path / str(seed) / "out")
        paired = analyze(df, replicates=1000).optimal
        independent = analyze(df.drop(columns=["sample_block"]), replicates=1000).optimal
        assert (paired["speedup_interval"] == "paired").all()
        assert (independent["speedup_interval"] == "independent").all()
        for p, i in zip(paired.itertuples(), independent.itertuples()):
            truth = AL[p.k] / ITL[p.k] * VANILLA_ITL
            covered += p.speedup_low <= truth <= p.speedup_high
            assert p.speedup_low <= p.speedup_vs_baseline <= p.speedup_high
            ratios.append((p.speedup_high - p.speedup_low) / (i.speedup_high - i.speedup_low))
    assert covered >= 13, covered  # of 16 at 90 %
    assert np.median(ratios) < 0.5, ratios


def test_speedup_interval_is_unknown_with_one_sample_each():
    from dsdprof.decide.analysis import analyze

    rows = pd.DataFrame([{"mode": m, "batch_size": 1, "num_spec_tokens": k, "acceptance_length": al,
                          "itl_s": 0.01}
                         for m, k, al in (("vanilla", 0, 1.0), ("dsd", 0, 1.0), ("dsd", 2, 2.0))])
    opt = analyze(rows).optimal
    assert math.isnan(opt["speedup_low"].iloc[0]) and opt["speedup_interval"].iloc[0] == ""


def test_analyze_warns_where_vanilla_had_one_block(tmp_path, monkeypatch):
    """A run measured under the rule before (one vanilla wave beside 3 waves of 3 Ks) gets one
    line in the text and in --json naming its batch sizes; a run measured now gets none."""
    import json

    import dsdprof.measure.engine as engine_mod
    from dsdprof.cli.analyze import analysis_json
    from dsdprof.decide.analysis import analyze
    from dsdprof.measure.runner import run_sweep

    def run(name: str):
        spec, eng = make_engine(tmp_path / name, Machine(), waves=3)
        run_sweep(spec, tmp_path / name / "out", engine=eng)
        return analyze(read(tmp_path / name / "out"), replicates=100)

    now = run("now")
    assert not now.warnings and json.loads(analysis_json(now))["warnings"] == []
    monkeypatch.setattr(engine_mod, "vanilla_waves", lambda w, group_size: 1)  # the rule before
    before = run("before")
    line = "warning: one vanilla block at BS 1, 4: speedups over it carry drift"
    assert before.warnings == (line,) and json.loads(analysis_json(before))["warnings"] == [line]
    from dsdprof.decide.analysis import one_block_warning

    many = pd.DataFrame({"mode": "vanilla", "design": "paired", "batch_size": [1, 16, 64, 256],
                         "sample_block": [[0]] * 4})
    assert len(one_block_warning(many)[0]) <= 80
