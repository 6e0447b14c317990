import json

import pandas as pd
import pytest

from dsdprof.engines.base import Cell, CellMeasurement
from dsdprof.errors import InputError
from dsdprof.schema import COLUMN_NAMES, MEASUREMENT_SCHEMA_VERSION, PARQUET_METADATA_KEY
from dsdprof.storage import SWEEP_META, SweepWriter
from dsdprof.sweep import measurement_row

PROV = {"engine": "vllm", "engine_version": "x", "model": "m", "draft_model": "d", "method": "draft_model",
        "hardware": "cpu", "dtype": "float32", "dataset": "synthetic", "seed": 0, "dsdprof_version": "0"}
SPEC = {"engine": {"model": "m"}, "workload": {"dataset": "synthetic"}}


def _m(al=2.0, itl=0.01, tpot=0.005):
    return CellMeasurement(al, (0.9, 0.1), 10, 20, 10, itl, itl, itl, itl, tpot, tpot, tpot, tpot,
                           1 / tpot, 100.0, 4, 64, 1.0)


def test_rows_are_durable_and_readable_with_pandas(tmp_path):
    out = tmp_path / "run"
    w = SweepWriter(out, SPEC)
    w.start(PROV)
    w.write_row(measurement_row(Cell(0, 1, "dsd", 1), _m(), PROV, 0.25))
    w.write_row(measurement_row(Cell(0, 2, "dsd", 1), None, PROV, 0.25, error="RuntimeError: boom"))
    df = pd.read_parquet(out)
    assert list(df.columns) == list(COLUMN_NAMES)
    assert df.status.tolist() == ["ok", "failed"]
    assert df.error.tolist()[1] == "RuntimeError: boom"
    assert df.goodput_check.iloc[0] == pytest.approx(1.0)
    assert bool(df.consistent.iloc[0])
    import pyarrow.parquet as pq

    meta = json.loads(pq.read_schema(next(out.glob("part-*.parquet"))).metadata[PARQUET_METADATA_KEY])
    assert meta["schema_version"] == MEASUREMENT_SCHEMA_VERSION and meta["model"] == "m"
    assert json.loads((out / SWEEP_META).read_text())["spec"] == SPEC


def test_inconsistent_cell_is_flagged():
    row = measurement_row(Cell(0, 1, "dsd", 1), _m(al=2.0, itl=0.01, tpot=0.01), PROV, 0.25)
    assert row["goodput_check"] == pytest.approx(2.0) and row["consistent"] is False


def test_never_overwrites_and_resumes(tmp_path):
    out = tmp_path / "run"
    w = SweepWriter(out, SPEC)
    w.start(PROV)
    w.write_row(measurement_row(Cell(0, 1, "dsd", 1), _m(), PROV, 0.25))
    w.write_row(measurement_row(Cell(0, 2, "dsd", 1), None, PROV, 0.25, error="x"))
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(InputError, match="--resume"):
        SweepWriter(out, SPEC)
    assert sorted(p.name for p in out.iterdir()) == before
    # torn part file from a crash is set aside, failed cells are redone
    (out / "part-00099-dsd-bs4-k1-r0.parquet").write_bytes(b"PAR1 torn")
    r = SweepWriter(out, SPEC, resume=True)
    assert r.done == {"dsd-bs1-k1-r0"}
    assert (out / "_corrupt-part-00099-dsd-bs4-k1-r0.parquet").exists()
    assert len(pd.read_parquet(out)) == 2
    with pytest.raises(InputError, match="spec.engine"):
        SweepWriter(out, {**SPEC, "engine": {"model": "other"}}, resume=True)


def test_refuses_foreign_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not a dsdprof sweep"):
        SweepWriter(tmp_path, SPEC, resume=True)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        SweepWriter(f, SPEC)
