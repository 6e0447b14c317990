import pytest

from dsdprof.schema import (
    COLUMN_NAMES, CONTRACT_COLUMNS, TABLE_SCHEMA, TableError, arrow_schema, empty_row,
    validate_ranges, validate_table,
)


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
])
def test_bad_ranges_name_the_field(ranges, field):
    with pytest.raises(TableError) as e:
        validate_ranges(ranges)
    assert str(e.value).startswith(field + "=")


def test_good_ranges():
    assert validate_ranges([[1, 1, 4], [2, 8, 2], [9, 100, 0]]) == [(1, 1, 4), (2, 8, 2), (9, 100, 0)]


def test_validate_table_checks_schema_and_points():
    doc = {"schema": TABLE_SCHEMA, "ranges": [[1, 10, 2]], "points": [{"batch_size": 1, "k": 2, "goodput": 3.0}]}
    assert validate_table(doc) is doc
    with pytest.raises(TableError, match="schema"):
        validate_table({**doc, "schema": "dsdprof.ktable/v0"})
    with pytest.raises(TableError, match=r"points\[0\].goodput"):
        validate_table({**doc, "points": [{"batch_size": 1, "k": 2, "goodput": float("nan")}]})
    with pytest.raises(TableError, match="must be a JSON object"):
        validate_table([1, 2])
