"""Public path: ``from dsdprof.runtime import KSelector`` (stdlib only, like :mod:`dsdprof.serve`).

The code lives in :mod:`dsdprof.serve.runtime` (the static selector) and
:mod:`dsdprof.serve.adaptive` (:class:`AdaptiveKSelector`); this module re-exports them so that
serving code written against ``dsdprof.runtime`` keeps working.
"""

from dsdprof.serve.adaptive import AdaptiveKSelector
from dsdprof.serve.runtime import (
                                   DENSE_CAP,
                                   DENSE_MIN,
                                   KSelector,
                                   TableError,
                                   VanillaGap,
                                   build_lookup,
                                   lookup_list,
)

__all__ = ["AdaptiveKSelector", "DENSE_CAP", "DENSE_MIN", "KSelector", "TableError", "VanillaGap",
           "build_lookup",
           "lookup_list"]
