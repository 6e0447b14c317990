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
                                          "dsd-bs2-k0-r0", "dsd-bs2-k1-r0", "vanilla-bs2-k0-r0"]
    fixed = plan_cells([1, 2], [0, 1], 2, "fixed")
    assert [c.cell_id for c in fixed] == ["vanilla-bs1-k0-r0", "vanilla-bs2-k0-r0", "fixed-bs1-k1-r0", "fixed-bs2-k1-r0",
                                          "fixed-bs1-k1-r1", "fixed-bs2-k1-r1", "vanilla-bs1-k0-r1", "vanilla-bs2-k0-r1"]


def test_plan_rotates_order_per_repeat_and_batch_size():
    from collections import Counter

    ks = [0, 1, 2, 3, 4]  # 6 cells per block with vanilla
    cells = plan_cells([4], ks, 6, "dsd")
    blocks = [cells[i:i + 6] for i in range(0, len(cells), 6)]
    assert all({c.repeat for c in blk} == {r} for r, blk in enumerate(blocks))  # repeats interleaved
    first = Counter((c.mode, c.num_spec_tokens) for c in (blk[0] for blk in blocks))
    assert len(first) == 6  # over 6 repeats every cell, vanilla included, is first once
    follows = Counter((a.num_spec_tokens, a.mode, b.num_spec_tokens, b.mode)
                      for blk in blocks for a, b in zip(blk, blk[1:]))
    assert set(follows.values()) == {1}  # and follows every other cell once
    by_bs = plan_cells([1, 2, 4], ks, 1, "dsd")
    assert len({tuple(c.num_spec_tokens if c.mode == "dsd" else -1 for c in by_bs[i:i + 6])
                for i in (0, 6, 12)}) == 3  # batch sizes of one repeat run in different orders
    groups = [[c.num_spec_tokens for c in plan_cells([1, 2], ks, 4, "fixed") if c.repeat == r][::2] for r in range(4)]
    assert len({g[0] for g in groups}) == 4  # fixed mode: the first engine (K) changes per repeat
    assert all(sorted(g) == [0, 1, 2, 3, 4] for g in groups)  # one group per K, vanilla as K=0


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
