"""The adaptive plugin keys K on the batch's context in a real vLLM engine (CPU build): one engine start.

A ``dsdprof.ktable/v3`` table serves K=3 up to 64 tokens of context and K=1 beyond, at every batch
size. Each slice's cells hold only that slice's K, so the selector has no other K to move to (and
``explore_every = 0``): what the engine drafts is the slice the plugin picked. The engine is started
as a user serves the plugin -- ``vllm.LLM(scheduler_cls=..., additional_config=...)`` in dynamic-SD
mode, no dsdprof run, so no run secret and no tracing -- in a child process. The evidence is vLLM's
own spec-decode counters (``vllm:spec_decode_num_drafts`` / ``..._num_draft_tokens`` from
``LLM.get_metrics()``, deltas over each phase), not anything the plugin reports: drafted tokens
per draft is ~3 for a batch of short prompts, ~1 for a batch of long ones, and ~3 for a mixed
batch whose mean context is short but whose longest request is long (the plugin keys on the mean).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from dsdprof.serve.settings import ADAPTIVE_SCHEDULER_QUALNAME, adaptive_additional_config  # noqa: E402

# vLLM's counters of what the plugin drafted, not step times: engine core in-process (tests/conftest.py)
pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("inproc_engine_core")]

ROOT = Path(__file__).resolve().parents[2]
SHORT_TOP = 64  # contexts <= 64 tokens: K=3; beyond: K=1
K_SHORT, K_LONG = 3, 1

# (phase, prompt lengths, max_tokens). short: <= 16 + 32 + 3 tokens of context, always in the short
# slice. long: >= 320. mixed: mean <= (3*8 + 90)/4 + 24 + 3 = 55.5 (short slice), max >= 90 (long).
PHASES = [("short", [16] * 4, 32), ("long", [320] * 4, 32), ("mixed", [8, 8, 8, 90], 24)]

CHILD = r"""
import json, random, sys, time
from vllm import LLM, SamplingParams

cfg = json.loads(open(sys.argv[1]).read())
t0 = time.perf_counter()
llm = LLM(**cfg["llm"])
start_s = time.perf_counter() - t0

def counters():
    drafts = tokens = 0.0
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            drafts += m.value
        elif m.name == "vllm:spec_decode_num_draft_tokens":
            tokens += m.value
    return drafts, tokens

rng = random.Random(0)
out = {"start_s": start_s, "phases": {}}
for name, lens, max_tokens in cfg["phases"]:
    prompts = [{"prompt_token_ids": [rng.randrange(100, 2000) for _ in range(n)]} for n in lens]
    params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    d0, t0_ = counters()
    t = time.perf_counter()
    res = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t
    d1, t1_ = counters()
    out["phases"][name] = {"drafts": d1 - d0, "draft_tokens": t1_ - t0_, "wall_s": wall,
                           "tokens": sum(len(r.outputs[0].token_ids) for r in res)}
print("RESULT " + json.dumps(out), flush=True)
"""


def _slice(max_context: int, context_len: int, k: int, acceptance: list[float]) -> dict:
    """A slice whose only measured K is ``k`` (at batch sizes 1 and 4)."""
    cells = [{"batch_size": b, "k": k, "itl_s": 0.02 + 0.005 * b,
              "acceptance_length": 1 + sum(acceptance[:k]),
              "acceptance_per_pos": acceptance[:k]} for b in (1, 4)]
    return {"max_context": max_context, "context_len": context_len, "ranges": [[1, 1 << 20, k]],
            "points": [{"batch_size": b, "k": k} for b in (1, 4)], "cells": cells,
            "acceptance_per_pos": acceptance[:k]}


def context_table(target: str, draft: str) -> dict:
    acceptance = [0.8, 0.64, 0.51]
    short, long = _slice(SHORT_TOP, 32, K_SHORT, acceptance), _slice(1 << 24, 320, K_LONG, acceptance)
    top = {k: short[k] for k in ("ranges", "points", "cells", "acceptance_per_pos")}  # batch-size-only answer
    return {"schema": "dsdprof.ktable/v3", "num_speculative_tokens": K_SHORT, "default_context": 32,
            "context_interpolation": "nearest-log", **top, "contexts": [short, long],
            "provenance": {"model": target, "draft_model": draft, "method": "draft_model"}}


def test_adaptive_plugin_drafts_the_k_of_the_batch_mean_context(tmp_path, toy_tiny):
    toy = toy_tiny  # the session's tiny toy pair (tests/conftest.py): drafted K, not step time
    table_file = tmp_path / "table.json"
    table_file.write_text(json.dumps(context_table(str(toy.target), str(toy.draft))))
    llm = {
        "model": str(toy.target), "dtype": "float32", "max_model_len": 512, "max_num_seqs": 4, "seed": 0,
        "enforce_eager": True, "disable_log_stats": False, "scheduler_cls": ADAPTIVE_SCHEDULER_QUALNAME,
        # vLLM's dynamic-SD mode on (the plugin replaces the schedule by the table's slices)
        "speculative_config": {"method": "draft_model", "model": str(toy.draft),
                               "num_speculative_tokens": K_SHORT,
                               "num_speculative_tokens_per_batch_size": [[1, 1 << 20, K_SHORT]]},
        "additional_config": adaptive_additional_config(str(table_file), {"explore_every": 0}),
    }
    cfg = tmp_path / "child.json"
    cfg.write_text(json.dumps({"llm": llm, "phases": PHASES}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSDPROF_")}  # no dsdprof run's secret
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(cfg)], capture_output=True, text=True, env=env,
                          timeout=900, cwd=tmp_path)
    wall = time.perf_counter() - t
    log = proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, log[-4000:]
    assert "dsdprof adaptive K: table" in log, log[-4000:]  # the plugin ran inside the engine core
    res = json.loads(lines[-1][len("RESULT "):])
    dpd = {name: p["draft_tokens"] / p["drafts"] for name, p in res["phases"].items() if p["drafts"]}
    print(f"engine start {res['start_s']:.1f} s, child {wall:.1f} s; drafted per draft (vLLM's counters) "
          + ", ".join(f"{n} {v:.3f} ({p['drafts']:.0f} drafts, {p['wall_s']:.1f} s)"
                      for (n, p), v in zip(res["phases"].items(), dpd.values())))
    for name, _, max_tokens in PHASES:
        assert res["phases"][name]["tokens"] == 4 * max_tokens, res
        assert res["phases"][name]["drafts"] >= 4 * 4, res  # every request drafted over its decode
    assert dpd["short"] == pytest.approx(K_SHORT, abs=0.05), dpd
    # long: exactly K_LONG -- the context is read when vLLM looks K up, after it admitted the batch,
    # so the admitting step is keyed on the new requests too (read before admission, it saw an empty
    # batch: context 0, the short slice, and 3 of 63 drafts were K=3)
    assert dpd["long"] == pytest.approx(K_LONG, abs=0.02), dpd
    assert dpd["mixed"] >= K_SHORT - 0.75, dpd  # keyed on the max (>= 90 tokens) it would be ~1
