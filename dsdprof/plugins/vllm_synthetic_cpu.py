"""vLLM ``worker_extension_cls`` of a CPU engine with synthetic acceptance: vLLM imports this
module in its worker process right after the platform registered its kernel fallbacks, and the
import registers :mod:`dsdprof.plugins.vllm_synthetic`'s synthetic-mode kernels over them."""

from dsdprof.plugins.vllm_synthetic import install

INSTALLED = install()


class SyntheticAcceptanceCPU:
    """Adds no method to the worker: the import above is its whole purpose."""
