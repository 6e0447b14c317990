"""The typed models of dsdprof's formats agree with what is written: the measurement row with the
Parquet columns, the K table's TypedDict with the tables export builds, the step-trace record with
what the profiling scheduler writes, the [sim] section with the spec, validate's arms."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import TypedDict

import pytest

from dsdprof.formats import ktable_types
from dsdprof.formats.measurements import (
    CONTEXT_COLUMN,
    MEASUREMENT_COLUMNS,
    PROVENANCE_FIELDS,
    MeasurementRow,
    row_columns,
)
from dsdprof.formats.trace import Step, TraceRecord, decode_line, encode_flush, step_record

# The Python type of each arrow type, written out here (the rows' types map to arrow types in formats).
_PYTHON = {"int64": "int", "float64": "float", "string": "str", "bool": "bool",
           "list<float64>": "list[float]", "list<int64>": "list[int]"}


def _keys(td: type) -> set[str]:
    return set(typing.get_type_hints(td))


def test_measurement_row_has_every_column_with_its_type():
    hints = typing.get_type_hints(MeasurementRow)
    columns = (*MEASUREMENT_COLUMNS, CONTEXT_COLUMN)
    assert list(hints) == [c.name for c in columns]
    for c in columns:
        want = _PYTHON[c.arrow_type]
        got = str(hints[c.name]).replace("typing.", "")
        assert got in (f"{want} | None", want, f"<class '{want}'>"), c.name


def test_rollout_row_has_every_column_with_its_type():
    from dsdprof.formats.rollouts import ROLLOUT_COLUMNS, RolloutRow, empty_rollout_row

    hints = typing.get_type_hints(RolloutRow)
    assert list(hints) == [c.name for c in ROLLOUT_COLUMNS] == list(empty_rollout_row())
    for c in ROLLOUT_COLUMNS:
        want = _PYTHON[c.arrow_type]
        assert str(hints[c.name]).replace("typing.", "") in (want, f"<class '{want}'>"), c.name


def test_provenance_columns_are_one_set_in_both_files():
    """Measurement and rollout files hold the same provenance columns (name, type, meaning), in the
    same order, right before created_at."""
    from dsdprof.formats.rollouts import ROLLOUT_COLUMNS

    for columns in (MEASUREMENT_COLUMNS, ROLLOUT_COLUMNS):
        names = [c.name for c in columns]
        at = names.index(PROVENANCE_FIELDS[0])
        assert names[at:at + len(PROVENANCE_FIELDS) + 1] == [*PROVENANCE_FIELDS, "created_at"]
    assert [c for c in MEASUREMENT_COLUMNS if c.name in PROVENANCE_FIELDS] == \
        [c for c in ROLLOUT_COLUMNS if c.name in PROVENANCE_FIELDS]


def test_a_row_key_without_its_meaning_is_refused():
    class Bare(TypedDict):
        x: int

    with pytest.raises(TypeError, match="Bare.x"):
        row_columns(Bare)


def _check_keys(doc: dict, td: type, where: str) -> None:
    unknown = set(doc) - _keys(td)
    assert not unknown, f"{where}: keys {sorted(unknown)} not in {td.__name__}"


def _check_table(table: dict) -> None:
    _check_keys(table, ktable_types.KTable, "table")
    for p in table.get("points") or []:
        _check_keys(p, ktable_types.TablePoint, "points[]")
    for c in table.get("cells") or []:
        _check_keys(c, ktable_types.TableCell, "cells[]")
    for v in table.get("vanilla_faster") or []:
        _check_keys(v, ktable_types.VanillaRecord, "vanilla_faster[]")
    for sl in table.get("contexts") or []:
        _check_keys(sl, ktable_types.ContextSlice, "contexts[]")
        _check_table({k: v for k, v in sl.items() if k in ("points", "cells", "vanilla_faster")})


def test_every_key_of_the_tables_export_writes_is_typed(tmp_path):
    from dsdprof.config.spec import parse_spec
    from dsdprof.export.api import export_document
    from dsdprof.measure.runner import run_sweep

    grid = {"batch_sizes": [1, 4], "num_spec_tokens": [0, 2], "waves": 3}
    for name, extra in (("plain", {}), ("ctx", {"context_lens": [1024, 4096]})):
        spec = parse_spec({"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3",
                                      "max_model_len": 70000},
                           "sweep": {**grid, **extra},
                           "sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.9}})
        run_sweep(spec, tmp_path / name)
        _check_table(export_document(tmp_path / name, "table").doc)


def test_the_committed_tables_are_typed():
    from pathlib import Path

    from dsdprof.formats.ktable import read_table_file

    files = sorted((Path(__file__).resolve().parents[2] / "tables").glob("*.json"))
    tables = [t for t in files
              if str(json.loads(t.read_text()).get("schema", "")).startswith("dsdprof.ktable/")]
    assert tables
    for t in tables:
        _check_table(read_table_file(t))


RECORD = dict(wave=2, t_end=1.5, t_own=0.01, scheduled=3, decoding=2, prefill_tokens=0, others=1, stale=0,
              ids=["a", "b"], drafted=[3, 3], accepted=[2, 0], generated=[3, 1], delivered={"a": 3, "b": 1},
              finished=[False, True], k_next=3)


def test_trace_record_keys_order_and_round_trip():
    rec = step_record(**RECORD, arm=None)
    # the order the trace has always had (JSON lines written before the record had a type read the same)
    assert list(rec) == ["wave", "t_end", "t_own", "scheduled", "decoding", "prefill_tokens", "others",
                         "stale", "ids", "drafted", "accepted", "generated", "delivered",
                         "finished", "k_next"]
    assert set(rec) <= _keys(TraceRecord) and list(step_record(**RECORD, arm=-1))[-1] == "arm"
    (step,) = decode_line(encode_flush([rec]))
    assert step == Step(2, 1.5, 3, 2, 0, 1, (3, 3), (3, 1), {"a": 3, "b": 1}, (False, True), (2, 0), 0,
                        ("a", "b"), 3, None, 0.01)
    # a record of an older trace (before others/stale/ids/k_next/arm/t_own) still reads
    old = {k: RECORD[k] for k in ("wave", "t_end", "scheduled", "decoding", "prefill_tokens", "drafted",
                                  "generated", "delivered")}
    s = Step.from_record(json.loads(json.dumps(old)))
    assert (s.others, s.stale, s.k_next, s.arm, s.t_own, s.accepted) == (0, 0, -1, None, 0.0, None)


def test_sim_section_is_typed_once_and_hashes_as_before():
    from pathlib import Path

    from dsdprof.config.sim import SimConfig
    from dsdprof.config.spec import load_spec, parse_spec
    from dsdprof.errors import InputError
    from dsdprof.io.manifest import normalised_spec_dump, spec_hash

    spec = load_spec(Path(__file__).resolve().parents[2] / "sweeps" / "sim-llama8b-eagle3-h100.toml")
    assert isinstance(spec.sim, SimConfig) and spec.sim.hardware == "H100 SXM"
    # the hash the code gave before [sim] had a type (free-form dict, normalised through SimConfig),
    # and before the band's stated inputs (serving_engine, engine_version, fp8_gemm,
    # attention_backend; kv_cache_dtype unstated = None) were [sim] keys: left out, they hash as before
    dump = normalised_spec_dump(spec)
    assert dump["sim"]["kv_cache_dtype"] is None and dump["sim"]["serving_engine"] is None  # as written
    assert spec_hash(dump) == "sha256:e8a7bd8b26a08eb1d37b89cf43727dc26816a736900875639c088292ce5ea8f5"
    stated = {**dump, "sim": {**dump["sim"], "serving_engine": "vllm"}}  # stating one is another run
    assert spec_hash(stated) != spec_hash(dump)
    base = {"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3"}}
    with pytest.raises(InputError) as err:
        parse_spec({**base, "sim": {"hardware": "H100 SXM", "acceptence_alpha": 0.9}})
    assert str(err.value).startswith("sim.acceptence_alpha=0.9: unknown key")
    with pytest.raises(InputError) as err:
        parse_spec({**base, "sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.9,
                                    "acceptance_per_pos": [0.5]}})
    assert str(err.value).startswith("sim={'acceptance_alpha': 0.9, 'acceptance_per_pos': [0.5]}: give one")


def test_validate_arms_are_named_and_plain_ints_on_the_wire():
    from dsdprof.measure.vllm.worker import k_sequence
    from dsdprof.plugins.names import ARM_ENGINE, ARM_TABLE, Arm, holds_arms, is_arm

    group = (Arm.ENGINE, Arm.TABLE, 1, 3)
    assert holds_arms(group) and not holds_arms((0, 1, 3)) and is_arm(Arm.TABLE) and not is_arm(0)
    assert group == (ARM_ENGINE, ARM_TABLE, 1, 3)  # the wire values
    seq = k_sequence(group, 0, 2)
    assert sorted(set(seq)) == [ARM_ENGINE, ARM_TABLE, 1, 3] and all(type(k) is int for k in seq)


def test_every_measured_field_is_a_column_and_an_unknown_one_is_named():
    """The sweep runner builds its rows as a MeasurementRow: a cell's measurement (every field of
    dsdprof.measure.engine.CellMeasurement) goes into columns of the same name, and a field no
    column stores is an error naming it, never dropped."""
    import pytest

    from dsdprof.formats.measurements import COLUMN_NAMES, row_values
    from dsdprof.measure.engine import CellMeasurement

    fields = [f.name for f in dataclasses.fields(CellMeasurement)]
    assert set(fields) <= set(COLUMN_NAMES)
    assert row_values({"itl_s": 0.1, "batch_size": 4}) == {"itl_s": 0.1, "batch_size": 4}
    with pytest.raises(ValueError, match="unknown measurement columns \\['itl_ms'\\]"):
        row_values({"itl_s": 0.1, "itl_ms": 100.0})
    assert row_values({"itl_s": 0.1, "itl_ms": 100.0}, strict=False) == {"itl_s": 0.1}
