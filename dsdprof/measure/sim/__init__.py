"""The analytic engine (``[engine] name = "sim"``): predicts AL and ITL per (batch size, K) cell
from the architecture, the hardware and the acceptance rates, and writes the same rows as a real
sweep, marked ``engine = "sim"``.

Modules: :mod:`~dsdprof.measure.sim.catalog` (models), :mod:`~dsdprof.measure.sim.hfconfig`
(HF config.json), :mod:`~dsdprof.measure.sim.quant` (``quantization_config`` → bytes per weight),
:mod:`~dsdprof.measure.sim.hardware` (accelerators, profile TOML), :mod:`~dsdprof.measure.sim.model`
(the step model, one function per term), :mod:`~dsdprof.measure.sim.acceptance`,
:mod:`~dsdprof.measure.sim.config` (the ``[sim]`` section), :mod:`~dsdprof.measure.sim.engine`
(``SimEngine``), :mod:`~dsdprof.measure.sim.calibrate` (+ :mod:`~dsdprof.measure.sim.fit`, the
bounded fit) and :mod:`~dsdprof.measure.sim.probe`; ``tests/support/fidelity.py`` (used by
``benchmarks/sim_fidelity.py`` and its test) fits the priors to published GPU step times
(``benchmarks/fidelity_points.toml``) and measures the whole-source-held-out and leave-one-out
errors. Importing this package imports nothing heavy (no pandas, scipy, torch, typer).
"""
