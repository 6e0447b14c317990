"""``dsdprof analyze`` checks a run once (:func:`dsdprof.io.checked.check_analyze_run`): each of
the Run's checks runs one time, on a sweep and on a context sweep (before, mixed provenance was
checked twice: once looking for a context axis, again in ``analyze_path``)."""

from __future__ import annotations

from collections import Counter

import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.io.runs import Run
from tests.export.test_walk import _sim_run

CHECKS = ("check_mixed", "pooled", "refuse_validate")


@pytest.mark.parametrize("sweep", [{}, {"context_lens": [1024, 4096]}], ids=["sweep", "ctx"])
def test_analyze_runs_each_check_once(tmp_path, monkeypatch, sweep):
    run = _sim_run(tmp_path / "run", **sweep)
    calls: Counter[str] = Counter()
    for name in CHECKS:
        original = getattr(Run, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Run, name, counted)
    r = CliRunner().invoke(app, ["analyze", str(run), "--json"])
    assert r.exit_code == 0, r.output
    if sweep:  # a context sweep: mixed provenance, then its slices (no pooled-run check, as before)
        assert calls == Counter(check_mixed=1)
    else:
        assert calls == Counter(check_mixed=1, refuse_validate=1, pooled=1)
