"""The sweep part of the report: the answer (``export``'s table, provenance and warnings) and the
panels below it, from the same public calls ``analyze`` and ``export`` make
(:func:`dsdprof.decide.analysis.analyze_path`, :func:`dsdprof.export.api.export_document`) on a run
opened once (:func:`dsdprof.io.runs.open_run`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict, cast

import pandas as pd

from dsdprof.decide.analysis import Analysis
from dsdprof.decide.decision import BatchDecision
from dsdprof.errors import InputError
from dsdprof.formats.ktable_types import KTable
from dsdprof.report.html.model import (
    Answer,
    Cell,
    Panel,
    TableData,
    finite,
    interval,
    num,
    provenance_items,
)
from dsdprof.report.html.svg import Mark, Series, step_line, xy_chart

if TYPE_CHECKING:
    from pathlib import Path

    from dsdprof.config.run import Coverage, ReadRun


class CellRecord(TypedDict, total=False):
    """A row of ``Analysis.cells`` (or ``.baseline``) as the panels read it (NaN where unknown)."""

    batch_size: int
    num_spec_tokens: int
    acceptance_length: float
    itl_s: float
    goodput: float
    samples: int
    ratio_to_best: float
    ratio_low: float
    ratio_high: float
    acceptance_per_pos: Sequence[float] | None  # an array per row


def records(df: pd.DataFrame) -> list[CellRecord]:
    """The rows of an analysis table (``Analysis.cells``, ``.baseline``), typed once here."""
    return [cast(CellRecord, {str(k): v for k, v in r.items()}) for r in df.to_dict(orient="records")]


def cell_id(b: int, k: int | str) -> str:
    return f"cell-b{b}-k{k}"


# ----------------------------------------------------------------------------- the answer

def answer_from_export(source: Path | ReadRun, tolerance: float, allow_mixed: bool = False) -> Answer:
    """What ``dsdprof export`` writes and prints for a table file or a run as read (the same call,
    the run checked as the command checks it); a partial run is refused there, so the table shown
    is then ``--allow-partial``'s, under export's refusal."""
    from dsdprof.config.run import ReadRun, checked_run
    from dsdprof.export.api import ExportDocument, export_document

    def exported_table(allow_partial: bool) -> ExportDocument:
        run = checked_run(source, "export", allow_mixed) if isinstance(source, ReadRun) else source
        return export_document(run, "table", tolerance, allow_partial=allow_partial)

    ans = Answer()
    try:
        exported = exported_table(False)
    except InputError as err:
        ans.refusal = str(err)
        try:
            exported = exported_table(True)
        except InputError as err2:
            ans.missing.append(f"no table: export refuses this run even with --allow-partial ({err2})")
            return ans
    doc = cast(KTable, exported.doc)  # format "table"
    ans.schema = str(doc.get("schema", ""))
    ans.cap = doc.get("num_speculative_tokens")
    ans.ranges = [(int(a), int(b), int(k)) for a, b, k in doc.get("ranges", [])]
    ans.warnings = list(exported.warnings)
    lo, slices = 1, doc.get("contexts") or []
    for i, sl in enumerate(slices):  # as `dsdprof show` names them: the contexts each slice serves
        span = f"{lo}+" if i == len(slices) - 1 else f"{lo}-{sl.get('max_context', '?')}"
        ans.contexts.append((f"context {span} (profiled at {sl.get('context_len', '?')})",
                             [(int(a), int(b), int(k)) for a, b, k in sl["ranges"]]))
        lo = int(sl.get("max_context", lo)) + 1
    ans.provenance = provenance_items(doc.get("provenance") or {})
    return ans


def sweep_headline(opt: Sequence[BatchDecision], ranges: list[tuple[int, int, int]]) -> list[str]:
    """The page's first lines for a sweep: the K per range in words, the speedup over vanilla from
    the smallest to the largest batch size, where speculation loses, what the data did not decide."""
    if not opt:
        return []
    lines = []
    if ranges:
        from dsdprof.formats.ktable import LAST_RANGE_END

        def span(a: int, b: int) -> str:
            return f"{a}+" if b >= LAST_RANGE_END else str(a) if a == b else f"{a}-{b}"

        served = [f"K={k} at batch size {span(a, b)}" for a, b, k in ranges]
        lines.append("the table serves " + ", ".join(served))
    first, last = opt[0], opt[-1]
    sp = [f"{num(r.speedup_vs_baseline)}x {interval(r.speedup_low, r.speedup_high)} at BS {r.batch_size}"
          for r in ((first, last) if len(opt) > 1 else (first,))]
    lines.append("K* over vanilla: " + " .. ".join(sp))
    losing = [str(r.batch_size) for r in opt if finite(r.speedup_vs_baseline) and r.speedup_vs_baseline < 1]
    if losing:
        lines.append(f"speculation loses to vanilla at batch size {', '.join(losing)}")
    undecided = [str(r.batch_size) for r in opt if not r.decided]
    lines.append(f"not decided at batch size {', '.join(undecided)} (the data still allow more than one K)"
                 if undecided else "every batch size decided")
    return lines


# ----------------------------------------------------------------------------- panels

def _bs_labels(bss: list[int]) -> list[str]:
    return [str(b) for b in bss]


def kstar_panel(opt: Sequence[BatchDecision], ranges: list[tuple[int, int, int]], confidence: float) -> Panel:
    p = Panel("kstar", "K* against batch size",
              "The K the data pick at each profiled batch size: filled when the data decided it, hollow "
              f"when not; the whisker spans the Ks the data still allow at {confidence:.0%} confidence.")
    bss = [r.batch_size for r in opt]
    chosen = Series("K*", line=False)
    rows, attrs = [], []
    for i, r in enumerate(opt):
        adm = [int(k) for k in r.admissible]
        decided = r.decided
        lo, hi = (min(adm), max(adm)) if adm else (math.nan, math.nan)
        margin = f"{num(r.margin)} {interval(r.ci_low, r.ci_high)}"
        runner_up = "-" if r.runner_up is None else str(r.runner_up)
        title = (f"BS {r.batch_size}: K*={r.k} ({'decided' if decided else 'not decided'}); "
                 f"K the data allow: {', '.join(map(str, adm)) or '?'}; "
                 f"runner-up K={runner_up}, goodput K*/runner-up {margin}")
        chosen.marks.append(Mark(i, float(r.k), title, lo, hi, decided, label=str(r.k)))
        rows.append([Cell(str(r.batch_size)),
                     Cell(str(r.k), href=f"#{cell_id(r.batch_size, r.k)}", title=title),
                     Cell("decided" if decided else "not decided", cls="" if decided else "warn"),
                     Cell(", ".join(map(str, adm)) or "-"), Cell(runner_up),
                     Cell(margin, title="goodput of K* / the runner-up's, with its interval"),
                     Cell(num(r.regret_bound, 2),
                          title="upper bound of K*'s shortfall vs the best K")])
        attrs.append({"data-bs": str(r.batch_size), "data-k": str(r.k)})
    served = Series("table", step_line(ranges, bss), step=True)
    p.charts.append(xy_chart([served, chosen], _bs_labels(bss), x_title="batch size", y_title="K",
                             y_min=-0.3, y_max=max([r[2] for r in ranges] + [float(m.hi) for m in chosen.marks
                                                                             if finite(m.hi)] + [1]) + 0.5,
                             integer_y=True, chart_id="chart-kstar"))
    p.tables.append(TableData("K* per batch size", ["BS", "K*", "decision", "K allowed", "runner-up",
                                                     "K*/runner-up [CI]", "regret bound"],
                              rows, "kstar-table", attrs))
    undecided = [r.batch_size for r in opt if not r.decided]
    if undecided:
        p.notes.append(f"not decided at batch size {', '.join(map(str, undecided))}: more repeats or waves "
                       "there would separate the Ks (`dsdprof sweep --budget`).")
    return p


def speedup_panel(opt: Sequence[BatchDecision], baseline_name: str) -> Panel:
    p = Panel("speedup", "Speedup over vanilla",
              f"Goodput of K* over {baseline_name} at each batch size, with its interval; below 1 "
              "speculation loses.")
    bss = [r.batch_size for r in opt]
    s = Series("K* / vanilla")
    rows = []
    for i, r in enumerate(opt):
        how = r.speedup_interval or "unknown"
        sp = f"{num(r.speedup_vs_baseline)}x"
        title = (f"BS {r.batch_size}, K={r.k}: {sp} {interval(r.speedup_low, r.speedup_high)} ({how} "
                 f"interval); goodput {num(r.goodput)} vs {num(r.baseline_goodput)} tok/s per user")
        s.marks.append(Mark(i, r.speedup_vs_baseline, title, r.speedup_low, r.speedup_high, label=sp))
        rows.append([Cell(str(r.batch_size)), Cell(str(r.k)), Cell(sp, title=title),
                     Cell(interval(r.speedup_low, r.speedup_high)), Cell(how),
                     Cell(num(r.goodput), href=f"#{cell_id(r.batch_size, r.k)}"),
                     Cell(num(r.baseline_goodput), href=f"#{cell_id(r.batch_size, 'vanilla')}"),
                     Cell("yes" if r.vanilla_faster else "no", cls="warn" if r.vanilla_faster else "",
                          title=f"vanilla / best K - 1: {num(r.vanilla_gain)} "
                                f"{interval(r.vanilla_gain_low, r.vanilla_gain_high)}")])
    p.charts.append(xy_chart([s], _bs_labels(bss), x_title="batch size", y_title="speedup (x vanilla)",
                             ref_y=1.0, ref_label="vanilla", chart_id="chart-speedup"))
    p.tables.append(TableData("speedup of K* over vanilla", ["BS", "K*", "speedup", "interval", "how",
                                                               "goodput", "vanilla", "vanilla faster"],
                              rows, "speedup-table"))
    losing = [r.batch_size for r in opt if finite(r.speedup_vs_baseline) and r.speedup_vs_baseline < 1]
    if losing:
        p.notes.append(f"speculation loses to vanilla at batch size {', '.join(map(str, losing))}.")
    return p


def heatmap_panel(cells: list[CellRecord], base: list[CellRecord],
                  opt: Sequence[BatchDecision]) -> Panel:
    p = Panel("heatmap", "Goodput: batch size x K, with vanilla",
              "Tokens/s per user in every cell; the shade is the cell's goodput relative to the best at its "
              "batch size, the boxed cell (*) is K*. Hover a cell for its interval and sample count; "
              "click it for its row.")
    bss = sorted({int(c["batch_size"]) for c in cells} | {int(b["batch_size"]) for b in base})
    ks = sorted({int(c["num_spec_tokens"]) for c in cells})
    by = {(int(c["batch_size"]), int(c["num_spec_tokens"])): c for c in cells}
    van = {int(b["batch_size"]): b for b in base}
    kstar = {r.batch_size: r.k for r in opt}
    best = {}
    for b in bss:  # the best goodput at b, vanilla included: the shade's 1.0
        at_b = [float(c["goodput"]) for (bb, _), c in by.items() if bb == b and finite(c["goodput"])]
        if b in van and finite(van[b]["goodput"]):
            at_b.append(float(van[b]["goodput"]))
        best[b] = max(at_b) if at_b else 1.0
    rows: list[list[Cell]] = []
    keys: list[int | str] = [*ks, "vanilla"]
    for k in keys:
        row = [Cell(f"K={k}" if k != "vanilla" else "vanilla", cls="rowhead")]
        for b in bss:
            c = van.get(b) if isinstance(k, str) else by.get((b, k))
            if c is None or not finite(c.get("goodput")):
                row.append(Cell("no cell", cls="gap", title=f"BS {b}, {k}: no measurement"))
                continue
            g = float(c["goodput"])
            rel = g / best[b] if best[b] else math.nan
            star = k != "vanilla" and kstar.get(b) == k
            if k == "vanilla":
                title = (f"BS {b}, vanilla: goodput {num(g)} tok/s per user; AL 1; "
                         f"ITL {num(1e3 * c['itl_s'])} ms")
            else:
                title = (f"BS {b}, K={k}: goodput {num(g)} tok/s per user; vs best K "
                         f"{num(c.get('ratio_to_best'))} "
                         f"{interval(c.get('ratio_low'), c.get('ratio_high'))}; "
                         f"AL {num(c.get('acceptance_length'))}, ITL {num(1e3 * float(c['itl_s']))} ms; "
                         f"samples {c.get('samples', '?')}")
            shade = 0.15 + 0.85 * max(0.0, min(1.0, (rel - 0.5) / 0.5)) if finite(rel) else 0
            row.append(Cell(f"{num(g)}{' *' if star else ''}", title=title, href=f"#{cell_id(b, k)}",
                            cls="hm" + (" star" if star else ""),
                            style=f"background: rgba(0, 114, 178, {shade * 0.55:.2f})",
                            attrs={"data-bs": str(b), "data-k": str(k), "data-goodput": f"{g:.6g}"}))
        rows.append(row)
    p.tables.append(TableData("goodput, tokens/s per user (rows: K; columns: batch size)",
                              ["K \\ BS", *map(str, bss)], rows, "heatmap"))
    return p


def step_time_panel(cells: list[CellRecord], base: list[CellRecord]) -> Panel:
    p = Panel("steptime", "Step time against K, per batch size",
              "ITL (seconds per engine step: draft + verify) against K; where the lines steepen with K the "
              "step has turned compute-bound. V: vanilla's step.")
    bss = sorted({int(c["batch_size"]) for c in cells})
    ks = sorted({int(c["num_spec_tokens"]) for c in cells})
    slots = ["V", *map(str, ks)]
    van = {int(b["batch_size"]): b for b in base}
    series = []
    for b in bss:
        s = Series(f"BS {b}")
        if b in van and finite(van[b].get("itl_s")):
            s.marks.append(Mark(0, 1e3 * float(van[b]["itl_s"]),
                                f"BS {b}, vanilla: ITL {num(1e3 * float(van[b]['itl_s']))} ms"))
        at_b = [c for c in cells if int(c["batch_size"]) == b]
        for c in sorted(at_b, key=lambda c: int(c["num_spec_tokens"])):
            if finite(c.get("itl_s")):
                k = int(c["num_spec_tokens"])
                s.marks.append(Mark(1 + ks.index(k), 1e3 * float(c["itl_s"]),
                                    f"BS {b}, K={k}: ITL {num(1e3 * float(c['itl_s']))} ms over "
                                    f"{c.get('samples', '?')} sample(s)"))
        series.append(s)
    p.charts.append(xy_chart(series, slots, x_title="K (V = vanilla)", y_title="ITL, ms per step",
                             chart_id="chart-steptime", y_min=0))
    growth = []
    for b in bss:
        row = {int(c["num_spec_tokens"]): float(c["itl_s"]) for c in cells
               if int(c["batch_size"]) == b and finite(c.get("itl_s"))}
        if len(row) >= 2 and min(row) in row:
            k0, k1 = min(row), max(row)
            growth.append([Cell(str(b)), Cell(num(1e3 * row[k0])), Cell(num(1e3 * row[k1])),
                           Cell(f"{num((row[k1] / row[k0] - 1) * 100 / max(1, k1 - k0), 2)} %",
                                title=f"ITL at K={k1} / K={k0} - 1, per added draft token")])
    if growth:
        per_token = [(int(r[0].text), r[3].text) for r in growth]
        p.notes.append("each added draft token costs "
                       + ", ".join(f"{t} of the step at BS {b}" for b, t in per_token)
                       + ": the larger the share, the closer the step is to compute-bound, and the less a "
                         "draft token can pay.")
        p.tables.append(TableData("step time growth per added draft token",
                                  ["BS", f"ITL K={ks[0]} ms", f"ITL K={ks[-1]} ms", "per draft token"],
                                  growth, "steptime-table"))
    return p


def acceptance_panel(cells: list[CellRecord], per_pos_table: list[float] | None) -> Panel:
    p = Panel("acceptance", "Acceptance: AL per K and acceptance per position",
              "AL (tokens a request gains per step) against K per batch size, and the acceptance rate at "
              "each draft position (accepted at i / drafted at i) of the largest K.")
    bss = sorted({int(c["batch_size"]) for c in cells})
    ks = sorted({int(c["num_spec_tokens"]) for c in cells})
    series = []
    for b in bss:
        s = Series(f"BS {b}")
        for c in cells:
            if int(c["batch_size"]) == b and finite(c.get("acceptance_length")):
                k = int(c["num_spec_tokens"])
                s.marks.append(Mark(ks.index(k), float(c["acceptance_length"]),
                                    f"BS {b}, K={k}: AL {num(c['acceptance_length'])} over "
                                    f"{c.get('samples', '?')} sample(s)"))
        s.marks.sort(key=lambda m: m.x)
        series.append(s)
    p.charts.append(xy_chart(series, [str(k) for k in ks], x_title="K", y_title="AL, tokens per step",
                             y_min=0, chart_id="chart-al"))
    pos_series, width = [], 0
    for b in bss:
        at_b = [(c, pos) for c in cells if int(c["batch_size"]) == b
                and (pos := c.get("acceptance_per_pos")) is not None and len(pos) > 0]
        if not at_b:
            continue
        c, pos = max(at_b, key=lambda cp: int(cp[0]["num_spec_tokens"]))
        vals = [float(v) for v in pos]
        width = max(width, len(vals))
        pos_series.append(Series(f"BS {b}", [Mark(i, v, f"BS {b}, K={c['num_spec_tokens']}: position {i + 1} "
                                              f"accepted {num(v)}", label="") for i, v in enumerate(vals)]))
    rows = []
    if pos_series:
        p.charts.append(xy_chart(pos_series, [str(i + 1) for i in range(width)], x_title="draft position",
                                 y_title="acceptance rate", y_min=0, y_max=1.05, chart_id="chart-perpos"))
        for s in pos_series:
            rows.append([Cell(s.name), *[Cell(num(m.y), title=m.title) for m in s.marks]])
        p.tables.append(TableData("acceptance per position (largest K at each batch size, median over rows)",
                                  ["BS", *[f"pos {i + 1}" for i in range(width)]], rows, "perpos-table"))
    else:
        p.missing.append("no per-position acceptance in these rows (the table serves statically; the "
                         "adaptive selector cannot use it)")
    if per_pos_table:
        p.notes.append("the table's profiled acceptance per position: "
                       + ", ".join(num(v, 2) for v in per_pos_table))
    return p


def coverage_panel(coverage: Coverage | None, rows: pd.DataFrame) -> Panel:
    p = Panel("coverage", "Coverage gaps and failed cells",
              "The planned grid against the cells that produced a number; failed cells with their errors.")
    if coverage is not None:
        p.notes.append(f"grid (from the {coverage.grid_from}): batch sizes "
                       f"{', '.join(map(str, coverage.batch_sizes))}; K {', '.join(map(str, coverage.ks))}")
        if coverage.complete:
            p.notes.append("every grid cell has a number: no gaps.")
        else:
            p.missing.append(f"gaps: {coverage.gap_summary}")
    failed = []
    if rows is not None and "status" in rows.columns:
        bad = rows[rows["status"].astype(str) != "ok"]
        for r in bad.to_dict(orient="records")[:200]:
            failed.append([Cell(str(r.get("cell_id", ""))), Cell(str(r.get("batch_size", ""))),
                           Cell(str(r.get("mode", ""))), Cell(str(r.get("num_spec_tokens", ""))),
                           Cell(str(r.get("status", ""))),
                           Cell(" ".join(str(r.get("error") or "").split())[:300])])
        if len(bad) > 200:
            p.notes.append(f"{len(bad) - 200} more failed rows not listed")
    if failed:
        p.tables.append(TableData(f"failed cells ({len(failed)})",
                                  ["cell", "BS", "mode", "K", "status", "error"], failed, "failed-table"))
    else:
        p.notes.append("no failed cells.")
    return p


def rows_panel(cells: list[CellRecord], base: list[CellRecord]) -> Panel:
    p = Panel("rows", "Every cell, as analysed",
              "One row per (batch size, K): the numbers every chart above is drawn from. Goodput = AL / ITL; "
              "'vs best' is the cell's goodput over the best K's at its batch size, with its interval.")
    rows = []
    for c in sorted(cells, key=lambda c: (int(c["batch_size"]), int(c["num_spec_tokens"]))):
        b, k = int(c["batch_size"]), int(c["num_spec_tokens"])
        rows.append([Cell(str(b), id=cell_id(b, k)), Cell(str(k)), Cell(num(c.get("acceptance_length"), 4)),
                     Cell(num(1e3 * float(c["itl_s"]), 4) if finite(c.get("itl_s")) else "-"),
                     Cell(num(c.get("goodput"), 4)), Cell(str(c.get("samples", "-"))),
                     Cell(num(c.get("ratio_to_best"))),
                     Cell(interval(c.get("ratio_low"), c.get("ratio_high")))])
    for v in sorted(base, key=lambda v: int(v["batch_size"])):
        b = int(v["batch_size"])
        rows.append([Cell(str(b), id=cell_id(b, "vanilla")), Cell("vanilla"),
                     Cell(num(v.get("acceptance_length"), 4)),
                     Cell(num(1e3 * float(v["itl_s"]), 4) if finite(v.get("itl_s")) else "-"),
                     Cell(num(v.get("goodput"), 4)), Cell("-"), Cell("-"), Cell("-")])
    p.tables.append(TableData("cells", ["BS", "K", "AL", "ITL ms", "goodput", "samples", "vs best",
                                        "interval"], rows, "rows-table"))
    return p


def sweep_panels(analysis: Analysis, ranges: list[tuple[int, int, int]]) -> list[Panel]:
    """The panels of one analysis (a sweep, or one context slice); ``ranges``: the table's K
    ranges as exported (the K* chart draws them as the served line)."""
    opt = analysis.decisions
    cells = records(analysis.cells)
    base = records(analysis.baseline)
    panels = [kstar_panel(opt, ranges, float(analysis.confidence)),
              speedup_panel(opt, "vanilla" if base else "K=0"),
              heatmap_panel(cells, base, opt), step_time_panel(cells, base), acceptance_panel(cells, None)]
    for w in getattr(analysis, "warnings", ()):
        panels[0].notes.append(str(w))
    return panels
