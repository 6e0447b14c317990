"""validate's steps design: every variant but vanilla inside the same waves of one engine, as arms
of the K sequence switched step by step (fixed K, the table's schedule, the adaptive plugin's own K).

* the scheduler (vLLM's real Scheduler/AsyncScheduler, fake runner of known acceptance:
  tests/vllm_fakes.py): each arm's rows from one shared trace, exactly; the adaptive plugin learns
  only from its own steps;
* the orchestration: the real validate job over fake engine workers (no vLLM) on one drifting
  machine clock, where each engine's waves also carry noise of their own (the seconds-scale noise
  that interleaving whole waves across engines leaves in the ratios)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dsdprof.plugins.names import ARM_ENGINE, ARM_TABLE
from tests.jobs.test_validate_paired import TABLE, TRUTH, SpanWorker, _spec
from tests.measure.test_paired_vanilla import Machine, fake_measurement

# ----------------------------------------------------------------------------- plan


def test_plan_puts_every_variant_in_one_group_of_arms():
    from dsdprof.errors import InputError
    from dsdprof.jobs.validate import plan_validation, worker_key

    cells = plan_validation([1, 4], [1, 3], TABLE["ranges"], 2, adaptive_k=3, design="steps")
    assert len(cells) == 2 * 2 * 5
    assert {c.group for c in cells} == {(ARM_ENGINE, ARM_TABLE, 1, 3)}
    assert {worker_key(c) for c in cells} == {"vanilla", "adaptive"}  # no fixed-K or dsd engine to start
    plain = plan_validation([1], [1, 2], TABLE["ranges"], 1, design="steps")
    assert {c.group
            for c in plain} == {(ARM_TABLE, 1, 2)} and {worker_key(c) for c in plain} == {"vanilla", "dsd"}
    with pytest.raises(InputError,
                       match="--fixed-k=3: above K=2"):  # the table's largest K, no adaptive engine
        plan_validation([1], [3], TABLE["ranges"], 1, design="steps")
    with pytest.raises(InputError, match="K=0 at every batch size"):
        plan_validation([1], [1], [[1, 1 << 20, 0]], 1, design="steps")


# ----------------------------------------------------------------------------- orchestration


class StepsWorker(SpanWorker):
    """SpanWorker, and for a group request (the steps design) every arm inside the same waves: one
    machine draw per wave for all of them, each arm with ``ARM_NOISE`` of its own; the table's arm
    drafts ``TABLE_DRAFTS`` per draft. A plain request's wave carries ``ENGINE_NOISE`` per engine."""

    ARM_NOISE = 0.01
    ENGINE_NOISE = 0.06
    TABLE_DRAFTS = 2.0

    def run(self, req, timeout_s):
        if not req.group:
            level = self.machine.own
            self.machine.own = math.hypot(level, self.ENGINE_NOISE)
            try:
                return super().run(req, timeout_s)
            finally:
                self.machine.own = level
        start, stop = req.span
        SpanWorker.log.append((self.key, req.batch_size, start, stop))
        if start == 0:
            for _ in range(req.warmup):
                self.machine.wave()
            self.open = {a: ([], []) for a in req.group}
        for _ in range(start, stop):
            level = self.machine.wave()
            for a in req.group:
                name = {ARM_ENGINE: "adaptive", ARM_TABLE: "dsd"}.get(a, f"fixed-{a}")
                al, itl = TRUTH[name]
                self.open[a][0].append(al)
                self.open[a][1].append(itl * level * self.machine.rng.lognormal(0.0, self.ARM_NOISE))
        if stop < req.waves:
            return None
        opened, self.open = self.open, None
        from dataclasses import replace

        return {a: replace(fake_measurement(als, itls, tuple(req.wave_block), 1),
                           drafted_per_draft=self.TABLE_DRAFTS if a == ARM_TABLE else float(max(a, 0)))
                for a, (als, itls) in opened.items()}


def _run(tmp_path, design: str, seed: int = 0, name: str = "out", waves: int = 12):
    from dsdprof.jobs.validate import run_validation
    from tests.plugins.test_adaptive_plugin import shifted_table

    StepsWorker.machine, SpanWorker.log = Machine(seed, walk=0.01, own=0.01), []
    table = dict(shifted_table(provenance={"model": str(tmp_path / "tgt")}))
    table["ranges"] = [[1, 1 << 20, 2]]  # the table serves K=2 (the dsd truth) at every batch size
    summary = run_validation(table, _spec(tmp_path, waves=waves), tmp_path / name, [1, 2, 3],
                             start_worker=StepsWorker, design=design, adaptive={"half_life": 64})
    return summary, pd.read_parquet(tmp_path / name)


def test_steps_design_runs_two_engines_and_pairs_every_variant(tmp_path):
    from dsdprof.report.compare import compare

    summary, df = _run(tmp_path, "steps")
    assert (summary.ok, summary.failed) == (2 * 6, 0), df[["cell_id", "error"]]
    assert {e[0] for e in SpanWorker.log} == {"vanilla", "adaptive"}
    assert (df["design"] == "paired").all()
    blocks = {tuple(b) for b in df["sample_block"]}
    assert len(blocks) == 2  # the arms' waves (each in its vanilla block) and vanilla's own blocks
    c = compare(df).set_index("batch_size")
    truth = 1 - (2.28 / 0.015) / (2.4 / 0.015)  # adaptive 5 % behind the best fixed K (fixed-2)
    assert ((c["adaptive_regret_lo"] <= truth) & (truth <= c["adaptive_regret_hi"])).all()
    assert (c["best_fixed_k"] == 2).all()
    assert ((c["adaptive_regret_hi"] - c["adaptive_regret_lo"]) < 0.03).all()
    import json

    assert json.loads((tmp_path / "out" / "_sweep.json").read_text())["spec"]["validate"]["design"] == "steps"


def test_steps_intervals_are_narrower_than_interleaved_waves_when_engines_differ_per_wave(tmp_path):
    """Each engine's wave carries 6 % noise of its own (what a shared 2-core VM does at the scale of
    seconds); arms inside one engine's waves share it. In the steps design the adaptive regret's
    interval is several times narrower and covers the truth; with waves interleaved across engines
    the points are off by several points (the best of three noisy fixed Ks is also biased up)."""
    from dsdprof.report.compare import compare

    widths: dict[str, list[float]] = {"steps": [], "paired": []}
    errors: dict[str, list[float]] = {"steps": [], "paired": []}
    truth = 1 - 2.28 / 2.4
    for seed in range(3):
        for design in widths:
            _, df = _run(tmp_path, design, seed, name=f"{design}{seed}")
            c = compare(df)
            widths[design] += (c["adaptive_regret_hi"] - c["adaptive_regret_lo"]).tolist()
            errors[design] += (c["adaptive_regret"] - truth).abs().tolist()
            if design == "steps":
                assert ((c["adaptive_regret_lo"] <= truth
                         + 0.005) & (truth - 0.005 <= c["adaptive_regret_hi"])).all()
    assert np.median(widths["steps"]) * 2.5 < np.median(widths["paired"]), widths
    assert max(errors["steps"]) < 0.01 and np.mean(errors["steps"]) * 3 < np.mean(errors["paired"]), errors


def test_the_table_arm_must_draft_the_tables_k(tmp_path):
    StepsWorker.TABLE_DRAFTS = 1.0
    try:
        summary, df = _run(tmp_path, "steps")
    finally:
        StepsWorker.TABLE_DRAFTS = 2.0
    bad = df[df["status"] != "ok"]
    assert set(bad["mode"]) == {"dsd"} and summary.failed == 2
    assert bad["error"].str.contains("table's arm drafted 1.000").all()


# ----------------------------------------------------------------------------- the scheduler

vllm = pytest.importorskip("vllm")

from dsdprof.measure.vllm.trace import read_trace, summarize_paired  # noqa: E402
from dsdprof.measure.vllm.worker import k_sequence  # noqa: E402
from dsdprof.plugins import vllm_adaptive as va  # noqa: E402
from dsdprof.plugins import vllm_profiling as vs  # noqa: E402
from tests.vllm_fakes import FakeRunner, drive, make_request, make_scheduler, vllm_config  # noqa: E402

TOKEN = "t" * 32  # conftest.RUN_TOKEN: the secret of conftest's run_env fixture


def run_arms(sched, mode, batch_size, arms, accept, waves=4, output_len=48, hold=4, trace="g"):
    runner = FakeRunner(accept)
    for w in range(waves):
        for i in range(batch_size):
            extra = {"dsdprof_run": TOKEN, "dsdprof_wave_size": batch_size, "dsdprof_trace": trace,
                     "dsdprof_wave": w, "dsdprof_k_sequence": k_sequence(arms, w, hold)}
            sched.add_request(make_request(f"w{w}-r{i}", 24 + i, output_len, extra, eos=False))
        drive(sched, runner, mode, True)
    return runner


@pytest.mark.parametrize("mode", ["sync", "async", "sync_bq"])
def test_each_arm_is_measured_exactly_from_one_trace(run_env, mode):
    """Accepting d - 1 of d drafts: AL = K per arm (the table's arm: the engine's K=3), pure steps of
    an arm verified and drafted its K, and every traced step records its arm."""
    arms = (ARM_TABLE, 1, 2)
    cls = vs.TracingAsyncScheduler if mode == "async" else vs.TracingScheduler
    sched = make_scheduler(cls, vllm_config(3, 8))
    run_arms(sched, mode, 2, arms, lambda r, s, d: d - 1)
    steps = read_trace(run_env / "g.jsonl")
    assert {s.arm for s in steps if s.wave >= 0} == set(arms)
    by_arm = summarize_paired(steps, 2, arms, 3)
    for arm, k in ((ARM_TABLE, 3), (1, 1), (2, 2)):
        t = by_arm[arm]
        assert t.acceptance_length == pytest.approx(k, rel=1e-12)
        assert t.drafted_per_draft == pytest.approx(k)
        assert t.steady_steps >= 4
    assert sched.dsdprof_ignored == 0


def test_arm_values_are_bounded_and_need_the_run_secret(run_env):
    from dsdprof.plugins.vllm_profiling import parse_keys

    p, bad = parse_keys({"dsdprof_run": TOKEN, "dsdprof_k_sequence": [ARM_ENGINE, ARM_TABLE, 0, 4]}, TOKEN,
                        str(run_env), 4, 8)
    assert not bad and p.k_seq == (ARM_ENGINE, ARM_TABLE, 0, 4)
    p, bad = parse_keys({"dsdprof_run": TOKEN, "dsdprof_k_sequence": [-3, 1]}, TOKEN, str(run_env), 4, 8)
    assert bad and p.k_seq == ()
    p, _ = parse_keys({"dsdprof_run": "x" * 32, "dsdprof_k_sequence": [ARM_ENGINE]}, TOKEN,
                      str(run_env), 4, 8)
    assert p is None


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_adaptive_plugin_learns_only_from_its_own_steps(run_env, mode):
    """Arms (plugin, table, K=1, K=4): the selector is fed the acceptance of exactly the steps that
    verified the plugin's own drafts -- as many drafts as the trace shows for them -- and step times
    only of steps that also drafted its K; the table's arm still serves the table's K."""
    from tests.plugins.test_adaptive_plugin import _hashed_chain, _plugin_config, spy

    config = _plugin_config(run_env, {"rebuild_every": 4})
    sched = make_scheduler(va.AdaptiveAsyncScheduler if mode == "async" else va.AdaptiveScheduler, config)
    calls = spy(sched)
    timed = []
    real_step = sched.dsdprof_k.selector.observe_step

    def observe_step(n, k, seconds):
        timed.append((n, k))
        return real_step(n, k, seconds)

    sched.dsdprof_k.selector.observe_step = observe_step
    arms = (ARM_ENGINE, ARM_TABLE, 1, 4)
    run_arms(sched, mode, 2, arms,
             lambda r, n, d: _hashed_chain(r, n, d, lambda a, h: (h >> (4 * a)) & 15 < 11), waves=6)
    sched.dsdprof_k.feed()
    steps = read_trace(run_env / "g.jsonl")
    prev: dict = {}
    last = None
    for s in steps:
        prev[id(s)] = last.arm if last is not None and last.wave == s.wave else None
        last = s
    own = [s for s in steps if prev[id(s)] == ARM_ENGINE]
    assert sum(c[0] for c in calls) == sum(1 for s in own for d in s.drafted if d > 0) > 20
    assert sum(c[0] for c in calls) < sum(1 for s in steps for d in s.drafted if d > 0) / 3
    own_pure = [s for s in own if s.arm == ARM_ENGINE]
    assert 0 < len(timed) <= len(own_pure)
    table = [s for s in steps if prev[id(s)] == ARM_TABLE and s.decoding == 2]
    assert table and all(set(s.drafted) == {3} for s in table)  # shifted_table: K=3 at BS 2
