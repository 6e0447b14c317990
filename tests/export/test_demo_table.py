"""The committed demo table is what ``make demo`` writes today: measured with the current
measurement schema, from the demo spec's own run directory, over its whole grid, and the vLLM
config beside it is the table's schedule (issue 48: a table from an older demo misled a rollout)."""

from __future__ import annotations

import json
from pathlib import Path

from dsdprof.config.spec import load_spec
from dsdprof.formats.ktable import k_for_batch_size
from dsdprof.formats.versions import MEASUREMENT_SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_demo_table_is_the_current_demo():
    table = json.loads((ROOT / "tables" / "toy-dense-cpu.json").read_text())
    spec = load_spec(ROOT / "sweeps" / "toy-dense-cpu.toml")
    prov = table["provenance"]
    assert prov["schema_version"] == MEASUREMENT_SCHEMA_VERSION, "regenerate it: make demo"
    assert prov["source"] == "runs/toy-dense-cpu"  # the Makefile's demo directory
    assert prov["extra_design"] == spec.sweep.design
    cells = {(c["batch_size"], c["k"]) for c in table["cells"]}
    assert cells == {(b, k) for b in spec.sweep.batch_sizes for k in spec.sweep.num_spec_tokens}
    vllm = json.loads((ROOT / "tables" / "toy-dense-cpu.vllm.json").read_text())
    assert vllm["num_speculative_tokens_per_batch_size"] == table["ranges"]
    assert vllm["num_speculative_tokens"] == max(r[2] for r in table["ranges"])
    assert [k_for_batch_size(table["ranges"], b) for b in (1, 1 << 20)] == [table["ranges"][0][2],
                                                                           table["ranges"][-1][2]]
