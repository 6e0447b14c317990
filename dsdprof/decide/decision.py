"""The analysis' answer at one batch size, typed: :class:`BatchDecision` -- K*, how sure the data
are of it (decided, the runner-up with the margin's interval, the Ks still admissible), the
speedup over no speculation with its interval, and whether vanilla beat every K.

:func:`dsdprof.decide.analysis.analyze` returns these records (``Analysis.decisions``); the
80-column renderer and the K-table builder read them. :func:`decisions_frame` is their DataFrame
view (``Analysis.optimal``, ``Analysis.to_frame()``), one column per field with ``speedup_vs_k{K}``
spread out: what ``analyze --json`` and ``--csv`` print.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import pandas as pd

NAN = math.nan


@dataclass(frozen=True)
class BatchDecision:
    """K* at one batch size and how sure the data are of it.

    ``goodput`` (AL / ITL, tokens/s per request), ``acceptance_length`` and ``itl_s`` are K*'s;
    ``speedup_vs_baseline`` is K*'s goodput over no speculation's (vanilla, else K=0), with its
    interval ``speedup_low``/``speedup_high`` (``speedup_interval``: paired | independent | ""
    unknown) and ``speedup_vs_k``: over each candidate K (NaN where that K has no cell).
    ``decided``: the data separate K* at the decision level; ``runner_up`` (None: none) and
    ``margin`` (K*'s goodput over the runner-up's) with its interval ``ci_low``/``ci_high``;
    ``best_k``: the highest point goodput; ``k_rule``: the rule's K before the non-increasing
    constraint; ``admissible``: the K* the data still allow; ``contenders``: the Ks more data could
    still make the answer; ``regret_bound``: an upper bound of K*'s shortfall against the best K.
    ``vanilla_gain`` (with ``vanilla_gain_low``/``_high``): no speculation's goodput over the best
    K's - 1; ``vanilla_faster``: beyond its interval (:mod:`dsdprof.decide.vanilla`)."""

    batch_size: int
    k: int
    goodput: float
    acceptance_length: float
    itl_s: float
    baseline_goodput: float
    speedup_vs_baseline: float
    speedup_vs_k: dict[int, float] = field(default_factory=dict)
    decided: bool = False
    runner_up: int | None = None
    margin: float = NAN
    ci_low: float = NAN
    ci_high: float = NAN
    best_k: int = 0
    k_rule: int = 0
    admissible: list[int] = field(default_factory=list)
    interval_known: bool = False
    regret_bound: float = NAN
    contenders: list[int] = field(default_factory=list)
    speedup_low: float = NAN
    speedup_high: float = NAN
    speedup_interval: str = ""
    vanilla_gain: float = NAN
    vanilla_gain_low: float = NAN
    vanilla_gain_high: float = NAN
    vanilla_faster: bool = False

    @property
    def interval(self) -> tuple[float, float]:
        """The interval of K*'s margin over the runner-up (NaN, NaN when unknown)."""
        return self.ci_low, self.ci_high

    def record(self) -> dict[str, object]:
        """The flat columns of :func:`decisions_frame`: ``speedup_vs_k{K}`` spread out after
        ``speedup_vs_baseline``."""
        out: dict[str, object] = {}
        for f in fields(self):
            if f.name == "speedup_vs_k":
                out.update({f"speedup_vs_k{k}": v for k, v in self.speedup_vs_k.items()})
            else:
                out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> BatchDecision:
        """From one flat record (a row of :func:`decisions_frame`, as ``to_dict("records")`` gives it)."""
        runner_up = rec.get("runner_up")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in rec.items() if k in known}
        values["runner_up"] = None if runner_up is None or pd.isna(runner_up) else int(runner_up)
        values["speedup_vs_k"] = {int(c.removeprefix("speedup_vs_k")): float(v) for c, v in rec.items()
                                  if c.startswith("speedup_vs_k")}
        return cls(**values)


def decisions_frame(decisions: Iterable[BatchDecision]) -> pd.DataFrame:
    """The records as a DataFrame, one row per batch size (``runner_up`` a nullable integer)."""
    frame = pd.DataFrame.from_records([d.record() for d in decisions])
    if "runner_up" in frame.columns:
        frame["runner_up"] = frame["runner_up"].astype("Int64")
    return frame
