"""K by batch size x context: the rows of a context sweep (``[sweep] context_lens``) split by
their ``context_len`` column and each slice analysed by :func:`dsdprof.decide.analysis.analyze`
-- the same rule, the same intervals, no second decision rule.

A context whose every cell failed (a predicted or real OOM: the KV cache cannot hold the batch)
has no slice; a context whose large batch sizes failed has a slice over the batch sizes that ran.
:func:`analyze_contexts_path` also records each context's coverage (the grid against the cells
with a number), so ``export`` refuses failed slices as it refuses a plain partial run.
Rows without the column (every sweep without a context axis) are not a context analysis:
:func:`context_slices` returns None and callers use ``analyze`` as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.config.run import Checked, Coverage, Run, context_slices
from dsdprof.decide.analysis import Analysis, analyze
from dsdprof.errors import InputError
from dsdprof.formats.jsontypes import ProvenanceView
from dsdprof.formats.measurements import CONTEXT_COLUMN, STATUS_OK

CONTEXT = CONTEXT_COLUMN.name


@dataclass(frozen=True)
class ContextAnalysis:
    """One :class:`Analysis` per measured context (ascending); ``skipped``: context -> why not;
    ``coverage``: context -> its :class:`dsdprof.io.runs.Coverage` (every context of the rows,
    skipped ones included; filled by :func:`analyze_contexts_path`)."""

    slices: dict[int, Analysis]
    skipped: dict[int, str] = field(default_factory=dict)
    coverage: dict[int, Coverage] = field(default_factory=dict)
    # derived when made (plain data: a reader such as export calls nothing back here)
    gaps: dict[int, Coverage] = field(init=False)  # contexts whose grid has cells with no ok row
    contexts: list[int] = field(init=False)  # the measured contexts, ascending
    default_context: int = field(init=False)  # answers when no context is known: the shortest measured

    def __post_init__(self) -> None:
        object.__setattr__(self, "gaps", {c: cov for c, cov in sorted(self.coverage.items())
                                          if not cov.complete})
        object.__setattr__(self, "contexts", sorted(self.slices))
        object.__setattr__(self, "default_context", self.contexts[0] if self.contexts else 0)

    def optimal(self) -> pd.DataFrame:
        """Every slice's ``optimal`` with a ``context_len`` column first."""
        frames = [a.optimal.assign(**{CONTEXT: c}) for c, a in sorted(self.slices.items())]
        df = pd.concat(frames, ignore_index=True)
        return df[[CONTEXT] + [c for c in df.columns if c != CONTEXT]]


def analyze_contexts(df: pd.DataFrame, tolerance: float = DEFAULT_TOLERANCE,
                     provenance: ProvenanceView | None = None, **options: Any) -> ContextAnalysis:
    """:func:`analyze` on every context slice of ``df`` (InputError when it has no context axis)."""
    return _analyze_slices(context_slices(df), tolerance, provenance, **options)


def _analyze_slices(slices: dict[int, pd.DataFrame] | None, tolerance: float,
                    provenance: ProvenanceView | None, valid: dict[int, Checked] | None = None,
                    **options: Any) -> ContextAnalysis:
    if slices is None:
        raise InputError(CONTEXT, None, "the rows have no context axis (a sweep without [sweep] "
                         "context_lens)")
    out: dict[int, Analysis] = {}
    skipped: dict[int, str] = {}
    for c, part in slices.items():
        ok = (part["status"].astype(str) == STATUS_OK if "status" in part.columns
              else pd.Series(True, part.index))
        if not ok.any():
            err = str(part["error"].iloc[0]) if "error" in part.columns else ""
            skipped[c] = f"no cell ran at this context ({err[:160]})"
            continue
        out[c] = analyze(part, tolerance=tolerance, provenance=provenance, valid=(valid or {}).get(c),
                         **options)
    if not out:
        raise InputError(CONTEXT, sorted(slices), "no context has a cell that ran")
    return ContextAnalysis(out, skipped)


def analyze_contexts_path(run: Run, tolerance: float = DEFAULT_TOLERANCE,
                          **options: Any) -> ContextAnalysis | None:
    """:func:`analyze` on every context slice of a run (opened by
    :func:`dsdprof.io.runs.open_run`), each slice with its coverage; None when the run has no
    context axis."""
    if run.contexts is None:
        return None
    result = _analyze_slices(run.contexts, tolerance, run.provenance, run.context_valid or None, **options)
    cov = run.context_coverage
    slices = {c: dataclasses.replace(a, coverage=cov[c]) for c, a in result.slices.items()}
    return ContextAnalysis(slices, result.skipped, cov)
