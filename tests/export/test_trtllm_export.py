"""TensorRT-LLM ``draft_len_schedule`` export against the rules documented in TensorRT-LLM's source."""

import json
import random
from bisect import bisect_left

import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.errors import InputError
from dsdprof.formats.ktable import LAST_RANGE_END, TableError, ranges_from_points
from dsdprof.formats.ktable_engines import check_trtllm_config, check_trtllm_schedule
from dsdprof.runtime import KSelector
from tests.support.tables import trtllm_draft_len_schedule, trtllm_speculative_config


def trtllm_draft_len(schedule, batch_size, max_draft_len):
    """TensorRT-LLM's rule (the oracle): the value of the smallest key >= ``batch_size``; 0 above
    every key; ``max_draft_len`` without a schedule."""
    if schedule is None:
        return max_draft_len
    keys = sorted(schedule)
    idx = bisect_left(keys, batch_size)
    return schedule[keys[idx]] if idx < len(keys) else 0


def _table(ranges, cap=None, **prov):
    doc = {"schema": "dsdprof.ktable/v1", "ranges": ranges, "provenance": prov}
    if cap is not None:
        doc["num_speculative_tokens"] = cap
    return doc


def test_rule_matches_the_documented_examples():
    # DecodingBaseConfig.draft_len_schedule: {4:4, 8:2, 32:1} -> BS 1-4: 4, 5-8: 2, 9-32: 1, 33+: 0
    schedule = {4: 4, 8: 2, 32: 1}
    expected = {**{b: 4 for b in range(1, 5)}, **{b: 2 for b in range(5, 9)},
                **{b: 1 for b in range(9, 33)}, 33: 0, 64: 0, 10**6: 0}
    assert {b: trtllm_draft_len(schedule, b, 4) for b in expected} == expected
    # the CUDA-graph docstring's example over cuda_graph_batch_sizes
    graph_bs = [1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 64]
    assert {b: trtllm_draft_len(schedule, b, 4) for b in graph_bs} == \
        {1: 4, 2: 4, 3: 4, 4: 4, 5: 2, 6: 2, 7: 2, 8: 2, 16: 1, 24: 1, 32: 1, 64: 0}
    assert trtllm_draft_len(None, 100, 3) == 3  # no schedule: max_draft_len


def test_validator_rules():
    assert check_trtllm_schedule({"8": 2, "1": 4}, 4) == {1: 4, 8: 2}
    for schedule, mdl, needle in [
        ({1: 3, 4: 2}, 4, "must equal max_draft_len"),   # smallest key's value == max_draft_len
        ({1: 2, 4: 3}, 2, "exceeds max_draft_len"),
        ({0: 2}, 2, "threshold must be >= 1"),
        ({1: -1}, 1, "draft length"),
        ({"x": 1}, 1, "integer batch size"),
        ({}, 1, "non-empty"),
        ({1: True}, 1, "draft length"),
    ]:
        with pytest.raises(TableError, match=needle):
            check_trtllm_schedule(schedule, mdl)


def test_ranges_map_to_upper_bound_keys_and_round_trip():
    ranges = [[1, 2, 4], [3, 11, 3], [12, 45, 2], [46, 181, 1], [182, LAST_RANGE_END, 0]]
    mdl, schedule = trtllm_draft_len_schedule(_table(ranges))
    assert mdl == 4 and schedule == {2: 4, 11: 3, 45: 2, 181: 1}  # trailing K=0 is implicit
    sel = KSelector(ranges)
    for b in list(range(1, 5000)) + [LAST_RANGE_END, LAST_RANGE_END + 1, 10**12]:
        assert trtllm_draft_len(schedule, b, mdl) == sel.select(b), b


def test_last_nonzero_range_carries_forward_to_last_range_end():
    ranges = [[1, 4, 3], [5, 64, 1]]  # vLLM / KSelector carry K=1 past 64
    mdl, schedule = trtllm_draft_len_schedule(_table(ranges))
    assert schedule == {4: 3, LAST_RANGE_END: 1}
    sel = KSelector(ranges)
    for b in (1, 4, 5, 64, 65, 4096, LAST_RANGE_END):
        assert trtllm_draft_len(schedule, b, mdl) == sel.select(b)
    # beyond the largest key TensorRT-LLM runs 0 where the table carries 1 (documented difference)
    assert trtllm_draft_len(schedule, LAST_RANGE_END + 1, mdl) == 0 and sel.select(LAST_RANGE_END + 1) == 1


def test_random_monotone_tables_round_trip():
    rng = random.Random(3)
    for _ in range(200):
        sizes = sorted(rng.sample(range(1, 600), rng.randint(1, 8)))
        ks = sorted((rng.randint(0, 7) for _ in sizes), reverse=True)
        if ks[0] == 0:
            continue
        ranges = ranges_from_points(list(zip(sizes, ks)))
        cap = rng.choice([None, rng.randint(1, 8)])
        mdl, schedule = trtllm_draft_len_schedule(_table(ranges, cap))
        check_trtllm_schedule(schedule, mdl)
        sel = KSelector(ranges, cap)
        for b in range(1, 1300):
            assert trtllm_draft_len(schedule, b, mdl) == sel.select(b), (ranges, cap, b)


def test_interior_zero_is_explicit():
    mdl, schedule = trtllm_draft_len_schedule(_table([[1, 4, 2], [5, 8, 0], [9, 100, 1]]))
    assert schedule == {4: 2, 8: 0, LAST_RANGE_END: 1}
    assert [trtllm_draft_len(schedule, b, mdl) for b in (4, 5, 8, 9)] == [2, 0, 0, 1]


def test_tables_trtllm_cannot_express_are_refused():
    with pytest.raises(InputError, match="largest K at its smallest key"):
        trtllm_draft_len_schedule(_table([[1, 4, 2], [5, 100, 3]]))  # MoE-like: K rises with BS
    with pytest.raises(InputError, match="K=0 at every batch size"):
        trtllm_draft_len_schedule(_table([[1, 100, 0]]))
    # a cap makes a rising table expressible: K is min(K, num_speculative_tokens) as served
    assert trtllm_draft_len_schedule(_table([[1, 4, 2], [5, 100, 3]], cap=2)) == (2, {LAST_RANGE_END: 2})


def test_speculative_config_fields():
    cfg = trtllm_speculative_config(_table([[1, 4, 3], [5, 9, 1], [10, 20, 0]], method="eagle3",
                                           draft_model="d/e3"))
    assert cfg == {"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3,
                                          "speculative_model": "d/e3",
                                          "draft_len_schedule": {"4": 3, "9": 1}}}
    check_trtllm_config(json.loads(json.dumps(cfg)))
    ngram = trtllm_speculative_config(_table([[1, 4, 3]], method="ngram",
                                             draft_model=""))["speculative_config"]
    assert ngram["decoding_type"] == "NGram" and "speculative_model" not in ngram
    unknown = trtllm_speculative_config(_table([[1, 4, 3]], method="medusa"))["speculative_config"]
    assert "decoding_type" not in unknown


def test_cli_export_trtllm(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(_table([[1, 2, 4], [3, 11, 2], [12, 1 << 20, 0]], method="eagle",
                                   draft_model="m")))
    out = tmp_path / "trt.json"
    r = CliRunner().invoke(app, ["export", str(p), "--format", "trtllm", "-o", str(out)])
    assert r.exit_code == 0, r.output
    cfg = json.loads(out.read_text())["speculative_config"]
    assert cfg["draft_len_schedule"] == {"2": 4, "11": 2} and cfg["max_draft_len"] == 4
    p.write_text(json.dumps(_table([[1, 2, 1], [3, 11, 2]])))
    r = CliRunner().invoke(app, ["export", str(p), "--format", "trtllm"])
    assert r.exit_code == 2 and "ranges=" in r.stderr and r.stderr.count("\n") == 1
