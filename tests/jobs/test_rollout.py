"""Rollout / serving workloads, their statistics and the makespan replay: pure, no engine."""

from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest

from dsdprof.decide.live_stats import (
    paired_ratio,
    percentile,
    request_times,
    rotated_orders,
    summarize_requests,
    summarize_steps,
    tail_time,
)
from dsdprof.decide.makespan import Grid, GridCell, best_fixed_k, grid_from_table, predict, predict_all
from dsdprof.errors import InputError
from dsdprof.measure.live_workload import (
    draw_lengths,
    lengths_from_batch_sizes,
    parse_length_spec,
    poisson_arrivals,
    read_lengths_file,
    read_trace_or_lengths,
)


# ---------------------------------------------------------------- workloads
def test_lengths_seeded_and_heavy_tailed():
    spec = parse_length_spec("lognormal:median=12,sigma=1.0")
    a = draw_lengths(spec, 2000, seed=3)
    assert a == draw_lengths(spec, 2000, seed=3)
    assert a != draw_lengths(spec, 2000, seed=4)
    med = percentile(a, 0.5)
    assert 10 <= med <= 14  # the median asked for
    assert max(a) > 8 * med  # heavy right tail: exp(3 sigma) ~ 20x the median
    p = draw_lengths(parse_length_spec("pareto:alpha=1.5,min=4"), 2000, seed=0, max_len=500)
    assert min(p) == 4 and max(p) <= 500
    assert percentile(p, 0.99) > 5 * percentile(p, 0.5)


@pytest.mark.parametrize(
    "text",
    [
        "lognormal:median=12",
        "lognormal:median=-1,sigma=1",
        "pareto:alpha=x,min=2",
        "weibull:k=1",
        "lengths.txt",
        "fixed:len=3,extra=2",
    ],
)
def test_bad_length_specs_are_one_line(text):
    with pytest.raises(InputError) as e:
        parse_length_spec(text)
    assert "--lengths" in str(e.value)


def test_lengths_file_forms(tmp_path):
    f = tmp_path / "l.jsonl"
    f.write_text('5\n{"output_len": 7}\n\n{"num_output_tokens": 9}\n')
    assert read_lengths_file(str(f)) == [5, 7, 9]
    g = tmp_path / "l.json"
    g.write_text(json.dumps([3, {"length": 4}]))
    assert read_lengths_file(str(g)) == [3, 4]
    assert draw_lengths(parse_length_spec(str(g)), 5, seed=0) == [3, 4, 3, 4, 3]  # cycled
    bad = tmp_path / "b.jsonl"
    bad.write_text('5\n{"tokens": 7}\n')
    with pytest.raises(InputError, match="b.jsonl:2"):
        read_lengths_file(str(bad))


def test_poisson_arrivals_rate():
    a = poisson_arrivals(4.0, 4001, seed=1)
    assert a[0] == 0 and all(x <= y for x, y in zip(a, a[1:]))
    assert 4000 / a[-1] == pytest.approx(4.0, rel=0.06)
    with pytest.raises(InputError):
        poisson_arrivals(0, 3, 0)


def test_lengths_from_batch_sizes_inverts_a_vanilla_trace(tmp_path):
    lens = [3, 1, 5, 5, 2]
    trace = [sum(1 for n in lens if n > s) for s in range(max(lens))]  # requests still generating at step s
    assert trace == [5, 4, 3, 2, 2]
    assert sorted(lengths_from_batch_sizes(trace)) == sorted(lens)
    with pytest.raises(InputError, match="shrinks"):
        lengths_from_batch_sizes([2, 3])
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(json.dumps({"batch_size": b}) for b in trace))
    assert sorted(read_trace_or_lengths(str(f))) == sorted(lens)


# ---------------------------------------------------------------- statistics
def test_request_times_and_summary():
    r = request_times(1.0, [1.5, 1.7, 2.1], [1, 3, 5])
    assert r.ttft == pytest.approx(0.5) and r.tpot == pytest.approx(0.6 / 4)
    assert r.itls == pytest.approx((0.2, 0.4))
    reqs = [r, request_times(0.0, [0.2, 0.3], [1, 2])]
    s = summarize_requests(reqs, slo_ttft_s=0.3)
    assert s["makespan_s"] == pytest.approx(2.1) and s["output_tokens"] == 7
    assert s["goodput_req_s"] == pytest.approx(1 / 2.1)  # only the second met the TTFT SLO
    assert s["itl_p50_s"] == pytest.approx(0.2)


def test_tail_time_is_last_ten_percent():
    finishes = list(range(1, 21))  # 20 requests: the 18th finish completes 90 %
    assert tail_time(finishes) == 2
    assert tail_time([5.0]) == 0


def test_summarize_steps_counts_lookup_mismatch():
    ranges = [[1, 2, 4], [3, 5, 2], [6, 1048576, 1]]
    s = summarize_steps(
        batch=[4, 4, 2, 1], decoding=[0, 2, 2, 1], drafted=[0.0, 2.0, 4.0, 4.0], ranges=ranges
    )
    assert s["lookup_differs"] == pytest.approx(2 / 4)  # steps 0 and 1 have prefills in the lookup
    assert s["table_k_differs"] == pytest.approx(1 / 4)  # step 1: K(4)=2 but K(2)=4; step 0 decodes none
    assert s["mean_k"] == pytest.approx((4 + 8 + 4) / 5)


def test_paired_ratio_cancels_drift():
    ref = {0: 10.0, 1: 20.0, 2: 15.0}  # drift between repeats
    var = {r: v * 0.8 for r, v in ref.items()}
    p = paired_ratio(var, ref, "dsd", "vanilla")
    assert p.ratio == pytest.approx(0.8) and p.lo == pytest.approx(0.8) and p.hi == pytest.approx(0.8)
    noisy = {0: 8.4, 1: 15.0, 2: 12.3}
    q = paired_ratio(noisy, ref, "dsd", "vanilla")
    assert q.lo < q.ratio < q.hi and q.repeats == 3
    assert math.isnan(paired_ratio({0: 1.0}, ref, "a", "b").lo)


def test_rotated_orders_balance_first_position():
    orders = rotated_orders(["a", "b", "c", "d"], 8)
    assert all(sorted(o) == ["a", "b", "c", "d"] for o in orders)
    firsts = [o[0] for o in orders]
    assert all(firsts.count(v) == 2 for v in "abcd")
    follows = {(o[i], o[i + 1]) for o in orders for i in range(3)}
    assert ("b", "a") in follows and ("a", "b") in follows  # reversed every other cycle


# ---------------------------------------------------------------- replay
def _grid(itl0=0.1, itl_per_k=0.02, p=0.8, sizes=(1, 4, 16)) -> Grid:
    cells = []
    for b in sizes:
        for k in range(0, 4):
            cells.append(
                GridCell(
                    b,
                    k,
                    (itl0 + itl_per_k * k) * (1 + 0.05 * math.log2(b)),
                    tuple(p**j for j in range(1, k + 1)),
                )
            )
    return Grid(cells)


def test_replay_vanilla_is_exact_step_count():
    g = _grid()
    lens = [5, 3, 3, 1]
    pred = predict(lens, lambda b: 0, g, prefill_s=0.5, variant="vanilla", runs=3)
    # 4 decode steps (5 tokens - 1 from the prefill): batch 3, 3 (the 5 and the two 3s), then 1, 1
    expected = 0.5 + 2 * g.itl(3, 0) + 2 * g.itl(1, 0)
    assert pred.makespan_s == pytest.approx(expected)
    assert pred.steps == 4 and pred.tail_s == 0  # 4 requests: "90 %" is all of them


def test_replay_matches_a_simulated_engine():
    """An independent step simulation (a request's accepted drafts drawn per position) agrees with
    the replay within its Monte Carlo error, and the replay ranks K the way the grid implies."""
    g = _grid(p=0.9)
    lens = draw_lengths(parse_length_spec("lognormal:median=20,sigma=1"), 16, seed=5)
    rng = random.Random(11)
    sims = []
    for _ in range(300):
        rem, t, k = [n - 1 for n in lens], 0.3, 2
        while any(x > 0 for x in rem):
            b = sum(1 for x in rem if x > 0)
            t += g.itl(b, k)
            for i, x in enumerate(rem):
                if x > 0:
                    acc = 0
                    while acc < k and rng.random() < 0.9:
                        acc += 1
                    rem[i] -= acc + 1
            k = 2
        sims.append(t)
    pred = predict(lens, lambda b: 2, g, 0.3, "fixed-2", runs=300, seed=1)
    assert pred.makespan_s == pytest.approx(sum(sims) / len(sims), rel=0.02)
    van = predict(lens, lambda b: 0, g, 0.3, "vanilla", runs=1)
    assert pred.makespan_s < van.makespan_s


def test_replay_on_the_toy_table():
    table = json.load(open("tests/data/toy-dense-cpu-2026-11-29.json"))
    lens = draw_lengths(parse_length_spec("lognormal:median=12,sigma=0.9"), 16, seed=0)
    preds = {p.variant: p for p in predict_all(table, lens, runs=50)}
    assert set(preds) >= {"vanilla", "fixed-1", "fixed-4", "dsd", "adaptive"}
    assert preds["dsd"].makespan_s < preds["vanilla"].makespan_s
    assert 1 <= best_fixed_k(list(preds.values())) <= 4
    assert 0 < preds["dsd"].mean_k < 4  # the schedule's K moves with the batch


def test_replay_refuses_a_table_without_a_grid():
    with pytest.raises(InputError, match="v2 table"):
        grid_from_table({"schema": "dsdprof.ktable/v1", "ranges": [[1, 8, 2]]})


# ---------------------------------------------------------------- rows and report
def _row(variant, rep, makespan, kind="rollout", rate=0.0):
    from dsdprof.formats.rollouts import empty_rollout_row

    r = empty_rollout_row()
    r.update(
        row_id=f"{kind}-{variant}-r{rep}-{rate}",
        kind=kind,
        variant=variant,
        repeat=rep,
        status="ok",
        rate_per_s=rate,
        makespan_s=makespan,
        tokens_per_s=100 / makespan,
        tail_s=1.0,
        mean_k=1.0,
        num_requests=2,
        request_output_len=[3, 5],
        step_t_s=[0.2, 0.4],
        step_prefill_tokens=[32, 0],
        step_batch_size=[2, 2],
        step_decoding=[0, 2],
        step_k=[1, 1],
        step_drafted=[0.0, 1.0],
    )
    return r


def test_rows_round_trip_and_summary(tmp_path):
    from dsdprof.io.rollouts import read_rollout_rows, write_rollout_rows
    from dsdprof.report.rollout import prefill_seconds, rollout_summary

    rows = [
        _row(v, r, m * (1 + 0.1 * r))
        for r in range(3)
        for v, m in (("vanilla", 10.0), ("fixed-2", 8.0), ("fixed-4", 7.0), ("dsd", 7.7))
    ]
    write_rollout_rows(tmp_path / "rollout.parquet", rows, {"engine": "vllm"})
    df = read_rollout_rows(tmp_path)
    s = rollout_summary(df).set_index("variant")
    assert s.loc["dsd", "vs_vanilla"] == pytest.approx(0.77)
    assert s.loc["dsd", "vs_best"] == pytest.approx(1.1) and s.loc["dsd", "best_fixed"] == "fixed-4"
    assert prefill_seconds(df.iloc[0]) == pytest.approx(0.2)


def test_measurement_readers_refuse_a_rollout_file(tmp_path):
    from dsdprof.io.readers import load_measurements
    from dsdprof.io.rollouts import read_rollout_rows, write_rollout_rows

    write_rollout_rows(tmp_path / "rollout.parquet", [_row("vanilla", 0, 1.0)], {})
    with pytest.raises(InputError, match="schema"):
        load_measurements(tmp_path)
    pd.DataFrame({"x": [1]}).to_parquet(tmp_path / "other.parquet")
    with pytest.raises(InputError, match="rollout"):
        read_rollout_rows(tmp_path / "other.parquet")


def test_plan_runs_every_variant_per_block_rotated():
    from dsdprof.jobs.rollout import RolloutPlan

    plan = RolloutPlan(("vanilla", "fixed-3", "dsd"), (3, 4), "x", repeats=2, rates=(1.0, 2.0))
    runs = plan.runs()
    assert len(runs) == 2 * 3 * 3
    blocks = [runs[i : i + 3] for i in range(0, len(runs), 3)]
    assert all(sorted(r[4] for r in b) == ["dsd", "fixed-3", "vanilla"] for b in blocks)
    assert len({b[0][4] for b in blocks}) == 3  # the first variant rotates


# ---------------------------------------------------------------- the job, on fake engines
ITL0, ITL_K = 0.05, 0.01  # the fake machine: step time = (ITL0 + ITL_K * K) * (1 + 0.1 * log2 B)


def _fake_itl(b: int, k: int) -> float:
    return (ITL0 + ITL_K * k) * (1 + 0.1 * math.log2(max(b, 1)))


class FakeArrivalsWorker:
    """Runs an ArrivalsRequest as vLLM would with every draft accepted: K of a step is the lookup at
    the previous step's batch size (fixed K: constant; vanilla: 0); all requests at t = 0."""

    def __init__(self, config, timeout_s) -> None:
        spec = config.llm_kwargs.get("speculative_config") or {}
        self.k_max = int(spec.get("num_speculative_tokens", 0))
        self.ranges = spec.get("num_speculative_tokens_per_batch_size")
        self.info = {"engine_version": "fake", "hardware": "fake", "async_scheduling": False}
        self.alive = True

    def k_of(self, b: int) -> int:
        from dsdprof.formats.ktable import k_for_batch_size

        return k_for_batch_size(self.ranges, b) if self.ranges else self.k_max

    calls: list[str] = []  # every request's trace name, in the order run ("": a warm-up)

    def run(self, req, timeout_s):
        from dsdprof.measure.vllm.arrivals import ArrivalsResult, StepRecord

        FakeArrivalsWorker.calls.append(req.trace_name)
        if self.k_max == 3 and not self.ranges:
            raise RuntimeError("fixed-3 engine died")
        n = len(req.output_lens)
        got = [1] * n
        t, pre = 0.2, 0.2
        times = [[pre] for _ in range(n)]
        counts = [[1] for _ in range(n)]
        steps = [StepRecord(pre, n, 0, 16 * n, self.k_of(n), 0.0, 0)]
        k = self.k_of(n)
        while any(g < m for g, m in zip(got, req.output_lens)):
            active = [i for i in range(n) if got[i] < req.output_lens[i]]
            t += _fake_itl(len(active), k)
            for i in active:
                got[i] = min(req.output_lens[i], got[i] + 1 + k)
                times[i].append(t)
                counts[i].append(got[i])
            steps.append(StepRecord(t, len(active), len(active), 0, self.k_of(len(active)), float(k), 0))
            k = self.k_of(len(active))
        return ArrivalsResult(0.0, tuple(req.arrivals_s), tuple(tuple(ts) for ts in times),
                              tuple(tuple(c) for c in counts), tuple(steps), t)

    def stop(self) -> None:
        self.alive = False

    def kill(self) -> None:
        self.alive = False


def _fake_table() -> dict:
    table = json.load(open("tests/data/toy-dense-cpu-2026-11-29.json"))
    table["cells"] = [{"batch_size": b, "k": k, "itl_s": _fake_itl(b, k), "acceptance_length": 1.0 + k,
                       "acceptance_per_pos": [1.0] * k} for b in (1, 2, 4, 8, 16) for k in range(5)]
    return table


def test_rollout_job_on_fake_engines(tmp_path):
    from dsdprof.config.spec import load_spec
    from dsdprof.io.rollouts import read_rollout_rows
    from dsdprof.jobs.rollout import make_plan, run_rollout
    from dsdprof.report.rollout import replay_check, rollout_summary

    table = _fake_table()
    spec = load_spec("sweeps/toy-dense-cpu.toml")
    models = {}  # the fake engines load nothing; the spec's model paths need only exist
    for name in ("target", "draft"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        models["model" if name == "target" else "draft_model"] = str(tmp_path / name)
    spec = spec.model_copy(update={"engine": spec.engine.model_copy(update=models)})
    plan = make_plan(table, spec, parse_length_spec("lognormal:median=10,sigma=1"), 12, 2, [], 0,
                     [2, 3], adaptive=False, seed=0)
    assert plan.variants == ("vanilla", "fixed-2", "fixed-3", "dsd")
    out = tmp_path / "run"
    FakeArrivalsWorker.calls.clear()
    rows = run_rollout(table, spec, out, plan, "t.json", None, start_worker=FakeArrivalsWorker)
    df = read_rollout_rows(out)
    assert len(rows) == len(df) == 8
    # Every engine warm (fixed-3's warm-up failed: retried before its runs) before the first measured
    # run: measured while the others still started, that run was 1.2-2.4x slow on a CPU host.
    calls = FakeArrivalsWorker.calls
    assert calls[:4] == [""] * 4 and calls[4] != ""
    failed = df[df["status"] == "failed"]
    assert set(failed["variant"]) == {"fixed-3"} and "died" in failed["error"].iloc[0]
    ok = df[df["status"] == "ok"]
    assert (ok["num_requests"] == 12).all() and (ok["output_tokens"] == sum(plan.lengths)).all()
    dsd = ok[ok["variant"] == "dsd"].iloc[0]
    assert max(dsd["step_k"]) == 4 and min(k for k in dsd["step_k"]) == 1  # the table's K follows the batch
    s = rollout_summary(df).set_index("variant")
    assert s.loc["fixed-2", "vs_vanilla"] < 1
    # The replay of the table's grid predicts the fake engine's makespan exactly (every draft accepted).
    chk = replay_check(df, table, runs=2)
    assert chk.rows["error_raw"].abs().max() < 1e-9
    assert all(v == pytest.approx(1.0) for v in chk.scale.values())
    # --resume reruns only the failed rows; another plan is refused.
    again = run_rollout(table, spec, out, plan, "t.json", None, resume=True, start_worker=FakeArrivalsWorker)
    assert len(again) == 8
    with pytest.raises(InputError, match="resume"):
        run_rollout(table, spec, out, plan, "t.json", None, start_worker=FakeArrivalsWorker)
    other = make_plan(table, spec, parse_length_spec("fixed:len=5"), 12, 2, [], 0, [2], adaptive=False,
                      seed=0)
    with pytest.raises(InputError, match="another plan"):
        run_rollout(table, spec, out, other, "t.json", None, resume=True, start_worker=FakeArrivalsWorker)
