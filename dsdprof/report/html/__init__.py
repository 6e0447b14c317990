"""``dsdprof report RUN -o report.html``: one self-contained HTML page per run (docs/report.md).

:func:`~dsdprof.report.html.build.build_report` reads the run through the public calls
``analyze``, ``export`` and the other report commands make;
:func:`~dsdprof.report.html.render.render_html` lays it out (Jinja2, inline CSS, static SVG)."""
