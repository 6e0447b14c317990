"""Names shared by the parent process and vLLM's engine core, importable without vLLM."""

from collections.abc import Iterable
from enum import IntEnum

# Keys of the request's SamplingParams.extra_args the profiling scheduler understands -- only in an
# engine a dsdprof run started, and only on requests carrying that run's secret (RUN_ARG).
RUN_ARG = "dsdprof_run"  # the run's secret (see RUN_TOKEN_ENV)
K_EXTRA_ARG = "dsdprof_num_spec_tokens"  # run the cell at this K
K_SEQ_ARG = "dsdprof_k_sequence"  # paired design: K of the wave's i-th step is seq[i % len(seq)]
MAX_K_SEQ = 4096  # longest K sequence honoured
# Arms of a K sequence that are not a constant K (validate's steps design: the variants that choose K
# themselves, switched step by step inside one engine): the schedule the engine started with (the
# table's K per batch size), and the engine's own current choice (the adaptive plugin's K; without
# the plugin, vLLM's lookup -- the same schedule).
# On the wire (a request's K sequence) an arm is its negative int; in the parent process it is an
# :class:`Arm`, so a group of a validate cell says which of its values are arms, not negative Ks.
ARM_TABLE = -1
ARM_ENGINE = -2
MIN_ARM = ARM_ENGINE  # the lowest value a K sequence may hold


class Arm(IntEnum):
    """A value of a K group that is not a K: validate's table (``TABLE``) or engine (``ENGINE``) arm."""

    TABLE = ARM_TABLE
    ENGINE = ARM_ENGINE


def is_arm(value: int) -> bool:
    """Whether a K-group value is an arm (an :class:`Arm`, or its wire value) rather than a K."""
    return isinstance(value, Arm) or value < 0


def holds_arms(group: Iterable[int]) -> bool:
    """Whether a K group holds arms (validate's steps design) rather than Ks only."""
    return any(is_arm(k) for k in group)
GATE_ARG = "dsdprof_wave_size"  # hold scheduling until this many requests of the wave are queued
TRACE_ARG = "dsdprof_trace"  # name of the cell's trace file, inside the engine's trace directory
WAVE_ARG = "dsdprof_wave"  # wave index within the cell (< 0: warm-up, not summarised)
# vLLM's ``scheduler_cls``: a factory following vLLM's resolved ``async_scheduling``.
SCHEDULER_QUALNAME = "dsdprof.engines.vllm_scheduler.make_scheduler"
# Set by dsdprof's engine worker (never by a client) in the process that starts vLLM, inherited by
# its engine core: the run's secret, which a request's extra_args must carry for the scheduler to
# act on its dsdprof keys, and the one directory the scheduler may write step traces into. An
# engine without them (any engine dsdprof did not start) ignores every dsdprof key.
RUN_TOKEN_ENV = "DSDPROF_RUN_TOKEN"
TRACE_DIR_ENV = "DSDPROF_TRACE_DIR"
MIN_TOKEN_CHARS = 16  # a shorter token is treated as none
