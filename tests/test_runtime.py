import json
import subprocess
import sys

import pytest

from dsdprof.serve.runtime import DENSE_CAP, KSelector, TableError

TABLE = {"schema": "dsdprof.ktable/v1", "num_speculative_tokens": 4,
         "ranges": [[1, 2, 4], [3, 12, 2], [13, 64, 0]]}


def test_select_follows_ranges_and_carries_forward(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(TABLE))
    s = KSelector.from_file(p)
    assert [s.select(b) for b in (1, 2, 3, 12, 13, 64, 65, 10**12)] == [4, 4, 2, 2, 0, 0, 0, 0]
    assert s(5) == 2


def test_cap_by_num_speculative_tokens():
    s = KSelector.from_dict({**TABLE, "num_speculative_tokens": 3})
    assert s.select(1) == 3 and s.select(5) == 2
    assert KSelector([[1, 3, 5], [4, 9, 2]], 0).select(1) == 0


def test_select_never_raises_for_ints():
    s = KSelector([[1, 3, 1]])
    for b in [1, 2, 3, 4, 1000, 2**63, 10**30]:
        assert s.select(b) == 1


def test_nonpositive_batch_size_gets_batch_size_1s_k():
    # Documented: n <= 0 (nothing scheduled) -> K of batch size 1; never another batch size's K
    # (a plain list would give lookup[-3] = the K of a large batch size).
    s = KSelector([[1, 1, 5], [2, 19, 3], [20, 20, 1], [21, 40, 0]])
    for n in (0, -1, -3, -20, -10**12):
        assert s.select(n) == 5
    s2 = KSelector([[1, 10**9, 2], [10**9 + 1, 10**9 + 1, 7]])
    assert s2.select(-1) == 2 and s2.select(0) == 2


def test_sparse_large_tables_load_small_and_select_right():
    s = KSelector([[1, 100_000_000, 3], [100_000_001, 100_000_001, 2]])
    assert len(s._lookup) <= DENSE_CAP + 1  # memory grows with the ranges, not the last start
    assert [s.select(b) for b in (1, DENSE_CAP, DENSE_CAP + 1, 99_999_999, 100_000_000, 100_000_001, 10**15)] == \
        [3, 3, 3, 3, 3, 2, 2]
    big = KSelector([[1, 10**12 - 1, 4], [10**12, 10**12, 1], [10**12 + 1, 2 * 10**12, 6]])
    assert len(big._lookup) <= DENSE_CAP + 1
    assert [big.select(b) for b in (1, 10**12 - 1, 10**12, 10**12 + 1, 3 * 10**12)] == [4, 4, 1, 6, 6]
    many = KSelector([[i, i, i % 5] for i in range(1, 200_001)])
    assert [many.select(b) for b in (1, 4096, 4097, 123_456, 200_000, 200_001)] == \
        [1, 4096 % 5, 4097 % 5, 123_456 % 5, 0, 0]


def test_lookup_list_is_the_dense_schedule():
    s = KSelector([[1, 2, 4], [3, 5, 2], [6, 6, 0]], 3)
    assert s.lookup_list(8) == [0, 3, 3, 2, 2, 2, 0, 0, 0]
    assert s.lookup_list(1) == [0, 3]
    with pytest.raises(ValueError):
        s.lookup_list(0)


@pytest.mark.parametrize("doc", [
    {"schema": "dsdprof.ktable/v1"},
    {"schema": "dsdprof.ktable/v1", "ranges": [[0, 3, 1]]},
    {"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, 1], [5, 9, 1]]},
    {"schema": "other", "ranges": [[1, 3, 1]]},
    {"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, 1]], "num_speculative_tokens": -1},
    {"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, 1]], "num_speculative_tokens": 129},
    {"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, 1]], "num_speculative_tokens": True},
    {"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, 200]]},
    {"schema": "dsdprof.ktable/v1", "ranges": [[1, True, 1]]},
    {"schema": "dsdprof.ktable/v1", "ranges": [[1, 2**64, 1]]},
    {"schema": "dsdprof.ktable/v2", "ranges": [[1, 3, 1]]},  # v2 without its measured cells
    [],
    None,
])
def test_malformed_tables_rejected_at_load(doc):
    with pytest.raises(TableError):
        KSelector.from_dict(doc)


def test_constructor_validates_too():
    for ranges, cap in [([[1, 3, 1]], -1), ([[1, 3, 1]], "2"), ("1-3", None), ([(1, 3, 1.5)], None)]:
        with pytest.raises(TableError):
            KSelector(ranges, cap)
    assert KSelector([(1, 3, 2)]).select(2) == 2


def test_unreadable_files_are_table_errors(tmp_path):
    with pytest.raises(TableError, match="cannot read"):
        KSelector.from_file(tmp_path / "missing.json")
    with pytest.raises(TableError, match="cannot read"):
        KSelector.from_file(tmp_path)
    p = tmp_path / "x.json"
    for data, needle in [(b"nope", "not valid JSON"), (b"\x80\x81 not utf8", "not UTF-8"),
                         (b'{"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, true]]}', "ranges"),
                         (b'{"schema": "dsdprof.ktable/v1", "ranges": [[1, 1e3, 1]]}', "ranges"),
                         (b'{"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, 1]], "points": "x"}', "points")]:
        p.write_bytes(data)
        with pytest.raises(TableError, match=needle):
            KSelector.from_file(p)


def test_v2_tables_serve_like_v1(tmp_path):
    doc = {"schema": "dsdprof.ktable/v2", "num_speculative_tokens": 3, "ranges": [[1, 4, 3], [5, 1 << 20, 1]],
           "cells": [{"batch_size": 1, "k": 3, "itl_s": 0.01, "acceptance_length": 2.5}],
           "acceptance_per_pos": [0.8, 0.5, 0.3]}
    s = KSelector.from_dict(doc)
    assert [s.select(b) for b in (1, 4, 5, 10**7)] == [3, 3, 1, 1]


def test_import_runtime_is_light():
    code = ("import sys, dsdprof.serve.runtime; "
            "heavy = [m for m in ('pandas', 'pyarrow', 'torch', 'vllm', 'numpy', 'pydantic', 'typer', 'rich') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
