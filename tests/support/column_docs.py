"""The Parquet measurement columns as the Markdown table docs/measurement.md holds (kept in sync
with the code by tests/report/test_report_docs.py).

    python -m tests.support.column_docs columns   # the table, to paste into the docs
"""

from __future__ import annotations

import sys


def columns_markdown() -> str:
    """Markdown table of :data:`dsdprof.formats.measurements.MEASUREMENT_COLUMNS` (name, type, meaning)."""
    from dsdprof.formats.measurements import MEASUREMENT_COLUMNS

    lines = ["| column | type | meaning |", "|---|---|---|"]
    for c in MEASUREMENT_COLUMNS:
        doc = c.doc.replace("|", "\\|")
        lines.append(f"| `{c.name}` | {c.arrow_type} | {doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["columns"]:
        sys.exit(__doc__)
    sys.stdout.write(columns_markdown())
