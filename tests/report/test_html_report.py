"""``dsdprof report RUN -o report.html``: one self-contained page per run, from real runs (the
notebook's vLLM sweep and validate run, a lab rollout, analytic-engine sweeps) and from runs made
broken or partial from them; then each page opened in headless Chromium with the network blocked
(tests/report/html_browser.py): no console error, every panel drawn and not blank, the served
table's K per range equal to ``export``'s, a screenshot saved (``$DSDPROF_ARTEFACTS``, else
``build/report-screenshots/``). Without Chromium the browser test skips, saying how to install it."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

from dsdprof.report.html.build import build_report
from dsdprof.report.html.render import render_html
from tests.report.html_browser import CHROMIUM, Browser, open_report

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_RUN = ROOT / "notebooks" / "sample_run"
SAMPLE_VALIDATE = ROOT / "notebooks" / "sample_validate"
ROLLOUT = ROOT / "docs" / "lab" / "data" / "rollout-heldout-2026-12-03.parquet"


def _sim(**sweep):
    from dsdprof.config.spec import parse_spec

    grid = {"batch_sizes": [1, 4], "num_spec_tokens": [0, 2], "waves": 3, **sweep}
    return parse_spec({"engine": {"name": "sim", "model": "Llama-3.1-8B", "method": "eagle3",
                                  "max_model_len": 70000},
                       "sweep": grid, "sim": {"hardware": "H100 SXM", "acceptance_alpha": 0.9}})


def _derived(src: Path, dst: Path, edit) -> Path:
    """A copy of the real run ``src`` with ``edit(rows)`` applied (the file's metadata kept)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src / "measurements.parquet")
    rows = table.to_pandas()
    edit(rows)
    dst.mkdir(parents=True)
    out = pa.Table.from_pandas(rows, preserve_index=False).replace_schema_metadata(table.schema.metadata)
    pq.write_table(out, dst / "measurements.parquet")
    return dst


def _fail_cells(rows) -> None:
    """BS 64 (every cell) and BS 16 K=4 failed, as an out-of-memory sweep leaves them."""
    bad = (rows.batch_size == 64) | ((rows.batch_size == 16) & (rows.num_spec_tokens == 4))
    rows.loc[bad, "status"] = "failed"
    rows.loc[bad, "error"] = "MemoryError: KV cache full"
    rows.loc[bad, ["acceptance_length", "itl_s"]] = math.nan


def _negative_itl(rows) -> None:
    rows.loc[rows.index[(rows.status == "ok") & (rows.num_spec_tokens == 2)][0], "itl_s"] = -1.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Every kind of run the report reads, real or derived from real ones, built once (~2 s)."""
    from dsdprof.measure.runner import run_sweep

    base = tmp_path_factory.mktemp("html-runs")
    run_sweep(_sim(batch_sizes=[8], num_spec_tokens=[0, 1, 2, 3]), base / "single")
    run_sweep(_sim(batch_sizes=[1, 4, 16], num_spec_tokens=[0, 1, 2], context_lens=[1024, 4096]),
              base / "ctx")
    torn = base / "torn"
    torn.mkdir()
    (torn / "measurements.parquet").write_bytes((SAMPLE_RUN / "measurements.parquet").read_bytes()[:5000])
    return {"sweep": SAMPLE_RUN, "validate": SAMPLE_VALIDATE, "rollout": ROLLOUT,
            "single": base / "single", "ctx": base / "ctx", "torn": torn,
            "partial": _derived(SAMPLE_RUN, base / "partial", _fail_cells),
            "broken": _derived(SAMPLE_RUN, base / "broken", _negative_itl)}


@pytest.fixture(scope="module")
def pages(runs, tmp_path_factory) -> dict[str, Path]:
    """Each run's report, written once by the library call the command makes."""
    out = tmp_path_factory.mktemp("html-pages")
    written = {}
    for name, path in runs.items():
        written[name] = out / f"{name}.html"
        written[name].write_text(render_html(build_report(path)), encoding="utf-8")
    return written


@pytest.fixture(scope="module")
def exported(runs) -> dict:
    """What ``dsdprof export`` makes of the runs that have a table (``--allow-partial`` for the
    partial one): the expected answer of their pages."""
    from dsdprof.export.api import export_document

    return {name: export_document(runs[name], "table", allow_partial=name == "partial")
            for name in ("sweep", "partial", "single")}


def served_ranges(html: str) -> list[list[int]]:
    """The K per range of the page's served table (what the browser test reads from the DOM)."""
    m = re.search(r'<table class="served" id="served-table".*?</table>', html, re.S)
    if m is None:
        return []
    return [[int(a), int(b), int(k)] for a, b, k in
            re.findall(r'<tr data-start="(\d+)" data-end="(\d+)" data-k="(\d+)">', m.group(0))]


def panels(html: str) -> list[str]:
    return re.findall(r'<section class="panel[^"]*" id="([^"]+)" data-panel=', html)


def test_the_page_opens_with_exports_table_and_draws_every_panel(pages, exported):
    html = pages["sweep"].read_text()
    exported = exported["sweep"]
    assert served_ranges(html) == exported.doc["ranges"]
    assert panels(html) == ["answer", "kstar", "speedup", "heatmap", "steptime", "acceptance", "coverage",
                            "rows"]
    assert html.index('id="answer"') < html.index('id="kstar"')  # the answer first
    for key, value in exported.doc["provenance"].items():
        if key != "created_at" and value not in ("", None):
            assert f"<dt>{key}</dt><dd>{value}</dd>" in html
    assert "export prints no warning for this run" in html and not exported.warnings


def test_the_page_is_self_contained(pages):
    """No script, no stylesheet or image to fetch, no URL outside the page: it opens offline."""
    for name, page in pages.items():
        html = page.read_text()
        assert "<script" not in html and "<link" not in html and "<img" not in html, name
        assert not re.search(r'(src|href)="(?!#)', html), name
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", html), name


def test_every_number_is_traceable_to_its_row(pages, runs):
    """Each heatmap cell prints its goodput, carries interval and samples on hover, and links to its
    row in the cells table, whose numbers are the analysis' own."""
    from dsdprof.config.defaults import DEFAULT_TOLERANCE
    from dsdprof.decide.analysis import analyze_path
    from dsdprof.io.runs import open_run
    from dsdprof.report.html.model import num

    html = pages["sweep"].read_text()
    cells = analyze_path(open_run(runs["sweep"], "analyze"), tolerance=DEFAULT_TOLERANCE).cells
    hm = re.findall(r'<td class="hm[^"]*" title="([^"]+)" style="[^"]+" data-bs="(\d+)" data-k="(\w+)" '
                    r'data-goodput="([^"]+)"><a href="#(cell-b\d+-k\w+)">([^<]+)</a>', html)
    assert len(hm) == len(cells) + cells["batch_size"].nunique()  # every K and vanilla at each batch size
    for r in cells.itertuples():
        title, _, _, g, anchor, text = next(h for h in hm if (h[1], h[2]) == (str(r.batch_size),
                                                                             str(r.num_spec_tokens)))
        assert float(g) == pytest.approx(r.goodput, rel=1e-5) and text.startswith(num(r.goodput))
        assert f"samples {r.samples}" in title and "vs best K" in title and "[" in title
        assert f'id="{anchor}"' in html


def test_the_page_agrees_with_analyze_json(pages, runs):
    """K* per batch size, its decision and the speedup over vanilla, as ``analyze --json`` prints them."""
    import json

    from typer.testing import CliRunner

    from dsdprof.cli.app import app
    from dsdprof.report.html.model import interval, num

    res = CliRunner().invoke(app, ["analyze", str(runs["sweep"]), "--json"])
    assert res.exit_code == 0, res.output
    optimal = json.loads(res.stdout)["optimal"]
    html = pages["sweep"].read_text()
    assert re.findall(r'<tr data-bs="(\d+)" data-k="(\d+)">', html) == [(str(o["batch_size"]), str(o["k"]))
                                                                         for o in optimal]
    speedups = re.search(r'<table id="speedup-table">.*?</table>', html, re.S).group(0)
    for o in optimal:
        assert f"{num(o['speedup_vs_baseline'])}x" in speedups
        assert interval(o["speedup_low"], o["speedup_high"]) in speedups
    decided = re.search(r'<table id="kstar-table">.*?</table>', html, re.S).group(0)
    assert decided.count(">not decided<") == sum(not o["decided"] for o in optimal)


def test_a_partial_run_says_what_is_missing(pages, exported):
    html = pages["partial"].read_text()
    assert "export refuses this run:" in html and "--allow-partial" in html
    assert served_ranges(html) == exported["partial"].doc["ranges"]
    assert "missing: gaps: no ok cell at batch size 64; missing BS 16 K=4" in html
    assert html.count("MemoryError: KV cache full") >= 7  # each failed cell listed with its error
    assert "partial run: no ok cell at batch size 64" in html  # export's own warning


def test_broken_rows_and_an_unreadable_file_still_give_a_page(pages):
    html = pages["broken"].read_text()
    assert "analyze refuses these rows: itl_s=-1.0: must be a finite number &gt; 0.0" in html
    assert "no table: export refuses this run" in html
    torn = pages["torn"].read_text()
    assert 'data-kind="unreadable"' in torn and "the run could not be read" in torn
    assert "not a readable Parquet" in torn


def test_a_single_batch_size_says_nothing_tells_where_k_changes(pages):
    html = pages["single"].read_text()
    assert "one batch size only" in html and served_ranges(html)[0][0] == 1
    assert "kstar" in panels(html) and "heatmap" in panels(html)


def test_validate_rollout_and_context_runs_get_their_own_panels(pages):
    from dsdprof.io.readers import read_measurements
    from dsdprof.report.compare import compare

    validate = pages["validate"].read_text()
    assert panels(validate)[:2] == ["answer", "validate"] and "validate-report" in validate
    comp = compare(read_measurements(SAMPLE_VALIDATE))
    for r in comp.itertuples():  # DSD's tokens/s per user as validate-report prints them
        assert f"DSD: {float(r.tops_dsd):.3g} tok/s per user" in validate
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    printed = CliRunner().invoke(app, ["validate-report", str(SAMPLE_VALIDATE)]).stdout
    verdict = next(line for line in printed.splitlines() if line.startswith("max regret vs best fixed K"))
    assert f'<ul class="headline"><li>{verdict}</li>' in validate  # validate-report's verdict, first
    rollout = pages["rollout"].read_text()
    assert {"rollout", "serving"} <= set(panels(rollout))
    ctx = pages["ctx"].read_text()
    assert {"contexts", "heatmap-ctx1024", "heatmap-ctx4096"} <= set(panels(ctx))
    assert re.findall(r'data-context="([^"]+)"', ctx) == ["context 1-2048 (profiled at 1024)",
                                                         "context 2049+ (profiled at 4096)"]


def test_the_command_writes_the_page_and_refuses_bad_input_in_one_line(runs, tmp_path):
    from typer.testing import CliRunner

    from dsdprof.cli.app import app

    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(runs["single"]), "-o", str(out)])
    assert res.exit_code == 0 and f"wrote {out}" in res.stdout
    assert out.read_text().startswith("<!DOCTYPE html>")
    for args, words in (([str(runs["single"]), "-o", str(out)], "exists"),
                        ([str(tmp_path / "nope"), "-o", str(tmp_path / "x.html")], "no such file"),
                        ([str(runs["single"]), "-o", str(tmp_path / "no" / "x.html")], "no directory"),
                        ([str(runs["single"]), "-o", str(tmp_path / "x.html"), "--tolerance", "2"],
                         "--tolerance=2.0: must be in [0, 1)")):
        res = CliRunner().invoke(app, ["report", *args])
        assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output, res.output
        assert res.stderr.strip().count("\n") == 0

# where the screenshots go (kept): $DSDPROF_ARTEFACTS, else build/report-screenshots (git-ignored)
ARTEFACTS = Path(os.environ.get("DSDPROF_ARTEFACTS") or ROOT / "build" / "report-screenshots")


@pytest.fixture(scope="module")
def browser():
    b = Browser(CHROMIUM)
    try:
        yield b
    finally:
        b.close()


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not found: `apt-get install -y chromium` "
                    "(Debian; `make test` tries it) or set DSDPROF_CHROMIUM to a Chromium binary")
@pytest.mark.slow  # a browser start and seven pages: ~16 s at load 11 on 2 cores (docs/lab/html-report-*)
@pytest.mark.parametrize("name", ["sweep", "partial", "single", "broken", "validate", "rollout", "ctx"])
def test_the_report_in_headless_chromium(browser, pages, exported, name):
    shots = ARTEFACTS
    shots.mkdir(parents=True, exist_ok=True)
    st = open_report(browser, pages[name], shots / f"report-{name}.png")
    assert st["errors"] == [], st["errors"]  # no console error, no exception
    assert st["requests"] == [] and st["externals"] == []  # nothing left the page
    assert st["heatmapBlank"] == 0 and st["untitled"] == 0  # every cell printed, every mark titled
    assert (shots / f"report-{name}.png").read_bytes()[:4] == b"\x89PNG" and st["pdf_bytes"] > 10_000
    assert st["panels"] and st["panels"][0]["id"] == "answer"
    for p in st["panels"]:  # drawn and not blank
        assert p["width"] > 300 and p["height"] > 60 and p["text"] > 40, p
        for c in p["charts"]:
            assert c["w"] > 300 and c["h"] > 150 and c["marks"] > 0, p
        assert all(n > 0 for n in p["tables"]), p
        assert p["charts"] or p["tables"] or p["missing"] or p["id"] in ("answer", "coverage"), p
    if name in ("sweep", "single", "partial"):  # the table's K per range, as export writes it
        assert st["ranges"] == exported[name].doc["ranges"]
        assert [p["id"] for p in st["panels"]][:6] == ["answer", "kstar", "speedup", "heatmap", "steptime",
                                                       "acceptance"]
    if name == "broken":
        assert any("analyze refuses" in m for p in st["panels"] for m in p["missing"])


@pytest.mark.slow  # a compare-drafts directory on the analytic engine (~3 s)
def test_a_compare_drafts_directory_gets_the_drafts_report(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from dsdprof.cli.app import app
    from tests.decide.test_drafts_domains import SIM_SPEC

    monkeypatch.chdir(tmp_path)
    recs = [{"category": "code", "prompt": "x"}, {"category": "text", "prompt": "y"}]
    (tmp_path / "w.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "s.toml").write_text(SIM_SPEC)
    runner = CliRunner()
    assert runner.invoke(app, ["compare-drafts", "s.toml", "--out", "out"]).exit_code == 0
    res = runner.invoke(app, ["report", "out", "-o", "d.html"])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "d.html").read_text()
    assert 'data-kind="drafts"' in html and panels(html) == ["answer", "drafts"]
    assert "Recommendation: ngram at every measured batch size" in html
    assert 'id="chart-drafts"' in html and html.count('<g class="series" data-name=') == 4  # 2 drafts x 2


def test_a_table_file_gives_its_answer_and_says_the_rest_needs_the_run(tmp_path):
    from dsdprof.export.api import export_document

    table = ROOT / "tables" / "toy-dense-cpu.json"
    html = render_html(build_report(table))
    assert served_ranges(html) == export_document(table, "table").doc["ranges"]
    assert 'data-kind="table"' in html and "a table file holds no measurements" in html
