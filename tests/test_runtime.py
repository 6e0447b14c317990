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
    probes = (1, DENSE_CAP, DENSE_CAP + 1, 99_999_999, 100_000_000, 100_000_001, 10**15)
    assert [s.select(b) for b in probes] == [3, 3, 3, 3, 3, 2, 2]
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
                         (b'{"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, 1]], "points": "x"}',
                          "points")]:
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
            "heavy = [m for m in ('pandas', 'pyarrow', 'torch', 'vllm', 'numpy', 'pydantic', 'typer', "
            "'rich') if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ----------------------------------------------------------------- select == the ranges, exhaustively
# The fast select (dense lists behind two comparisons, everything else to a slow path) against a
# reference written from the table's definition alone: K of the range holding the batch size,
# carried forward, capped; n <= 0 -> K of batch size 1; a context picks the first slice whose
# max_context holds it (past the last: the last slice); None / negative / float / str / bool: the
# batch-size-only ranges.

def _ref_k(ranges, cap, b):
    if b < 1:
        return min(ranges[0][2], cap)
    k = ranges[0][2]
    for start, _, rk in ranges:
        if start <= b:
            k = rk
    return min(k, cap)


def _ref_select(ranges, cap, contexts, b, c):
    if contexts and type(c) is int and c >= 0:
        ranges = next((r for top, r in contexts if c <= top), contexts[-1][1])
    return _ref_k(ranges, cap, b)


def _random_table(rng, n_slices):
    def rand_ranges(starts):
        return [[s, (starts[i + 1] - 1 if i + 1 < len(starts) else 10**9), rng.randint(0, 7)]
                for i, s in enumerate(starts)]
    starts = [1] + sorted(rng.sample(range(2, DENSE_CAP + 300), rng.randint(0, 6)))
    tops = sorted(rng.sample(range(2, (1 << 18) + 5000), n_slices))
    return rand_ranges(starts), [(t, rand_ranges([1] + sorted(rng.sample(range(2, 600), rng.randint(0, 4)))))
                                 for t in tops]


@pytest.mark.parametrize("seed", range(6))
def test_select_matches_the_ranges_for_every_batch_size_and_context(seed):
    import random

    from dsdprof.serve.runtime import CONTEXT_DENSE_CAP
    rng = random.Random(seed)
    ranges, contexts = _random_table(rng, n_slices=1 + seed % 4)
    contexts = contexts if seed % 3 else []  # v1/v2-like (no context axis) too
    cap = rng.choice([7, 3])
    sel = KSelector(ranges, cap, contexts)
    tops = [t for t, _ in contexts]
    ctxs = [None, 0, 1, 2, 3, -1, -2, -(1 << 18), 10**6, 10**12, CONTEXT_DENSE_CAP - 1, CONTEXT_DENSE_CAP,
            CONTEXT_DENSE_CAP + 1] + [t + d for t in tops for d in (-1, 0, 1, 2)]
    sizes = list(range(-3, DENSE_CAP + 300)) + [10**7, 10**9, 10**9 + 1, 10**15, -10**12]
    for c in ctxs:
        want = [_ref_select(ranges, cap, contexts, b, c) for b in sizes]
        assert [sel.select(b, c) for b in sizes] == want, c
        if c is None:
            assert [sel.select(b) for b in sizes] == want
            assert [sel(b) for b in sizes] == want


def test_select_bad_inputs_behave_as_documented():
    contexts = [(1000, [[1, 4, 6], [5, 1 << 20, 2]]), (50_000, [[1, 1 << 20, 5]])]
    sel = KSelector([[1, 2, 3], [3, 1 << 20, 1]], 7, contexts)
    v2 = KSelector([[1, 2, 3], [3, 1 << 20, 1]], 7)
    for s in (sel, v2):
        for c in (None, -1, -10**20, 2.5, 3000.0, float("nan"), "4096", True, False, [5]):
            # no context: batch-size-only
            assert [s.select(b, c) for b in (1, 2, 3, 10**6)] == [3, 3, 1, 1], c
        assert s.select(3.0) == s.select(3) and s.select(2.5) == s.select(2) and s.select(True) == s.select(1)
        for b in ("3", None, [1]):  # a non-number batch size raises, as a dict lookup does
            with pytest.raises(TypeError):
                s.select(b)
    assert [sel.select(b, 3000) for b in (0, -5, 1, 4, 5, 2.5)] == [5, 5, 5, 5, 5, 5]
    assert [sel.select(b, 10) for b in (0, -5, 1, 4, 5, 4.5)] == [6, 6, 6, 6, 2, 6]
    with pytest.raises(TypeError):
        sel.select("3", 3000)
    np = pytest.importorskip("numpy")  # an integer context of another integer type is a context
    assert sel.select(5, np.int64(3000)) == sel.select(5, 3000) == 5 and sel.select(5, np.int64(10**9)) == 5
    assert sel.slice_index(np.int64(10)) == 0 and sel.select(np.int64(5), np.int64(10)) == 2


# ----------------------------------------------------------------- the hot path takes no slow path
# select(n) is one comparison and one list index for 0 <= n inside its list (every batch size up to
# max(last range start, LIST_MIN) from load; larger ones up to GROW_CAP once asked for); every other
# input goes to ``_far``. Replacing ``_far`` with a function that fails shows that no such batch size
# (and no context inside the dense index) raises and catches an exception or takes the slow path.

def _boom(*args):
    raise AssertionError(f"slow path taken for {args}")


def _no_far(sel):
    for s in (sel, *sel._by_slice):
        s.select.__globals__["_far"] = _boom


def _table_1449():
    from dsdprof.formats.ktable import ranges_from_points
    pts = [(1, 4), (2, 3), (4, 3), (8, 2), (16, 2), (32, 1), (64, 1), (128, 1), (256, 0), (512, 0),
           (1024, 1), (2048, 0)]
    return ranges_from_points(pts)


def test_select_hot_path_never_takes_the_slow_path():
    from dsdprof.serve.runtime import LIST_MIN
    ranges = _table_1449()
    assert ranges[-1][0] == 1449  # the held-out shape: BS 4096 is past the last range's start
    contexts = [(100, [[1, 2, 3], [3, 10**6, 1]]), (5000, ranges), (20000, [[1, 3000, 2], [3001, 3001, 5]])]
    sizes = range(0, LIST_MIN + 1)
    for sel, ctxs in ((KSelector(ranges, 7), [None]),
                      (KSelector(ranges, 7, contexts), [None, 2, 50, 100, 101, 4999, 5000, 20000])):
        ctx_ranges = [(t, r) for t, r in sel.contexts]
        want = {c: [_ref_select(sel.ranges, 7, ctx_ranges, b, c) for b in sizes] for c in ctxs}
        warm = [sel.select(b, c) for c in ctxs for b in (300_000, 2**20)]  # grows the lists once
        _no_far(sel)
        for c in ctxs:
            assert [sel.select(b, c) for b in sizes] == want[c], c
            assert [sel.for_context(c).select(b) for b in sizes] == want[c], c
            probes = (300_000, 2**20 - 1, 2**20)
            assert [sel.select(b, c) for b in probes] == [_ref_select(sel.ranges, 7, ctx_ranges, b, c)
                                                       for b in probes]
        assert warm and sel.select(4096) == sel.select(1449) == sel.select(2**20) == 0
        with pytest.raises(AssertionError, match="slow path"):  # the check can fail: the slow path is guarded
            sel.select(-1)
        with pytest.raises(AssertionError, match="slow path"):
            sel.select(2**20 + 1)


def test_select_lists_grow_once_and_stay_bounded():
    from dsdprof.serve.runtime import GROW_CAP, LIST_MIN, LOAD_CAP
    sel = KSelector([[1, 3, 2], [4, 10**12, 1]], 7)
    lst = sel.select.__globals__["_k"]
    assert len(lst) == LIST_MIN + 1
    assert sel.select(LIST_MIN + 1) == 1 and len(lst) == 2 * (LIST_MIN + 1)  # the next doubling
    # past the cap: no growth
    assert sel.select(10**15) == 1 and sel.select(GROW_CAP + 1) == 1 and len(lst) == 2 * (LIST_MIN + 1)
    assert sel.select(GROW_CAP) == 1 and len(lst) == GROW_CAP + 1
    # a last start past the load cap: the list stops at it
    far = KSelector([[1, 10**8, 3], [10**8 + 1, 10**8 + 1, 2]])
    assert len(far.select.__globals__["_k"]) == LOAD_CAP + 1
    assert [far.select(b) for b in (1, GROW_CAP, GROW_CAP + 1, 10**8, 10**8 + 1, 10**9)] == [3, 3, 3, 3, 2, 2]


def test_for_context_is_the_slice_selector():
    contexts = [(1000, [[1, 4, 6], [5, 1 << 20, 2]]), (50_000, [[1, 1 << 20, 5]])]
    sel = KSelector([[1, 2, 3], [3, 1 << 20, 1]], 7, contexts)
    assert sel.for_context(None) is sel and sel.for_context(-1) is sel and sel.for_context(True) is sel
    short, long = sel.for_context(10), sel.for_context(10**9)
    assert isinstance(short, KSelector) and short.ranges == sel.contexts[0][1] and short.max_k == 7
    assert [short.select(b) for b in (0, 4, 5, 10**6)] == [6, 6, 2, 2] and short(5) == 2
    assert [long.select(b) for b in (1, 10**6)] == [5, 5] and long.lookup_list(3) == [0, 5, 5, 5]
    v2 = KSelector([[1, 2, 3], [3, 1 << 20, 1]], 7)
    assert v2.for_context(3000) is v2


def test_select_grows_correctly_under_threads():
    import random
    import threading
    # starts past LOAD_CAP
    ranges = [[1, 70_000, 3], [70_001, 100_000, 2], [100_001, 300_000, 4], [300_001, 10**9, 1]]
    sel, errors = KSelector(ranges, 7), []

    def worker(seed):
        rng = random.Random(seed)
        for _ in range(3000):
            b = rng.choice([rng.randint(1, 2**20), rng.randint(60_000, 110_000)])
            if sel.select(b) != _ref_k(ranges, 7, b):
                errors.append(b)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    probes = range(0, 2**20 + 2, 997)
    assert [sel.select(b) for b in probes] == [_ref_k(ranges, 7, b) for b in probes]
