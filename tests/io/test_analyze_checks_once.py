"""``dsdprof analyze`` opens and checks a run once (:func:`dsdprof.io.runs.open_run`, its checks
in :func:`dsdprof.config.run.checked_run`): each check runs one time, in one order, on a sweep and
on a context sweep (before, mixed provenance was checked twice: once looking for a context axis,
again in ``analyze_path``)."""

from __future__ import annotations

from collections import Counter

import pytest
from typer.testing import CliRunner

from dsdprof.cli.app import app
from dsdprof.config import run as checks
from dsdprof.io import runs
from tests.export.test_walk import _sim_run

CHECKS = {"check_mixed": checks, "_check_pooled": checks, "_refuse_validate": checks, "read_files": runs}


@pytest.mark.parametrize("sweep", [{}, {"context_lens": [1024, 4096]}], ids=["sweep", "ctx"])
def test_analyze_runs_each_check_once(tmp_path, monkeypatch, sweep):
    run = _sim_run(tmp_path / "run", **sweep)
    calls: Counter[str] = Counter()
    for name, module in CHECKS.items():
        original = getattr(module, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    r = CliRunner().invoke(app, ["analyze", str(run), "--json"])
    assert r.exit_code == 0, r.output
    if sweep:  # a context sweep: a validate run, mixed provenance, then its slices (no pooled runs)
        assert calls == Counter(read_files=1, _refuse_validate=1, check_mixed=1)
    else:
        assert calls == Counter(read_files=1, _refuse_validate=1, check_mixed=1, _check_pooled=1)
