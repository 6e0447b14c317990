"""Issue 21: K by batch size x context -- the sweep axis, per-context analysis, the v3 table,
export --context, and KSelector.select(batch_size, context_len). Fast: the analytic engine only."""

from __future__ import annotations

import glob
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from dsdprof.config.spec import parse_spec
from dsdprof.decide.analysis import analyze
from dsdprof.decide.context import analyze_contexts, analyze_contexts_path
from dsdprof.errors import InputError
from dsdprof.export.api import export_document
from dsdprof.formats.ktable import TableError, context_buckets, validate_table
from dsdprof.formats.measurements import COLUMN_NAMES, arrow_schema
from dsdprof.io.manifest import normalised_spec_dump, spec_hash
from dsdprof.io.runs import open_run
from dsdprof.measure.engine import Cell, plan_cells
from dsdprof.measure.runner import run_sweep
from dsdprof.serve.adaptive import AdaptiveKSelector
from dsdprof.serve.runtime import KSelector
from tests.support.tables import build_context_table, slice_for_context

CONTEXTS = [1024, 16384, 65536]  # the held-out check's three contexts


def _sim_spec(contexts=None, **sweep):
    data = {"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3", "max_model_len": 70000},
            "sweep": {"batch_sizes": [1, 2, 4, 8], "num_spec_tokens": [*range(17), 31, 32],
                      "waves": 3, **sweep},
            "sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.9}}
    if contexts is not None:
        data["sweep"]["context_lens"] = contexts
    return parse_spec(data)


@pytest.fixture(scope="module")
def ctx_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ctx") / "run"
    run_sweep(_sim_spec(CONTEXTS), out)
    return out


# ----------------------------------------------------------------------------- spec and cells

def test_spec_without_context_lens_hashes_as_before():
    """Hashes computed by the code before issue 21 (the vLLM spec's after issue 17 added
    sweep.design -- a run's design changes what it measures, so a run of the old cell design must
    not resume as a paired one; the sim spec's after issue 20 added [sim] keys, whose defaults the
    normalised dump carries): unchanged by the context axis."""
    a = parse_spec({"engine": {"model": "m", "method": "ngram"}})
    b = parse_spec({"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3"},
                    "sweep": {"batch_sizes": [1, 8], "num_spec_tokens": [0, 2]},
                    "sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.8}})
    assert "context_lens" not in normalised_spec_dump(a)["sweep"]
    assert spec_hash(normalised_spec_dump(a)) == (
        "sha256:a3098ea3444386baf583b662de52e3b044376e7f68827adbd5abe92e9dd38f65")
    assert spec_hash(normalised_spec_dump(b)) == (
        "sha256:898bbd850f5f1737be317b937b63dd3c1b8bc2f52dfc596fb66c2b829d87b3a8")
    with_ctx = parse_spec({"engine": {"model": "m", "method": "ngram"},
                           "sweep": {"context_lens": [4096, 512]}})
    assert normalised_spec_dump(with_ctx)["sweep"]["context_lens"] == [512, 4096]
    assert spec_hash(normalised_spec_dump(with_ctx)) != spec_hash(normalised_spec_dump(a))


@pytest.mark.parametrize("value, words", [
    ([], "must not be empty"), ([0], "context 0 must be in 1..16777216"), ([8, 8], "duplicate contexts"),
    ([1.5], "valid integer"), ("4096", "valid list"),
])
def test_context_lens_bad_values_are_one_line_errors(value, words):
    with pytest.raises(InputError) as err:
        parse_spec({"engine": {"model": "m", "method": "ngram"}, "sweep": {"context_lens": value}})
    msg = str(err.value)
    assert msg.startswith("sweep.context_lens") and words in msg and "\n" not in msg


def test_engine_check_uses_the_longest_context():
    from dsdprof.config.spec import check_workload_for_engine

    spec = parse_spec({"engine": {"model": "m", "method": "ngram", "max_model_len": 4096},
                       "sweep": {"context_lens": [512, 4096]}})
    with pytest.raises(InputError, match="max context_lens"):
        check_workload_for_engine(spec)


def test_cell_ids_unchanged_without_contexts_and_suffixed_with():
    assert Cell(0, 4, "dsd", 2).cell_id == "dsd-bs4-k2-r0"
    assert Cell(1, 4, "dsd", 2, 8192).cell_id == "dsd-bs4-k2-r1-c8192"
    plain = plan_cells([1, 2], [1, 2], 2, "dsd")
    assert plan_cells([1, 2], [1, 2], 2, "dsd", context_lens=None) == plain
    for mode in ("dsd", "fixed"):
        cells = plan_cells([1, 2], [1, 2], 2, mode, context_lens=[100, 1000])
        ids = [c.cell_id for c in cells]
        assert len(ids) == len(set(ids)) == 2 * 2 * 3 * 2
        for c in (100, 1000):  # every context holds the full grid of every repeat
            assert sorted((x.repeat, x.batch_size, x.mode, x.num_spec_tokens) for x in cells
                          if x.context_len == c) \
                == sorted((x.repeat, x.batch_size, x.mode, x.num_spec_tokens)
                          for x in plan_cells([1, 2], [1, 2], 2, mode))


# ----------------------------------------------------------------------------- rows

def test_rows_without_contexts_keep_the_schema(tmp_path):
    run_sweep(_sim_spec(batch_sizes=[1, 2], num_spec_tokens=[0, 2]), tmp_path / "r")
    schema = pq.read_schema(glob.glob(str(tmp_path / "r" / "*.parquet"))[0])
    assert schema.names == list(COLUMN_NAMES) and schema.remove_metadata().equals(arrow_schema())


def test_context_rows_record_their_context(ctx_run):
    df = pd.read_parquet(ctx_run)
    assert sorted(df["context_len"].unique()) == CONTEXTS
    assert all(cid.endswith(f"-c{c}") for cid, c in zip(df["cell_id"], df["context_len"]))
    ok = df[df["status"] == "ok"]
    # a longer context is a slower step at the same batch size and K (the KV read)
    piv = ok[ok["mode"] == "dsd"].pivot_table(index=["batch_size", "num_spec_tokens"], columns="context_len",
                                              values="itl_s")
    assert (piv[16384] > piv[1024]).all() and (piv[65536].dropna() > piv[16384][piv[65536].notna()]).all()


def test_kv_capacity_limits_batch_size_at_long_context(ctx_run):
    df = pd.read_parquet(ctx_run)
    failed = df[(df["status"] == "failed") & (df["context_len"] == 65536)]
    assert len(failed) and failed["error"].str.contains("predicted out of memory").all()
    assert (df[(df["context_len"] == 1024)]["status"] == "ok").all()


# ----------------------------------------------------------------------------- analysis and table

def test_each_context_is_analysed_by_the_same_rule(ctx_run):
    df = pd.read_parquet(ctx_run)
    res = analyze_contexts(df)
    assert res.contexts == CONTEXTS and res.default_context == 1024
    for c in CONTEXTS:
        alone = analyze(df[df["context_len"] == c].drop(columns=["context_len"]))
        pd.testing.assert_frame_equal(res.slices[c].optimal, alone.optimal)
    with pytest.raises(InputError, match="rows of several contexts"):
        analyze(df)


def test_long_context_does_not_lower_k_where_attention_dominates(ctx_run):
    res = analyze_contexts_path(open_run(ctx_run, "analyze"))
    k = {c: dict(zip(a.optimal["batch_size"], a.optimal["k"])) for c, a in res.slices.items()}
    for b in k[65536]:
        assert k[65536][b] >= k[16384][b] >= k[1024][b]
    assert any(k[65536][b] > k[1024][b] for b in k[65536])  # and it does move K* here


def test_v3_table_and_selector_serve_every_exported_k(ctx_run):
    doc, _ = __import__("dsdprof.export.api", fromlist=["x"]).table_from_source(ctx_run, allow_partial=True)
    assert doc["schema"] == "dsdprof.ktable/v3" and validate_table(json.loads(json.dumps(doc)))
    tops = [sl["max_context"] for sl in doc["contexts"]]
    assert tops == context_buckets(CONTEXTS)
    sel = KSelector.from_dict(doc)
    for sl in doc["contexts"]:
        lo = 1 + max([t for t in tops if t < sl["max_context"]], default=0)
        for p in sl["points"]:
            for ctx in {lo, sl["context_len"], min(sl["max_context"], 10**7)}:
                assert sel.select(p["batch_size"], ctx) == p["k"], (ctx, p)
    for p in doc["points"]:  # without a context: the batch-size-only answer (shortest context)
        assert sel.select(p["batch_size"]) == sel.select(p["batch_size"], None) == p["k"]
    assert sel.select(1, 10**12) == sel.select(1, 65536)  # past the last bucket: the last slice
    assert sel.select(1, -3) == sel.select(1, 2.5) == sel.select(1)  # bad context: batch-size-only
    assert AdaptiveKSelector(doc).select(1) == sel.select(1)


def test_v2_tables_still_serve_with_a_context(tmp_path):
    run_sweep(_sim_spec(batch_sizes=[1, 8], num_spec_tokens=[0, 2, 4]), tmp_path / "r")
    doc = export_document(tmp_path / "r").doc
    assert doc["schema"] == "dsdprof.ktable/v2"
    sel = KSelector.from_dict(doc)
    assert [sel.select(b, c) for b in (1, 8)
            for c in (None, 1, 10**6)] == [sel.select(b) for b in (1, 8) for _ in range(3)]
    v1 = {"schema": "dsdprof.ktable/v1", "ranges": [[1, 3, 4], [4, 100, 1]]}
    assert KSelector.from_dict(v1).select(2, 99999) == 4
    assert sel.lookup_list(8, 12345) == sel.lookup_list(8)


def test_export_vllm_context_picks_a_slice_and_says_so(ctx_run):
    long = export_document(ctx_run, "vllm", context=60000, allow_partial=True)  # 65536: BS 8 predicted OOM
    short = export_document(ctx_run, "vllm", allow_partial=True)
    table = export_document(ctx_run, allow_partial=True).doc
    assert long.doc["num_speculative_tokens_per_batch_size"] == slice_for_context(table, 60000)["ranges"]
    assert short.doc["num_speculative_tokens_per_batch_size"] == table["ranges"]
    assert any("profiled at context 65536" in w for w in long.warnings)
    assert any("batch size only" in w and "--context" in w for w in short.warnings)
    with pytest.raises(InputError, match="--context"):
        export_document(ctx_run, "vllm", context=0, allow_partial=True)


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.pop("contexts"), "contexts=None"),
    (lambda d: d["contexts"].reverse(), "max_context"),
    (lambda d: d["contexts"][0].__setitem__("ranges", [[2, 5, 1]]), "contexts[0].ranges[0]"),
    (lambda d: d["contexts"][1].__setitem__("context_len", 1), "contexts[1].context_len"),
])
def test_bad_v3_tables_name_the_field(ctx_run, mutate, words):
    doc = json.loads(json.dumps(export_document(ctx_run, allow_partial=True).doc))
    mutate(doc)
    with pytest.raises(TableError, match=words.replace("[", r"\[").replace("]", r"\]")):
        validate_table(doc)


def test_build_context_table_without_rows_matches(ctx_run):
    res = analyze_contexts_path(open_run(ctx_run, "analyze"))
    doc = build_context_table(res, source="x")
    assert [sl["context_len"] for sl in doc["contexts"]] == CONTEXTS


# ----------------------------------------------------------------------------- serving: mean, not max

def test_a_mixed_batch_costs_what_its_mean_context_costs_not_its_max():
    """The step model summed request by request (attention is per request, linear in its context)
    equals the step at the batch's mean context; K* of a batch with one long request among short
    ones is K* at the mean context, not at the max (which would over-draft)."""
    import numpy as np

    from dsdprof.measure.sim.catalog import MODELS
    from dsdprof.measure.sim.hardware import HARDWARE
    from dsdprof.measure.sim.model import (
        HwArrays,
        arch_features,
        attention_term,
        step_time,
    )
    from dsdprof.serve.runtime import batch_context

    hw = HwArrays.of(HARDWARE["H100 SXM"])
    tgt = arch_features(MODELS["Llama-3.1-8B"], "bfloat16", 1)
    drf = arch_features(MODELS["EAGLE3-Llama-3.1-8B"], "bfloat16", 1)
    contexts = [120_000] + [2_000] * 15
    b, ks = len(contexts), np.arange(0, 33)
    al = np.array([sum(0.9 ** i for i in range(k + 1)) for k in ks])

    def attention_s(k, per_request):  # the step's attention terms (target, and K draft steps), roofline each
        t = k + 1.0
        tm, tf = (sum(x) for x in zip(*[attention_term(tgt, hw, 1, t, c) for c in per_request]))
        dm, df = (k * sum(x) for x in zip(*[attention_term(drf, hw, 1, 1.0, c) for c in per_request]))
        e = hw.efficiency
        return max(tm / e.bandwidth, tf / e.compute) + max(dm / e.bandwidth, df / e.compute)

    def summed(k):  # every other term from the model at a short context, attention request by request
        short = [2_000] * b
        return float(step_time(hw, tgt, drf, b, k,
                               2_000).total_s) - attention_s(k, short) + attention_s(k, contexts)

    true = np.array([summed(k) for k in ks])
    at = lambda c: np.array([float(step_time(hw, tgt, drf, b, k, c).total_s) for k in ks])  # noqa: E731
    mean, biggest = batch_context(contexts), max(contexts)
    assert np.allclose(true, at(np.mean(contexts)), rtol=1e-9) and abs(mean - np.mean(contexts)) < 1
    k_true, k_mean, k_max = (int(ks[np.argmax(al / t)]) for t in (true, at(mean), at(biggest)))
    assert k_true == k_mean and k_max > k_true


def test_tile_effect_drafts_up_to_128_over_g_are_free_when_attention_dominates():
    import numpy as np

    from dsdprof.measure.sim.catalog import MODELS
    from dsdprof.measure.sim.context import query_tokens
    from dsdprof.measure.sim.hardware import HARDWARE
    from dsdprof.measure.sim.model import HwArrays, arch_features, attention_term
    from tests.support.sim_grid import free_draft_length

    assert list(query_tokens(4, np.array([1, 32, 33]), 128)) == [1, 32, 64]
    assert list(query_tokens(4, np.array([1, 33]), 1)) == [1, 33]  # no tile on a CPU profile
    for name, g, free in (("Llama-3.1-8B", 4, 31), ("Qwen3-30B-A3B", 8, 15)):
        f = arch_features(MODELS[name], "bfloat16", 1)
        assert f.q_per_kv == g and free_draft_length(g) == free
        hw = HwArrays.of(HARDWARE["H200 SXM"])
        cost = [max(float(m) / hw.efficiency.bandwidth, float(x) / hw.efficiency.compute)
                for m, x in (attention_term(f, hw, 8, k + 1.0, 65536) for k in (0, free, free + 1))]
        assert cost[1] == pytest.approx(cost[0], rel=1e-9) and cost[2] > 1.2 * cost[1]


def _v3_doc(tmp_path):
    from tests.plugins.test_adaptive_plugin import shifted_table

    short = shifted_table()
    long = shifted_table(base_itl_s=0.04)
    for c in long["cells"]:  # attention-bound at long context: K nearly free
        c["itl_s"] = 0.5 + c["itl_s"] * 0.01
        c["goodput"] = c["acceptance_length"] / c["itl_s"]
    long["ranges"], long["points"] = [[1, 1 << 20, 3]], [{"batch_size": b, "k": 3} for b in (1, 2, 4)]
    slices = [{"max_context": 1000, "context_len": 500,
               **{k: short[k] for k in ("ranges", "points", "cells", "acceptance_per_pos")}},
              {"max_context": 1 << 24, "context_len": 32000,
               **{k: long[k] for k in ("ranges", "points", "cells", "acceptance_per_pos")}}]
    doc = {**short, "schema": "dsdprof.ktable/v3", "default_context": 500, "contexts": slices}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(validate_table(doc)))
    return doc


def test_adaptive_plugin_keys_each_step_on_the_batch_mean_context(tmp_path):
    pytest.importorskip("vllm")
    from types import SimpleNamespace as NS

    import dsdprof.plugins.vllm_adaptive as va
    from dsdprof.serve.settings import adaptive_additional_config
    from tests.plugins.test_adaptive_plugin import serving_setup

    _v3_doc(tmp_path)
    s = va.AdaptiveScheduler.__new__(va.AdaptiveScheduler)
    s.num_spec_tokens, s.dynamic_sd_lookup = 4, [0] + [3] * 8
    s.running, s.waiting, s.requests = [], [], {}
    serving_setup(s, adaptive_additional_config(str(tmp_path / "table.json"), {"rebuild_every": 1}))
    short_lookup, long_lookup = s.dsdprof_k.ctx_lookups
    assert short_lookup != long_lookup and long_lookup[1:] == [3] * 8
    for contexts, want in (([100] * 4, short_lookup), ([40_000] * 4, long_lookup),
                           ([3_000] + [100] * 3, short_lookup)):  # mean 825: the max (3000) would say long
        s.running = [NS(num_tokens=c) for c in contexts]
        s._dsdprof_apply_k()
        lookup = s.dynamic_sd_lookup
        assert [lookup[b] for b in range(1, 9)] == want[1:], contexts
        assert len(lookup) == len(want)
    # vLLM looks K up after admitting the step's requests: a long batch arriving at an idle engine
    # is served its own slice from its first step (the lookup is read when indexed, not before)
    s.running = []
    s._dsdprof_apply_k()
    lookup = s.dynamic_sd_lookup
    s.running = [NS(num_tokens=40_000) for _ in range(4)]  # admitted by vLLM's schedule()
    assert lookup[4] == long_lookup[4] and s.dsdprof_k.ctx_i == 1


# ----------------------------------------------------------------------------- plots and show

def test_plot_draws_a_heatmap_per_context(ctx_run, tmp_path):
    pytest.importorskip("matplotlib")
    from dsdprof.report.plots import plot_results

    paths = plot_results(ctx_run, tmp_path / "plots")
    names = {p.name for p in paths}
    assert {"goodput_heatmap_by_context.png", "optimal_k_by_context.png"} <= names
    assert "goodput_heatmap.png" not in names  # never one pooled heatmap
    from dsdprof.decide.context import analyze_contexts_path
    from dsdprof.report.context_plots import context_heatmaps_figure

    fig = context_heatmaps_figure(analyze_contexts_path(open_run(ctx_run, "analyze")))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["context 1k", "context 16k", "context 64k"]


def test_show_prints_a_table_per_context(ctx_run, tmp_path):
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    path = tmp_path / "t.json"
    path.write_text(json.dumps(export_document(ctx_run, allow_partial=True).doc))
    out = CliRunner().invoke(app, ["show", str(path)], env={"COLUMNS": "160"})
    assert out.exit_code == 0, out.output
    for title in ("context 1..4096 (profiled at 1024)", "context 4097..32768 (profiled at 16384)",
                  "context 32769+ (profiled at 65536)", "no context known"):
        assert title in out.output
    res = CliRunner().invoke(app, ["export", str(ctx_run), "--format", "vllm", "--context", "20000",
                                   "--allow-partial"])
    assert res.exit_code == 0 and "profiled at context 16384" in res.output


def test_vllm_engine_builds_the_pool_at_the_longest_context_and_cuts_per_cell():
    """No engine starts: the pool's workload is at the longest context, each cell asks for its own."""
    from dsdprof.measure.vllm.engine import VllmEngine

    spec = parse_spec({"engine": {"model": "m", "method": "ngram", "max_model_len": 9000},
                       "sweep": {"context_lens": [8000, 100], "batch_sizes": [1, 2]},
                       "workload": {"input_len": 7}})
    eng = VllmEngine(spec, start_worker=lambda *a, **k: None)
    assert eng.pool._workload.input_len == 8000 and spec.workload.input_len == 7
    assert eng.cell_request(Cell(0, 2, "dsd", 1, 100), 1).context_len == 100
    plain = VllmEngine(parse_spec({"engine": {"model": "m", "method": "ngram"}}),
                       start_worker=lambda *a, **k: None)
    assert plain.pool._workload.input_len == 128
    assert plain.cell_request(Cell(0, 2, "dsd", 1), 1).context_len == 0


# ----------------------------------------------------------------------------- failed slices (issue 31)

GRID_BS = [1, 2, 4, 8, 16, 32, 64, 128]
OOM = {8192: {64, 128}, 65536: {16, 32, 64, 128}}  # the held-out context sweep's out-of-memory cells


def _context_run(path, failed=OOM, contexts=(1024, 8192, 65536), ks=(0, 1, 3, 5)):
    """A context sweep's run directory from synthetic rows (manifest grid included): AL grows with K,
    the step with B * (K + 1) and the context; the cells in ``failed`` are failed rows (OOM)."""
    from dsdprof.formats.measurements import empty_row
    from dsdprof.io.store import SweepWriter

    grid = {"batch_sizes": GRID_BS, "num_spec_tokens": list(ks), "context_lens": list(contexts)}
    with SweepWriter(path, {"engine": {}, "sweep": grid, "workload": {}}) as w:
        w.start({"engine": "vllm", "hardware": "cpu"})
        for c in contexts:
            for b in GRID_BS:
                for mode, k in [("vanilla", 0)] + [("dsd", k) for k in ks]:
                    row = empty_row()
                    cell = Cell(0, b, mode, k, c)
                    row.update(cell_id=cell.cell_id, mode=mode, batch_size=b, num_spec_tokens=k, repeat=0,
                               context_len=c)
                    if b in failed.get(c, ()):
                        row.update(status="failed", error="MemoryError: predicted out of memory (KV cache)")
                    else:
                        al = sum(0.8 ** i for i in range(k + 1))
                        itl = (0.010 + 0.0005 * k + 0.00008 * b * (k + 1)) * (1 + c / 65536)
                        row.update(status="ok", acceptance_length=al, itl_s=itl)
                    w.write_row(row)
    return path


@pytest.mark.slow  # ~3 s
def test_context_export_refuses_failed_slices_in_one_line(tmp_path):
    """As a plain sweep's export: batch sizes with no number at a context are refused, naming the
    context and its batch sizes (exit 2, one line), in every format."""
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    run = _context_run(tmp_path / "run")
    with pytest.raises(InputError) as err:
        export_document(run)
    assert err.value.field == "contexts" and err.value.value == {8192: [64, 128], 65536: [16, 32, 64, 128]}
    for fmt in ("table", "vllm"):
        r = CliRunner().invoke(app,
                               ["export", str(run), "--format", fmt, "-o", str(tmp_path / f"{fmt}.json")])
        err_line = r.stderr.strip()
        assert r.exit_code == 2 and err_line.count("\n") == 0 and "Traceback" not in r.output, r.output
        for words in ("contexts={8192: [64, 128], 65536: [16, 32, 64, 128]}", "context 8192: no ok cell at "
                      "batch size 64, 128", "predicted out of memory", "--allow-partial"):
            assert words in err_line, err_line
        assert not (tmp_path / f"{fmt}.json").exists()


def test_context_export_with_allow_partial_never_extends_a_k_over_failed_batch_sizes(tmp_path):
    from dsdprof.formats.ktable import LAST_RANGE_END, k_for_batch_size

    run = _context_run(tmp_path / "run")
    out = export_document(run, allow_partial=True)
    doc = validate_table(json.loads(json.dumps(out.doc)))
    ends = {sl["context_len"]: sl["ranges"][-1][1] for sl in doc["contexts"]}
    assert ends == {1024: LAST_RANGE_END, 8192: 32, 65536: 8}  # each slice ends at its last measured BS
    for sl in doc["contexts"]:
        measured = {p["batch_size"] for p in sl["points"]}
        assert max(r[1] for r in sl["ranges"]) >= max(measured)
        assert not any(r[0] <= b <= r[1] for r in sl["ranges"] for b in OOM.get(sl["context_len"], ()))
    assert "partial" not in doc["contexts"][0]
    assert doc["contexts"][1]["partial"] == "no ok cell at batch size 64, 128"
    assert "context 65536: no ok cell at batch size 16, 32, 64, 128" in doc["provenance"]["partial"]
    assert any(w.startswith("partial context sweep: context 8192") for w in out.warnings)
    vllm = export_document(run, "vllm", allow_partial=True, context=65536).doc
    assert vllm["num_speculative_tokens_per_batch_size"][-1][1] == 8
    assert k_for_batch_size(slice_for_context(doc, 65536)["ranges"],
                            128) == doc["contexts"][2]["points"][-1]["k"]


def test_complete_context_sweep_exports_as_before(tmp_path):
    """No failed cell: nothing refused, nothing recorded, the last range open as in any sweep."""
    from dsdprof.formats.ktable import LAST_RANGE_END

    out = export_document(_context_run(tmp_path / "run", failed={}))
    assert all(sl["ranges"][-1][1] == LAST_RANGE_END and "partial" not in sl for sl in out.doc["contexts"])
    assert "partial" not in out.doc["provenance"] and not any("partial" in w for w in out.warnings)


def test_a_context_whose_every_cell_failed_is_refused_then_skipped(tmp_path):
    run = _context_run(tmp_path / "run", failed={65536: set(GRID_BS)})
    with pytest.raises(InputError, match=r"contexts=\{65536: \[1, 2, 4, 8, 16, 32, 64, 128\]\}"):
        export_document(run)
    doc = export_document(run, allow_partial=True).doc
    assert [sl["context_len"]
            for sl in doc["contexts"]] == [1024, 8192] and "65536" in doc["contexts_skipped"]


def test_plain_partial_export_ends_at_its_last_measured_batch_size(tmp_path):
    """The same rule without a context axis: --allow-partial never carries a K over the failed
    largest batch sizes (a gap inside the grid still takes the measured neighbours' K)."""
    from dsdprof.formats.measurements import empty_row
    from dsdprof.io.store import SweepWriter

    run = tmp_path / "plain"
    with SweepWriter(run, {"engine": {}, "sweep": {"batch_sizes": GRID_BS, "num_spec_tokens": [0, 2]},
                           "workload": {}}) as w:
        w.start({"engine": "vllm", "hardware": "cpu"})
        for b in GRID_BS:
            for mode, k in (("vanilla", 0), ("dsd", 0), ("dsd", 2)):
                row = empty_row()
                row.update(cell_id=Cell(0, b, mode, k).cell_id, mode=mode, batch_size=b,
                           num_spec_tokens=k, repeat=0)
                if b in (4, 64, 128):
                    row.update(status="failed", error="MemoryError")
                else:
                    row.update(status="ok", acceptance_length=1 + 0.8 * k / 2,
                               itl_s=0.01 + 0.0001 * b * (k + 1))
                w.write_row(row)
    with pytest.raises(InputError, match=r"batch_sizes=\[4, 64, 128\]"):
        export_document(run)
    doc = export_document(run, allow_partial=True).doc
    assert doc["ranges"][-1][1] == 32 and doc["ranges"][0][0] == 1
    assert "no ok cell at batch size 4, 64, 128" in doc["provenance"]["partial"]


def test_v3_table_without_default_context_exports_its_first_slice(tmp_path):
    """default_context is optional in a v3 table: export serves the first profiled slice then
    (it raised KeyError for the vllm and trtllm formats)."""
    doc = _v3_doc(tmp_path)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({k: v for k, v in doc.items() if k != "default_context"}))
    for fmt in ("vllm", "trtllm"):
        assert export_document(plain, fmt).doc == export_document(tmp_path / "table.json", fmt).doc
