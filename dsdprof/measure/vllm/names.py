"""Names shared by the parent process and vLLM's engine core, importable without vLLM."""

K_EXTRA_ARG = "dsdprof_num_spec_tokens"
# vLLM's ``scheduler_cls``: a factory following vLLM's resolved ``async_scheduling``.
SCHEDULER_QUALNAME = "dsdprof.engines.vllm_scheduler.make_scheduler"
