"""Sweep orchestration on the analytic engine (a real model, cheap to run)."""

import pandas as pd
import pytest

from dsdprof.engines.base import plan_cells
from dsdprof.errors import InputError
from dsdprof.spec import parse_spec
from dsdprof.sweep import run_sweep


def _spec(**sweep):
    return parse_spec({
        "engine": {"name": "sim", "model": "Llama-3.1-8B", "draft_model": "EAGLE3-Llama-3.1-8B",
                   "method": "eagle3", "dtype": "bfloat16", "max_model_len": 32768},
        "sweep": {"batch_sizes": [1, 8, 64], "num_spec_tokens": [0, 2, 4], **sweep},
        "workload": {"input_len": 16000},
        "sim": {"hardware": "RTX 4090", "acceptance_alpha": 0.8},
    })


def test_plan_interleaves_dsd_and_groups_fixed():
    cells = plan_cells([1, 2], [0, 1], 1, "dsd")
    assert [c.cell_id for c in cells] == ["vanilla-bs1-k0-r0", "dsd-bs1-k0-r0", "dsd-bs1-k1-r0",
                                          "vanilla-bs2-k0-r0", "dsd-bs2-k0-r0", "dsd-bs2-k1-r0"]
    fixed = plan_cells([1, 2], [0, 1], 2, "fixed")
    assert [c.cell_id for c in fixed][:4] == ["vanilla-bs1-k0-r0", "vanilla-bs2-k0-r0", "fixed-bs1-k1-r0", "fixed-bs2-k1-r0"]
    assert len(fixed) == 8


def test_failed_cells_are_rows_and_sweep_goes_on(tmp_path):
    events = []
    s = run_sweep(_spec(), tmp_path / "run", on_progress=events.append)
    df = pd.read_parquet(tmp_path / "run")
    assert len(df) == s.total == 3 * 4
    assert s.failed > 0 and s.ok > 0  # long contexts do not fit a 24 GB card at larger batches
    failed = df[df.status == "failed"]
    assert failed.error.str.contains("out of memory").all()
    assert (df[df.status == "ok"].engine == "sim").all()
    assert [e.phase for e in events if e.phase == "done"] == ["done"] * len(df)
    assert events[0].phase == "plan" and events[0].total == len(df)


def test_resume_skips_finished_cells(tmp_path):
    out = tmp_path / "run"
    run_sweep(_spec(batch_sizes=[1, 2]), out)
    parts = sorted(out.glob("part-*.parquet"))
    victim = parts[3]
    victim_id = pd.read_parquet(victim).cell_id.iloc[0]
    victim.unlink()  # as if the sweep had been killed before this cell finished
    with pytest.raises(InputError, match="--resume"):
        run_sweep(_spec(batch_sizes=[1, 2]), out)
    events = []
    s = run_sweep(_spec(batch_sizes=[1, 2]), out, resume=True, on_progress=events.append)
    assert s.skipped == len(parts) - 1 and s.ok == 1
    assert [e.cell.cell_id for e in events if e.phase == "done"] == [victim_id]
    df = pd.read_parquet(out)
    assert sorted(df.cell_id) == sorted(set(df.cell_id)) and len(df) == len(parts)
