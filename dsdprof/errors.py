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
