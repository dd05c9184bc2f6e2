"""The one exception type for user mistakes: the CLI prints it as one line and exits 2."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: names the field and says what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")
