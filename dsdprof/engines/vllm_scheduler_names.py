"""Names shared by the parent process and vLLM's engine core, importable without vLLM."""

K_EXTRA_ARG = "dsdprof_num_spec_tokens"
SYNC_QUALNAME = "dsdprof.engines.vllm_scheduler.KFollowingScheduler"
ASYNC_QUALNAME = "dsdprof.engines.vllm_scheduler.KFollowingAsyncScheduler"
