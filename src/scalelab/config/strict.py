"""The one rule for numbers read from a user's file: a number is a number.

YAML and JSON spell booleans `true`/`false`, and pydantic's lax mode reads `true` as the integer 1
or the float 1.0: `n_layers: true` became a one-layer model. `StrictNumbers` refuses a boolean
for any field whose type admits no boolean (inside a mapping or a list too), and every float must
be finite (`allow_inf_nan=False`: `.inf` and `.nan` are not a bandwidth or a latency). Each spec
model of `config/` (GPU, cluster, its parameters, stack, model, layout) derives from it.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

STRICT_CONFIG = ConfigDict(allow_inf_nan=False)


def admits_bool(annotation: Any) -> bool:
    """Whether a field's type accepts a boolean anywhere in it (`bool`, `int | bool`, `Any`)."""
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return admits_bool(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(admits_bool(a) for a in typing.get_args(annotation))
    return False


def _holds_number(annotation: Any) -> bool:
    """Whether a field's type is, or holds, an int or a float."""
    if annotation in (int, float):
        return True
    return any(_holds_number(a) for a in typing.get_args(annotation) if a is not Ellipsis)


def _has_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, dict):
        return any(_has_bool(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_bool(v) for v in value)
    return False


class StrictNumbers(BaseModel):
    """A pydantic model whose numeric fields refuse booleans and non-finite floats."""

    model_config = STRICT_CONFIG

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None or not _has_bool(value):
            return value
        annotation = cls.model_fields[info.field_name].annotation
        if _holds_number(annotation) and not admits_bool(annotation):
            raise ValueError(f"must be a number, not a boolean ({value!r:.40})")
        return value
