"""dsdprof: hardware-aware dynamic speculative decoding profiler.

Measures acceptance length (AL) and inter-token latency (ITL) of a target+draft pair over a
batch size x K grid, picks the goodput-optimal K per batch size and exports it as a table that
vLLM (``num_speculative_tokens_per_batch_size``) or custom serving code (``dsdprof.serve.runtime``)
can serve.
"""

__version__ = "0.1.0"
