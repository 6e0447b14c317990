"""The README's Parquet column table is generated from dsdprof.formats.measurements and must stay in sync."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsdprof.formats.measurements import MEASUREMENT_COLUMNS
from tests.support.column_docs import columns_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_columns_markdown_lists_every_column_in_order():
    lines = columns_markdown().splitlines()
    assert lines[0].startswith("| column |")
    names = [line.split("`")[1] for line in lines[2:]]
    assert names == [c.name for c in MEASUREMENT_COLUMNS]
    assert all(line.count(" | ") == 2 for line in lines[2:])  # escaped pipes keep three cells


def test_docs_column_tables_are_current():
    docs = [p for p in (ROOT / "README.md", ROOT / "docs" / "measurement.md")
            if p.is_file() and "| column | type | meaning |" in p.read_text()]
    if not docs:
        pytest.skip("no generated column table in the docs yet")
    for p in docs:
        assert columns_markdown() in p.read_text(), \
            f"{p.name}: regenerate with python -m tests.support.column_docs columns"
