"""Numbers as the text reports print them: the one home of the formatting helpers the 80-column
renderers (``cli``) and the Markdown and text reports (``report``) share."""

from __future__ import annotations

import math
from typing import Any


def fmt_number(x: Any, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals; ``-`` for None or NaN, ``str(x)`` for anything not a number."""
    if x is None:
        return "-"
    try:
        if math.isnan(float(x)):
            return "-"
    except (TypeError, ValueError):
        return str(x)
    return f"{float(x):.{digits}f}"


def fmt_finite(x: Any, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals; ``?`` for None and anything not finite."""
    return f"{float(x):.{digits}f}" if x is not None and math.isfinite(float(x)) else "?"


def fmt_interval(r: Any, name: str = "speedup") -> str:
    """``r[name]`` with its interval ``r[name_low]``, ``r[name_high]``: ``1.23 [1.10, 1.35]``."""
    return f"{fmt_finite(r[name])} [{fmt_finite(r[f'{name}_low'])}, {fmt_finite(r[f'{name}_high'])}]"
