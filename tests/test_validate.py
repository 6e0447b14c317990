"""dsdprof validate's pure parts (planning, vLLM kwargs, table checks); tests/test_validate_vllm.py
runs it on real vLLM."""

from __future__ import annotations

import pytest

from dsdprof.errors import InputError
from dsdprof.jobs.validate import (
    dsd_llm_kwargs, plan_validation, table_warnings, worker_key,
)
from dsdprof.config.spec import parse_spec

TABLE = {
    "schema": "dsdprof.ktable/v1", "num_speculative_tokens": 3,
    "ranges": [[1, 2, 3], [3, 11, 1], [12, 1 << 20, 0]],
    "points": [{"batch_size": 1, "k": 3}, {"batch_size": 4, "k": 1}, {"batch_size": 16, "k": 0}],
    "provenance": {"model": "tgt", "draft_model": "drf", "method": "draft_model"},
}


def make_spec(batch_sizes=(1, 4, 16), repeats=1, **engine):
    e = {"name": "vllm", "model": "tgt", "draft_model": "drf", "method": "draft_model", "extra": {"enforce_eager": True}}
    e.update(engine)
    return parse_spec({"engine": e, "sweep": {"batch_sizes": list(batch_sizes), "num_spec_tokens": [0, 3],
                                              "waves": 2, "output_len": 8, "repeats": repeats}})


def test_plan_interleaves_and_rotates():
    cells = plan_validation([4, 1], [3, 1], TABLE["ranges"], repeats=2)
    assert len(cells) == 2 * 2 * 4
    first = cells[:4]
    assert {c.batch_size for c in first} == {1}
    assert {(c.mode, c.num_spec_tokens) for c in first} == {("vanilla", 0), ("fixed", 1), ("fixed", 3), ("dsd", 3)}
    assert cells[4].mode != cells[0].mode  # order rotates
    assert [c for c in cells if c.mode == "dsd" and c.batch_size == 4][0].num_spec_tokens == 1
    assert worker_key(first[0]) in ("vanilla", "fixed-1", "fixed-3", "dsd")
    with pytest.raises(InputError, match="fixed-k"):
        plan_validation([1], [0], TABLE["ranges"], 1)
    with pytest.raises(InputError, match="fixed-k"):
        plan_validation([1], [], TABLE["ranges"], 1)


def test_dsd_kwargs_use_vllm_schedule():
    spec = make_spec()
    base = {"model": "tgt", "max_num_seqs": 16, "scheduler_cls": "dsdprof.engines.vllm_scheduler.make_scheduler"}
    kw = dsd_llm_kwargs(base, TABLE, spec)
    cfg = kw["speculative_config"]
    assert cfg["num_speculative_tokens"] == 3
    assert cfg["num_speculative_tokens_per_batch_size"] == TABLE["ranges"]
    assert cfg["model"] == "drf" and cfg["method"] == "draft_model"
    assert kw["scheduler_cls"] == base["scheduler_cls"]  # gate + trace only; K comes from vLLM's lookup
    zero = dict(TABLE, ranges=[[1, 1 << 20, 0]])
    assert dsd_llm_kwargs({"model": "tgt"}, zero, spec) is None


def test_table_warnings_name_mismatches():
    spec = make_spec(batch_sizes=(1, 64), model="other")
    w = table_warnings(TABLE, spec)
    assert any("model='tgt'" in x for x in w)
    assert any("[64]" in x for x in w)
    assert table_warnings(TABLE, make_spec()) == []

