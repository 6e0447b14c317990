"""Names shared by the parent process and vLLM's engine core, importable without vLLM."""

K_EXTRA_ARG = "dsdprof_num_spec_tokens"
# vLLM's ``scheduler_cls``: a factory following vLLM's resolved ``async_scheduling``.
SCHEDULER_QUALNAME = "dsdprof.engines.vllm_scheduler.make_scheduler"
# Set by dsdprof's engine worker (never by a client) in the process that starts vLLM, inherited by
# its engine core: the run's secret, which a request's extra_args must carry for the scheduler to
# act on its dsdprof keys, and the one directory the scheduler may write step traces into. An
# engine without them (any engine dsdprof did not start) ignores every dsdprof key.
RUN_TOKEN_ENV = "DSDPROF_RUN_TOKEN"
TRACE_DIR_ENV = "DSDPROF_TRACE_DIR"
MIN_TOKEN_CHARS = 16  # a shorter token is treated as none
