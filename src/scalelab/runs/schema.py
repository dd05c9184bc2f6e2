"""The typed record of one published training run: every field explicit, each documented.

A `Run` is what a person reviews: the model's shape, the hardware it ran on, the full layout (with
the `Layout` types), the software stack, what was measured and how it becomes tokens/s per GPU,
and which values the source did not state (`assumed`, each with its reason). Runs are stored one
per row in a flat CSV (`published_runs_typed.csv`); `Run.model_spec()`, `Run.cluster()` and
`Run.layout()` turn a run into the predictor's inputs.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from scalelab.config.catalog import load_cluster, load_gpu
from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Attention, Layout, Recompute, Schedule, Sharding
from scalelab.config.model import ModelSpec
from scalelab.errors import InputError
from scalelab.io import csv_records

SCHEMA_VERSION = 1

# Ends an `assumed` entry that follows from what the row names (scalelab.runs.knowledge's data).
NAMED_TAG = "(reading rules)"


class PrecisionRecipe(StrEnum):
    """The numeric recipe of the run's matrix multiplies, as the source states it."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8_TENSORWISE = "fp8-tensorwise"
    FP8_DELAYED = "fp8-delayed"
    FP8_BLOCKWISE = "fp8-blockwise"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"


class MeasuredQuantity(StrEnum):
    """What the source reports; tokens/s per GPU is derived from it (see `tokens_per_s_per_gpu`)."""

    TOKENS_PER_S_PER_GPU = "tokens_per_s_per_gpu"
    TOKENS_PER_S = "tokens_per_s"  # whole job
    STEP_TIME_S = "step_time_s"  # x global batch x sequence length = tokens per step
    MFU = "mfu"  # with `flop_formula` and `peak_tflops`
    TFLOPS_PER_GPU = "tflops_per_gpu"  # with `flop_formula`


class FlopFormula(StrEnum):
    """FLOPs per token formulas that sources use to report MFU or TFLOP/s."""

    NONE = ""
    # 6·N + 12·L·H·Q·T (PaLM appendix B; 3·(2·N·s + 4·l·d·s²) per sequence is the same per token).
    PALM = "palm: 6N+12LHQT"
    # 6·N_non-embedding + 12·L·H·Q·T (torchtitan's MFU).
    PALM_NON_EMBEDDING = "palm-non-embedding: 6N_nonemb+12LHQT"
    # 96·B·s·l·h²·(1 + s/6h + V/16lh) per step (Narayanan et al. 2021, includes the recompute pass).
    MEGATRON = "megatron: 96Bslh^2(1+s/6h+V/16lh)"


# Precision recipes and what the predictor's Layout.precision makes of them.
RECIPE_TO_LAYOUT_PRECISION: dict[str, str | None] = {
    "bf16": "bf16",
    "fp16": "bf16",  # same dense peak and bytes as bf16
    "fp8-tensorwise": "fp8",
    "fp8-delayed": "fp8",
    "fp8-blockwise": "fp8",
    "mxfp8": "fp8",
    "nvfp4": None,  # no fp4 in the predictor
}


class Run(BaseModel):
    """One measured training run, every value explicit (the reading rules are in docs/runs.md)."""

    # allow_inf_nan=False: an inf or NaN measurement would make the validation's MAPE null
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_enum_values=True, allow_inf_nan=False
    )

    # Identity and provenance -------------------------------------------------------------------
    row: int = Field(ge=0, description="0-based data row of the raw CSV this run was read from")
    source: str = Field(min_length=1, description="citation of the source, as in the raw file")
    source_group: str = Field(
        min_length=1,
        description="one label per publishing origin; leave-one-source-out holds out a group",
    )
    stack: str = Field(
        default="",
        description="framework and version that ran the job, as the source states it ('' = not stated)",
    )

    # Model shape -------------------------------------------------------------------------------
    model: str = Field(min_length=1, description="model name as the source writes it")
    n_layers: int = Field(gt=0, description="transformer blocks")
    d_model: int = Field(gt=0, description="hidden size")
    n_heads: int = Field(gt=0, description="attention heads")
    n_kv_heads: int = Field(gt=0, description="key/value heads (= n_heads without GQA)")
    d_ff: int = Field(gt=0, description="FFN inner width")
    vocab_size: int = Field(gt=0, description="vocabulary entries")
    ffn: str = Field(pattern="^(swiglu|gelu)$", description="FFN type")
    norm: str = Field(pattern="^(rmsnorm|layernorm)$", description="normalisation")
    position: str = Field(pattern="^(rope|learned)$", description="position encoding")
    bias: bool = Field(description="linear layers carry biases")
    tied_embeddings: bool = Field(description="LM head shares the input embedding")
    seq_len: int = Field(gt=0, description="tokens per sequence")

    # Hardware ----------------------------------------------------------------------------------
    gpu: str = Field(description="catalog GPU name (config/catalog/gpus.yaml)")
    gpu_memory_gib: float = Field(gt=0, description="HBM per GPU in GiB as stated (else catalog)")
    cluster: str = Field(
        description="catalog cluster whose fitted parameters apply (the one with this GPU family)"
    )
    gpus_per_node: int = Field(gt=0)
    nvlink_domain: int = Field(gt=0, description="GPUs joined by NVLink (72 for an NVL72 rack)")
    nics_per_node: int = Field(gt=0, description="network links per node")
    nic_gbps: float = Field(gt=0, description="Gb/s per link")
    gpus: int = Field(gt=0, description="GPUs in the job")

    # Layout (the predictor's Layout types) -----------------------------------------------------
    global_batch: int = Field(gt=0, description="sequences per optimizer step")
    micro_batch: int = Field(gt=0, description="sequences per micro-batch per data-parallel rank")
    sharding: Sharding = Field(description="ddp | zero1 | zero2 | fsdp | hsdp")
    hsdp_shard_size: int | None = Field(default=None, gt=0)
    reshard_after_forward: bool = Field(description="FSDP frees gathered parameters after forward")
    tp: int = Field(gt=0)
    sequence_parallel: bool = Field(description="TP shards norms/dropout along the sequence")
    pp: int = Field(gt=0)
    pp_schedule: Schedule
    virtual_stages: int = Field(gt=0)
    cp: int = Field(gt=0)
    recompute: Recompute
    precision: PrecisionRecipe
    attention: Attention = Field(description="attention kernel: flash | flash1 | fused | math")
    async_tp: bool | None = Field(
        default=None, description="TP communication overlapped (None: not stated)"
    )
    torch_compile: bool | None = Field(
        default=None, description="torch.compile used (None: not stated)"
    )
    norm_kernel: Literal["fused", "eager"] | None = Field(
        default=None,
        description="RMSNorm as one fused kernel or as eager PyTorch ops (None: not stated; the "
        "stack's `norm_kernel` applies)",
    )
    cross_entropy: Literal["fp32-upcast", "vocab-parallel-fp32", "fused"] | None = Field(
        default=None,
        description="how the loss ran over the logits, where the run or its framework version "
        "says (config/stack.py `cross_entropy`; None: not stated, the stack's applies)",
    )

    # Measurement -------------------------------------------------------------------------------
    measured_quantity: MeasuredQuantity
    measured_value: float = Field(gt=0, description="the number the source reports, in its unit")
    flop_formula: FlopFormula = FlopFormula.NONE
    flop_params: float | None = Field(
        default=None, gt=0, description="N in the FLOP formula, when the source states it"
    )
    peak_tflops: float | None = Field(default=None, gt=0, description="peak MFU is taken against")
    tokens_per_s_per_gpu: float = Field(
        gt=0, description="the comparison target, derived from the above"
    )
    measured_peak_memory_gib: float | None = Field(default=None, gt=0)

    # Review ------------------------------------------------------------------------------------
    assumed: str = Field(
        default="",
        description="'field: reason' entries joined by ' | ' for every value the source does not state",
    )
    notes: str = Field(default="", description="the raw row's notes, for the reviewer")

    @model_validator(mode="after")
    def _check(self) -> Run:
        if self.tp * self.pp * self.cp > self.gpus or self.gpus % (self.tp * self.pp * self.cp):
            raise ValueError(f"tp x pp x cp must divide gpus ({self.gpus})")
        return self

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def assumed_fields(self) -> list[str]:
        """Every field an assumption sets ('ffn, norm: ...' sets two)."""
        heads = [a.split(":", 1)[0] for a in self.assumed.split(" | ") if a.strip()]
        return [name.strip() for head in heads for name in head.split(",") if name.strip()]

    @property
    def assumed_beyond_named(self) -> list[str]:
        """The fields of assumptions that do not follow from what the row names."""
        entries = [a for a in self.assumed.split(" | ") if a.strip()]
        heads = [a.split(":", 1)[0] for a in entries if not a.rstrip().endswith(NAMED_TAG)]
        return [name.strip() for head in heads for name in head.split(",") if name.strip()]

    @property
    def assumption_kind(self) -> Literal["none", "named", "assumed"]:
        """'none': the row states every value; 'named': what it does not state follows from what
        it names (a model family and size, a system, a framework's default; each entry ends with
        the reading rules' tag); 'assumed': some other assumption (a review sheet's, a convention)."""
        entries = [a for a in self.assumed.split(" | ") if a.strip()]
        if not entries:
            return "none"
        return "named" if all(a.rstrip().endswith(NAMED_TAG) for a in entries) else "assumed"

    def model_spec(self) -> ModelSpec:
        return ModelSpec(
            name=self.model,
            n_layers=self.n_layers,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            d_ff=self.d_ff,
            vocab_size=self.vocab_size,
            ffn=self.ffn,  # type: ignore[arg-type]
            tied_embeddings=self.tied_embeddings,
            seq_len=self.seq_len,
            norm=self.norm,  # type: ignore[arg-type]
            bias=self.bias,
            position=self.position,  # type: ignore[arg-type]
        )

    def cluster_spec(self, base: ClusterSpec | None = None) -> ClusterSpec:
        """The catalog cluster's parameters on this run's own GPU and node (as stated)."""
        base = base or load_cluster(self.cluster)
        gpu = load_gpu(self.gpu)
        if gpu.hbm_gib != self.gpu_memory_gib:
            gpu = gpu.model_copy(update={"hbm_gib": self.gpu_memory_gib})
        return base.model_copy(
            update={
                "gpu": gpu,
                "gpus_per_node": self.gpus_per_node,
                "nvlink_domain": self.nvlink_domain,
                "nics_per_node": self.nics_per_node,
                "nic_gbps": self.nic_gbps,
            }
        )

    def layout(self) -> Layout:
        """The predictor's layout; raises ValueError when the predictor cannot express the run."""
        precision = RECIPE_TO_LAYOUT_PRECISION[str(self.precision)]
        if precision is None:
            raise ValueError(f"precision {self.precision} is not modelled by the predictor")
        return Layout(
            gpus=self.gpus,
            global_batch=self.global_batch,
            seq_len=self.seq_len,
            sharding=self.sharding,
            hsdp_shard_size=self.hsdp_shard_size,
            reshard_after_forward=self.reshard_after_forward,
            tp=self.tp,
            sequence_parallel=self.sequence_parallel,
            pp=self.pp,
            pp_schedule=self.pp_schedule,
            virtual_stages=self.virtual_stages,
            cp=self.cp,
            micro_batch=self.micro_batch,
            recompute=self.recompute,
            precision=precision,  # type: ignore[arg-type]
            attention=self.attention,
        )


class MoERun(Run):
    """A published mixture-of-experts run (`published_runs_moe.csv`, written typed, no raw reading).

    The shape fields must agree with `catalog_model`, whose MoE and attention fields (experts,
    top-k, shared experts, expert width, dense first layers, MLA) the predictor uses; `ep` and
    `expert_tp` complete the layout. Reported apart from the dense runs (`scalelab validate`)."""

    catalog_model: str = Field(
        min_length=1, description="catalog model (config/catalog/models.yaml) with the MoE shape"
    )
    ep: int = Field(default=1, gt=0, description="expert-parallel degree as stated")
    expert_tp: int = Field(default=1, gt=0, description="expert tensor-parallel degree as stated")

    def model_spec(self) -> ModelSpec:
        from scalelab.config.catalog import load_model

        spec = load_model(self.catalog_model)
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "vocab_size"):
            if getattr(spec, name) != getattr(self, name):
                raise ValueError(
                    f"{name} {getattr(self, name)} differs from {self.catalog_model}'s "
                    f"{getattr(spec, name)}"
                )
        return spec.model_copy(update={"name": self.model, "seq_len": self.seq_len})

    def layout(self) -> Layout:
        data = super().layout().model_dump()
        return Layout(**{**data, "ep": self.ep, "expert_tp": self.expert_tp})


FIELDS: tuple[str, ...] = tuple(Run.model_fields)
MOE_FIELDS: tuple[str, ...] = tuple(MoERun.model_fields)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def write_runs(runs: Sequence[Run], path: Path | None = None) -> str:
    """The runs as CSV text (one column per field, schema version in the first column); MoE runs
    (`MoERun`) carry their extra columns."""
    names = MOE_FIELDS if runs and isinstance(runs[0], MoERun) else FIELDS
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["schema_version", *names])
    for run in runs:
        data = run.model_dump()
        writer.writerow([SCHEMA_VERSION, *(_cell(data[f]) for f in names)])
    text = out.getvalue()
    if path is not None:
        from scalelab.io import atomic_write_text

        atomic_write_text(path, text)
    return text


def is_typed_header(fieldnames: Sequence[str] | None) -> bool:
    return bool(fieldnames) and next(iter(fieldnames or [])) == "schema_version"


def read_runs(text: str, where: str = "data", kind: type[Run] = Run) -> list[Run]:
    """Runs from typed CSV text; a bad cell is one InputError naming the row and field. `kind`
    is `MoERun` for the MoE runs file."""
    fieldnames, records = csv_records(text, where)
    if not is_typed_header(fieldnames):
        raise InputError(where, "not a typed runs file (first column must be schema_version)")
    runs = []
    for line, record in enumerate(records, start=2):
        version = record.pop("schema_version", "")
        if version != str(SCHEMA_VERSION):
            raise InputError(
                where,
                f"line {line}: schema_version {version!r}; this scalelab reads {SCHEMA_VERSION}",
            )
        data: dict[str, Any] = {k: (None if v == "" else v) for k, v in record.items()}
        for key in ("assumed", "notes", "stack", "flop_formula"):
            data[key] = record.get(key, "") or ""
        try:
            runs.append(kind(**data))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "row"
            raise InputError(where, f"line {line}: {field}: {err['msg']}") from None
    return runs
