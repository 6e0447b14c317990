"""dsdprof validate's pure parts (planning, vLLM kwargs, table checks); tests/cli/test_validate_vllm.py
runs it on real vLLM."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from dsdprof.config.spec import parse_spec
from dsdprof.errors import InputError
from dsdprof.jobs.validate import (
    dsd_llm_kwargs,
    plan_validation,
    table_warnings,
    worker_key,
)

if TYPE_CHECKING:
    import pandas as pd

TABLE = {
    "schema": "dsdprof.ktable/v1", "num_speculative_tokens": 3,
    "ranges": [[1, 2, 3], [3, 11, 1], [12, 1 << 20, 0]],
    "points": [{"batch_size": 1, "k": 3}, {"batch_size": 4, "k": 1}, {"batch_size": 16, "k": 0}],
    "provenance": {"model": "tgt", "draft_model": "drf", "method": "draft_model"},
}


def make_spec(batch_sizes=(1, 4, 16), repeats=1, **engine):
    e = {"name": "vllm", "model": "tgt", "draft_model": "drf", "method": "draft_model",
         "extra": {"enforce_eager": True}}
    e.update(engine)
    return parse_spec({"engine": e, "sweep": {"batch_sizes": list(batch_sizes), "num_spec_tokens": [0, 3],
                                              "waves": 2, "output_len": 8, "repeats": repeats}})


def test_plan_interleaves_and_rotates():
    cells = plan_validation([4, 1], [3, 1], TABLE["ranges"], repeats=2)
    assert len(cells) == 2 * 2 * 4
    first = cells[:4]
    assert {c.batch_size for c in first} == {1}
    want = {("vanilla", 0), ("fixed", 1), ("fixed", 3), ("dsd", 3)}
    assert {(c.mode, c.num_spec_tokens) for c in first} == want
    assert cells[4].mode != cells[0].mode  # order rotates
    assert [c for c in cells if c.mode == "dsd" and c.batch_size == 4][0].num_spec_tokens == 1
    assert worker_key(first[0]) in ("vanilla", "fixed-1", "fixed-3", "dsd")
    with pytest.raises(InputError, match="fixed-k"):
        plan_validation([1], [0], TABLE["ranges"], 1)
    with pytest.raises(InputError, match="fixed-k"):
        plan_validation([1], [], TABLE["ranges"], 1)


def test_dsd_kwargs_use_vllm_schedule():
    spec = make_spec()
    base = {"model": "tgt", "max_num_seqs": 16,
            "scheduler_cls": "dsdprof.engines.vllm_scheduler.make_scheduler"}
    kw = dsd_llm_kwargs(base, TABLE, spec)
    cfg = kw["speculative_config"]
    assert cfg["num_speculative_tokens"] == 3
    assert cfg["num_speculative_tokens_per_batch_size"] == TABLE["ranges"]
    assert cfg["model"] == "drf" and cfg["method"] == "draft_model"
    assert kw["scheduler_cls"] == base["scheduler_cls"]  # gate + trace only; K comes from vLLM's lookup
    zero = dict(TABLE, ranges=[[1, 1 << 20, 0]])
    assert dsd_llm_kwargs({"model": "tgt"}, zero, spec) is None


def test_table_warnings_name_mismatches():
    spec = make_spec(batch_sizes=(1, 64), model="other")
    w = table_warnings(TABLE, spec)
    assert any("model='tgt'" in x for x in w)
    assert any("[64]" in x for x in w)
    assert table_warnings(TABLE, make_spec()) == []



# ----------------------------------------------------------------------- validate rows, whatever the metadata

def _variant_rows(adaptive: bool) -> pd.DataFrame:
    """Rows as ``dsdprof validate`` plans them (vanilla, fixed K, the table's one K in dsd, adaptive)."""
    import pandas as pd

    rows = []
    for c in plan_validation([1, 4, 16], [1, 3], TABLE["ranges"], 2, adaptive_k=3 if adaptive else None):
        al = 1.0 + 0.6 * c.num_spec_tokens
        rows.append({"cell_id": c.cell_id, "mode": c.mode, "batch_size": c.batch_size, "num_spec_tokens":
                     c.num_spec_tokens, "repeat": c.repeat, "status": "ok", "acceptance_length": al,
                     "itl_s": 0.01 * (1 + 0.1 * c.num_spec_tokens) * (1 + c.batch_size / 64)})
    return pd.DataFrame(rows)


def _sweep_rows(mode: str) -> pd.DataFrame:
    """Rows as a sweep writes them: vanilla + every K of the grid in one speculation mode."""
    import pandas as pd

    rows = [{"cell_id": f"{m}-bs{b}-k{k}-r{r}", "mode": m, "batch_size": b, "num_spec_tokens": k, "repeat": r,
             "status": "ok", "acceptance_length": 1.0 + 0.6 * k, "itl_s": 0.01 * (1 + 0.1 * k) * (1 + b / 64)}
            for r in range(2) for b in (1, 4, 16)
            for m, k in [("vanilla", 0)] + [(mode, k) for k in ((0, 1, 3) if mode == "dsd" else (1, 3))]]
    return pd.DataFrame(rows)


def _with_sweep_metadata(df, path):
    """``df`` written with the dsdprof metadata a sweep's file carries (no run kind)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dsdprof.io.store import file_metadata

    table = pa.Table.from_pandas(df, preserve_index=False)
    pq.write_table(table.replace_schema_metadata(file_metadata({"engine": "vllm", "hardware": "cpu"})), path)
    return path


@pytest.mark.parametrize("adaptive", [True, False])
@pytest.mark.parametrize("metadata", ["none", "sweep"])
def test_validate_rows_are_refused_by_export_and_analyze_whatever_their_metadata(tmp_path, adaptive,
                                                                                 metadata):
    from typer.testing import CliRunner

    from dsdprof.cli.app import app
    from dsdprof.config.run import RUN_KIND_VALIDATE
    from dsdprof.io.runs import open_run

    df = _variant_rows(adaptive)
    path = tmp_path / "v.parquet"
    if metadata == "none":
        df.to_parquet(path)
    else:
        _with_sweep_metadata(df, path)
    assert open_run(path).kind == RUN_KIND_VALIDATE
    runner = CliRunner()
    for cmd in (["export", str(path), "-o", str(tmp_path / "t.json")], ["analyze", str(path)],
                ["export", str(path), "--format", "vllm", "--allow-partial"]):
        r = runner.invoke(app, cmd)
        err = r.stderr.strip()
        assert r.exit_code == 2 and err.count("\n") == 0 and "Traceback" not in r.output, r.output
        assert "is a validate run" in err and "validate-report" in err, err
        assert ("'adaptive'" if adaptive else "one dsd K per batch size") in err, err
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("mode", ["dsd", "fixed"])
def test_sweep_rows_are_not_taken_for_validate_rows(tmp_path, mode):
    """The row test can disagree: a sweep in either speculation mode (and both pooled, each with
    every K of its grid) is a sweep, exported as before."""
    import pandas as pd
    from typer.testing import CliRunner

    from dsdprof.cli.app import app
    from dsdprof.config.run import RUN_KIND_SWEEP, validate_rows
    from dsdprof.io.runs import open_run

    path = _with_sweep_metadata(_sweep_rows(mode), tmp_path / "s.parquet")
    assert open_run(path).kind == RUN_KIND_SWEEP
    assert validate_rows(pd.concat([_sweep_rows("dsd"), _sweep_rows("fixed")])) == ""
    r = CliRunner().invoke(app, ["export", str(path)])
    assert r.exit_code == 0, r.output


def test_committed_validate_files_carry_their_metadata_and_are_refused():
    import glob
    from pathlib import Path

    from typer.testing import CliRunner

    from dsdprof.cli.app import app
    from dsdprof.config.run import validate_rows
    from dsdprof.io.readers import read_measurements, read_provenance

    data = Path(__file__).resolve().parents[2] / "docs" / "lab" / "data"
    files = sorted(glob.glob(str(data / "validate-*.parquet")))
    assert len(files) >= 18
    for f in files:
        prov = read_provenance(f)
        assert prov.get("extra_run_kind") == "validate", f
        assert prov["schema_version"].startswith("dsdprof.measurements/"), f
        rows = read_measurements(f)
        assert prov["hardware"] == rows["hardware"].iloc[0] and prov["model"] == rows["model"].iloc[0]
        assert validate_rows(rows), f  # the rows alone say so too
    shifted = [f for f in files if f.endswith("validate-shifted-adaptive.parquet")][0]
    r = CliRunner().invoke(app, ["export", shifted])
    assert r.exit_code == 2 and "is a validate run" in r.stderr and r.stderr.count("\n") == 1, r.output
