"""Layout: how one training job is parallelised, and the rules a valid layout obeys.

The rules are written once, over numpy arrays of layouts (`LayoutTable`), so that search can count
invalid layouts by reason without a Python loop; `rule_violations` applies them to a single `Layout` and
turns each failing rule into one clear message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np
from pydantic import ConfigDict, Field, ValidationError

from scalelab.config.hardware import ClusterSpec
from scalelab.config.model import ModelSpec
from scalelab.config.options import (
    OPTIONS,
    AttentionKernel,
    PipelineSchedule,
    Precision,
    Recompute,
    Sharding,
)
from scalelab.config.strict import StrictNumbers
from scalelab.errors import InputError

# Older names of the option types (runs/schema.py and others import them from here).
Schedule = PipelineSchedule
Attention = AttentionKernel
TrainPrecision = Precision

# The allowed names of each categorical option, in code order (kept for callers that want strings).
SHARDINGS: tuple[str, ...] = Sharding.names()
SCHEDULES: tuple[str, ...] = PipelineSchedule.names()
RECOMPUTES: tuple[str, ...] = Recompute.names()
PRECISIONS: tuple[str, ...] = Precision.names()
ATTENTIONS: tuple[str, ...] = AttentionKernel.names()


# Stated limits (far above any real job) so that products of them stay exact in int64/float64:
# beyond them a prediction would overflow into 0 or negative throughput.
MAX_GPUS = 2**20
MAX_GLOBAL_BATCH = 2**24
MAX_SEQ_LEN = 2**24


class Layout(StrictNumbers):
    """One parallelism layout of a job on `gpus` GPUs (degrees multiply to `gpus`).

    The same object drives the predictor (`scalelab predict`, `search`) and the harness
    (`scalelab bench`); the CLI's layout flags are generated from these fields
    (`scalelab.cli.common.layout_options`). Data parallelism is not a field: it takes the GPUs
    that TP, PP and CP leave (`dp`). Categorical fields hold the option's name (a `str`); their
    enums live in `scalelab.config.options`.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_enum_values=True, validate_default=True
    )

    gpus: int = Field(
        gt=0,
        le=MAX_GPUS,
        description="GPUs in the job (all ranks); the degrees tp x pp x cp x dp multiply to it. "
        "Set by the user (--gpus) or by a sweep's GPU list.",
    )
    global_batch: int = Field(
        gt=0,
        le=MAX_GLOBAL_BATCH,
        description="sequences per optimizer step, over all data-parallel ranks; a multiple of "
        "dp x micro_batch. Default: `Layout.default_global_batch` (one micro-batch per "
        "data-parallel rank, pp of them when pipelined).",
    )
    seq_len: int = Field(
        gt=0,
        le=MAX_SEQ_LEN,
        description="tokens per sequence. Default: the model's context length (ModelSpec.seq_len).",
    )
    sharding: Sharding = Field(
        default=Sharding.FSDP,
        description="how data-parallel ranks hold parameters, gradients and optimizer state: "
        "ddp (replicated), zero1 (optimizer sharded), zero2 (+ gradients), fsdp (everything "
        "sharded over all data-parallel ranks, FSDP2), hsdp (FSDP inside a shard group, "
        "replicated across groups).",
    )
    hsdp_shard_size: int | None = Field(
        default=None,
        gt=0,
        le=MAX_GPUS,
        description="HSDP only: ranks in one shard group (a divisor of dp). Default (None): the "
        "GPUs of one node not taken by TP and CP.",
    )
    reshard_after_forward: bool = Field(
        default=True,
        description="FSDP/HSDP: free gathered parameters after a layer's forward and gather them "
        "again in backward (FSDP2's reshard_after_forward; ZeRO-3 behaviour). False keeps them "
        "(ZeRO-2-like memory, one AllGather per layer per step).",
    )
    tp: int = Field(
        default=1,
        gt=0,
        le=MAX_GPUS,
        description="tensor-parallel degree (Megatron-style column/row split of attention and "
        "MLP); divides n_heads, n_kv_heads and d_ff. TP ranks are innermost (inside NVLink).",
    )
    sequence_parallel: bool = Field(
        default=True,
        description="with tp > 1: shard norms and dropout along the sequence (Korthikanti et al. "
        "2022), replacing TP's AllReduce with AllGather + ReduceScatter. Ignored when tp = 1.",
    )
    pp: int = Field(
        default=1,
        gt=0,
        le=MAX_GPUS,
        description="pipeline-parallel degree (stages); pp x virtual_stages <= n_layers and at "
        "least pp micro-batches per step.",
    )
    pp_schedule: PipelineSchedule = Field(
        default=PipelineSchedule.ONE_F_ONE_B,
        description="pipeline schedule when pp > 1: gpipe, 1f1b, interleaved (interleaved 1F1B "
        "with virtual_stages chunks per rank), zbv (zero-bubble V, 2 chunks per rank).",
    )
    virtual_stages: int = Field(
        default=1,
        gt=0,
        le=MAX_GPUS,
        description="model chunks per pipeline rank (interleaved: any; zbv: 2; else 1).",
    )
    cp: int = Field(
        default=1,
        gt=0,
        le=MAX_GPUS,
        description="context-parallel degree: the sequence split over cp ranks, K/V exchanged in "
        "a ring (seq_len divisible by 2 x cp for load-balanced causal attention).",
    )
    ep: int = Field(
        default=1,
        gt=0,
        le=MAX_GPUS,
        description="expert-parallel degree (MoE models only): each MoE layer's routed experts "
        "are split over ep ranks and tokens reach them by AllToAll. EP takes no GPUs of its own: "
        "it borrows ranks of the data-parallel x context-parallel groups (and of TP when "
        "expert_tp is 1), as torchtitan and Megatron-Core do; so ep divides dp x cp x "
        "(tp / expert_tp) and n_experts.",
    )
    expert_tp: int = Field(
        default=1,
        gt=0,
        le=MAX_GPUS,
        description="tensor-parallel degree of the experts (MoE models only): 1 (experts whole "
        "on a rank, EP spans the TP ranks too; torchtitan's default) or tp (each expert split "
        "like the dense MLP, torchtitan's etp = tp).",
    )
    micro_batch: int = Field(
        default=1,
        gt=0,
        le=MAX_GLOBAL_BATCH,
        description="sequences per micro-batch per data-parallel rank; global_batch / (dp x "
        "micro_batch) micro-batches run per step (gradient accumulation or pipeline).",
    )
    recompute: Recompute = Field(
        default=Recompute.NONE,
        description="activation recomputation in backward: none; selective (recompute the "
        "attention core, scaled-dot-product attention, Korthikanti et al. 2022); full (recompute "
        "every layer's forward). Changes HFU, never MFU (config.model.hardware_flops_per_token).",
    )
    precision: Precision = Field(
        default=Precision.BF16,
        description="matmul precision of the linear layers: bf16, or fp8 (Transformer Engine "
        "style; attention and the LM head stay bf16). MFU uses the GPU's dense peak for it.",
    )
    attention: AttentionKernel = Field(
        default=AttentionKernel.FLASH,
        description="attention kernel: flash (FlashAttention-2), math (unfused PyTorch, scores "
        "in HBM), flash1 (FlashAttention v1), fused (Megatron fused softmax).",
    )

    @property
    def dp(self) -> int:
        return max(1, self.gpus // (self.tp * self.pp * self.cp))

    def dp_shard_on(self, gpus_per_node: int) -> int:
        """Ranks a parameter is sharded over (1 for DDP, dp for FSDP/ZeRO, the group for HSDP)."""
        return int(LayoutTable.from_layouts([self]).dp_shard_for(gpus_per_node)[0])

    @property
    def n_microbatches(self) -> int:
        return max(1, self.global_batch // (self.dp * self.micro_batch))

    @staticmethod
    def default_global_batch(
        gpus: int, *, tp: int = 1, pp: int = 1, cp: int = 1, micro_batch: int = 1
    ) -> int:
        """The default sequences per step: one micro-batch per data-parallel rank, and pp of them
        when pipelined (the fewest a pipeline can run). With no model parallelism this is
        `micro_batch` sequences per GPU, the study's weak-scaling batch."""
        dp = max(1, gpus // (tp * pp * cp))
        return dp * micro_batch * (pp if pp > 1 else 1)

    @classmethod
    def from_template(
        cls,
        template: Mapping[str, Any],
        *,
        gpus: int,
        seq_len: int,
        global_batch: int | None = None,
        field_prefix: str = "layout",
    ) -> Layout:
        """A layout from a template (any `Layout` fields but `gpus`, as a sweep file writes them):
        `seq_len` and `global_batch` fill what the template leaves out, the batch defaulting to
        `default_global_batch`. Unknown keys and bad values raise one `InputError` naming the key
        and what is allowed."""
        allowed = [f for f in cls.model_fields if f != "gpus"]
        unknown = sorted(set(template) - set(allowed))
        if unknown:
            raise InputError(
                f"{field_prefix}.{unknown[0]}",
                f"not a layout template field; the fields are {', '.join(allowed)} "
                "(gpus comes from the job)",
            )
        values: dict[str, Any] = {"seq_len": seq_len, **template, "gpus": gpus}
        for name, option in OPTIONS.items():
            if name in values and not isinstance(values[name], option):
                values[name] = option.parse(f"{field_prefix}.{name}", str(values[name]))
        if values.get("global_batch") is None:
            degrees = {k: values[k] for k in ("tp", "pp", "cp", "micro_batch") if k in values}
            usable = all(isinstance(v, int) and v > 0 for v in degrees.values())
            # With a bad degree the batch is a placeholder: validation below names the degree.
            default = cls.default_global_batch(gpus, **degrees) if usable else 1
            values["global_batch"] = default if global_batch is None else global_batch
        try:
            return cls(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "value"
            raise InputError(f"{field_prefix}.{where}", err["msg"]) from None

    # Names -------------------------------------------------------------------------------------
    def _sharding_name(self) -> str:
        if self.sharding == Sharding.HSDP and self.hsdp_shard_size:
            return f"hsdp{self.hsdp_shard_size}"
        return str(self.sharding)

    @property
    def parallelism_label(self) -> str:
        """The sharding and model-parallel degrees only: `fsdp tp2 pp4`, `hsdp8 cp2`."""
        parts = [self._sharding_name()]
        for name in ("tp", "pp", "cp", "ep"):
            if getattr(self, name) > 1:
                parts.append(f"{name}{getattr(self, name)}")
        return " ".join(parts)

    def label_parts(self) -> list[str]:
        """The words of `label`: degrees, then every option that differs from its default."""
        parts = [self._sharding_name()]
        if self.tp > 1:
            parts.append(f"tp{self.tp}" + ("sp" if self.sequence_parallel else ""))
        if self.pp > 1:
            parts.append(f"pp{self.pp}-{self.pp_schedule}")
            if self.virtual_stages > 1:
                parts.append(f"v{self.virtual_stages}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.expert_tp > 1:
            parts.append(f"etp{self.expert_tp}")
        if self.micro_batch > 1:
            parts.append(f"mb{self.micro_batch}")
        if self.recompute != Recompute.NONE:
            parts.append(f"ac-{self.recompute}")
        if not self.reshard_after_forward:
            parts.append("noreshard")
        if self.precision != Precision.BF16:
            parts.append(str(self.precision))
        if self.attention != AttentionKernel.FLASH:
            parts.append(f"attn-{self.attention}")
        return parts

    @property
    def label(self) -> str:
        """A short label: `fsdp tp2sp pp4-1f1b mb2 ac-full` (no GPU count; `slug` for file names)."""
        return " ".join(self.label_parts())

    @property
    def slug(self) -> str:
        """`label` for file and directory names: `fsdp-tp2sp-pp4-1f1b-mb2-ac-full`."""
        return "-".join(self.label_parts())

    @property
    def description(self) -> str:
        """A human name for tables and figures: `FSDP TP2+SP PP4 1f1b mb1 AC full`."""
        parts = [str(self.sharding).upper()]
        if self.sharding == Sharding.HSDP:
            parts[0] = f"HSDP(shard {self.hsdp_shard_size or 'node'})"
        if self.tp > 1:
            parts.append(f"TP{self.tp}{'+SP' if self.sequence_parallel else ''}")
        if self.pp > 1:
            chunks = f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""
            parts.append(f"PP{self.pp} {self.pp_schedule}{chunks}")
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}" + (f" ETP{self.expert_tp}" if self.expert_tp > 1 else ""))
        parts.append(f"mb{self.micro_batch}")
        if self.recompute != Recompute.NONE:
            parts.append(f"AC {self.recompute}")
        if self.sharding in (Sharding.FSDP, Sharding.HSDP) and not self.reshard_after_forward:
            parts.append("no-reshard")
        return " ".join(parts)


@dataclass
class LayoutTable:
    """Many layouts as parallel numpy arrays (categoricals as the integer `code` of their option).

    Code asks the named predicates below (`is_hsdp`, `shards_params`, `is_interleaved`, ...)
    instead of comparing codes with numbers. Predicates and derived degrees are computed once per
    table (cached): treat a table's arrays as read-only and build a new table (`take`) instead.
    """

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
    ep: np.ndarray
    expert_tp: np.ndarray
    micro_batch: np.ndarray
    recompute: np.ndarray
    precision: np.ndarray
    attention: np.ndarray

    def __len__(self) -> int:
        return int(self.gpus.shape[0])

    @classmethod
    def from_layouts(cls, layouts: Sequence[Layout]) -> LayoutTable:
        columns: dict[str, np.ndarray] = {}
        for f in fields(cls):
            values = [getattr(layout, f.name) for layout in layouts]
            if f.name in OPTIONS:
                option = OPTIONS[f.name]
                columns[f.name] = np.array([option(v).code for v in values], dtype=np.int64)
            elif f.name == "hsdp_shard_size":
                columns[f.name] = np.array([0 if v is None else v for v in values], dtype=np.int64)
            elif f.name in ("reshard_after_forward", "sequence_parallel"):
                columns[f.name] = np.array(values, dtype=bool)
            else:
                columns[f.name] = np.array(values, dtype=np.int64)
        return cls(**columns)

    @classmethod
    def column_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @staticmethod
    def default_code(name: str) -> int | bool:
        """The array form of a `Layout` field's default (an option's code, 0 for None)."""
        default = Layout.model_fields[name].default
        if name in OPTIONS:
            return OPTIONS[name](default).code
        if default is None:
            return 0
        return bool(default) if isinstance(default, bool) else int(default)

    def take(self, mask_or_index: np.ndarray) -> LayoutTable:
        return LayoutTable(**{f.name: getattr(self, f.name)[mask_or_index] for f in fields(self)})

    def layout(self, i: int) -> Layout:
        values: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)[i]
            if f.name in OPTIONS:
                values[f.name] = OPTIONS[f.name].from_code(int(v))
            elif f.name == "hsdp_shard_size":
                values[f.name] = int(v) or None
            elif v.dtype == bool:
                values[f.name] = bool(v)
            else:
                values[f.name] = int(v)
        return Layout(**values)

    # Named predicates on the categorical codes -------------------------------------------------
    @cached_property
    def is_ddp(self) -> np.ndarray:
        return self.sharding == Sharding.DDP.code

    @cached_property
    def is_zero(self) -> np.ndarray:
        """ZeRO-1 or ZeRO-2: optimizer state (and, for ZeRO-2, gradients) sharded."""
        return (self.sharding == Sharding.ZERO1.code) | (self.sharding == Sharding.ZERO2.code)

    @cached_property
    def is_zero2(self) -> np.ndarray:
        return self.sharding == Sharding.ZERO2.code

    @cached_property
    def is_hsdp(self) -> np.ndarray:
        return self.sharding == Sharding.HSDP.code

    @cached_property
    def shards_params(self) -> np.ndarray:
        """FSDP or HSDP: parameters sharded and gathered per layer."""
        return (self.sharding == Sharding.FSDP.code) | self.is_hsdp

    @cached_property
    def is_gpipe(self) -> np.ndarray:
        return self.pp_schedule == PipelineSchedule.GPIPE.code

    @cached_property
    def is_zbv(self) -> np.ndarray:
        return self.pp_schedule == PipelineSchedule.ZBV.code

    @cached_property
    def is_interleaved(self) -> np.ndarray:
        """Schedules with several model chunks per rank: interleaved 1F1B and ZB-V."""
        return (self.pp_schedule == PipelineSchedule.INTERLEAVED.code) | self.is_zbv

    @cached_property
    def recompute_full(self) -> np.ndarray:
        return self.recompute == Recompute.FULL.code

    @cached_property
    def recompute_selective(self) -> np.ndarray:
        return self.recompute == Recompute.SELECTIVE.code

    @cached_property
    def is_fp8(self) -> np.ndarray:
        return self.precision == Precision.FP8.code

    @cached_property
    def is_flash1(self) -> np.ndarray:
        return self.attention == AttentionKernel.FLASH1.code

    @cached_property
    def materialises_scores(self) -> np.ndarray:
        """Attention kernels that write the score matrix to HBM (math, fused)."""
        return (self.attention == AttentionKernel.MATH.code) | (
            self.attention == AttentionKernel.FUSED.code
        )

    @cached_property
    def is_fused_attention(self) -> np.ndarray:
        return self.attention == AttentionKernel.FUSED.code

    # Derived degrees -------------------------------------------------------------------------
    @cached_property
    def model_parallel(self) -> np.ndarray:
        return self.tp * self.pp * self.cp

    @cached_property
    def dp(self) -> np.ndarray:
        return np.maximum(1, self.gpus // self.model_parallel)

    def default_hsdp_group(self, gpus_per_node: int) -> np.ndarray:
        """HSDP shards inside a node by default: the node's GPUs not taken by TP and CP."""
        per_node = np.maximum(1, gpus_per_node // (self.tp * self.cp))
        return np.minimum(self.dp, per_node)

    def dp_shard_for(self, gpus_per_node: int) -> np.ndarray:
        """Ranks a parameter (or optimizer state) is sharded over: 1 for DDP, the HSDP group for
        HSDP, all data-parallel ranks otherwise."""
        group = np.where(
            self.hsdp_shard_size > 0, self.hsdp_shard_size, self.default_hsdp_group(gpus_per_node)
        )
        return np.where(self.is_ddp, 1, np.where(self.is_hsdp, np.minimum(group, self.dp), self.dp))

    @cached_property
    def n_microbatches(self) -> np.ndarray:
        return np.maximum(1, self.global_batch // (self.dp * self.micro_batch))

    @cached_property
    def expert_dp(self) -> np.ndarray:
        """Ranks holding the same experts (they reduce the experts' gradients together): the
        dp x cp x (tp / expert_tp) ranks an expert spans, divided by ep."""
        span = self.dp * self.cp * (self.tp // np.maximum(1, self.expert_tp))
        return np.maximum(1, span // self.ep)


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
        # Past the K/V heads, TP replicates them (Megatron-Core): tp must then be a multiple.
        lambda t, m, c: (
            (m.n_heads % t.tp != 0) | ((m.n_kv_heads % t.tp != 0) & (t.tp % m.n_kv_heads != 0))
        ),
        lambda L, m, c: (
            f"tp ({L.tp}) must divide n_heads ({m.n_heads}) and divide, or be a multiple of, "
            f"n_kv_heads ({m.n_kv_heads})"
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
        lambda t, m, c: (t.virtual_stages > 1) & ~t.is_interleaved,
        lambda L, m, c: (
            f"virtual_stages ({L.virtual_stages}) > 1 needs pp_schedule interleaved or zbv, "
            f"not {L.pp_schedule}"
        ),
    ),
    Rule(
        "zbv needs exactly 2 virtual stages",
        "virtual_stages",
        lambda t, m, c: t.is_zbv & (t.virtual_stages != 2) & (t.pp > 1),
        lambda L, m, c: f"pp_schedule zbv needs virtual_stages 2, not {L.virtual_stages}",
    ),
    Rule(
        "expert parallelism on a dense model",
        "ep",
        lambda t, m, c: ((t.ep > 1) | (t.expert_tp > 1)) & (m.n_experts == 0),
        lambda L, m, c: (
            f"ep ({L.ep}) and expert_tp ({L.expert_tp}) must be 1 for {m.name}, which has no "
            "experts"
        ),
    ),
    Rule(
        "ep does not divide the experts",
        "ep",
        lambda t, m, c: (m.n_experts > 0) & (m.n_experts % t.ep != 0),
        lambda L, m, c: f"ep ({L.ep}) must divide n_experts ({m.n_experts})",
    ),
    Rule(
        "expert_tp neither 1 nor tp",
        "expert_tp",
        lambda t, m, c: (t.expert_tp != 1) & (t.expert_tp != t.tp),
        lambda L, m, c: f"expert_tp ({L.expert_tp}) must be 1 or tp ({L.tp})",
    ),
    Rule(
        "expert_tp does not divide the expert FFN",
        "expert_tp",
        lambda t, m, c: (m.n_experts > 0) & (m.expert_width % t.expert_tp != 0),
        lambda L, m, c: f"expert_tp ({L.expert_tp}) must divide d_ff_expert ({m.expert_width})",
    ),
    Rule(
        "ep does not divide the ranks it borrows",
        "ep",
        lambda t, m, c: (t.dp * t.cp * (t.tp // np.maximum(1, t.expert_tp))) % t.ep != 0,
        lambda L, m, c: (
            f"ep ({L.ep}) must divide dp ({L.dp}) x cp ({L.cp}) x tp/expert_tp "
            f"({L.tp // max(1, L.expert_tp)}): expert parallelism borrows those ranks"
        ),
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
        lambda t, m, c: (t.pp > 1) & t.is_interleaved & (t.n_microbatches % t.pp != 0),
        lambda L, m, c: (
            f"pp_schedule {L.pp_schedule} needs the micro-batch count ({L.n_microbatches}) "
            f"divisible by pp ({L.pp})"
        ),
    ),
    Rule(
        "hsdp group does not divide the data-parallel ranks",
        "hsdp_shard_size",
        lambda t, m, c: t.is_hsdp & (t.dp % t.dp_shard_for(_gpn(c)) != 0),
        lambda L, m, c: (
            f"hsdp_shard_size ({L.hsdp_shard_size}) must divide the data-parallel ranks ({L.dp})"
        ),
    ),
    Rule(
        "hsdp group size set for another sharding",
        "hsdp_shard_size",
        lambda t, m, c: ~t.is_hsdp & (t.hsdp_shard_size > 0),
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


def rule_violations(layout: Layout, model: ModelSpec, cluster: ClusterSpec) -> list[InputError]:
    """All violations of one layout, each as an `InputError` naming its field."""
    table = LayoutTable.from_layouts([layout])
    errors = []
    for rule in RULES:
        if bool(np.asarray(rule.bad(table, model, cluster))[0]):
            errors.append(InputError(rule.field, rule.message(layout, model, cluster)))
    return errors


def check(layout: Layout, model: ModelSpec, cluster: ClusterSpec) -> None:
    """Raise the first violation of `layout`, if any."""
    errors = rule_violations(layout, model, cluster)
    if errors:
        raise errors[0]
