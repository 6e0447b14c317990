"""User-facing errors. The CLI turns these into one line on stderr and exit code 2."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: names the field and the offending value."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        if hasattr(value, "item") and callable(value.item):  # numpy scalar -> plain Python
            try:
                value = value.item()
            except (ValueError, TypeError):
                pass
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")


def did_you_mean(name: str, choices, prefix: str = "did you mean ") -> str:
    """``did you mean Llama-3.1-8B? `` for the closest of ``choices`` (case and punctuation
    folded), or "" when none is close."""
    import difflib
    import re

    def fold(s: str) -> str:
        return re.sub(r"[^a-z0-9]", "", str(s).lower())

    choices = [str(c) for c in choices]
    folded = {fold(c): c for c in choices}
    key = fold(name)
    longer = [c for f, c in folded.items() if key and f.startswith(key)]  # "H100" -> "H100 SXM"
    shorter = [c for f, c in folded.items() if key and key.startswith(f)]  # "DeepSeek-V3.1" -> "DeepSeek-V3"
    close = difflib.get_close_matches(key, list(folded), n=1, cutoff=0.85)
    close_name = (longer[0] if len(longer) == 1 else shorter[0] if len(shorter) == 1
                  else folded[close[0]] if close else None)
    return f"{prefix}{close_name}? " if close_name else ""
