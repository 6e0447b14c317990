"""Shared fixtures. Measurement frames here are synthetic inputs to pure functions, not engines."""

from __future__ import annotations

import os

import pandas as pd
import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def make_rows(itl, al, mode=None, status=None, repeat=0):
    """Rows from {(bs, k): itl_s} and {(bs, k): acceptance_length}."""
    rows = []
    for (b, k), t in itl.items():
        r = {"batch_size": b, "num_spec_tokens": k, "acceptance_length": al[(b, k)], "itl_s": t}
        if mode is not None:
            r["mode"] = mode
        if status is not None:
            r["status"] = status
        r["repeat"] = repeat
        rows.append(r)
    return pd.DataFrame(rows)


@pytest.fixture
def dense_like_frame():
    """AL grows with K with diminishing returns; step cost grows with B*(K+1)."""
    alpha = 0.8
    itl, al = {}, {}
    for b in (1, 2, 4, 8, 16, 32, 64):
        for k in range(0, 6):
            al[(b, k)] = sum(alpha**i for i in range(k + 1))
            tokens = b * (k + 1)
            itl[(b, k)] = 0.010 + 0.0005 * k + 0.00008 * tokens  # fixed + draft + verify
    return make_rows(itl, al)


RUN_TOKEN = "t" * 32  # a dsdprof run's secret, for tests that drive the profiling scheduler


@pytest.fixture
def run_env(tmp_path, monkeypatch):
    """An engine a dsdprof run started: its secret (``RUN_TOKEN``) and trace directory (``tmp_path``)
    in the environment the scheduler reads."""
    monkeypatch.setenv("DSDPROF_RUN_TOKEN", RUN_TOKEN)
    monkeypatch.setenv("DSDPROF_TRACE_DIR", str(tmp_path))
    return tmp_path
