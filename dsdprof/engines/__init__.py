"""Public plugin paths only (serving configs name them): the code lives in :mod:`dsdprof.measure`
and :mod:`dsdprof.plugins`. ``dsdprof.engines.vllm_scheduler.make_scheduler`` is the profiling
scheduler a sweep starts vLLM with; ``dsdprof.engines.vllm_adaptive.make_scheduler`` the adaptive
serving plugin."""
