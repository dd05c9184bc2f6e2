"""One help style for every verb, applied once to the whole app (not per verb file).

- A flag (`--json`, `--cross-validate/--no-cross-validate`, `--help`) shows no type label: typer
  0.16 and later print `<bool>` beside every flag, which says nothing a flag does not.
- Help is written as paragraphs: a single line break inside a docstring or an option's help is
  where the source was wrapped, not where the terminal should break, so it becomes a space. A blank
  line still starts a paragraph, and a paragraph of list items (lines starting with `-` or `*`),
  indented lines or one marked with click's `\\b` keeps its breaks.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import typer


def one_paragraph_per_block(text: str) -> str:
    """`text` with the line breaks inside each paragraph replaced by spaces (see the module)."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    out = []
    for paragraph in paragraphs:
        lines = paragraph.split("\n")
        keeps_breaks = paragraph.startswith("\b") or any(
            line[:1].isspace() or line.lstrip().startswith(("- ", "* ")) for line in lines[1:]
        )
        out.append(paragraph if keeps_breaks else " ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def _parameter_infos(callback: Any) -> list[Any]:
    """typer's OptionInfo/ArgumentInfo objects of a command's parameters (defaults and Annotated)."""
    infos: list[Any] = []
    for parameter in inspect.signature(callback).parameters.values():
        candidates = [parameter.default]
        annotation = parameter.annotation
        if typing.get_origin(annotation) is typing.Annotated:
            candidates.extend(typing.get_args(annotation)[1:])
        infos.extend(c for c in candidates if isinstance(c, typer.models.ParameterInfo))
    return infos


def _style_commands(app: typer.Typer) -> None:
    for info in app.registered_commands:
        if info.callback is None:
            continue
        doc = info.help if info.help is not None else inspect.getdoc(info.callback)
        if doc:
            info.help = one_paragraph_per_block(doc)
        for parameter_info in _parameter_infos(info.callback):
            if parameter_info.help:
                parameter_info.help = one_paragraph_per_block(parameter_info.help)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            _style_commands(group.typer_instance)


def _flags_without_type_labels() -> None:
    """A flag's row in `--help` shows no `<bool>`: typer's rich help asks each option for its
    type label through `TyperOption.display_type_rich` (typer >= 0.16; older ones print none)."""
    from typer import core

    original = getattr(core.TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "scalelab_style", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if getattr(self, "is_flag", False) else original(self, ctx)

    display_type_rich.scalelab_style = True  # type: ignore[attr-defined]
    core.TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def apply(app: typer.Typer) -> None:
    """Give every registered verb of `app` the one help style (idempotent)."""
    _style_commands(app)
    _flags_without_type_labels()
