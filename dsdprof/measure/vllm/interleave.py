"""Validate's side-by-side designs.

**Paired design**: the variants of one batch size and repeat (vanilla, fixed K, the table
served by vLLM's schedule, the adaptive plugin), each on its own engine, run their measured waves
**interleaved one by one**: wave ``j`` of every variant runs before wave ``j + 1`` of any, in the
order of row ``j`` of a Williams design (every variant first, and right after every other, equally
often). Variants measured minutes apart drift 10-35 % on a busy machine; wave ``j`` of every variant
runs within seconds of the others, so ``sample_block`` (= the wave) pairs them in the regret
bootstrap (:func:`dsdprof.report.compare.regret_intervals`) and the drift cancels.

Every engine keeps its cell open between its waves (the worker's ``span``, as in the sweep's
paired design); an engine that fails ends its own variant's row (its error), the others go on.

**Steps design** (:func:`unit_row`): every variant but vanilla inside the same waves of **one**
engine, switched step by step like the sweep's paired design, each variant an *arm* of the K
sequence (:mod:`dsdprof.plugins.vllm_profiling`): fixed K, the table's schedule (``ARM_TABLE``) and
the engine's own choice (``ARM_ENGINE``: the adaptive plugin). Step-scale noise then hits every
variant alike; vanilla's waves interleave with them block by block on its own engine
(:meth:`~dsdprof.measure.vllm.engine.VllmEngine.run_unit`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dsdprof.formats.measurements import MODE_ADAPTIVE, MODE_DSD, MODE_FIXED, MODE_VANILLA
from dsdprof.measure.engine import Cell, balanced_order
from dsdprof.measure.vllm.pool import EngineFailure
from dsdprof.plugins.names import ARM_ENGINE, ARM_TABLE

STEPS_HOLD = 4  # steps design: steps per arm before the next (2 settled of 4 timed, as PAIRED_HOLD)


def unit_row(cell: Cell) -> tuple:
    """The key of ``cell``'s row in what a unit's run returns: ``(mode, K)``; in the steps design
    (a group holding arms) ``("arm", a)``: ``ARM_ENGINE`` for adaptive, ``ARM_TABLE`` for the
    table served on vLLM's schedule, K for fixed K (vanilla stays ``(vanilla, 0)``)."""
    if not cell.group or min(cell.group) >= 0 or cell.mode == MODE_VANILLA:
        return (cell.mode, cell.num_spec_tokens)
    return ("arm", {MODE_ADAPTIVE: ARM_ENGINE, MODE_DSD: ARM_TABLE}.get(cell.mode, cell.num_spec_tokens))


def run_interleaved(engine: Any, cell: Cell) -> dict[tuple[str, int], Any]:
    """Measure every variant of ``cell.interleave`` (``(mode, K)`` pairs) wave by wave on
    ``engine`` (a :class:`~dsdprof.measure.vllm.engine.VllmEngine`); returns
    ``(mode, K) -> measurement | exception``. Each variant's request is the one it gets on its own
    (:meth:`VllmEngine.request_for`), run one measured wave at a time, its rows tagged with
    ``sample_block`` = the wave."""
    variants = [replace(cell, mode=mode, num_spec_tokens=k) for mode, k in cell.interleave]
    if engine.one_fixed_engine and sum(mode == MODE_FIXED for mode, _ in cell.interleave) > 1:
        raise ValueError("interleaved variants need every fixed-K engine alive (one_fixed_engine is set)")
    waves = engine.spec.sweep.waves
    reqs = []
    for v in variants:
        key, req = engine.request_for(v)
        reqs.append((key, replace(req, wave_block=tuple(range(waves)))))
    out: dict[tuple[str, int], Any] = {}
    b = engine.spec.sweep.batch_sizes
    turn = cell.repeat * len(b) + (b.index(cell.batch_size) if cell.batch_size in b else 0)
    for j in range(waves):
        for i in balanced_order(len(variants), turn * waves + j):
            ident = (variants[i].mode, variants[i].num_spec_tokens)
            if isinstance(out.get(ident), Exception):
                continue
            key, req = reqs[i]
            try:
                with engine.pool.exclusive(key) as worker:  # the idle engines paused meanwhile, if enabled
                    out[ident] = worker.run(replace(req, span=(j, j + 1)), engine.cell_timeout_s)
            except EngineFailure as err:
                out[ident] = engine.failure(key, err)
    return out
