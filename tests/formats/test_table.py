import dataclasses
import json
import os
import random

import pandas as pd
import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.decide.analysis import analyze
from dsdprof.errors import InputError
from dsdprof.export.table import build_table, check_vllm_config, load_table, vllm_speculative_config
from dsdprof.formats.ktable import (
    LAST_RANGE_END,
    TableError,
    k_for_batch_size,
    ranges_from_points,
    validate_table,
)
from dsdprof.formats.versions import TABLE_SCHEMA_V2
from dsdprof.io import atomic as atomic_mod
from dsdprof.io.atomic import write_json_atomic
from dsdprof.runtime import KSelector
from tests.conftest import make_rows

runner = CliRunner()


@pytest.fixture
def vllm_utils():
    return pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")


def _one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in result.output + result.stderr, err
    for n in needles:
        assert n in err, err


def test_nearest_log_rule_and_merging():
    r = ranges_from_points([(1, 5), (2, 4), (4, 3), (8, 3), (16, 1)])
    assert r == [[1, 1, 5], [2, 2, 4], [3, 11, 3], [12, LAST_RANGE_END, 1]]
    # BS 5 is nearer 4 than 8 on a log scale; 6 is nearer 8 (6*6 = 36 > 32)
    r2 = ranges_from_points([(4, 2), (8, 1)])
    assert k_for_batch_size(r2, 5) == 2 and k_for_batch_size(r2, 6) == 1
    assert k_for_batch_size(r2, 1) == 2 and k_for_batch_size(r2, 10**9) == 1


def test_single_point_and_errors():
    assert ranges_from_points([(7, 2)]) == [[1, LAST_RANGE_END, 2]]
    with pytest.raises(InputError):
        ranges_from_points([])
    with pytest.raises(InputError):
        ranges_from_points([(2, 1), (2, 3)])


def _frame_with_acceptance(alpha=0.8, noise=0.0, seed=0):
    """dense_like rows plus acceptance_per_pos = alpha^i (one row per cell, optional jitter)."""
    rng = random.Random(seed)
    itl, al = {}, {}
    for b in (1, 2, 4, 8, 16, 32, 64):
        for k in range(0, 6):
            al[(b, k)] = sum(alpha**i for i in range(k + 1))
            itl[(b, k)] = 0.010 + 0.0005 * k + 0.00008 * b * (k + 1)
    df = make_rows(itl, al)
    df["acceptance_per_pos"] = [[alpha**i * (1 + rng.uniform(-noise, noise)) for i in range(1, k + 1)]
                                for k in df["num_spec_tokens"]]
    return df


def test_built_table_is_v2_with_cells_and_accepted_by_vllm(dense_like_frame, tmp_path):
    doc = build_table(analyze(dense_like_frame), source="x")
    assert doc["schema"] == TABLE_SCHEMA_V2 == "dsdprof.ktable/v2"
    assert doc["ranges"][0][0] == 1
    assert [p["batch_size"] for p in doc["points"]] == [1, 2, 4, 8, 16, 32, 64]
    for p in doc["points"]:
        assert k_for_batch_size(doc["ranges"], p["batch_size"]) == p["k"]
    assert len(doc["cells"]) == 7 * 6
    cell = next(c for c in doc["cells"] if c["batch_size"] == 8 and c["k"] == 3)
    assert cell["itl_s"] == pytest.approx(0.010 + 0.0005 * 3 + 0.00008 * 32)
    assert cell["acceptance_length"] == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert cell["goodput"] == pytest.approx(cell["acceptance_length"] / cell["itl_s"])
    assert doc["acceptance_per_pos"] is None  # the frame has no per-position column
    cfg = vllm_speculative_config(doc)
    assert cfg["num_speculative_tokens"] == max(r[2] for r in doc["ranges"])
    check_vllm_config(cfg)
    path = write_json_atomic(tmp_path / "t.json", doc, check=validate_table)
    assert load_table(path)["ranges"] == doc["ranges"]
    with pytest.raises(InputError, match="exists"):
        write_json_atomic(path, {"other": 1})
    assert json.loads(path.read_text())["ranges"] == doc["ranges"]


def test_vllm_config_is_accepted_by_vllm(dense_like_frame, vllm_utils):
    doc = build_table(analyze(dense_like_frame))
    cfg = vllm_speculative_config(doc)
    assert vllm_utils.validate_and_normalize_dynamic_sd_schedule(cfg["num_speculative_tokens_per_batch_size"])


def test_per_position_acceptance_from_raw_rows():
    rows = _frame_with_acceptance(alpha=0.8, noise=0.05)
    analysis = analyze(rows)
    # an Analysis without the per-position column (older analysis): fall back to the raw rows
    analysis = dataclasses.replace(analysis,
                                   cells=analysis.cells.drop(columns=["acceptance_per_pos"], errors="ignore"))
    doc = build_table(analysis, rows=rows)
    assert doc["acceptance_per_pos"] == pytest.approx([0.8**i for i in range(1, 6)], rel=0.06)
    cell = next(c for c in doc["cells"] if c["batch_size"] == 4 and c["k"] == 2)
    assert len(cell["acceptance_per_pos"]) == 2
    assert all("acceptance_per_pos" not in c for c in doc["cells"] if c["k"] == 0)


def test_per_position_acceptance_from_analysis_cells():
    rows = _frame_with_acceptance(alpha=0.7)
    analysis = analyze(rows)
    cells = analysis.cells.copy()
    cells["acceptance_per_pos"] = [[0.6**i for i in range(1, k + 1)] for k in cells["num_spec_tokens"]]
    doc = build_table(dataclasses.replace(analysis, cells=cells), rows=rows)  # the column wins over rows
    assert doc["acceptance_per_pos"] == pytest.approx([0.6**i for i in range(1, 6)])


def test_optional_point_fields_are_copied(dense_like_frame):
    analysis = analyze(dense_like_frame)
    n = len(analysis.decisions)
    decisions = tuple(dataclasses.replace(d, decided=i < n - 1, runner_up=None if i == 0 else 2, margin=0.05,
                                          ci_low=0.01, ci_high=float("nan"))
                      for i, d in enumerate(analysis.decisions))
    doc = build_table(dataclasses.replace(analysis, decisions=decisions))
    p0, p_last = doc["points"][0], doc["points"][-1]
    assert p0["decided"] is True and p0["runner_up"] is None and p_last["decided"] is False
    assert p_last["runner_up"] == 2 and p0["margin"] == 0.05 and p0["ci_high"] is None


def test_vllm_export_rejects_all_zero_table():
    with pytest.raises(InputError, match="K=0 at every batch size"):
        vllm_speculative_config({"schema": "dsdprof.ktable/v1", "ranges": [[1, 10, 0]]})


def _random_ranges(rng, max_len=40, n=6):
    ranges, start = [], 1
    for _ in range(rng.randint(1, n)):
        end = start + rng.randint(0, max_len)
        ranges.append([start, end, rng.randint(0, 7)])
        start = end + 1
    return ranges


def test_selector_matches_vllm_lookup_on_random_tables(vllm_utils):
    rng = random.Random(0)
    for _ in range(200):
        ranges = _random_ranges(rng)
        cap = rng.choice([None, rng.randint(1, 8)])
        max_k = max(r[2] for r in ranges) if cap is None else cap
        if max_k <= 0:
            continue
        sel = KSelector(ranges, cap)
        lookup = vllm_utils.build_dynamic_sd_schedule_lookup(ranges, 400, max_k)
        for b in range(1, 401):
            assert sel.select(b) == lookup[b], (ranges, cap, b)
        assert sel.lookup_list(400) == lookup


def test_selector_matches_vllm_lookup_on_sparse_large_tables(vllm_utils):
    # Ranges long enough that starts pass DENSE_CAP (binary-search path) and the tail starts late.
    rng = random.Random(1)
    for _ in range(25):
        ranges = _random_ranges(rng, max_len=rng.choice([300, 3000, 9000]), n=8)
        max_k = max(r[2] for r in ranges)
        if max_k <= 0:
            continue
        max_bs = ranges[-1][0] + 50
        sel = KSelector(ranges)
        lookup = vllm_utils.build_dynamic_sd_schedule_lookup(ranges, max_bs, max_k)
        assert [sel.select(b) for b in range(1, max_bs + 1)] == lookup[1:], ranges
        assert sel.lookup_list(max_bs) == lookup


@pytest.mark.slow  # ~5 s
def test_selector_on_huge_sparse_tables_matches_reference():
    rng = random.Random(2)
    for _ in range(200):
        ranges, start = [], 1
        for _ in range(rng.randint(1, 10)):
            end = start + rng.choice([0, 1, rng.randint(0, 10**6), rng.randint(0, 10**12)])
            ranges.append([start, end, rng.randint(0, 9)])
            start = end + 1
        sel = KSelector(ranges)
        probes = {1, 2, 4096, 4097, 10**13}
        for s, e, _ in ranges:
            probes |= {s - 1, s, s + 1, e - 1, e, e + 1}
        for b in sorted(p for p in probes if p >= 1):
            assert sel.select(b) == k_for_batch_size(ranges, b), (ranges, b)


def test_load_table_errors(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        load_table(tmp_path / "none.json")
    p = tmp_path / "bad.json"
    p.write_text("{")
    with pytest.raises(TableError, match="not valid JSON"):
        load_table(p)
    p.write_bytes(b"\xc3\x28")
    with pytest.raises(TableError, match="not UTF-8"):
        load_table(p)
    p.write_text(json.dumps({"schema": "dsdprof.ktable/v1", "ranges": [[2, 3, 1]]}))
    with pytest.raises(TableError, match=r"ranges\[0\]"):
        load_table(p)


# ----------------------------------------------------------------------------- atomic writes

def _leftovers(d):
    return [n for n in os.listdir(d) if n.endswith(".tmp")]


def test_write_refuses_under_a_file_and_leaves_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        write_json_atomic(blocker / "sub" / "t.json", {"a": 1})
    assert blocker.read_text() == "x" and _leftovers(tmp_path) == []
    with pytest.raises(InputError, match="is a directory"):
        write_json_atomic(tmp_path, {"a": 1}, force=True)


def test_write_validates_before_rename(tmp_path):
    target = tmp_path / "new" / "t.json"
    with pytest.raises(TableError):
        write_json_atomic(target, {"schema": "dsdprof.ktable/v2", "ranges": [[1, 2, 1]]},
                          check=validate_table)
    assert not target.exists() and not (tmp_path / "new").exists()  # the directory it made is gone too
    keep = tmp_path / "keep.json"
    keep.write_text("old")
    with pytest.raises(TableError):
        write_json_atomic(keep, {"schema": "x"}, force=True, check=validate_table)
    assert keep.read_text() == "old" and _leftovers(tmp_path) == []
    with pytest.raises(InputError, match="not JSON-serialisable"):
        write_json_atomic(tmp_path / "nan.json", {"x": float("nan")})


def test_write_failure_mid_way_leaves_no_temp(tmp_path, monkeypatch):
    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_mod.os, "fsync", full_disk)
    with pytest.raises(InputError, match="No space left"):
        write_json_atomic(tmp_path / "t.json", {"a": 1})
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- CLI export / show

@pytest.fixture
def measured(tmp_path):
    p = tmp_path / "m.parquet"
    _frame_with_acceptance().to_parquet(p)
    return p


def test_export_writes_v2_and_v1_tables_keep_working(tmp_path, measured):
    out = tmp_path / "t.json"
    r = runner.invoke(app, ["export", str(measured), "-o", str(out)])
    assert r.exit_code == 0, r.output
    v2 = json.loads(out.read_text())
    assert v2["schema"] == "dsdprof.ktable/v2" and v2["cells"] and len(v2["acceptance_per_pos"]) == 5
    r = runner.invoke(app, ["show", str(out)])
    assert r.exit_code == 0 and "measured cells: 42" in r.output and "0.80, 0.64" in r.output
    v1 = {k: v for k, v in v2.items() if k not in ("cells", "acceptance_per_pos")}
    v1["schema"] = "dsdprof.ktable/v1"
    v1_path = tmp_path / "v1.json"
    v1_path.write_text(json.dumps(v1))
    assert runner.invoke(app, ["show", str(v1_path)]).exit_code == 0
    cfg1 = json.loads(runner.invoke(app, ["export", str(v1_path), "--format", "vllm"]).output)
    cfg2 = json.loads(runner.invoke(app, ["export", str(out), "--format", "vllm"]).output)
    assert cfg1 == cfg2 and cfg1["num_speculative_tokens_per_batch_size"] == v2["ranges"]
    passthrough = json.loads(runner.invoke(app, ["export", str(v1_path)]).output)
    assert passthrough == v1
    assert KSelector.from_file(v1_path).lookup_list(128) == KSelector.from_file(out).lookup_list(128)


def test_export_output_problems_are_one_line(tmp_path, measured, monkeypatch):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    _one_line_error(runner.invoke(app, ["export", str(measured), "-o", str(blocker / "t.json")]),
                    "--output=", "not a directory")
    _one_line_error(runner.invoke(app, ["export", str(measured), "-o", str(tmp_path)]), "is a directory")

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(atomic_mod.tempfile, "mkstemp", denied)
    _one_line_error(runner.invoke(app, ["export", str(measured), "-o", str(tmp_path / "ro" / "t.json")]),
                    "output=", "Permission denied")
    assert not (tmp_path / "ro").exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("cap", [-1, 129, True, "3", 2.5])
def test_one_validator_for_num_speculative_tokens(tmp_path, cap):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"schema": "dsdprof.ktable/v1", "ranges": [[1, 4, 2]],
                             "num_speculative_tokens": cap}))
    with pytest.raises(TableError) as e:
        KSelector.from_file(p)
    message = str(e.value)
    assert message.startswith("num_speculative_tokens=")
    for cmd in (["show", str(p)], ["export", str(p)], ["export", str(p), "--format", "vllm"],
                ["export", str(p), "--format", "trtllm"]):
        _one_line_error(runner.invoke(app, cmd), message)
    with pytest.raises(TableError, match="num_speculative_tokens="):
        load_table(p)


def test_show_marks_carry_forward_and_caps(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"schema": "dsdprof.ktable/v1", "num_speculative_tokens": 2,
                             "ranges": [[1, 3, 4], [4, 9, 1]]}))
    r = runner.invoke(app, ["show", str(p)])
    assert r.exit_code == 0 and "4+" in r.output and "2 (table 4, capped)" in r.output


def test_export_from_measurements_without_per_position_warns(tmp_path, dense_like_frame):
    src = tmp_path / "m.parquet"
    dense_like_frame.to_parquet(src)
    r = runner.invoke(app, ["export", str(src), "-o", str(tmp_path / "t.json")])
    assert r.exit_code == 0 and "per-position acceptance" in r.stderr
    assert pd.isna(json.loads((tmp_path / "t.json").read_text())["acceptance_per_pos"] or float("nan"))


def test_shipped_tables_load_everywhere():
    from pathlib import Path

    from dsdprof.runtime import AdaptiveKSelector

    tables = [p for p in sorted((Path(__file__).resolve().parents[2] / "tables").glob("*.json"))
              if not p.name.endswith((".vllm.json", ".trtllm.json"))]
    assert tables
    for p in tables:
        doc = load_table(p)
        sel = KSelector.from_file(p)
        assert [sel.select(pt["batch_size"]) for pt in doc.get("points", [])] == \
            [min(pt["k"], sel.max_k) for pt in doc.get("points", [])]
        assert runner.invoke(app, ["show", str(p)]).exit_code == 0
        if doc["schema"] == TABLE_SCHEMA_V2 and doc.get("acceptance_per_pos"):
            assert AdaptiveKSelector.from_file(p).lookup_list(64) == sel.lookup_list(64)
