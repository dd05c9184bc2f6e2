"""What reaches a terminal and the one rule for options that need another, in a module light
enough for `scalelab trace` (rich and the standard library only)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from scalelab.errors import InputError


def terminal_safe(text: str) -> str:
    """`text` with its control characters (ESC, BEL, backspace, a bidirectional override...)
    shown escaped (`\\x1b`), newlines and tabs kept: a name read from a file (a model YAML, a
    record, a trace's kernel) never moves the cursor, retitles the terminal or hides text."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t " else repr(c)[1:-1] for c in text)


class SafeConsole(Console):
    """A rich console that prints the text of whatever it renders through `terminal_safe`: the
    one place where names from files reach a terminal. Rich's own styling is added after
    rendering (from each segment's style), so it is not touched."""

    def render_str(self, text: str, **kwargs: Any) -> Any:
        return super().render_str(terminal_safe(text), **kwargs)  # before layout: widths hold

    def render(self, renderable: Any, options: Any = None) -> Any:
        for segment in super().render(renderable, options):
            if segment.control or segment.text.isprintable():
                yield segment
            else:
                yield segment._replace(text=terminal_safe(segment.text))


def safe_print(*values: object, stderr: bool = False) -> None:
    """Plain `print` (no markup) of values that may hold names from files, made terminal-safe."""
    print(terminal_safe(" ".join(str(v) for v in values)), file=sys.stderr if stderr else None)


def only_with(flag: str, given: bool, needs: str, satisfied: bool) -> None:
    """The one rule for an option that applies only with another: `flag` given (set to other
    than its default) while `needs` does not hold would do nothing, silently; it is refused.
    `flag` and `needs` are written as the user types them (`--cluster`, `--predict`)."""
    if given and not satisfied:
        raise InputError(
            flag.lstrip("-"), f"applies only with {needs}: give {needs} too, or leave {flag} out"
        )
