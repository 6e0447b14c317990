"""Defaults shared by the library, the CLI and the spec: the one place each is written.

Stdlib only (the serving path reads :data:`DEFAULT_TOLERANCE`).
"""

DEFAULT_TOLERANCE = 0.02  # relative goodput a smaller K may give up and still be chosen
DEFAULT_CONFIDENCE = 0.9  # two-sided level of every interval and decision
DEFAULT_REPLICATES = 2000  # bootstrap replicates
DEFAULT_SEED = 0  # bootstrap seed (results are reproducible)
