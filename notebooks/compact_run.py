"""Compact a sweep or validate directory into one small Parquet file (how notebooks/sample_* were
made; beside make_analysis_notebook.py, which makes the notebook that reads them).

    python notebooks/compact_run.py RUN_DIR OUT.parquet

Rows and the provenance metadata of the first part file are kept; ``pandas.read_parquet`` and
``dsdprof analyze``/``plot`` read the result like the directory.
"""

from __future__ import annotations

import sys
from pathlib import Path


def compact_run(src: str | Path, dst: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dsdprof.errors import InputError

    src, dst = Path(src), Path(dst)
    parts = sorted(p for p in src.glob("*.parquet") if not p.name.startswith(("_", ".")))
    if not parts:
        raise InputError("run", str(src), "holds no .parquet part files")
    if dst.exists():
        raise InputError("output", str(dst), "exists")
    tables = [pq.read_table(p) for p in parts]
    meta = tables[0].schema.metadata
    table = pa.concat_tables([t.replace_schema_metadata(meta) for t in tables])
    dst.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, dst, compression="zstd")
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(compact_run(sys.argv[1], sys.argv[2]))
