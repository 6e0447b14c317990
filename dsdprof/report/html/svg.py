"""Static SVG charts for the HTML report: no script, no network, readable in print and without
colour (every mark carries its value in a ``<title>`` the browser shows on hover, lines are named
at their ends and told apart by dash pattern as well as colour).

The functions return SVG text (a :class:`markupsafe.Markup`, every label escaped). X positions are
categorical (one slot per batch size or K, evenly spaced: batch sizes are usually powers of two,
so an even slot is a log axis); y is linear from the data's range, with rounded ticks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

# Okabe-Ito: distinguishable with the common colour-vision deficiencies
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
DASHES = ("", "6 3", "2 3", "8 3 2 3", "1 2", "10 4", "4 2 1 2", "3 6")


@dataclass
class Mark:
    """One point: ``x`` is the slot index, ``y`` the value, ``lo``/``hi`` an interval (NaN: none),
    ``title`` what hovering shows, ``filled`` False draws a hollow marker (e.g. not decided)."""

    x: int
    y: float
    title: str
    lo: float = math.nan
    hi: float = math.nan
    filled: bool = True
    label: str = ""  # printed beside the mark (the value, so the chart reads without hovering)


@dataclass
class Series:
    name: str
    marks: list[Mark] = field(default_factory=list)
    line: bool = True
    step: bool = False  # drawn as steps (a K held over a range of batch sizes), changing between slots


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else [0.0]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    out, v = [], start
    while v <= hi + step * 1e-6:
        out.append(round(v, 10))
        v += step
    return out


def _num(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def xy_chart(series: Sequence[Series], x_labels: Sequence[str], *, x_title: str, y_title: str,
             y_min: float | None = None, y_max: float | None = None, ref_y: float | None = None,
             ref_label: str = "", width: int = 640, height: int = 300, chart_id: str = "",
             integer_y: bool = False) -> Markup:
    """A line / point chart over categorical x slots, with interval whiskers where marks have them."""
    left, right, top, bottom = 58, 110, 14, 46
    if len(series) > 1:  # room for the legend's longest name (about 7 px a character at 12 px)
        right = max(right, 50 + 7 * max(len(s.name) for s in series))
        width += right - 110
    pw, ph = width - left - right, height - top - bottom
    values = [v for s in series for m in s.marks for v in (m.y, m.lo, m.hi) if math.isfinite(v)]
    if ref_y is not None:
        values.append(ref_y)
    lo = min(values) if values else 0.0
    hi = max(values) if values else 1.0
    lo = y_min if y_min is not None else lo - 0.05 * (hi - lo or 1)
    hi = y_max if y_max is not None else hi + 0.08 * (hi - lo or 1)
    if hi <= lo:
        hi = lo + 1
    n = max(1, len(x_labels))

    def px(i: float) -> float:
        return left + (i + 0.5) * pw / n

    def py(v: float) -> float:
        return top + ph - (v - lo) / (hi - lo) * ph

    out = [f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {width} {height}" width="100%" '
           f'role="img" aria-label="{escape(y_title)} against {escape(x_title)}" '
           'xmlns="http://www.w3.org/2000/svg">']
    out.append(f'<rect class="plot" x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
               'stroke="#999"/>')
    ticks = [t for t in (_ticks(lo, hi) if not integer_y else range(math.ceil(lo), math.floor(hi) + 1))
             if lo <= t <= hi]
    for t in ticks:
        y = py(t)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_num(t)}</text>')
    for i, lab in enumerate(x_labels):
        out.append(f'<text x="{px(i):.1f}" y="{top + ph + 16}" text-anchor="middle" class="tick">'
                   f'{escape(lab)}</text>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 8}" text-anchor="middle" class="axis">'
               f'{escape(x_title)}</text>')
    out.append(f'<text transform="translate(14,{top + ph / 2:.1f}) rotate(-90)" text-anchor="middle" '
               f'class="axis">{escape(y_title)}</text>')
    if ref_y is not None and lo <= ref_y <= hi:
        y = py(ref_y)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#444" '
                   f'stroke-dasharray="4 3"/><text x="{left + pw + 4}" y="{y + 4:.1f}" class="tick">'
                   f'{escape(ref_label)}</text>')
    for si, s in enumerate(series):
        color, dash = PALETTE[si % len(PALETTE)], DASHES[si % len(DASHES)]
        pts = [m for m in s.marks if math.isfinite(m.y)]
        out.append(f'<g class="series" data-name="{escape(s.name)}">')
        if s.line and len(pts) > 1:
            xy = [(px(m.x), py(m.y)) for m in pts]
            if s.step:  # hold each value to the midpoint between slots, then change
                held = [xy[0]]
                for (x0, y0), (x1, y1) in zip(xy, xy[1:]):
                    held += [((x0 + x1) / 2, y0), ((x0 + x1) / 2, y1), (x1, y1)]
                xy = held
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
            out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"'
                       + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        for m in pts:
            x, y = px(m.x), py(m.y)
            if math.isfinite(m.lo) and math.isfinite(m.hi):
                y1, y2 = py(min(max(m.lo, lo), hi)), py(min(max(m.hi, lo), hi))
                out.append(f'<g class="whisker"><title>{escape(m.title)}</title>'
                           f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y1:.1f}" y2="{y2:.1f}" stroke="{color}"/>'
                           f'<line x1="{x - 4:.1f}" x2="{x + 4:.1f}" y1="{y1:.1f}" y2="{y1:.1f}" '
                           f'stroke="{color}"/><line x1="{x - 4:.1f}" x2="{x + 4:.1f}" y1="{y2:.1f}" '
                           f'y2="{y2:.1f}" stroke="{color}"/></g>')
            fill = color if m.filled else "#fff"
            out.append(f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{fill}" '
                       f'stroke="{color}" stroke-width="2"><title>{escape(m.title)}</title></circle>')
            if m.label:
                out.append(f'<text x="{x + 7:.1f}" y="{y - 6:.1f}" class="val">{escape(m.label)}</text>')
        if len(series) > 1:  # the legend: a line sample in the series' dash and its name
            ly = top + 8 + 18 * si
            sample = (f'<line x1="{left + pw + 8}" x2="{left + pw + 34}" y1="{ly}" y2="{ly}" '
                      f'stroke="{color}" stroke-width="2"' + (f' stroke-dasharray="{dash}"' if dash else "")
                      + "/>") if s.line else ""
            out.append(f'<g class="legend">{sample}<circle cx="{left + pw + 21}" cy="{ly}" r="3.5" '
                       f'fill="{color}"/><text x="{left + pw + 40}" y="{ly + 4}" class="name">'
                       f'{escape(s.name)}</text></g>')
        out.append("</g>")
    out.append("</svg>")
    return Markup("".join(out))


def step_line(ranges: Sequence[tuple[int, int, int]], x_values: Sequence[int]) -> list[Mark]:
    """The served K at each x slot's batch size (the table's ranges), as marks of a step line."""
    marks = []
    for i, b in enumerate(x_values):
        k = next((r[2] for r in ranges if r[0] <= b <= r[1]), None)
        if k is not None:
            marks.append(Mark(i, float(k), f"the table serves K={k} at batch size {b}"))
    return marks
