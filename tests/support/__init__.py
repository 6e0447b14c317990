"""Harnesses the tests and benchmarks share; not part of the dsdprof package (production never reaches
them). ``simulate``: a closed-loop, stdlib engine with known truth for the adaptive selector;
``sim_grid``: the analytic step model evaluated over a whole (hardware, model, BS, K) grid at once.
Benchmarks import them as ``tests.support.*`` with the repository root on ``sys.path``."""
