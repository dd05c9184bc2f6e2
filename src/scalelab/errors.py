"""The one exception type for user mistakes: the CLI prints it as one line and exits 2."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: names the field and says what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = one_line(field)
        self.message = one_line(message)
        super().__init__(f"{self.field}: {self.message}")


def one_line(text: str) -> str:
    """`text` with its control characters (a newline from a hostile name, say) escaped, so the
    error stays one line and a terminal shows what was given."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
