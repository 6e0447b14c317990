"""Engines behind the :class:`~dsdprof.engines.base.Engine` protocol (imported lazily)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsdprof.engines.base import Cell, CellMeasurement, Engine, Provenance, plan_cells

if TYPE_CHECKING:
    from dsdprof.spec import SweepSpec

__all__ = ["Cell", "CellMeasurement", "Engine", "Provenance", "make_engine", "plan_cells"]


def make_engine(spec: "SweepSpec") -> Engine:
    """Build the engine a spec names. Heavy imports (vllm, torch) happen here, not at import."""
    if spec.engine.name == "vllm":
        from dsdprof.engines.vllm_engine import VllmEngine

        return VllmEngine(spec)
    if spec.engine.name == "sim":
        from dsdprof.sim.engine import SimEngine

        return SimEngine(spec)
    raise ValueError(f"engine.name={spec.engine.name!r}")
