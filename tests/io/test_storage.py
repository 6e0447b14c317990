import errno
import json
import os

import pandas as pd
import pyarrow.parquet as pq
import pytest

from dsdprof.errors import InputError
from dsdprof.formats.measurements import COLUMN_NAMES
from dsdprof.formats.versions import MEASUREMENT_SCHEMA_VERSION, PARQUET_METADATA_KEY
from dsdprof.io.manifest import MANIFEST_VERSION, spec_hash
from dsdprof.io.runlock import HOLDER_NAME
from dsdprof.io.store import ATTEMPTS_DIR, SWEEP_META, SweepWriter
from dsdprof.measure.engine import Cell, CellMeasurement
from dsdprof.measure.runner import measurement_row

PROV = {"engine": "vllm", "engine_version": "x", "model": "m", "draft_model": "d", "method": "draft_model",
        "hardware": "cpu", "dtype": "float32", "dataset": "synthetic", "seed": 0, "dsdprof_version": "0"}
SPEC = {"engine": {"model": "m"}, "sweep": {"waves": 3}, "workload": {"dataset": "synthetic"}}


def _m(al=2.0, itl=0.01, tpot=0.005):
    return CellMeasurement(al, (0.9, 0.1), 10, 20, 10, itl, itl, itl, itl, tpot, tpot, tpot, tpot,
                           1 / tpot, 100.0, 4, 64, 1.0)


def _ok(bs):
    return measurement_row(Cell(0, bs, "dsd", 1), _m(), PROV)


def _failed(bs, error="RuntimeError: boom"):
    return measurement_row(Cell(0, bs, "dsd", 1), None, PROV, error=error)


def _run(out, rows, spec=SPEC, resume=False, **kw):
    with SweepWriter(out, spec, resume=resume, **kw) as w:
        w.start(PROV)
        for r in rows:
            w.write_row(r)
    return w


def _snapshot(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_rows_are_durable_and_readable_with_pandas(tmp_path):
    out = tmp_path / "run"
    _run(out, [_ok(1), _failed(2)])
    df = pd.read_parquet(out)
    assert set(COLUMN_NAMES) <= set(df.columns)
    assert df.status.tolist() == ["ok", "failed"]
    assert df.error.tolist()[1] == "RuntimeError: boom"
    assert bool(df.consistent.iloc[0]) and df.checks_failed.iloc[0] == ""
    assert "goodput_check" not in df.columns  # v3 dropped the identity
    meta = json.loads(pq.read_schema(next(out.glob("part-*.parquet"))).metadata[PARQUET_METADATA_KEY])
    assert meta["schema_version"] == MEASUREMENT_SCHEMA_VERSION and meta["model"] == "m"
    manifest = json.loads((out / SWEEP_META).read_text())
    assert manifest["manifest"] == MANIFEST_VERSION and manifest["spec"] == SPEC
    assert manifest["spec_hash"] == spec_hash(SPEC) and manifest["provenance"] == PROV
    assert manifest["versions"]["measurements"] == MEASUREMENT_SCHEMA_VERSION
    assert "dsdprof" in manifest["versions"] and "torch" in manifest["versions"]
    assert not (out / HOLDER_NAME).exists()  # released


def test_a_failed_cross_check_is_flagged_and_named():
    from dataclasses import replace

    row = measurement_row(Cell(0, 1, "dsd", 1),
                          replace(_m(), checks_failed="tokens: 10 vs 12 (-16.67%)"), PROV)
    assert row["consistent"] is False and row["checks_failed"].startswith("tokens: ")


def test_never_overwrites_and_resumes(tmp_path):
    out = tmp_path / "run"
    _run(out, [_ok(1), _failed(2)])
    before = _snapshot(out)
    with pytest.raises(InputError, match="--resume"):
        SweepWriter(out, SPEC)
    assert _snapshot(out) == before
    # a torn part file (a disk fault: the protocol never leaves one) is set aside, failed cells redone
    (out / "part-00099-dsd-bs4-k1-r0.parquet").write_bytes(b"PAR1 torn")
    with SweepWriter(out, SPEC, resume=True) as r:
        assert r.done == {"dsd-bs1-k1-r0"}
        r.start(PROV)
    assert (out / "_corrupt-part-00099-dsd-bs4-k1-r0.parquet").exists()
    assert len(pd.read_parquet(out)) == 2


def test_retried_cell_supersedes_its_failed_row_after_any_number_of_resumes(tmp_path):
    out = tmp_path / "run"
    _run(out, [_ok(1), _failed(2), _failed(4)])
    for attempt in range(3):
        _run(out, [_failed(2, f"try {attempt}"), _failed(4, f"try {attempt}")], resume=True)
    _run(out, [_ok(2), _failed(4, "last")], resume=True)
    df = pd.read_parquet(out)
    assert sorted(df.cell_id) == ["dsd-bs1-k1-r0", "dsd-bs2-k1-r0", "dsd-bs4-k1-r0"]
    assert df.set_index("cell_id").status.to_dict() == {
        "dsd-bs1-k1-r0": "ok", "dsd-bs2-k1-r0": "ok", "dsd-bs4-k1-r0": "failed"}
    assert df.set_index("cell_id").error["dsd-bs4-k1-r0"] == "last"
    archived = pd.concat([pd.read_parquet(p) for p in (out / ATTEMPTS_DIR).glob("*.parquet")])
    assert {"RuntimeError: boom", "try 0", "try 1", "try 2"} <= set(archived.error)


def test_batched_rows_supersede_in_place_and_flush_on_interrupt(tmp_path):
    out = tmp_path / "run"
    _run(out, [_ok(1), _failed(2), _ok(3), _failed(4)], flush_rows=100)
    assert len(list(out.glob("part-*.parquet"))) == 1  # one file for the whole batch
    with pytest.raises(KeyboardInterrupt):
        with SweepWriter(out, SPEC, resume=True, flush_rows=100) as w:
            w.start(PROV)
            w.write_row(_ok(2))
            w.write_row(_ok(5))
            assert len(pd.read_parquet(out)) == 4  # buffered, not yet visible
            raise KeyboardInterrupt
    df = pd.read_parquet(out)
    assert sorted(df.cell_id) == sorted(set(df.cell_id)) and len(df) == 5
    assert df.set_index("cell_id").status["dsd-bs2-k1-r0"] == "ok"
    assert not (out / HOLDER_NAME).exists()


def test_flush_interval_bounds_what_a_kill_can_lose(tmp_path):
    out = tmp_path / "run"
    with SweepWriter(out, SPEC, flush_rows=10**6, flush_interval_s=0.0) as w:
        w.start(PROV)
        w.write_row(_ok(1))
        assert len(pd.read_parquet(out)) == 1  # interval elapsed: written at once


def test_duplicate_rows_are_repaired_on_resume(tmp_path):
    out = tmp_path / "run"
    _run(out, [_ok(1), _failed(2)])
    first = sorted(out.glob("part-*.parquet"))[1]
    (out / "part-00007-copy.parquet").write_bytes(first.read_bytes())  # the failed row, twice
    assert len(pd.read_parquet(out)) == 3
    _run(out, [], resume=True)
    df = pd.read_parquet(out)
    assert sorted(df.cell_id) == ["dsd-bs1-k1-r0", "dsd-bs2-k1-r0"]


def test_resume_of_another_spec_is_refused_and_touches_nothing(tmp_path):
    out = tmp_path / "run"
    _run(out, [_ok(1), _failed(2)])
    before = _snapshot(out)
    with pytest.raises(InputError) as err:
        SweepWriter(out, {**SPEC, "sweep": {"waves": 5}}, resume=True)
    assert str(err.value).startswith("spec.sweep.waves=5: differs from the run being resumed in ")
    assert "(was 3)" in str(err.value)
    with pytest.raises(InputError, match=r"spec.engine.model='other'"):
        SweepWriter(out, {**SPEC, "engine": {"model": "other"}}, resume=True)
    with pytest.raises(InputError, match=r"spec.engine.extra=.*was '<absent>'"):
        SweepWriter(out, {**SPEC, "engine": {"model": "m", "extra": {}}}, resume=True)
    # same spec, other provenance (another GPU): refused when the engine reports it
    w = SweepWriter(out, SPEC, resume=True)
    with pytest.raises(InputError, match=r"provenance.hardware='H100': differs .*was 'cpu'"):
        w.start({**PROV, "hardware": "H100"})
    w.close()
    assert _snapshot(out) == before


@pytest.mark.parametrize("content, needle", [
    ("[1, 2]", "holds a JSON list"),
    ("{not json", "unreadable JSON"),
    ('{"schema_version": "dsdprof.measurements/v1", "spec": {}}', "older dsdprof"),
    ('{"manifest": "dsdprof.run/v99"}', "unknown manifest version"),
])
def test_bad_manifest_is_one_line(tmp_path, content, needle):
    out = tmp_path / "run"
    _run(out, [_ok(1)])
    (out / SWEEP_META).write_text(content)
    before = _snapshot(out)
    with pytest.raises(InputError, match=needle) as err:
        SweepWriter(out, SPEC, resume=True)
    assert "\n" not in str(err.value)
    assert _snapshot(out) == before


def test_hand_edited_manifest_is_refused(tmp_path):
    out = tmp_path / "run"
    _run(out, [_ok(1)])
    doc = json.loads((out / SWEEP_META).read_text())
    doc["spec"]["sweep"]["waves"] = 7
    (out / SWEEP_META).write_text(json.dumps(doc))
    with pytest.raises(InputError, match="spec_hash"):
        SweepWriter(out, {**SPEC, "sweep": {"waves": 7}}, resume=True)


def test_second_writer_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    w = SweepWriter(out, SPEC)
    w.start(PROV)
    with pytest.raises(InputError, match=rf"is in use by pid {os.getpid()} on "):
        SweepWriter(out, SPEC, resume=True)
    w.close()
    # a holder file left behind (kill -9) is not trusted on its own: the OS lock is free
    (out / HOLDER_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    _run(out, [_ok(1)], resume=True)
    assert len(pd.read_parquet(out)) == 1


def test_refuses_foreign_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not a dsdprof run"):
        SweepWriter(tmp_path, SPEC, resume=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        SweepWriter(f, SPEC)
    with pytest.raises(InputError, match="which is a file"):
        SweepWriter(f / "sub" / "run", SPEC)
    assert f.read_text() == "x"


def test_a_run_that_never_started_leaves_nothing(tmp_path):
    out = tmp_path / "a" / "b" / "run"
    with pytest.raises(RuntimeError):
        with SweepWriter(out, SPEC):
            raise RuntimeError("engine failed to start")
    assert not (tmp_path / "a").exists()
    # a directory the user made stays, emptied of the claim
    out.mkdir(parents=True)
    with pytest.raises(RuntimeError):
        with SweepWriter(out, SPEC):
            raise RuntimeError("engine failed to start")
    assert not (out / SWEEP_META).exists()
    _run(out, [_ok(1)])  # and a fresh run may use it


def test_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch):
    out = tmp_path / "run"
    _run(out, [_ok(1)])
    before = _snapshot(out)
    real_write = pq.write_table

    def full_disk(table, where, **kw):
        with open(where, "wb") as fh:
            fh.write(b"PAR1 half a file")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq, "write_table", full_disk)
    with pytest.raises(InputError,
                       match=r"cannot write part-00001-dsd-bs2-k1-r0.parquet \(No space left on device\)"):
        _run(out, [_ok(2)], resume=True)
    monkeypatch.setattr(pq, "write_table", real_write)
    after = _snapshot(out)
    assert not [n for n in after if n.endswith(".tmp")]
    assert {k: v for k, v in after.items()
            if k != SWEEP_META} == {k: v for k, v in before.items() if k != SWEEP_META}
    _run(out, [_ok(2)], resume=True)
    assert sorted(pd.read_parquet(out).cell_id) == ["dsd-bs1-k1-r0", "dsd-bs2-k1-r0"]


@pytest.fixture
def python_sigint():
    """Python's own Ctrl-C handler for the test, whatever this process inherited (a background shell
    starts commands with SIGINT ignored, and Python keeps that)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_signals_are_held_during_a_write_and_delivered_after(python_sigint):
    """Ctrl-C (or SIGTERM) in the middle of a flush used to lose the rows already taken from the
    buffer; now the write finishes first, then the interrupt is raised."""
    import signal

    from dsdprof.io.atomic import signals_held

    done = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("write finished")  # not interrupted in between
    assert done == ["write finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_a_flush_interrupted_by_ctrl_c_keeps_its_rows(tmp_path, monkeypatch, python_sigint):
    import signal

    w = SweepWriter(tmp_path / "run", SPEC, flush_rows=100)
    original = w._write_table

    def interrupted_write(name, rows):  # Ctrl-C arrives while the part file is being written
        os.kill(os.getpid(), signal.SIGINT)
        return original(name, rows)

    monkeypatch.setattr(w, "_write_table", interrupted_write)
    with pytest.raises(KeyboardInterrupt):
        with w:
            w.start(PROV)
            for b in (1, 2, 3):
                w.write_row(_ok(b))
            w.flush()
    assert sorted(pd.read_parquet(tmp_path / "run")["batch_size"]) == [1, 2, 3]
