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

from dsdprof.decide.makespan import StepModel, StepSample, grid_from_table
from dsdprof.errors import InputError
from dsdprof.formats.ktable import k_for_batch_size
from dsdprof.formats.rollouts import empty_rollout_row
from dsdprof.measure.live_workload import draw_lengths, parse_length_spec
from dsdprof.report.rollout import fit_step_model, replay_check, replay_summary

P_TRUE = 0.93  # per-position acceptance of the machine (the toy table says ~0.6-0.9)
PREFILL = {"vanilla": 1.5, "fixed-4": 1.9, "dsd": 1.8}
N = 16


def machine_step(variant: str, b: int, k: int) -> float:
    """Seconds of one decode step: the engine's own overhead plus a cost per token in the batch."""
    over = 0.09 if variant == "vanilla" else (0.11 if variant == "fixed-4" else 0.12)
    return over + 0.004 * b * (1 + k) + 0.008 * k


def simulate(variant: str, lengths: list[int], ranges, rng: random.Random, rep: int) -> dict:
    """One rollout on the machine, as a dsdprof.rollouts/v1 row."""
    fixed = {"vanilla": lambda b: 0, "fixed-4": lambda b: 4}
    k_of = fixed.get(variant, lambda b: k_for_batch_size(ranges, b))
    rem = [n - 1 for n in lengths]
    t = PREFILL[variant] * rng.uniform(0.98, 1.02)
    ts, dec, drafted, pre = [t], [0], [0.0], [N * 32]
    k = k_of(len(lengths))
    while any(x > 0 for x in rem):
        b = sum(1 for x in rem if x > 0)
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
    row = empty_rollout_row()
    row.update(row_id=f"{variant}-{rep}", kind="rollout", variant=variant, repeat=rep, status="ok",
               makespan_s=t, num_requests=len(lengths), request_output_len=list(lengths), step_t_s=ts,
               step_decoding=dec, step_batch_size=dec, step_drafted=drafted, step_prefill_tokens=pre,
               step_k=[k_of(b) for b in dec], mean_k=0.0)
    return row


def run(lengths: list[int], ranges, seed: int, repeats: int = 3) -> pd.DataFrame:
    rng = random.Random(seed)
    return pd.DataFrame([simulate(v, lengths, ranges, rng, r) for r in range(repeats) for v in PREFILL])


@pytest.fixture(scope="module")
def table() -> dict:
    return json.load(open("tables/toy-dense-cpu.json"))


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


def test_step_model_falls_back_to_the_grid(table):
    grid = grid_from_table(table)
    samples = [StepSample("fixed-4", b, 4, 2 * grid.itl(b, 4)) for b in (1, 2, 4) for _ in range(3)]
    samples += [StepSample("dsd", 3, 2, 0.3)]
    m = StepModel(grid, samples, {"fixed-4": [2.0, 2.2, 2.1]}, num_requests=16)
    assert m.seconds("fixed-4", 2, 4) == pytest.approx(2 * grid.itl(2, 4), rel=0.1)
    assert m.seconds("fixed-4", 8, 1) == pytest.approx(2 * grid.itl(8, 1))  # K never served: ratio
    assert m.seconds("dsd", 6, 2) == pytest.approx(0.3 * grid.itl(6, 2) / grid.itl(3, 2))  # one B: shape
    assert m.prefill_s("fixed-4", 32) == pytest.approx(4.2)  # twice the requests, twice the prefill
    assert m.prefill_s("dsd", 16) == 0.0  # neither it nor vanilla fitted
    with pytest.raises(InputError, match="--fit"):
        StepModel(grid, [], {}, 16)
