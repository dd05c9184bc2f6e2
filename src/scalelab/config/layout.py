"""Layout: how one training job is parallelised, and the rules a valid layout obeys.

The rules are written once, over numpy arrays of layouts (`LayoutTable`), so that search can count
invalid layouts by reason without a Python loop; `validate` applies them to a single `Layout` and
turns each failing rule into one clear message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scalelab.config.hardware import ClusterSpec
from scalelab.config.model import ModelSpec
from scalelab.errors import InputError

Sharding = Literal["ddp", "zero1", "zero2", "fsdp", "hsdp"]
Schedule = Literal["gpipe", "1f1b", "interleaved", "zbv"]
Recompute = Literal["none", "selective", "full"]
TrainPrecision = Literal["bf16", "fp8"]
Attention = Literal["flash", "math", "flash1", "fused"]

SHARDINGS: tuple[str, ...] = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zbv")
RECOMPUTES: tuple[str, ...] = ("none", "selective", "full")
PRECISIONS: tuple[str, ...] = ("bf16", "fp8")
ATTENTIONS: tuple[str, ...] = ("flash", "math", "flash1", "fused")


class Layout(BaseModel):
    """One parallelism layout of a job on `gpus` GPUs (degrees multiply to `gpus`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int = Field(gt=0)
    global_batch: int = Field(gt=0, description="sequences per optimizer step")
    seq_len: int = Field(gt=0)
    sharding: Sharding = "fsdp"
    hsdp_shard_size: int | None = Field(default=None, gt=0)
    reshard_after_forward: bool = True
    tp: int = Field(default=1, gt=0)
    sequence_parallel: bool = True
    pp: int = Field(default=1, gt=0)
    pp_schedule: Schedule = "1f1b"
    virtual_stages: int = Field(default=1, gt=0)
    cp: int = Field(default=1, gt=0)
    micro_batch: int = Field(default=1, gt=0)
    recompute: Recompute = "none"
    precision: TrainPrecision = "bf16"
    attention: Attention = "flash"

    @property
    def dp(self) -> int:
        return max(1, self.gpus // (self.tp * self.pp * self.cp))

    def dp_shard_on(self, gpus_per_node: int) -> int:
        """Ranks a parameter is sharded over (1 for DDP, dp for FSDP/ZeRO, the group for HSDP)."""
        return int(LayoutTable.from_layouts([self]).dp_shard_for(gpus_per_node)[0])

    @property
    def n_microbatches(self) -> int:
        return max(1, self.global_batch // (self.dp * self.micro_batch))


@dataclass
class LayoutTable:
    """Many layouts as parallel numpy arrays (categoricals as integer codes)."""

    gpus: np.ndarray
    global_batch: np.ndarray
    seq_len: np.ndarray
    sharding: np.ndarray
    hsdp_shard_size: np.ndarray
    reshard_after_forward: np.ndarray
    tp: np.ndarray
    sequence_parallel: np.ndarray
    pp: np.ndarray
    pp_schedule: np.ndarray
    virtual_stages: np.ndarray
    cp: np.ndarray
    micro_batch: np.ndarray
    recompute: np.ndarray
    precision: np.ndarray
    attention: np.ndarray

    def __len__(self) -> int:
        return int(self.gpus.shape[0])

    @classmethod
    def from_layouts(cls, layouts: Sequence[Layout]) -> LayoutTable:
        codes = {
            "sharding": SHARDINGS,
            "pp_schedule": SCHEDULES,
            "recompute": RECOMPUTES,
            "precision": PRECISIONS,
            "attention": ATTENTIONS,
        }
        columns: dict[str, np.ndarray] = {}
        for f in fields(cls):
            values = [getattr(layout, f.name) for layout in layouts]
            if f.name in codes:
                columns[f.name] = np.array([codes[f.name].index(v) for v in values], dtype=np.int64)
            elif f.name == "hsdp_shard_size":
                columns[f.name] = np.array([0 if v is None else v for v in values], dtype=np.int64)
            elif f.name in ("reshard_after_forward", "sequence_parallel"):
                columns[f.name] = np.array(values, dtype=bool)
            else:
                columns[f.name] = np.array(values, dtype=np.int64)
        return cls(**columns)

    def take(self, mask_or_index: np.ndarray) -> LayoutTable:
        return LayoutTable(**{f.name: getattr(self, f.name)[mask_or_index] for f in fields(self)})

    def layout(self, i: int) -> Layout:
        return Layout(
            gpus=int(self.gpus[i]),
            global_batch=int(self.global_batch[i]),
            seq_len=int(self.seq_len[i]),
            sharding=SHARDINGS[int(self.sharding[i])],  # type: ignore[arg-type]
            hsdp_shard_size=int(self.hsdp_shard_size[i]) or None,
            reshard_after_forward=bool(self.reshard_after_forward[i]),
            tp=int(self.tp[i]),
            sequence_parallel=bool(self.sequence_parallel[i]),
            pp=int(self.pp[i]),
            pp_schedule=SCHEDULES[int(self.pp_schedule[i])],  # type: ignore[arg-type]
            virtual_stages=int(self.virtual_stages[i]),
            cp=int(self.cp[i]),
            micro_batch=int(self.micro_batch[i]),
            recompute=RECOMPUTES[int(self.recompute[i])],  # type: ignore[arg-type]
            precision=PRECISIONS[int(self.precision[i])],  # type: ignore[arg-type]
            attention=ATTENTIONS[int(self.attention[i])],  # type: ignore[arg-type]
        )

    # Derived degrees -------------------------------------------------------------------------
    @property
    def model_parallel(self) -> np.ndarray:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> np.ndarray:
        return np.maximum(1, self.gpus // self.model_parallel)

    def default_hsdp_group(self, gpus_per_node: int) -> np.ndarray:
        """HSDP shards inside a node by default: the node's GPUs not taken by TP and CP."""
        per_node = np.maximum(1, gpus_per_node // (self.tp * self.cp))
        return np.minimum(self.dp, per_node)

    def dp_shard_for(self, gpus_per_node: int) -> np.ndarray:
        code = self.sharding
        group = np.where(
            self.hsdp_shard_size > 0, self.hsdp_shard_size, self.default_hsdp_group(gpus_per_node)
        )
        return np.where(code == 0, 1, np.where(code == 4, np.minimum(group, self.dp), self.dp))

    @property
    def n_microbatches(self) -> np.ndarray:
        return np.maximum(1, self.global_batch // (self.dp * self.micro_batch))


@dataclass(frozen=True)
class Rule:
    """One validity rule: `bad` marks violating layouts; `message` explains one of them."""

    reason: str
    field: str
    bad: Callable[[LayoutTable, ModelSpec, ClusterSpec], np.ndarray]
    message: Callable[[Layout, ModelSpec, ClusterSpec], str]


def _gpn(cluster: ClusterSpec) -> int:
    return cluster.gpus_per_node


RULES: tuple[Rule, ...] = (
    Rule(
        "degrees do not multiply to the GPU count",
        "gpus",
        lambda t, m, c: t.tp * t.pp * t.cp * t.dp != t.gpus,
        lambda L, m, c: (
            f"tp ({L.tp}) x pp ({L.pp}) x cp ({L.cp}) must divide the GPU count ({L.gpus})"
        ),
    ),
    Rule(
        "tp does not divide attention heads",
        "tp",
        lambda t, m, c: (m.n_heads % t.tp != 0) | (m.n_kv_heads % t.tp != 0),
        lambda L, m, c: (
            f"tp ({L.tp}) must divide n_heads ({m.n_heads}) and n_kv_heads ({m.n_kv_heads})"
        ),
    ),
    Rule(
        "tp does not divide the FFN or vocabulary",
        "tp",
        lambda t, m, c: m.d_ff % t.tp != 0,
        lambda L, m, c: f"tp ({L.tp}) must divide d_ff ({m.d_ff})",
    ),
    Rule(
        "more pipeline stages than layers",
        "pp",
        lambda t, m, c: t.pp * t.virtual_stages > m.n_layers,
        lambda L, m, c: (
            f"pp ({L.pp}) x virtual_stages ({L.virtual_stages}) must be at most n_layers ({m.n_layers})"
        ),
    ),
    Rule(
        "virtual stages without an interleaved schedule",
        "virtual_stages",
        lambda t, m, c: (t.virtual_stages > 1) & ~np.isin(t.pp_schedule, (2, 3)),
        lambda L, m, c: (
            f"virtual_stages ({L.virtual_stages}) > 1 needs pp_schedule interleaved or zbv, "
            f"not {L.pp_schedule}"
        ),
    ),
    Rule(
        "zbv needs exactly 2 virtual stages",
        "virtual_stages",
        lambda t, m, c: (t.pp_schedule == 3) & (t.virtual_stages != 2) & (t.pp > 1),
        lambda L, m, c: f"pp_schedule zbv needs virtual_stages 2, not {L.virtual_stages}",
    ),
    Rule(
        "cp does not divide the sequence",
        "cp",
        lambda t, m, c: (t.cp > 1) & (t.seq_len % (2 * t.cp) != 0),
        lambda L, m, c: f"cp ({L.cp}) needs seq_len ({L.seq_len}) divisible by 2 x cp",
    ),
    Rule(
        "global batch does not divide into data-parallel ranks x micro-batch",
        "global_batch",
        lambda t, m, c: t.global_batch % (t.dp * t.micro_batch) != 0,
        lambda L, m, c: (
            f"global_batch ({L.global_batch}) must be a multiple of data-parallel ranks ({L.dp}) "
            f"x micro_batch ({L.micro_batch})"
        ),
    ),
    Rule(
        "too few micro-batches for the pipeline",
        "micro_batch",
        lambda t, m, c: (t.pp > 1) & (t.n_microbatches < t.pp),
        lambda L, m, c: (
            f"pp ({L.pp}) needs at least pp micro-batches per step; global_batch / (dp x micro_batch) "
            f"= {L.n_microbatches}"
        ),
    ),
    Rule(
        "interleaved schedule needs micro-batches divisible by pp",
        "micro_batch",
        lambda t, m, c: (
            (t.pp > 1) & np.isin(t.pp_schedule, (2, 3)) & (t.n_microbatches % t.pp != 0)
        ),
        lambda L, m, c: (
            f"pp_schedule {L.pp_schedule} needs the micro-batch count ({L.n_microbatches}) "
            f"divisible by pp ({L.pp})"
        ),
    ),
    Rule(
        "hsdp group does not divide the data-parallel ranks",
        "hsdp_shard_size",
        lambda t, m, c: (t.sharding == 4) & (t.dp % t.dp_shard_for(_gpn(c)) != 0),
        lambda L, m, c: (
            f"hsdp_shard_size ({L.hsdp_shard_size}) must divide the data-parallel ranks ({L.dp})"
        ),
    ),
    Rule(
        "hsdp group size set for another sharding",
        "hsdp_shard_size",
        lambda t, m, c: (t.sharding != 4) & (t.hsdp_shard_size > 0),
        lambda L, m, c: f"hsdp_shard_size is only for sharding hsdp, not {L.sharding}",
    ),
    Rule(
        "sequence longer than the model's context",
        "seq_len",
        lambda t, m, c: t.seq_len > 1_048_576,
        lambda L, m, c: f"seq_len ({L.seq_len}) must be at most 1048576",
    ),
    Rule(
        "more GPUs than the cluster has",
        "gpus",
        lambda t, m, c: t.gpus > c.max_gpus,
        lambda L, m, c: f"gpus ({L.gpus}) exceeds the cluster's max_gpus ({c.max_gpus})",
    ),
)


def violation_masks(
    table: LayoutTable, model: ModelSpec, cluster: ClusterSpec
) -> dict[str, np.ndarray]:
    """For each rule, a boolean array marking the layouts that break it."""
    return {rule.reason: np.asarray(rule.bad(table, model, cluster), dtype=bool) for rule in RULES}


def validate(layout: Layout, model: ModelSpec, cluster: ClusterSpec) -> list[InputError]:
    """All violations of one layout, each as an `InputError` naming its field."""
    table = LayoutTable.from_layouts([layout])
    errors = []
    for rule in RULES:
        if bool(np.asarray(rule.bad(table, model, cluster))[0]):
            errors.append(InputError(rule.field, rule.message(layout, model, cluster)))
    return errors


def check(layout: Layout, model: ModelSpec, cluster: ClusterSpec) -> None:
    """Raise the first violation of `layout`, if any."""
    errors = validate(layout, model, cluster)
    if errors:
        raise errors[0]
