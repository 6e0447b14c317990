"""The report as one self-contained HTML file: Jinja2 lays out the page (autoescaped: provenance,
errors and model names are data, never markup), the stylesheet is inlined, the charts are static
SVG. No script and no URL outside the page: it opens offline, prints, and reads without colour."""

from __future__ import annotations

from importlib.resources import files

from dsdprof.report.html.model import Report

TEMPLATE_PACKAGE = "dsdprof.report.html"


def render_html(report: Report) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader(TEMPLATE_PACKAGE, "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    css = files(TEMPLATE_PACKAGE).joinpath("templates", "report.css").read_text(encoding="utf-8")
    return env.get_template("report.html.j2").render(report=report, css=css)
