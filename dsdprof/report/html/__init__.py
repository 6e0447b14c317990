"""``dsdprof report RUN -o report.html``: one self-contained HTML page per run (docs/report.md).

:func:`build_report` reads the run through the public calls ``analyze``, ``export`` and the other
report commands make; :func:`render_html` lays it out (Jinja2, inline CSS, static SVG)."""

from dsdprof.report.html.build import build_report
from dsdprof.report.html.render import render_html

__all__ = ["build_report", "render_html"]
