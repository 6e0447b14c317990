import json
import random

import pytest

from dsdprof.analysis import analyze
from dsdprof.errors import InputError
from dsdprof.runtime import KSelector
from dsdprof.schema import TableError
from dsdprof.table import (
    LAST_RANGE_END, build_table, k_for_batch_size, load_table, ranges_from_points,
    vllm_speculative_config, write_json_atomic,
)

vllm_utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")


def test_nearest_log_rule_and_merging():
    r = ranges_from_points([(1, 5), (2, 4), (4, 3), (8, 3), (16, 1)])
    assert r == [[1, 1, 5], [2, 2, 4], [3, 11, 3], [12, LAST_RANGE_END, 1]]
    # BS 5 is nearer 4 than 8 on a log scale; 6 is nearer 8 (6*6 = 36 > 32)
    r2 = ranges_from_points([(4, 2), (8, 1)])
    assert k_for_batch_size(r2, 5) == 2 and k_for_batch_size(r2, 6) == 1
    assert k_for_batch_size(r2, 1) == 2 and k_for_batch_size(r2, 10**9) == 1


def test_single_point_and_errors():
    assert ranges_from_points([(7, 2)]) == [[1, LAST_RANGE_END, 2]]
    with pytest.raises(InputError):
        ranges_from_points([])
    with pytest.raises(InputError):
        ranges_from_points([(2, 1), (2, 3)])


def test_built_table_is_valid_and_accepted_by_vllm(dense_like_frame, tmp_path):
    doc = build_table(analyze(dense_like_frame), source="x")
    assert doc["schema"] == "dsdprof.ktable/v1"
    assert doc["ranges"][0][0] == 1
    assert [p["batch_size"] for p in doc["points"]] == [1, 2, 4, 8, 16, 32, 64]
    for p in doc["points"]:
        assert k_for_batch_size(doc["ranges"], p["batch_size"]) == p["k"]
    cfg = vllm_speculative_config(doc)
    assert cfg["num_speculative_tokens"] == max(r[2] for r in doc["ranges"])
    assert vllm_utils.validate_and_normalize_dynamic_sd_schedule(cfg["num_speculative_tokens_per_batch_size"])
    path = write_json_atomic(tmp_path / "t.json", doc)
    assert load_table(path)["ranges"] == doc["ranges"]
    with pytest.raises(InputError, match="exists"):
        write_json_atomic(path, {"other": 1})
    assert json.loads(path.read_text())["ranges"] == doc["ranges"]


def test_vllm_export_rejects_all_zero_table():
    with pytest.raises(InputError, match="K=0 at every batch size"):
        vllm_speculative_config({"schema": "dsdprof.ktable/v1", "ranges": [[1, 10, 0]]})


def _random_ranges(rng):
    ranges, start = [], 1
    for _ in range(rng.randint(1, 6)):
        end = start + rng.randint(0, 40)
        ranges.append([start, end, rng.randint(0, 7)])
        start = end + 1
    return ranges


def test_selector_matches_vllm_lookup_on_random_tables():
    rng = random.Random(0)
    for _ in range(200):
        ranges = _random_ranges(rng)
        cap = rng.choice([None, rng.randint(1, 8)])
        max_k = max(r[2] for r in ranges) if cap is None else cap
        if max_k <= 0:
            continue
        sel = KSelector(ranges, cap)
        lookup = vllm_utils.build_dynamic_sd_schedule_lookup(ranges, 400, max_k)
        for b in range(1, 401):
            assert sel.select(b) == lookup[b], (ranges, cap, b)


def test_load_table_errors(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        load_table(tmp_path / "none.json")
    p = tmp_path / "bad.json"
    p.write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        load_table(p)
    p.write_text(json.dumps({"schema": "dsdprof.ktable/v1", "ranges": [[2, 3, 1]]}))
    with pytest.raises(TableError, match=r"ranges\[0\]"):
        load_table(p)
