"""How long ``dsdprof export`` takes on a run directory, and how often it opens each of the run's
files: a sweep (9 BS x 8 K, analytic engine) and a context sweep (4 BS x 5 K x 3 contexts).

    python benchmarks/bench_export.py [--runs 5]

The runs are written once by the analytic engine (``sim``) into a temporary directory; this times
the export path (read, decide, build the table), it measures nothing about speculative decoding.
File opens are counted by wrapping pyarrow's readers and ``Path.read_text``/``read_bytes`` (Parquet
read by pandas is counted once, as its ``pq.read_table``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsdprof.config.spec import parse_spec  # noqa: E402
from dsdprof.export.api import export_document  # noqa: E402
from dsdprof.measure.runner import run_sweep  # noqa: E402


def _spec(contexts: list[int] | None) -> object:
    sweep: dict[str, object] = {"batch_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256],
                                "num_spec_tokens": list(range(8)), "waves": 20}
    if contexts:
        sweep = {"batch_sizes": [1, 2, 4, 8], "num_spec_tokens": [0, 1, 2, 3, 4], "waves": 5,
                 "context_lens": contexts}
    return parse_spec({"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3",
                                  "max_model_len": 70000},
                       "sweep": sweep, "sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.9}})


def _count_opens(run: Path) -> Counter:
    """Opens of each file of ``run`` during one export (Parquet bodies, footers, manifests)."""
    import pandas as pd
    import pyarrow.parquet as pq

    opens: Counter = Counter()
    real = {"read_table": pq.read_table, "read_schema": pq.read_schema, "read_parquet": pd.read_parquet,
            "read_text": Path.read_text, "read_bytes": Path.read_bytes, "ParquetFile": pq.ParquetFile}

    def wrap(name):
        def inner(*args, **kwargs):
            target = args[0] if args else kwargs.get("source", "")
            if isinstance(target, (str, Path)) and str(target).startswith(str(run)):
                opens[(Path(target).name, name)] += 1
            return real[name](*args, **kwargs)
        return inner

    with mock.patch.object(pq, "read_table", wrap("read_table")), \
            mock.patch.object(pq, "read_schema", wrap("read_schema")), \
            mock.patch.object(pd, "read_parquet", wrap("read_parquet")), \
            mock.patch.object(pq, "ParquetFile", wrap("ParquetFile")), \
            mock.patch.object(Path, "read_text", wrap("read_text")), \
            mock.patch.object(Path, "read_bytes", wrap("read_bytes")):
        export_document(run, "table")
    return opens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, contexts in (("sweep", None), ("context sweep", [1024, 4096, 16384])):
            run = Path(tmp) / name.replace(" ", "-")
            run_sweep(_spec(contexts), run)
            export_document(run, "table")  # warm imports
            times, cpu = [], []
            for _ in range(args.runs):
                t0, c0 = time.perf_counter(), time.process_time()
                export_document(run, "table")
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            opens = _count_opens(run)
            by_file: Counter = Counter()
            for (fname, how), n in opens.items():
                by_file[fname] += n if how != "read_parquet" else 0  # pandas calls pq.read_table
            med, low = statistics.median(times) * 1e3, min(times) * 1e3
            print(f"{name}: export median {med:.0f} ms, min {low:.0f} ms (CPU min {min(cpu) * 1e3:.0f} ms) "
                  f"over {args.runs} runs; opens per file: "
                  + ", ".join(f"{f} {n}" for f, n in sorted(by_file.items()))
                  + " (" + ", ".join(f"{k[1]} {n}" for k, n in sorted(opens.items())) + ")")


if __name__ == "__main__":
    main()
