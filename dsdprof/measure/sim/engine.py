"""``SimEngine``: the analytic engine behind the :class:`~dsdprof.measure.engine.Engine` protocol.

It "measures" a cell by evaluating the step model (:mod:`dsdprof.measure.sim.model`) and the acceptance
model (:mod:`dsdprof.measure.sim.acceptance`), so a sweep with ``[engine] name = "sim"`` writes the same
Parquet rows as a real one, marked ``engine = "sim"`` (predictions, not measurements).

Per cell at batch B and K drafts (vanilla cells: K = 0, no drafter; DSD cells: drafter present)::

    itl_s  = T(B, K)                      (every percentile = the same value: no noise is modelled)
    AL     = 1 + Σ_{i≤K} p_i              tpot_s = itl_s / AL
    steps  = ceil(output_len / AL) per request; num_drafts = waves · B · steps when K > 0
    wall_s = waves · steps · itl_s        tokens/s per user = AL / itl_s, total = B · AL / itl_s
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dsdprof import __version__
from dsdprof.config.defaults import DEFAULT_TOLERANCE
from dsdprof.formats.measurements import MODE_DSD, MODE_VANILLA
from dsdprof.formats.versions import SIM_MODEL_VERSION
from dsdprof.measure.engine import Cell, CellMeasurement, Provenance
from dsdprof.measure.sim.acceptance import acceptance_length
from dsdprof.measure.sim.band import sim_band
from dsdprof.measure.sim.config import SimSetup, resolve
from dsdprof.measure.sim.context import decode_context
from dsdprof.measure.sim.model import (
    MEMORY_UTILIZATION,
    NO_DRAFT,
    arch_features,
    memory_bytes,
    step_time,
)


class SimEngine:
    """Predicts cells of a sweep spec whose ``engine.name`` is ``"sim"``."""

    name = "sim"
    speculation_mode = MODE_DSD

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.setup: SimSetup = resolve(spec)
        s = self.setup
        self._hw = s.arrays()
        self._target = arch_features(s.target, s.dtype, s.tensor_parallel_size, s.kv_cache_dtype)
        self._draft = (arch_features(s.draft, s.dtype, s.tensor_parallel_size, s.kv_cache_dtype)
                       if s.draft else NO_DRAFT)
        self._cache: dict[tuple[int, int, bool, int], float] = {}
        bs, ks = spec.sweep.batch_sizes, spec.sweep.num_spec_tokens
        for c in spec.sweep.context_lens or [0]:  # 0: no context axis (the setup's context)
            ctx = self.decode_context(c)
            b_col, k_row = np.asarray(bs, dtype=float)[:, None], np.asarray(ks, dtype=float)[None, :]
            grid = self._itl(b_col, k_row, True, ctx)
            van = self._itl(np.asarray(bs, dtype=float), 0.0, False, ctx)
            for i, b in enumerate(bs):
                self._cache[(b, 0, False, c)] = float(van[i])
                self._cache.update({(b, k, True, c): float(grid[i, j]) for j, k in enumerate(ks)})

    def decode_context(self, context_len: int) -> int:
        """KV positions a cell decodes at: its prompt plus half the output (a context sweep's
        cell), else the setup's context (``[sim] context_len`` or input_len + output_len / 2)."""
        if context_len:
            return decode_context(context_len, self.spec.sweep.output_len)
        return self.setup.context_len

    def _itl(self, batch: Any, k: Any, speculative: bool, context: Any) -> np.ndarray:
        draft = self._draft if speculative else NO_DRAFT
        spec = 1.0 if speculative else 0.0
        return step_time(self._hw, self._target, draft, batch, k, context,
                         self.setup.routing_correlation, spec, self.setup.method).total_s

    def provenance(self) -> Provenance:
        s = self.setup
        e = s.hardware.efficiency
        return Provenance(
            engine="sim", engine_version=f"dsdprof {__version__} {SIM_MODEL_VERSION}",
            model=s.target.served_name, draft_model=s.draft.served_name if s.draft else "", method=s.method,
            hardware=(f"{s.hardware.name} x{s.tensor_parallel_size}" if s.tensor_parallel_size > 1
                      else s.hardware.name),
            dtype=s.dtype, dataset=self.spec.workload.dataset, seed=self.spec.workload.seed,
            dsdprof_version=__version__,
            extra={"prediction": "true", "context_len": str(s.context_len),
                   "routing_correlation": str(s.routing_correlation), "acceptance": s.acceptance_source,
                   "quantization": s.target.quantization or "none", "kv_cache_dtype": s.kv_cache_dtype,
                   "efficiency": (f"bw={e.bandwidth} compute={e.compute} step={e.step_overhead_s} "
                                  f"draft_step={e.draft_step_overhead_s} dsd={e.dsd_overhead_s} "
                                  f"layer={e.layer_overhead_s} moe_layer={e.moe_layer_overhead_s} "
                                  f"expert={e.expert_overhead_s} mla_layer={e.mla_layer_overhead_s} "
                                  f"token={e.token_overhead_s} allreduce={s.hardware.allreduce_latency_s}"),
                   **self._band_provenance()},
        )

    def _band_provenance(self) -> dict[str, str]:
        """The band and K* ranges at the default tolerance (:mod:`dsdprof.measure.sim.band`), which
        ``export`` carries into the table; ``analyze`` recomputes them at its own tolerance."""
        sweep = self.spec.sweep
        if sweep.context_lens:
            return {"prediction_band": "not computed for a context sweep"}
        return sim_band(self.setup, list(sweep.batch_sizes), sorted(sweep.num_spec_tokens),
                        DEFAULT_TOLERANCE).provenance()

    def predict_itl(self, batch_size: int, k: int, speculative: bool, context_len: int = 0) -> float:
        """Seconds per engine step (see :func:`dsdprof.measure.sim.model.step_time`) at a cell's
        ``context_len`` (0: no context axis)."""
        hit = self._cache.get((batch_size, k, speculative, context_len))
        return hit if hit is not None else float(
            self._itl(batch_size, k, speculative, self.decode_context(context_len)))

    def measure(self, cell: Cell) -> CellMeasurement:
        s = self.setup
        b, k = cell.batch_size, cell.num_spec_tokens
        speculative = cell.mode != MODE_VANILLA
        if cell.mode == MODE_VANILLA and k != 0:
            raise ValueError(f"vanilla cell with K={k}")
        if k > len(s.acceptance):
            raise ValueError(f"K={k} beyond the acceptance vector ({len(s.acceptance)} positions)")
        ctx = self.decode_context(cell.context_len)
        if s.check_memory:
            need = float(memory_bytes(self._target, self._draft if speculative else NO_DRAFT, b, k, ctx))
            have = s.hardware.memory_gb * 1e9 * MEMORY_UTILIZATION
            if need > have:
                raise MemoryError(f"predicted out of memory: needs {need / 1e9:.1f} GB per device, "
                                  f"{have / 1e9:.1f} GB usable on {s.hardware.name} "
                                  f"(tensor_parallel_size={s.tensor_parallel_size}"
                                  + (f", context {cell.context_len}" if cell.context_len else "") + ")")
        itl = self.predict_itl(b, k, speculative, cell.context_len)
        al = acceptance_length(s.acceptance, k)
        waves, out_len = self.spec.sweep.waves, self.spec.sweep.output_len
        steps = math.ceil(out_len / al)
        requests = waves * b
        drafts = requests * steps if k > 0 else 0
        tpot = itl / al
        return CellMeasurement(
            acceptance_length=al, acceptance_per_pos=tuple(float(x) for x in np.asarray(s.acceptance[:k])),
            num_drafts=drafts, num_draft_tokens=drafts * k,
            num_accepted_tokens=int(round(drafts * (al - 1.0))),
            itl_s=itl, itl_p50_s=itl, itl_p90_s=itl, itl_p99_s=itl,
            tpot_s=tpot, tpot_p50_s=tpot, tpot_p90_s=tpot, tpot_p99_s=tpot,
            tokens_per_s_per_user=al / itl, tokens_per_s_total=b * al / itl,
            num_requests=requests, num_output_tokens=requests * out_len, wall_s=waves * steps * itl,
        )

    def close(self) -> None:
        """Nothing to release."""
