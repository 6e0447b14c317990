"""validate's paired design: the variants of a batch size and repeat (vanilla, fixed K, the table on
vLLM's schedule, the adaptive plugin) run their waves interleaved one by one, on their own engines,
and the regret bootstrap pairs wave j of every variant.

The orchestration runs the real validate job and cell loop over fake engine workers (no vLLM) that
measure waves on one shared machine clock whose drift moves every wave's step time alike
(tests/measure/test_paired_vanilla.py's Machine): cell by cell, the variants' cells land minutes apart."""

from __future__ import annotations

import pandas as pd
import pytest

from dsdprof.measure.engine import CellMeasurement
from tests.measure.test_paired_vanilla import Machine, fake_measurement

# Truth per engine at every batch size: (AL, ITL). Goodput: vanilla 100, fixed-1 150, fixed-2 160,
# fixed-3 155, dsd (serves K=2) 160, adaptive 152 (a 5 % regret against the best fixed K, fixed-2).
TRUTH = {"vanilla": (1.0, 0.010), "fixed-1": (1.8, 0.012), "fixed-2": (2.4, 0.015), "fixed-3": (2.79, 0.018),
         "dsd": (2.4, 0.015), "adaptive": (2.28, 0.015)}
TABLE = {"schema": "dsdprof.ktable/v1", "num_speculative_tokens": 3, "ranges": [[1, 1 << 20, 2]]}


class SpanWorker:
    """What the real engine worker offers: one cell open at a time, run in spans of measured waves."""

    machine: Machine
    log: list = []
    fail: str = ""

    def __init__(self, config, timeout_s) -> None:
        from dsdprof.serve.settings import ADAPTIVE_SCHEDULER_QUALNAME

        kw = config.llm_kwargs
        cfg = kw.get("speculative_config")
        if cfg is None:
            self.key = "vanilla"
        elif kw.get("scheduler_cls") == ADAPTIVE_SCHEDULER_QUALNAME:
            self.key = "adaptive"
        elif "num_speculative_tokens_per_batch_size" in cfg:
            self.key = "dsd"
        else:
            self.key = f"fixed-{cfg['num_speculative_tokens']}"
        self.info = {"engine_version": "fake", "hardware": "fake", "async_scheduling": False}
        self.alive, self.open = True, None

    def run(self, req, timeout_s) -> CellMeasurement | None:
        from dsdprof.measure.vllm.pool import EngineFailure

        start, stop = req.span if req.span != (0, 0) else (0, req.waves)
        SpanWorker.log.append((self.key, req.batch_size, start, stop))
        if self.key == SpanWorker.fail:
            raise EngineFailure(f"{self.key} died")
        if start == 0:
            for _ in range(req.warmup):
                self.machine.wave()
            self.open = ([], [])
        assert self.open is not None and len(self.open[0]) == start, "spans must be contiguous"
        al, itl = TRUTH[self.key]
        for _ in range(start, stop):
            self.open[0].append(al)
            self.open[1].append(itl * self.machine.wave())
        if stop < req.waves:
            return None
        (als, itls), self.open = self.open, None
        return fake_measurement(als, itls, tuple(req.wave_block), 1)

    def stop(self) -> None:
        self.alive = False

    def kill(self) -> None:
        self.alive = False


def _spec(tmp_path, waves: int = 8, repeats: int = 1):
    from dsdprof.config.spec import parse_spec

    for name in ("tgt", "drf"):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text("{}")
    return parse_spec({"engine": {"name": "vllm", "model": str(tmp_path / "tgt"),
                                  "draft_model": str(tmp_path / "drf"), "method": "draft_model"},
                       "sweep": {"batch_sizes": [1, 4], "num_spec_tokens": [0, 3], "waves": waves,
                                 "warmup": 1, "output_len": 8, "repeats": repeats}})


def _run(tmp_path, design: str, seed: int = 0, walk: float = 0.01, name: str = "out", adaptive=None):
    from dsdprof.jobs.validate import run_validation

    SpanWorker.machine, SpanWorker.log = Machine(seed, walk=walk, own=0.01), []
    table = TABLE
    if adaptive is not None:
        from tests.plugins.test_adaptive_plugin import shifted_table

        table = shifted_table(provenance={"model": str(tmp_path / "tgt")})
    summary = run_validation(table, _spec(tmp_path), tmp_path / name, [1, 2, 3], start_worker=SpanWorker,
                             design=design, adaptive=adaptive)
    return summary, pd.read_parquet(tmp_path / name)


def test_plan_marks_every_variant_of_a_batch_size_with_its_unit():
    from dsdprof.errors import InputError
    from dsdprof.jobs.validate import plan_validation

    cells = plan_validation([1, 4], [1, 3], TABLE["ranges"], 2, adaptive_k=3)
    units: dict = {}
    for c in cells:
        units.setdefault(c.unit, []).append(c)
    assert len(units) == 4 and all(len(v) == 5 for v in units.values())
    for v in units.values():
        assert {(c.mode, c.num_spec_tokens) for c in v} == set(v[0].interleave)
    assert all(c.unit is None and not c.interleave
               for c in plan_validation([1], [1], TABLE["ranges"], 1, design="cells"))
    with pytest.raises(InputError, match="--design"):
        plan_validation([1], [1], TABLE["ranges"], 1, design="waves")


def test_waves_interleave_one_by_one_and_rows_carry_the_wave(tmp_path):
    summary, df = _run(tmp_path, "paired")
    assert (summary.ok, summary.failed) == (2 * 5, 0)
    bs1 = [e for e in SpanWorker.log if e[1] == 1]
    assert len(bs1) == 5 * 8 and all(stop == start + 1 for _, _, start, stop in bs1)
    for j in range(8):  # wave j of every variant before wave j + 1 of any
        assert {e[0] for e in bs1[5 * j:5 * j + 5]} == {"vanilla", "fixed-1", "fixed-2", "fixed-3", "dsd"}
        assert {e[2] for e in bs1[5 * j:5 * j + 5]} == {j}
    firsts = {bs1[5 * j][0] for j in range(8)}
    assert len(firsts) >= 4  # no variant always first (Williams rows)
    assert (df["design"] == "paired").all()
    assert all(list(b) == list(range(8)) for b in df["sample_block"])


@pytest.mark.slow  # many simulated validate runs, ~3 s
def test_paired_regret_intervals_cancel_drift_and_cover_the_truth(tmp_path):
    """A machine whose speed wanders 1 % per wave (10-35 % over the minutes a batch size's cells take
    cell by cell) with 1 % noise of its own per wave. The table serves the best fixed K (fixed-2),
    so the true regret is 0: paired, every interval covers it and the points sit within ~1 %; cell by
    cell, the drift between the variants' cells lands in the points (and the intervals, resampled
    per cell, do not see it)."""
    from dsdprof.report.compare import compare

    covered, covered_cells, err_p, err_c, best_ok, widths = 0, 0, [], [], 0, []
    for seed in range(6):
        _, paired = _run(tmp_path, "paired", seed, walk=0.01, name=f"p{seed}")
        _, cells = _run(tmp_path, "cells", seed, walk=0.01, name=f"c{seed}")
        cp, cc = compare(paired).set_index("batch_size"), compare(cells).set_index("batch_size")
        covered += int(((cp["regret_lo"] <= 0) & (0 <= cp["regret_hi"])).sum())
        covered_cells += int(((cc["regret_lo"] <= 0) & (0 <= cc["regret_hi"])).sum())
        widths += (cp["regret_hi"] - cp["regret_lo"]).tolist()
        best_ok += int((cp["best_fixed_k"] == 2).sum())
        err_p += cp["regret"].abs().tolist()
        err_c += cc["regret"].abs().tolist()
    assert covered >= 11, covered  # 12 intervals at 90 %
    assert covered_cells <= 6, covered_cells  # cell by cell the drift between cells is not in the intervals
    assert max(widths) < 0.05, widths  # resampling each variant on its own: up to 0.07 on these runs
    assert best_ok >= 11  # 160 vs 155 tokens/s: told apart paired
    assert sum(err_p) / 12 < 0.015 and sum(err_p) * 2 < sum(err_c), (err_p, err_c)


def test_paired_adaptive_regret_is_paired_too(tmp_path):
    from dsdprof.report.compare import compare

    _, df = _run(tmp_path, "paired", adaptive={"half_life": 64})
    c = compare(df).set_index("batch_size")
    truth = 1 - (2.28 / 0.015) / (2.4 / 0.015)  # 5 %
    assert ((c["adaptive_regret_lo"] <= truth) & (truth <= c["adaptive_regret_hi"])).all()
    assert ((c["adaptive_regret_hi"] - c["adaptive_regret_lo"]) < 0.03).all()


def test_a_failed_engine_ends_its_own_rows_only(tmp_path):
    SpanWorker.fail = "fixed-3"
    try:
        summary, df = _run(tmp_path, "paired")
    finally:
        SpanWorker.fail = ""
    assert summary.failed == 2 and summary.ok == 2 * 4
    failed = df[df["status"] != "ok"]
    assert set(failed["cell_id"]) == {"fixed-bs1-k3-r0", "fixed-bs4-k3-r0"}
    assert failed["error"].str.contains("fixed-3 died").all()
    assert (df[df["status"] == "ok"]["sample_block"].map(len) == 8).all()  # the others ran all their waves


def test_cli_design_option(tmp_path):
    import json

    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    (tmp_path / "t.json").write_text(json.dumps(TABLE))
    (tmp_path / "s.toml").write_text("[engine]\nname = 'vllm'\nmodel = "
                                     f"'{tmp_path / 'tgt'}'\nmethod = 'ngram'\n")
    (tmp_path / "tgt").mkdir()
    (tmp_path / "tgt" / "config.json").write_text("{}")
    r = CliRunner().invoke(app,
                           ["validate", str(tmp_path / "t.json"), str(tmp_path / "s.toml"),
                            "--design", "waves",
                                 "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--design" in r.output and "waves" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()
