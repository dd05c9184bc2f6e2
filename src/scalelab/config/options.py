"""The categorical layout options, each named once.

Each option is a `str` enum: a `Layout` holds the value's name (`"fsdp"`, what users type and
records store), and the array form (`LayoutTable`) holds its integer `code` (its position here).
Code never compares a code with a number: it asks `Sharding.HSDP.code` or, better, one of
`LayoutTable`'s named predicates (`is_hsdp`, `shards_params`, `is_interleaved`, ...). Adding a
value is adding a member here (at the end, so stored codes keep their meaning) plus its cost and
harness code.
"""

from __future__ import annotations

from enum import Enum
from functools import cache
from typing import TypeVar

_O = TypeVar("_O", bound="LayoutOption")


class LayoutOption(str, Enum):
    """A categorical layout option: a name (the value) and an integer code (its position)."""

    def __str__(self) -> str:
        return str(self.value)

    @property
    def code(self) -> int:
        return _codes(type(self))[self]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The allowed names, in code order."""
        return tuple(m.value for m in cls)

    @classmethod
    def from_code(cls: type[_O], code: int) -> _O:
        return list(cls)[int(code)]

    @classmethod
    def parse(cls: type[_O], field: str, value: str) -> _O:
        """The member named `value`, or an `InputError` naming the field and what is allowed."""
        from scalelab.errors import InputError

        try:
            return cls(value)
        except ValueError:
            raise InputError(field, f"'{value}' is not one of {', '.join(cls.names())}") from None


@cache
def _codes(cls: type[LayoutOption]) -> dict[LayoutOption, int]:
    return {m: i for i, m in enumerate(cls)}


class Sharding(LayoutOption):
    """How the data-parallel ranks hold parameters, gradients and optimizer state."""

    DDP = "ddp"  # everything replicated; gradients all-reduced
    ZERO1 = "zero1"  # optimizer state sharded (Megatron distributed optimizer, DeepSpeed stage 1)
    ZERO2 = "zero2"  # optimizer state and gradients sharded
    FSDP = "fsdp"  # parameters, gradients and optimizer state sharded over all data-parallel ranks
    HSDP = "hsdp"  # FSDP inside a shard group, replicated across groups


class PipelineSchedule(LayoutOption):
    """The pipeline-parallel schedule (torch.distributed.pipelining's names)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"  # interleaved 1F1B, `virtual_stages` chunks per rank
    ZBV = "zbv"  # zero-bubble V schedule, exactly 2 chunks per rank


class Recompute(LayoutOption):
    """Activation recomputation (checkpointing) in backward.

    `selective` recomputes the attention core only (scaled-dot-product attention; Korthikanti et
    al. 2022, "selective activation recomputation"); `full` recomputes every layer's forward.
    """

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Precision(LayoutOption):
    """The precision of the linear layers' matmuls (master weights stay fp32)."""

    BF16 = "bf16"
    FP8 = "fp8"


class AttentionKernel(LayoutOption):
    """The attention kernel."""

    FLASH = "flash"  # FlashAttention-2 (causal, scores never materialised)
    MATH = "math"  # unfused PyTorch attention: the score matrix goes through HBM
    FLASH1 = "flash1"  # FlashAttention v1: half FlashAttention-2's rate
    FUSED = "fused"  # Megatron's fused scale-mask-softmax: scores materialised, fewer passes

    @property
    def materialises_scores(self) -> bool:
        return self in (AttentionKernel.MATH, AttentionKernel.FUSED)


# The categorical fields of `Layout`, by field name.
OPTIONS: dict[str, type[LayoutOption]] = {
    "sharding": Sharding,
    "pp_schedule": PipelineSchedule,
    "recompute": Recompute,
    "precision": Precision,
    "attention": AttentionKernel,
}
