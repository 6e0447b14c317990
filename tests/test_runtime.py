import json
import subprocess
import sys

import pytest

from dsdprof.runtime import KSelector, TableError

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


def test_select_never_raises_for_positive_ints():
    s = KSelector([[1, 3, 1]])
    for b in [1, 2, 3, 4, 1000, 2**63]:
        assert s.select(b) == 1


@pytest.mark.parametrize("doc", [
    {"schema": "dsdprof.ktable/v1"},
    {"schema": "dsdprof.ktable/v1", "ranges": [[0, 3, 1]]},
    {"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, 1], [5, 9, 1]]},
    {"schema": "other", "ranges": [[1, 3, 1]]},
    {"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, 1]], "num_speculative_tokens": -1},
    [],
])
def test_malformed_tables_rejected_at_load(doc):
    with pytest.raises(TableError):
        KSelector.from_dict(doc)


def test_unreadable_file(tmp_path):
    with pytest.raises(TableError, match="cannot read"):
        KSelector.from_file(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("nope")
    with pytest.raises(TableError, match="not valid JSON"):
        KSelector.from_file(tmp_path / "x.json")


def test_import_runtime_is_light():
    code = ("import sys, dsdprof.runtime; "
            "heavy = [m for m in ('pandas', 'pyarrow', 'torch', 'vllm', 'numpy', 'pydantic', 'typer', 'rich') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
