"""Sweep orchestration on the analytic engine (a real model, cheap to run)."""

import pandas as pd
import pytest

from dsdprof.config.spec import parse_spec
from dsdprof.errors import InputError
from dsdprof.measure.engine import plan_cells
from dsdprof.measure.runner import run_sweep


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
    assert [c.cell_id for c in fixed] == ["vanilla-bs1-k0-r0", "vanilla-bs2-k0-r0",
                                          "fixed-bs1-k1-r0", "fixed-bs2-k1-r0",
                                          "fixed-bs1-k1-r1", "fixed-bs2-k1-r1",
                                          "vanilla-bs1-k0-r1", "vanilla-bs2-k0-r1"]


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
    groups = [[c.num_spec_tokens for c in plan_cells([1, 2], ks, 4, "fixed") if c.repeat == r][::2]
              for r in range(4)]
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
    plan = next(e for e in events if e.phase == "plan")
    assert events[0].phase == "begin" and plan.total == len(df)  # begin: the grid, before the engine


def _interrupt_after(n, events):
    def on_progress(ev):
        events.append(ev)
        if ev.phase == "done" and sum(e.phase == "done" for e in events) == n:
            raise KeyboardInterrupt

    return on_progress


def test_resume_skips_finished_cells_and_supersedes_failed_ones(tmp_path):
    out = tmp_path / "run"
    events = []
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_spec(), out, on_progress=_interrupt_after(7, events))
    first = pd.read_parquet(out)  # the buffer was flushed on the interrupt
    assert len(first) == 7 and first.cell_id.is_unique
    ok_before = set(first[first.status == "ok"].cell_id)
    with pytest.raises(InputError, match="--resume"):
        run_sweep(_spec(), out)
    for _ in range(3):  # failed (out-of-memory) cells are retried each time, never duplicated
        events = []
        s = run_sweep(_spec(), out, resume=True, on_progress=events.append)
        assert s.skipped == len(ok_before) and s.ok + s.failed + s.skipped == s.total == 12
        assert not ok_before & {e.cell.cell_id for e in events if e.phase == "done"}
        df = pd.read_parquet(out)
        assert len(df) == 12 and df.cell_id.is_unique
        ok_before = set(df[df.status == "ok"].cell_id)
    assert list((out / "_attempts").glob("*.parquet"))  # earlier versions kept, invisible to pandas


def test_sim_rows_are_batched_into_few_files(tmp_path):
    out = tmp_path / "run"
    s = run_sweep(_spec(batch_sizes=list(range(1, 41))), out)
    assert s.total == 160 and len(pd.read_parquet(out)) == 160
    assert len(list(out.glob("part-*.parquet"))) == 1


@pytest.mark.parametrize("change, field", [
    ({"sweep": {"waves": 5}}, "spec.sweep.waves=5"),
    ({"sweep": {"output_len": 32}}, "spec.sweep.output_len=32"),
    ({"sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.8}}, "spec.sim.hardware='H100 SXM'"),
    ({"sim": {"hardware": "RTX 4090", "acceptance_alpha": 0.7}}, "spec.sim.acceptance_alpha=0.7"),
])
def test_resume_with_another_spec_is_refused(tmp_path, change, field):
    out = tmp_path / "run"
    run_sweep(_spec(batch_sizes=[1, 2]), out)
    manifest = (out / "_sweep.json").read_bytes()
    d = _spec(batch_sizes=[1, 2]).model_dump(mode="json")
    for section, values in change.items():
        d[section] = {**(d[section] or {}), **values} if section != "sim" else values
    with pytest.raises(InputError) as err:
        run_sweep(parse_spec(d), out, resume=True)
    assert str(err.value).startswith(f"{field}: differs from the run being resumed in {out} (was ")
    assert (out / "_sweep.json").read_bytes() == manifest


def test_resume_accepts_an_equivalent_spec(tmp_path):
    out = tmp_path / "run"
    run_sweep(_spec(batch_sizes=[1, 2]), out)
    d = _spec(batch_sizes=[2, 1], waves=20).model_dump(mode="json")  # defaults spelled out, order changed
    d["sim"] = {**d["sim"], "routing_correlation": 0.0, "check_memory": True}
    s = run_sweep(parse_spec(d), out, resume=True)
    assert s.skipped == s.ok + s.skipped and len(pd.read_parquet(out)) == s.total
