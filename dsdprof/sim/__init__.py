"""The analytic engine (``[engine] name = "sim"``): predicts AL and ITL per (batch size, K) cell
from the architecture, the hardware and the acceptance rates, and writes the same rows as a real
sweep, marked ``engine = "sim"``.

Modules: :mod:`~dsdprof.sim.catalog` (models), :mod:`~dsdprof.sim.hfconfig` (HF config.json),
:mod:`~dsdprof.sim.quant` (``quantization_config`` → bytes per weight), :mod:`~dsdprof.sim.hardware`
(accelerators, profile TOML), :mod:`~dsdprof.sim.model` (the step model, one function per term),
:mod:`~dsdprof.sim.acceptance`, :mod:`~dsdprof.sim.config` (the ``[sim]`` section),
:mod:`~dsdprof.sim.engine` (``SimEngine``), :mod:`~dsdprof.sim.grid` (whole-grid vectorised
evaluation), :mod:`~dsdprof.sim.calibrate` (+ :mod:`~dsdprof.sim.fit`, the bounded fit) and
:mod:`~dsdprof.sim.probe`; :mod:`~dsdprof.sim.fidelity` fits the priors to published GPU step times
(``benchmarks/fidelity_points.toml``) and measures the leave-one-out error. Importing this package imports nothing heavy (no pandas, scipy, torch,
typer).
"""
