"""Parallelise the Llama model for a `Layout` on one DeviceMesh (`pp`, `dp_replicate`, `dp_shard`, `cp`, `tp`).

The order is fixed, as in torchtitan's `parallelize_llama`:

1. pipeline split (`pipeline_modules`): each rank keeps the layers of its stage(s);
2. tensor parallelism (`apply_tp`) with sequence parallelism and loss parallelism; then, for a
   mixture-of-experts model, expert parallelism and expert TP (`apply_moe`, measure/moe.py:
   each rank keeps its experts, tokens move by AllToAll over the EP mesh, which borrows
   dp_shard x cp, and tp when expert_tp is 1, as torchtitan's `_build_mesh_with_ep` does);
3. activation checkpointing (`apply_ac`): none, selective (recompute the attention core,
   scaled_dot_product_attention, and keep every other activation: Korthikanti et al. 2022, the
   recompute the predictor costs and counts in HFU) or full (recompute each block);
4. `torch.compile` per block (`apply_compile`);
5. data parallelism: FSDP2 (`apply_fsdp`, fully_shard per block and root; 2-D mesh for HSDP;
   bf16 parameters with fp32 reduction on GPU) or DDP (`apply_ddp`, after initialisation, since
   DDP broadcasts real parameters). The layout's ZeRO stages map onto these: `zero2` is FSDP2
   without resharding after forward (gradients and optimizer state sharded, parameters stay
   gathered from forward to the end of backward, like FSDP1's SHARD_GRAD_OP), `zero1` is DDP with
   `ZeroRedundancyOptimizer` (optimizer state sharded). Under EP each MoE layer's routed experts
   are their own FSDP unit on the ranks that hold the same experts (`Meshes.expert_fsdp`,
   dp_shard_mod_ep); everything else is sharded over dp x cp as for a dense model.

Context parallelism is applied per step around forward and backward (`cp_context`). Gradient
clipping (`clip_grad_norm_`) works when parameters live on different meshes (plain tensors, TP
DTensors, FSDP×TP DTensors, and pipeline stages) and when expert weights are plain slices of the
model's (their squared norms summed over the EP and expert-TP groups).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from scalelab.config.layout import Layout
from scalelab.config.model import ModelSpec
from scalelab.config.options import PipelineSchedule, Recompute
from scalelab.config.pipeline import Stage, layout_stages, rank_stage_ids
from scalelab.measure.config import data_parallel_degrees, ep_problem

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of the five mesh dimensions (they multiply to the world size), and the expert
    parallelism that borrows some of them (`ep`, `etp`: Layout.ep and Layout.expert_tp)."""

    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    ep: int = 1
    etp: int = 1

    @classmethod
    def from_layout(cls, layout: Layout, gpus_per_node: int) -> ParallelDims:
        """HSDP shards over `hsdp_shard_size` ranks (default: a node's ranks not taken by TP and CP)."""
        replicate, shard = data_parallel_degrees(layout, gpus_per_node)
        return cls(layout.pp, replicate, shard, layout.cp, layout.tp, layout.ep, layout.expert_tp)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_degree(self) -> int:
        """Ranks a parameter is sharded over by FSDP (context-parallel ranks included)."""
        return self.dp_shard * self.cp

    def shape(self) -> tuple[int, ...]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)

    # Expert parallelism (torchtitan's ParallelDims._build_mesh_with_ep). ---------------------
    @property
    def ep_inner(self) -> int:
        """The ranks EP always takes whole: cp, and tp when the experts are not split by TP."""
        return self.cp * (self.tp if self.etp == 1 else 1)

    @property
    def dp_shard_in_ep(self) -> int:
        """The dp_shard ranks inside one EP group (ep = dp_shard_in_ep x cp [x tp])."""
        return max(1, self.ep // self.ep_inner)

    @property
    def dp_shard_mod_ep(self) -> int:
        """The dp_shard ranks that hold the same experts (their FSDP group)."""
        return self.dp_shard // self.dp_shard_in_ep

    def ep_problem(self) -> str | None:
        """Why this EP layout cannot be built as torchtitan builds it, or None."""
        return ep_problem(self.dp_replicate, self.dp_shard, self.cp, self.tp, self.ep, self.etp)


@dataclass
class Meshes:
    """The world mesh and the sub-meshes each parallelism uses.

    `dp` (dp_replicate×dp_shard): ranks that see different data. `fsdp`: FSDP's mesh, 1-D over
    dp_shard×cp, or 2-D (dp_replicate, dp_shard×cp) for HSDP. `dp_cp`: all data and context
    shards (DDP's group). With expert parallelism, `ep`: the EP group (dp_shard_in_ep × cp, × tp
    when expert_tp is 1), and `expert_fsdp`: the ranks that hold the same experts (FSDP's mesh
    for them: dp_shard_mod_ep, 2-D with dp_replicate for HSDP).
    """

    world: DeviceMesh
    dims: ParallelDims
    dp: DeviceMesh
    fsdp: DeviceMesh
    dp_cp: DeviceMesh
    ep: DeviceMesh | None = None
    expert_fsdp: DeviceMesh | None = None

    def __getitem__(self, name: str) -> DeviceMesh:
        return self.world[name]


def build_meshes(dims: ParallelDims, device_type: str) -> Meshes:
    """One mesh with all five dimensions (size 1 where unused) plus the flattened views. With
    expert parallelism dp_shard is split into (dp_shard_mod_ep, dp_shard_in_ep), as torchtitan
    does, and the EP and expert-FSDP meshes are views of the same world mesh."""
    if dims.ep > 1:
        problem = dims.ep_problem()
        if problem:
            raise ValueError(problem)
        shape = (
            dims.pp, dims.dp_replicate, dims.dp_shard_mod_ep, dims.dp_shard_in_ep, dims.cp, dims.tp
        )  # fmt: skip
        names = ("pp", "dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep", "cp", "tp")
        world = init_device_mesh(device_type, shape, mesh_dim_names=names)
        shard: tuple[str, ...] = ("dp_shard_mod_ep", "dp_shard_in_ep")
    else:
        world = init_device_mesh(device_type, dims.shape(), mesh_dim_names=MESH_DIMS)
        shard = ("dp_shard",)
    dp = world[("dp_replicate", *shard)]._flatten("dp")
    dp_shard_cp = world[(*shard, "cp")]._flatten("dp_shard_cp")
    dp_cp = world[("dp_replicate", *shard, "cp")]._flatten("dp_cp")
    if dims.dp_replicate > 1:
        fsdp = dp_cp._unflatten(
            0, (dims.dp_replicate, dims.fsdp_degree), ("dp_replicate", "dp_shard_cp")
        )
    else:
        fsdp = dp_shard_cp
    meshes = Meshes(world, dims, dp, fsdp, dp_cp)
    if dims.ep > 1:
        ep_dims = ("dp_shard_in_ep", "cp", "tp") if dims.etp == 1 else ("dp_shard_in_ep", "cp")
        meshes.ep = world[ep_dims]._flatten("ep")
        if dims.dp_replicate > 1:
            meshes.expert_fsdp = world["dp_replicate", "dp_shard_mod_ep"]
        else:
            meshes.expert_fsdp = world["dp_shard_mod_ep"]
    return meshes


# 1. Pipeline split -------------------------------------------------------------------------------


def stage_ids(layout: Layout, pp_rank: int) -> list[int]:
    """The global stage indices a pipeline rank runs: looped (r, r+pp, ...) or V-shaped (zbv)."""
    return rank_stage_ids(layout, pp_rank)


def pipeline_modules(
    spec: ModelSpec, layout: Layout, pp_rank: int, build: Callable[[Stage], nn.Module]
) -> list[tuple[int, nn.Module]]:
    """(stage index, module) for each stage of this rank.

    The layers each stage holds come from `config.pipeline.layout_stages` (torchtitan's split
    of [embedding, layers, norm + output], uneven where the count does not divide), the split
    the predictor prices; the first stage holds the embedding, the last the final norm and
    output. `build(stage)` makes that stage's module (on the meta device), its layers keyed by
    their global index.
    """
    stages = layout_stages(spec, layout)
    return [(index, build(stages[index])) for index in stage_ids(layout, pp_rank)]


def build_schedule(
    stages: Sequence[tuple[int, nn.Module]],
    layout: Layout,
    n_stages: int,
    device: torch.device,
    pp_group: dist.ProcessGroup,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Any:
    """A `torch.distributed.pipelining` schedule over this rank's stage modules."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as sched

    pipeline_stages: list[Any] = [
        PipelineStage(module, index, n_stages, device, group=pp_group) for index, module in stages
    ]
    n_micro = layout.n_microbatches
    if layout.pp_schedule == PipelineSchedule.GPIPE:
        return sched.ScheduleGPipe(pipeline_stages[0], n_microbatches=n_micro, loss_fn=loss_fn)
    if layout.pp_schedule == PipelineSchedule.ONE_F_ONE_B:
        return sched.Schedule1F1B(pipeline_stages[0], n_microbatches=n_micro, loss_fn=loss_fn)
    if layout.pp_schedule == PipelineSchedule.INTERLEAVED:
        return sched.ScheduleInterleaved1F1B(
            pipeline_stages, n_microbatches=n_micro, loss_fn=loss_fn
        )
    return sched.ScheduleZBVZeroBubble(pipeline_stages, n_microbatches=n_micro, loss_fn=loss_fn)


# 2. Tensor parallelism ---------------------------------------------------------------------------


def apply_tp(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    sequence_parallel: bool,
    loss_parallel: bool,
    block_styles: tuple[Any, Any, Any] | None = None,
) -> None:
    """Megatron-style TP: column-parallel q/k/v and w1/w3, row-parallel wo/w2, vocab-parallel
    embedding and output; with SP the norms and the residual stream are sharded on the sequence.
    `block_styles` (colwise, rowwise, prepare-input) replace the blocks' styles (FP8: `fp8.tp_styles`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    colwise, rowwise, prepare_input = block_styles or (
        ColwiseParallel,
        RowwiseParallel,
        PrepareModuleInput,
    )
    m: Any = model
    seq_layout = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {}
    if m.tok_embeddings is not None:
        plan["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=seq_layout
        )
    if m.norm is not None and sequence_parallel:
        plan["norm"] = SequenceParallel()
    if m.output is not None:
        plan["output"] = ColwiseParallel(
            input_layouts=seq_layout,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    if plan:
        parallelize_module(m, tp_mesh, plan)
    for block in m.layers.values():
        moe = getattr(block, "moe_enabled", False)
        if moe and not sequence_parallel:
            raise ValueError("MoE layers under TP need sequence parallelism")
        layer_plan: dict[str, Any] = {
            "attention.wq": colwise(),
            "attention.wk": colwise(),
            "attention.wv": colwise(),
            "attention.wo": rowwise(output_layouts=seq_layout),
        }
        if not moe:
            layer_plan |= {
                "feed_forward.w1": colwise(),
                "feed_forward.w2": rowwise(output_layouts=seq_layout),
                "feed_forward.w3": colwise(),
            }
        if sequence_parallel:
            layer_plan |= {
                "attention_norm": SequenceParallel(),
                "attention": prepare_input(
                    input_layouts=(Shard(1), None, None),
                    desired_input_layouts=(Replicate(), None, None),
                ),
                "ffn_norm": SequenceParallel(),
            }
            if moe:  # the MoE layer takes this rank's sequence shard as a plain tensor
                layer_plan["moe"] = PrepareModuleInput(
                    input_layouts=(Shard(1),),
                    desired_input_layouts=(Shard(1),),
                    use_local_output=True,
                )
            else:
                layer_plan["feed_forward"] = prepare_input(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                )
        parallelize_module(block, tp_mesh, layer_plan)


# 2b. Expert parallelism --------------------------------------------------------------------------


def moe_layers(model: nn.Module) -> list[tuple[int, Any]]:
    """(global layer index, MoE module) of each MoE layer of a model or stage."""
    from torch.nn.parallel import DistributedDataParallel

    from scalelab.measure.moe import MoE

    inner: Any = model.module if isinstance(model, DistributedDataParallel) else model
    layers: Any = inner.layers
    return [
        (int(key), sub)
        for key, block in layers.items()
        for sub in block.modules()
        if isinstance(sub, MoE)
    ]


def apply_moe(model: nn.Module, meshes: Meshes, expert_grad_reducers: int) -> None:
    """Expert parallelism and TP inside each MoE layer (after `apply_tp`, as torchtitan's
    apply_moe_ep_tp): this rank's slice of the experts (EP over `meshes.ep`; with expert_tp = tp
    also the TP slices), the groups the layer's collectives use, and the experts' gradient scale.

    Under EP an expert's gradient arrives (through the combine AllToAll's backward) summed over
    the EP group's tokens, each from its own rank's mean loss; FSDP then averages it over the
    `expert_grad_reducers` ranks that hold the same experts. The data-parallel gradient is the
    average over all dp x cp ranks, so the experts' gradients are scaled by
    expert_grad_reducers / (dp x cp) (torchtitan sets FSDP's gradient divide factor to dp x cp)."""
    dims = meshes.dims
    tp_group = meshes["tp"].get_group() if dims.tp > 1 else None
    ep_rank = meshes.ep.get_local_rank() if meshes.ep is not None else 0
    tp_rank = meshes["tp"].get_local_rank() if dims.tp > 1 else 0
    split_tp = dims.etp if dims.etp > 1 else 1
    for _, moe in moe_layers(model):
        moe.shard(ep_rank, dims.ep, tp_rank, split_tp)
        moe.tp_group = tp_group
        moe.tp_gather = split_tp > 1
        moe.experts_tp_partial = dims.tp > 1 and dims.etp == 1 and dims.ep == 1
        if meshes.ep is not None:
            moe.experts.ep_group = meshes.ep.get_group()
            moe.experts.grad_scale = expert_grad_reducers / (dims.dp * dims.cp)


# 3. Activation checkpointing ---------------------------------------------------------------------


def apply_ac(model: nn.Module, mode: str) -> None:
    """Recompute in backward (`mode`): none; selective, the attention core of each block
    (`Attention.recompute_core`: only its inputs q, k, v are kept); or full, each block's forward
    (`checkpoint_wrapper`: only the block's input is kept)."""
    if mode == Recompute.NONE:
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from scalelab.measure.model import Attention

    layers: Any = model.layers
    for key in list(layers.keys()):
        block = layers[key]
        if mode == Recompute.FULL:
            layers[key] = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            for module in block.modules():
                if isinstance(module, Attention):
                    module.recompute_core = True


# 4. torch.compile --------------------------------------------------------------------------------


def apply_compile(model: nn.Module) -> None:
    """Compile each block separately (identical blocks share one compiled graph)."""
    layers: Any = model.layers
    for key in list(layers.keys()):
        layers[key] = torch.compile(layers[key])


# 5. Data parallelism -----------------------------------------------------------------------------


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype | None,
    reshard_after_forward: bool,
    expert_mesh: DeviceMesh | None = None,
) -> None:
    """FSDP2 per block and on the root; bf16 parameters reduce gradients in fp32. Under expert
    parallelism each MoE layer's routed experts are their own FSDP unit on `expert_mesh`.

    The root (embedding, final norm, output) is never resharded after forward: its backward
    starts right after its forward, so resharding would only gather it again (FSDP2's own
    default for the root, and what the predictor costs: one root AllGather per micro-batch)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    if expert_mesh is not None:  # experts sharded over the ranks holding the same experts
        for _, moe in moe_layers(model):
            fully_shard(
                moe.experts,
                mesh=expert_mesh,
                mp_policy=mp,
                reshard_after_forward=reshard_after_forward,
            )
    layers: Any = model.layers
    for block in layers.values():
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


def apply_ddp(model: nn.Module, group: dist.ProcessGroup) -> nn.Module:
    """DDP over `group` (the data- and context-parallel ranks); call after initialisation."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, process_group=group, broadcast_buffers=False)


# Context parallelism -----------------------------------------------------------------------------


def cp_context(
    cp_mesh: DeviceMesh,
    buffers: list[torch.Tensor],
    seq_dims: list[int],
    no_restore: set[torch.Tensor],
) -> contextlib.AbstractContextManager[None]:
    """PyTorch's context-parallel context (ring attention, head-tail load balancing).

    On CPU, SDPA runs a kernel the stock API has no rule for; `cp_cpu` adds one.
    """
    from torch.distributed.tensor.experimental import context_parallel

    if cp_mesh.device_type == "cpu":
        from scalelab.measure.cp_cpu import install_cpu_ring_attention

        install_cpu_ring_attention()
    return context_parallel(
        cp_mesh, buffers=buffers, buffer_seq_dims=seq_dims, no_restore_buffers=no_restore
    )


# Gradient clipping -------------------------------------------------------------------------------


def _group_key(t: torch.Tensor) -> tuple[Any, ...]:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return (id(t.device_mesh), tuple(t.placements))
    return ("plain",)


def _squared_norm(grads: Sequence[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """The squared L2 norm of `grads` (DTensors reduced over their meshes), fp32."""
    from torch.distributed.tensor import DTensor

    groups: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    for g in grads:
        if g is not None:
            groups.setdefault(_group_key(g), []).append(g)
    total_sq = torch.zeros((), dtype=torch.float32, device=device)
    for members in groups.values():
        norm = torch.nn.utils.get_total_norm(members, norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total_sq += norm.float() ** 2
    return total_sq


@torch.no_grad()
def clip_grad_norm_(
    parameters: Iterator[nn.Parameter] | Sequence[nn.Parameter],
    max_norm: float,
    pp_group: dist.ProcessGroup | None = None,
    sliced: Sequence[tuple[Sequence[nn.Parameter], Sequence[dist.ProcessGroup]]] = (),
) -> torch.Tensor:
    """Clip gradients to a total L2 norm of `max_norm`; returns the norm before clipping.

    Gradients are grouped by (mesh, placements) so each group's norm is one DTensor reduction
    (`torch.nn.utils.clip_grad_norm_` fails on mixed meshes); the squared norms are summed over
    groups and, for pipelines, over stages. Parameters in `sliced` hold plain slices of the
    model's (experts under EP or expert TP): their squared norms are also summed over the groups
    given with them. The coefficient is torch's, max_norm / (norm + 1e-6).
    """
    from torch.distributed.tensor import DTensor

    params = list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    in_slice = {id(p) for members, _ in sliced for p in members}
    total_sq = _squared_norm([p.grad for p in params if id(p) not in in_slice], device)
    for members, groups in sliced:
        part = _squared_norm([p.grad for p in members], device)
        for group in groups:
            dist.all_reduce(part, group=group)
        total_sq += part
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(total_sq, group=pp_group)
    total = total_sq.sqrt()
    if max_norm > 0:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            (g.to_local() if isinstance(g, DTensor) else g).mul_(coef.to(g.dtype))
    return total
