"""Engines behind the :class:`~dsdprof.measure.engine.Engine` protocol (imported lazily)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsdprof.measure.engine import Engine

if TYPE_CHECKING:
    from dsdprof.config.spec import SweepSpec


def make_engine(spec: SweepSpec, out_dir=None, stream_engine_log: bool = False) -> Engine:
    """Build the engine a spec names. Heavy imports (vllm, torch) happen here, not at import.

    ``out_dir``: the run directory; the vLLM engine keeps its logs and step traces under it.
    ``stream_engine_log``: vLLM engines print to this process's stdout/stderr instead of their logs."""
    if spec.engine.name == "vllm":
        from dsdprof.measure.vllm.engine import VllmEngine

        return VllmEngine(spec, out_dir=out_dir, stream_engine_log=stream_engine_log)
    if spec.engine.name == "sim":
        from dsdprof.measure.sim.engine import SimEngine

        return SimEngine(spec)
    raise ValueError(f"engine.name={spec.engine.name!r}")
