"""Software stacks: what the training framework does, apart from the hardware it runs on.

A cluster (config/hardware.py) holds what the hardware is: peaks, bandwidths, latencies, NICs,
power, and the efficiencies fitted to it. A stack holds what the framework does with it: which
pipeline schedules and shardings it offers, whether gradients are reduced once per step or on
every micro-batch, which communications it overlaps with compute, and the framework-side
parameters (attention kernel efficiency, FP8 recipe speed, per-collective host cost) that differ
between frameworks on the same GPUs, and the combinations of options the framework refuses
(`refuses`, each with its reason and upstream source: config/stack_rules.py evaluates them).
`--stack` selects one (catalog/stacks.yaml); the verbs default to `torchtitan` (DEFAULT_STACK),
whose refusals are exactly those of scalelab's own harness (`scalelab bench`). `generic` changes
nothing and refuses nothing: the predictor's assumptions as documented in perf/, for what-if
questions (the library's `load_stack()` without a name).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field, field_validator

from scalelab.config.hardware import ClusterParams, ClusterSpec
from scalelab.config.layout import Layout, LayoutTable
from scalelab.config.model import ModelSpec
from scalelab.config.options import PipelineSchedule, Sharding
from scalelab.config.stack_rules import StackRule, rule_masks, rule_message
from scalelab.config.strict import StrictNumbers
from scalelab.errors import InputError

# The ClusterParams a stack may set: what the framework, not the hardware, decides.
STACK_PARAMS: tuple[str, ...] = (
    "attention_efficiency",
    "fp8_efficiency_ratio",
    "collective_overhead_us",
    "layer_overhead_us",
    "step_overhead_ms",
    "tp_layer_overhead_us",
)


class StackParams(StrictNumbers):
    """Framework-side parameters; None keeps the cluster's value (each set one names its source
    in `StackSpec.source`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attention_efficiency: float | None = Field(
        None,
        gt=0,
        le=1,
        description="the framework's attention kernel's achieved fraction of the bf16 peak "
        "(ClusterParams.attention_efficiency)",
    )
    fp8_efficiency_ratio: float | None = Field(
        None,
        gt=0,
        le=1,
        description="the framework's FP8 recipe: fp8 GEMM efficiency relative to bf16 "
        "(ClusterParams.fp8_efficiency_ratio)",
    )
    collective_overhead_us: float | None = Field(
        None,
        ge=0,
        le=1e6,  # 1 s: host costs are µs to ms
        description="µs of host work per collective the framework issues",
    )
    layer_overhead_us: float | None = Field(
        None,
        ge=0,
        le=1e6,  # 1 s: host costs are µs to ms
        description="µs of host and launch overhead per layer per forward",
    )
    step_overhead_ms: float | None = Field(
        None,
        ge=0,
        le=3.6e6,  # an hour per step
        description="ms of fixed per-step work (dataloader, logging, hooks)",
    )
    tp_layer_overhead_us: float | None = Field(
        None,
        ge=0,
        le=1e6,  # 1 s: host costs are µs to ms
        description="µs per layer per forward (twice in backward) that tensor parallelism adds "
        "beyond its collectives' NCCL time: host dispatch and the wait for the slowest rank at "
        "each TP collective (ClusterParams.tp_layer_overhead_us)",
    )


class StackSpec(StrictNumbers):
    """One training framework's behaviour (catalog/stacks.yaml or a YAML file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="catalog name or the YAML file's stem")
    description: str = Field("", description="the framework and version this profile describes")
    schedules: tuple[PipelineSchedule, ...] = Field(
        default=tuple(PipelineSchedule),
        description="pipeline schedules the framework offers (a layout with another is refused)",
    )
    shardings: tuple[Sharding, ...] = Field(
        default=tuple(Sharding),
        description="data-parallel sharding modes the framework offers",
    )
    # Degrees above 2**20 (the most GPUs a layout has, config.layout.MAX_GPUS) mean nothing.
    max_tp: int = Field(
        2**20, gt=0, le=2**20, description="largest tensor-parallel degree offered (1: no TP)"
    )
    max_pp: int = Field(
        2**20, gt=0, le=2**20, description="largest pipeline degree offered (1: no PP)"
    )
    max_cp: int = Field(
        2**20, gt=0, le=2**20, description="largest context-parallel degree offered"
    )
    microbatch_grad_sync: tuple[Sharding, ...] = Field(
        default=(),
        description="shardings whose data-parallel gradients the framework reduces on every "
        "micro-batch of a step without a pipeline (FSDP2 without set_requires_gradient_sync(False), DeepSpeed "
        "ZeRO-2/3); the others reduce once, with the last micro-batch (DDP no_sync, Megatron's "
        "gradient-accumulation fusion)",
    )
    tp_comm_overlap: bool = Field(
        False,
        description="tensor-parallel AllGather/ReduceScatter overlapped with the adjacent GEMMs "
        "(Transformer Engine userbuffers, PyTorch async TP): only what the layer's GEMMs cannot "
        "hide is exposed",
    )
    pp_p2p_overlap: bool = Field(
        False,
        description="pipeline send/recv overlapped with the next micro-batch's compute in the "
        "steady state (Megatron's overlap_p2p_comm): only warm-up and cool-down transfers are "
        "exposed",
    )
    pp_partition: Literal["layers", "modules"] = Field(
        "layers",
        description="how the framework assigns the model to pipeline stages: `layers`, "
        "ceil(L / (pp x v)) transformer layers per chunk with the embedding on the first stage "
        "and the LM head on the last (Megatron's layers per stage; the slowest stage then holds "
        "a full share of layers and the head); `modules`, the module list [embedding, L layers, "
        "final norm, LM head] split uniformly, so the head takes the place of layers on its "
        "stage (perf/schedule.py `module_partition_slowest_stage`)",
    )
    grad_reduce_overlap: bool = Field(
        True,
        description="data-parallel gradient reduction issued layer by layer during backward and "
        "overlapped with it (FSDP, DDP buckets, Megatron's overlap_grad_reduce); False: one "
        "reduction of every gradient after the last backward, exposed (an optimizer-step "
        "all-reduce)",
    )
    grad_reduce_overlap_with_model_parallel: bool = Field(
        True,
        description="with tensor or pipeline parallelism (tp x pp > 1) the data-parallel gradient "
        "reduction still overlaps backward as `grad_reduce_overlap` says; False: the framework "
        "then issues its collectives on the compute stream (OneFlow's nccl_use_compute_stream), "
        "so every gradient reduction is serialised with compute, exposed",
    )
    grad_reduce_bytes: float = Field(
        4.0,
        gt=0,
        le=8,  # fp64, the widest dtype
        description="bytes per gradient element the data-parallel reduction moves: 4 where "
        "gradients are reduced in fp32 (FSDP2's reduce_dtype fp32, Megatron's fp32 main "
        "gradients), 2 where the framework reduces the half-precision gradients before widening "
        "them to the fp32 master weights",
    )
    zero1_grad_reduce: Literal["reduce_scatter", "all_reduce"] = Field(
        "reduce_scatter",
        description="how ZeRO-1 reduces gradients: a ReduceScatter into each rank's partition, "
        "or an AllReduce of every gradient after which each rank keeps its partition (the "
        "first ZeRO-1 of DeepSpeed and its derivatives)",
    )
    norm_kernel: Literal["fused", "eager"] = Field(
        "fused",
        description="how the framework runs RMSNorm: one fused kernel (Transformer Engine, Apex, "
        "flash-attn's rms_norm, torch.compile) or eager PyTorch ops upcast to fp32 "
        "(torch.nn.RMSNorm before PyTorch 2.8, Hugging Face's LlamaRMSNorm), whose extra HBM "
        "passes perf/compute.py counts; LayerNorm is one kernel either way",
    )
    selective_recompute: Literal["attention", "alternate-matmuls"] = Field(
        "attention",
        description="what `--recompute selective` recomputes in this framework: the attention "
        "core and element-wise ops (Korthikanti et al. 2022; Megatron) or, as torchtitan's "
        "per-op selective checkpointing does, every second matmul of the layer's forward and "
        "every op that is not a matmul, attention or a TP ReduceScatter (the attention output "
        "is saved)",
    )
    cross_entropy: Literal["fp32-upcast", "vocab-parallel-fp32", "fused"] = Field(
        "fp32-upcast",
        description="how the framework computes the loss over the logits, which sets the bytes "
        "per logit element alive at the loss's peak (perf/memory.py `LOSS_BYTES_PER_LOGIT`): "
        "PyTorch's cross_entropy on logits upcast to fp32 (eager), Megatron's vocab-parallel "
        "cross-entropy (an fp32 copy in which the softmax and then the gradient are computed "
        "in place), or one fused kernel on the bf16 logits (flash-attn's cross_entropy, "
        "Liger, a compiled loss)",
    )
    tp_saves_gathered_inputs: bool = Field(
        False,
        description="under sequence parallelism, the column-parallel matmuls keep their "
        "all-gathered full-sequence input for backward (PyTorch DTensor TP: the mm saves the "
        "replicated tensor it was given) rather than the local shard that Megatron's "
        "sequence-parallel linear saves and all-gathers again in backward (Korthikanti et al.'s "
        "accounting; perf/memory.py)",
    )
    refuses: tuple[StackRule, ...] = Field(
        default=(),
        description="combinations of options the framework refuses or runs wrongly, each with "
        "the field it names, why, and the upstream issue or document (config/stack_rules.py)",
    )
    params: StackParams = Field(default_factory=StackParams)
    fp8_recipe_ratios: dict[str, float] = Field(
        default_factory=dict,
        description="fp8_efficiency_ratio per FP8 recipe a run states (fp8-tensorwise, "
        "fp8-blockwise, ...): the recipe's realised speed in this framework",
    )
    fitted_on: tuple[str, ...] = Field(
        default=(),
        description="source groups the numbers in `params` and `fp8_recipe_ratios` were fitted "
        "on (`calibrate.fit_stack`); validate's cross-validation drops them for those groups",
    )
    source: str = Field("", description="where each behaviour and parameter comes from")

    @field_validator("fp8_recipe_ratios")
    @classmethod
    def _ratios_are_fractions(cls, ratios: dict[str, float]) -> dict[str, float]:
        for recipe, ratio in ratios.items():
            if not 0 < ratio <= 1:  # as StackParams.fp8_efficiency_ratio
                raise ValueError(f"{recipe}: {ratio:g} must be above 0 and at most 1")
        return ratios

    def grad_sync_every_microbatch(self, table: LayoutTable) -> np.ndarray:
        """Layouts whose gradients this stack reduces on every micro-batch: gradient accumulation
        without a pipeline. Pipeline schedules reduce once per step in every stack here
        (torch.distributed.pipelining's stage turns gradient sync off for all but the last
        micro-batch, `backward_maybe_with_nosync`; DeepSpeed's PipelineEngine reduces after the
        schedule; Megatron after the last micro-batch)."""
        codes = [s.code for s in self.microbatch_grad_sync]
        return np.isin(table.sharding, codes) & (table.pp == 1)

    def grad_reduce_overlaps(self, table: LayoutTable) -> np.ndarray | bool:
        """Whether each layout's gradient reduction overlaps backward: `grad_reduce_overlap`,
        except with tp x pp > 1 in a stack that then runs its collectives on the compute stream
        (`grad_reduce_overlap_with_model_parallel` False). One bool when no layout differs."""
        if not self.grad_reduce_overlap or self.grad_reduce_overlap_with_model_parallel:
            return self.grad_reduce_overlap
        return np.asarray((table.tp * table.pp) <= 1)

    def unfitted(self) -> StackSpec:
        """This stack without the numbers fitted to measurements (behaviours stay)."""
        return self.model_copy(update={"params": StackParams(), "fp8_recipe_ratios": {}})

    def for_recipe(self, recipe: str) -> StackSpec:
        """This stack with the FP8 ratio of `recipe` where it states one."""
        ratio = self.fp8_recipe_ratios.get(recipe)
        if ratio is None:
            return self
        params = self.params.model_copy(update={"fp8_efficiency_ratio": ratio})
        return self.model_copy(update={"params": params})

    def cluster_for(self, cluster: ClusterSpec) -> ClusterSpec:
        """`cluster` with this stack's parameters in place of the cluster's where it sets them."""
        updates = {k: v for k, v in self.params.model_dump().items() if v is not None}
        if not updates:
            return cluster
        params: ClusterParams = cluster.params.model_copy(update=updates)
        return cluster.model_copy(update={"params": params})

    # Offered-feature and combination rules over many layouts (search) and one (predict). -----
    def violation_masks(
        self,
        table: LayoutTable,
        model: ModelSpec | None = None,
        gpus_per_node: int | None = None,
    ) -> dict[str, np.ndarray]:
        """For each reason this stack refuses layouts, the layouts it refuses: options it does
        not offer, then (with the model) the combinations in `refuses`."""
        offered_sched = np.isin(table.pp_schedule, [s.code for s in self.schedules])
        offered_shard = np.isin(table.sharding, [s.code for s in self.shardings])
        masks = {
            f"pipeline schedule not offered by stack {self.name}": (table.pp > 1) & ~offered_sched,
            f"sharding not offered by stack {self.name}": ~offered_shard,
            f"tp above what stack {self.name} offers": table.tp > self.max_tp,
            f"pp above what stack {self.name} offers": table.pp > self.max_pp,
            f"cp above what stack {self.name} offers": table.cp > self.max_cp,
        }
        if model is not None:
            for rule, bad in zip(
                self.refuses, rule_masks(self.refuses, table, model, gpus_per_node), strict=True
            ):
                key = f"stack {self.name} refuses: {rule.summary}"
                masks[key] = masks[key] | bad if key in masks else bad
        return masks

    def check(
        self, layout: Layout, model: ModelSpec | None = None, gpus_per_node: int | None = None
    ) -> None:
        """Raise one `InputError` for the first option of `layout` this stack does not offer,
        then (given the model) for the first combination it refuses."""
        if layout.pp > 1 and layout.pp_schedule not in {str(s) for s in self.schedules}:
            allowed = ", ".join(str(s) for s in self.schedules) or "none"
            raise InputError(
                "pp_schedule",
                f"stack {self.name} offers {allowed}, not {layout.pp_schedule}",
            )
        if layout.sharding not in {str(s) for s in self.shardings}:
            allowed = ", ".join(str(s) for s in self.shardings)
            raise InputError(
                "sharding", f"stack {self.name} offers {allowed}, not {layout.sharding}"
            )
        for name in ("tp", "pp", "cp"):
            limit = getattr(self, f"max_{name}")
            if getattr(layout, name) > limit:
                raise InputError(
                    name,
                    f"stack {self.name} offers {name} up to {limit}, not {getattr(layout, name)}",
                )
        if model is None:
            return
        self.check_combinations(layout, model, gpus_per_node)

    def check_combinations(
        self, layout: Layout, model: ModelSpec, gpus_per_node: int | None = None
    ) -> None:
        """Raise one `InputError` (its field, the reason and the source) for the first
        combination of `refuses` that `layout` hits."""
        table = LayoutTable.from_layouts([layout])
        for rule, bad in zip(
            self.refuses, rule_masks(self.refuses, table, model, gpus_per_node), strict=True
        ):
            if bool(bad[0]):
                raise InputError(rule.field, rule_message(rule, layout, model, gpus_per_node))


# The stack the verbs (predict, search, bench's checks) use unless told: a real framework, whose
# refusals are the harness's own. The library's `load_stack()` without a name stays `generic`
# (NEUTRAL_STACK), the predictor's documented assumptions, so calibration and validation keep
# their meaning.
DEFAULT_STACK = "torchtitan"
NEUTRAL_STACK = "generic"
