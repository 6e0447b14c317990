"""The report's plain data: panels of charts, tables and notes that the Jinja2 template lays out.

Every panel names what it could not show (``missing``): a partial run, a refused analysis or a
run kind without the data still gives a page that says what is absent and why."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from dsdprof.formats.jsontypes import ProvenanceView


@dataclass
class Cell:
    """One table cell: the printed ``text``; ``title`` what hovering shows (value, interval,
    samples); ``href`` a link to the rows it came from; ``cls`` CSS classes; ``attrs`` data-* keys
    the browser test reads; ``style`` an inline background (never the only carrier of a value)."""

    text: str
    title: str = ""
    href: str = ""
    cls: str = ""
    id: str = ""
    style: str = ""
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass
class TableData:
    caption: str
    columns: list[str]
    rows: list[list[Cell]]
    id: str = ""
    row_attrs: list[dict[str, str]] = field(default_factory=list)  # data-* per row (same length or empty)


@dataclass
class Panel:
    id: str
    title: str
    lead: str = ""  # one sentence: what the panel answers
    charts: list[Markup] = field(default_factory=list)
    tables: list[TableData] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # what the data could not show, and why


@dataclass
class Answer:
    """The page's opening: the table as ``export`` serves it, its provenance, export's warnings."""

    heading: str = "The answer: the table as served"
    headline: list[str] = field(default_factory=list)  # the command's own verdict lines (validate, rollout)
    ranges: list[tuple[int, int, int]] = field(default_factory=list)
    cap: int | None = None
    schema: str = ""
    provenance: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    refusal: str = ""  # export's refusal without --allow-partial (the table shown is then partial)
    missing: list[str] = field(default_factory=list)
    contexts: list[tuple[str, list[tuple[int, int, int]]]] = field(default_factory=list)  # v3 slices


@dataclass
class Report:
    title: str
    source: str
    kind: str  # sweep | context sweep | validate | rollout | drafts | unreadable
    subtitle: str = ""
    answer: Answer | None = None
    panels: list[Panel] = field(default_factory=list)
    generated: str = ""
    dsdprof_version: str = ""


def num(x: Any, digits: int = 3) -> str:
    """A number for a page: ``-`` for missing/NaN, else ``digits`` significant digits."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "-"
    if not math.isfinite(v):
        return "-"
    if abs(v) >= 10 ** digits:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def interval(lo: Any, hi: Any, digits: int = 3) -> str:
    """``[lo, hi]`` or ``[unknown]``."""
    if not (finite(lo) and finite(hi)):
        return "[unknown]"
    return f"[{num(lo, digits)}, {num(hi, digits)}]"


def finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def provenance_items(prov: ProvenanceView) -> list[tuple[str, str]]:
    return [(str(k), str(v)) for k, v in prov.items() if v not in ("", None)]
