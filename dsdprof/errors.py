"""User-facing errors. The CLI turns these into one line on stderr and exit code 2."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: names the field and the offending value."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")
