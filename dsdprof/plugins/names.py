"""Names shared by the parent process and vLLM's engine core, importable without vLLM."""

K_EXTRA_ARG = "dsdprof_num_spec_tokens"  # run the cell at this K
GATE_ARG = "dsdprof_wave_size"  # hold scheduling until this many requests of the wave are queued
TRACE_ARG = "dsdprof_trace"  # path of the trace file (JSON lines) for this request's cell
WAVE_ARG = "dsdprof_wave"  # wave index within the cell (< 0: warm-up, not summarised)
# vLLM's ``scheduler_cls``: a factory following vLLM's resolved ``async_scheduling``.
SCHEDULER_QUALNAME = "dsdprof.engines.vllm_scheduler.make_scheduler"
