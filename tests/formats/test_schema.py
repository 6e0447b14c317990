import json

import pytest

from dsdprof.formats import ktable
from dsdprof.formats.ktable import (
    MAX_BATCH_SIZE,
    MAX_K,
    TableError,
    read_table_file,
    validate_num_speculative_tokens,
    validate_ranges,
    validate_table,
)
from dsdprof.formats.measurements import COLUMN_NAMES, CONTRACT_COLUMNS, arrow_schema, empty_row
from dsdprof.formats.versions import TABLE_SCHEMA, TABLE_SCHEMA_V1, TABLE_SCHEMA_V2


def test_contract_columns_are_measurement_columns():
    assert set(CONTRACT_COLUMNS) <= set(COLUMN_NAMES)
    assert arrow_schema().names == list(COLUMN_NAMES)
    assert set(empty_row()) == set(COLUMN_NAMES)


@pytest.mark.parametrize("ranges, field", [
    ([], "ranges"),
    ([[2, 4, 1]], "ranges[0]"),
    ([[1, 4, 1], [6, 8, 1]], "ranges[1]"),
    ([[1, 4, 1], [3, 8, 1]], "ranges[1]"),
    ([[1, 0, 1]], "ranges[0]"),
    ([[1, 4, -1]], "ranges[0]"),
    ([[1, 4.0, 1]], "ranges[0]"),
    ([[1, 4]], "ranges[0]"),
    ("1-4:3", "ranges"),
    ([[1, True, 2]], "ranges[0]"),
    ([[1, 4, False]], "ranges[0]"),
    ([[1, 4, MAX_K + 1]], "ranges[0]"),
    ([[1, MAX_BATCH_SIZE + 1, 1]], "ranges[0]"),
    ([[1, 10**40, 1]], "ranges[0]"),
    ([[1, 4, "3"]], "ranges[0]"),
    ([[1, 4, None]], "ranges[0]"),
])
def test_bad_ranges_name_the_field(ranges, field):
    with pytest.raises(TableError) as e:
        validate_ranges(ranges)
    assert str(e.value).startswith(field + "=")


def test_good_ranges_and_bounds():
    assert validate_ranges([[1, 1, 4], [2, 8, 2], [9, 100, 0]]) == [(1, 1, 4), (2, 8, 2), (9, 100, 0)]
    assert validate_ranges([[1, MAX_BATCH_SIZE, MAX_K]]) == [(1, MAX_BATCH_SIZE, MAX_K)]
    assert MAX_K == 128  # vLLM's rejection sampler MAX_SPEC_LEN


@pytest.mark.parametrize("value", [-1, MAX_K + 1, True, "3", 3.0, None, [3]])
def test_num_speculative_tokens_bounds(value):
    with pytest.raises(TableError, match="num_speculative_tokens="):
        validate_num_speculative_tokens(value)


def test_num_speculative_tokens_accepted():
    assert [validate_num_speculative_tokens(v) for v in (0, 1, MAX_K)] == [0, 1, MAX_K]


def test_error_lines_stay_short():
    with pytest.raises(TableError) as e:
        validate_ranges("x" * 10_000)
    assert len(str(e.value)) < 200 and "\n" not in str(e.value)


V1 = {"schema": TABLE_SCHEMA_V1, "ranges": [[1, 10, 2]],
      "points": [{"batch_size": 1, "k": 2, "goodput": 3.0}]}
V2 = {"schema": TABLE_SCHEMA_V2, "num_speculative_tokens": 2, "ranges": [[1, 10, 2]],
      "cells": [{"batch_size": 1, "k": 0, "itl_s": 0.01, "acceptance_length": 1.0},
                {"batch_size": 1, "k": 2, "itl_s": 0.012, "acceptance_length": 2.4,
                 "acceptance_per_pos": [0.8, 0.6]}],
      "acceptance_per_pos": [0.8, 0.6]}


def test_validate_table_v1_checks_schema_and_points():
    assert TABLE_SCHEMA == TABLE_SCHEMA_V2
    assert validate_table(V1) is V1
    with pytest.raises(TableError, match="schema"):
        validate_table({**V1, "schema": "dsdprof.ktable/v0"})
    with pytest.raises(TableError, match=r"points\[0\].goodput"):
        validate_table({**V1, "points": [{"batch_size": 1, "k": 2, "goodput": float("nan")}]})
    with pytest.raises(TableError, match="must be a JSON object"):
        validate_table([1, 2])


@pytest.mark.parametrize("point, field", [
    ({"batch_size": 0, "k": 1}, "points[0].batch_size"),
    ({"batch_size": True, "k": 1}, "points[0].batch_size"),
    ({"batch_size": 1, "k": MAX_K + 1}, "points[0].k"),
    ({"batch_size": 1, "k": 1, "decided": "yes"}, "points[0].decided"),
    ({"batch_size": 1, "k": 1, "runner_up": -1}, "points[0].runner_up"),
    ({"batch_size": 1, "k": 1, "ci_low": "x"}, "points[0].ci_low"),
    ({"batch_size": 1, "k": 1, "itl_s": True}, "points[0].itl_s"),
    ({"batch_size": 1, "k": 1, "speedup_vs_fixed_k": {"1": float("inf")}}, "points[0].speedup_vs_fixed_k.1"),
])
def test_bad_points(point, field):
    with pytest.raises(TableError) as e:
        validate_table({**V1, "points": [point]})
    assert str(e.value).startswith(field + "=")


def test_optional_point_fields_accepted():
    p = {"batch_size": 4, "k": 2, "decided": True, "runner_up": 3, "margin": 0.04, "ci_low": 0.01,
         "ci_high": 0.07}
    validate_table({**V1, "points": [p, {"batch_size": 8, "k": 1, "decided": None, "runner_up": None}]})


def test_v2_needs_cells_and_checks_them():
    assert validate_table(V2) is V2
    with pytest.raises(TableError, match="^cells="):
        validate_table({k: v for k, v in V2.items() if k != "cells"})
    bad_cells = [
        ({"batch_size": 1, "k": 1, "itl_s": 0.0, "acceptance_length": 1.5}, "cells[0].itl_s"),
        ({"batch_size": 1, "k": 1, "itl_s": 0.01, "acceptance_length": 2.5}, "cells[0].acceptance_length"),
        ({"batch_size": 1, "k": 1, "itl_s": 0.01, "acceptance_length": 0.5}, "cells[0].acceptance_length"),
        ({"batch_size": 1, "k": 1, "itl_s": 0.01, "acceptance_length": 1.5, "acceptance_per_pos": [1.5]},
         "cells[0].acceptance_per_pos[0]"),
        ({"batch_size": 1, "k": 1, "itl_s": 0.01, "acceptance_length": 1.5, "acceptance_per_pos": [0.5, 0.4]},
         "cells[0].acceptance_per_pos"),
        ({"batch_size": "1", "k": 1, "itl_s": 0.01, "acceptance_length": 1.5}, "cells[0].batch_size"),
    ]
    for cell, field in bad_cells:
        with pytest.raises(TableError) as e:
            validate_table({**V2, "cells": [cell]})
        assert str(e.value).startswith(field + "="), (cell, str(e.value))
    dup = V2["cells"][:1] * 2
    with pytest.raises(TableError, match="duplicate"):
        validate_table({**V2, "cells": dup})
    with pytest.raises(TableError, match=r"^acceptance_per_pos\[1\]="):
        validate_table({**V2, "acceptance_per_pos": [0.8, -0.1]})
    validate_table({**V2, "acceptance_per_pos": None})  # optional: the table then is not adaptive-ready


def test_read_table_file_turns_every_failure_into_table_error(tmp_path, monkeypatch):
    p = tmp_path / "t.json"
    cases = {
        b"\xff\xfe\x00garbage": "not UTF-8",
        b"{": "not valid JSON",
        b"[" * 100_000: "not valid JSON",  # nesting deeper than the parser's recursion limit
        ('{"schema": "dsdprof.ktable/v1", "ranges": [[1, ' + "9" * 5000
         + ', 1]]}').encode(): "not valid JSON",
        b'{"schema": "dsdprof.ktable/v1", "ranges": [[1, 4, 1]], "num_speculative_tokens": NaN}':
            "num_speculative_tokens",
        b'{"schema": "dsdprof.ktable/v1", "ranges": [[1, 100000000000000000000000, 1]]}': "ranges[0]",
    }
    for data, needle in cases.items():
        p.write_bytes(data)
        with pytest.raises(TableError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            read_table_file(p)
    with pytest.raises(TableError, match="cannot read"):
        read_table_file(tmp_path)
    with pytest.raises(TableError, match="cannot read"):
        read_table_file(tmp_path / "missing.json")
    monkeypatch.setattr(ktable, "MAX_TABLE_BYTES", 10)
    p.write_text(json.dumps(V1))
    with pytest.raises(TableError, match="larger than"):
        read_table_file(p)
    monkeypatch.undo()
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(V2).encode())  # a UTF-8 BOM is fine
    assert read_table_file(p)["schema"] == TABLE_SCHEMA_V2


def test_one_record_cell_measurement_fields_are_columns():
    """CellMeasurement (and the StepStats it shares with the trace summary) is the row contract:
    every field is a measurement column of a matching type, so a field cannot be added in one
    place only."""
    from dataclasses import fields

    from dsdprof.formats.measurements import MEASUREMENT_COLUMNS
    from dsdprof.measure.engine import CellMeasurement, StepStats
    from dsdprof.measure.vllm.trace import TraceSummary

    columns = {c.name: c.arrow_type for c in MEASUREMENT_COLUMNS}
    kinds = {"float": "float64", "int": "int64", "str": "string", "tuple[float, ...]": "list<float64>",
             "tuple[int, ...]": "list<int64>"}
    for f in fields(CellMeasurement):
        assert f.name in columns, f"CellMeasurement.{f.name} is not a measurement column"
        assert kinds[str(f.type)] == columns[f.name], f.name
    shared = {f.name for f in fields(StepStats)}
    assert shared <= {f.name
                      for f in fields(TraceSummary)} and shared <= {f.name for f in fields(CellMeasurement)}
