"""The adaptive scheduler in a real vLLM engine (CPU build, toy pair): one engine start.

The demo table of 2026-11-29 (tests/data/toy-dense-cpu-2026-11-29.json: K=4 at BS 1 and 2, the default toy
pair) is served on the far-shifted pair (same shapes, so the same step times; residual scale 0.1,
so acceptance ~0.4 per token instead of ~0.85), where fixed K=1 is the fastest (docs/lab/notebook.md).
Served through ``dsdprof validate``'s adaptive engine (K <= 4), the scheduler must observe the
live acceptance and step times, swap vLLM's lookup, and the cells must draft fewer tokens than
the table's K. (Until issue 18 this test served a table whose step times were synthetic: the
selector now learns the engine's step times, under which the default pair's best K is 4.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from dsdprof.config.spec import parse_spec  # noqa: E402
from dsdprof.formats.ktable import k_for_batch_size  # noqa: E402
from dsdprof.formats.measurements import MODE_ADAPTIVE  # noqa: E402
from dsdprof.jobs.validate import validation_engine  # noqa: E402
from dsdprof.measure.engine import Cell  # noqa: E402
from dsdprof.measure.toy_models import ToyModelConfig, build_toy_pair  # noqa: E402

pytestmark = pytest.mark.vllm


def test_adaptive_engine_moves_k_to_the_live_acceptance(tmp_path):
    toy = build_toy_pair(tmp_path / "toy", ToyModelConfig(residual_scale=0.1))
    spec = parse_spec({
        "engine": {"name": "vllm", "model": str(toy.target), "draft_model": str(toy.draft),
                   "method": "draft_model",
                   "dtype": "float32", "max_model_len": 256, "extra": {"enforce_eager": True}},
        "sweep": {"batch_sizes": [1, 2], "num_spec_tokens": [0, 3], "waves": 1,
                  "output_len": 16, "warmup": 1},
        "workload": {"input_len": 16, "num_prompts": 16},
    })
    table = json.loads((Path(__file__).parents[1] / "data" / "toy-dense-cpu-2026-11-29.json").read_text())
    table["provenance"] = {"model": str(toy.target), "draft_model": str(toy.draft)}
    table_file = tmp_path / "table.json"
    table_file.write_text(json.dumps(table))
    out = tmp_path / "run"
    options = {"prior_weight": 2, "half_life": 32, "rebuild_every": 1}  # follow within a few steps
    engine = validation_engine(spec, table, out, adaptive=(str(table_file), 4, options))
    try:
        m1 = engine.measure(Cell(0, 1, MODE_ADAPTIVE, 4))
        m2 = engine.measure(Cell(0, 2, MODE_ADAPTIVE, 4))
    finally:
        engine.close()
    log = (out / "_logs" / "engine-adaptive.log").read_text()
    assert "dsdprof adaptive K: table" in log, log[-3000:]
    assert "dsdprof adaptive K: now" in log, log[-3000:]  # the lookup was swapped inside the engine core
    static = {b: k_for_batch_size(table["ranges"], b) for b in (1, 2)}
    assert static == {1: 4, 2: 4}
    for m in (m1, m2):
        assert m.steady_steps > 0 and m.num_drafts > 0 and m.acceptance_length > 1.0
        assert m.acceptance_per_pos == ()  # adaptive cells carry no per-position acceptance
    # the K served after the warm-up wave is the live acceptance's, not the table's
    assert m2.drafted_per_draft < static[2] - 1.5, (m1.drafted_per_draft, m2.drafted_per_draft)
    assert m1.drafted_per_draft < static[1], (m1.drafted_per_draft, m2.drafted_per_draft)
