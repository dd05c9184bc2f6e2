"""The predictor: one training step of many layouts at once, and its breakdown.

Composed the way torchtitan's `parallelize` applies one parallelism after another: a
`StepContext` of arrays is built once per call (degrees, micro-batches, per-layer compute), then
one vectorised function per parallelism prices what it adds to a layer or a step:

- `tensor_parallel`: TP's activation collectives on the critical path of every layer;
- `context_parallel`: the exposed part of CP's K/V ring;
- `recomputation`: what activation recomputation adds to every layer's backward;
- `data_parallel`: FSDP/HSDP/ZeRO/DDP's per-layer AllGather and gradient reduction;
- `flat_step` (no pipeline: the two streams simulated layer by layer) or `pipeline_parallel`
  (the schedule's bubble, send/recv and per-stage data-parallel traffic);
- `optimizer_step`: AdamW and ZeRO's parameter AllGather;

and `predict` composes them and derives the metrics (`scalelab.metrics` names) into a typed
`Prediction`. `predict_layout` is the one-layout convenience returning a flat, JSON-ready dict
(the fields `scalelab predict --json` prints).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from scalelab.config.catalog import load_stack
from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout, LayoutTable, check
from scalelab.config.model import ModelSpec, flops_utilisation, model_tflops_per_gpu
from scalelab.config.stack import StackSpec
from scalelab.metrics import canonical
from scalelab.perf import comm
from scalelab.perf import moe as moe_mod
from scalelab.perf.compute import (
    BF16_BYTES,
    LayerCompute,
    layer_compute,
    layer_rows,
    optimizer_time,
)
from scalelab.perf.distinct import Distinct, distinct_rows
from scalelab.perf.memory import memory_per_gpu
from scalelab.perf.power import average_power_w
from scalelab.perf.schedule import (
    PassResult,
    module_partition_slowest_stage,
    pipeline_bubble_units,
    simulate_microbatches,
)

PARAM_GATHER_BYTES = BF16_BYTES  # the default of ClusterParams.compute_bytes (GPUs)

ASSUMPTIONS = (
    "bf16 compute with fp32 master weights, gradients reduced in fp32, AdamW (torchtitan defaults)",
    "FSDP2 prefetches one layer ahead; collectives of one data-parallel group share one stream",
    "mesh order pp > dp_replicate > dp_shard > cp > tp (tp innermost, inside NVLink first)",
    "causal flash attention unless --attention math; MFU counts 6N + 12·L·d·s FLOPs per token",
    "with gradient accumulation, gradients are reduced once per step (no_sync on earlier micro-batches)",
    "power is GPU board power only (as NVML reports), not CPU, memory or network",
    *moe_mod.ASSUMPTIONS,
)


@dataclass
class Prediction:
    """The predictor's result: one array per metric (`scalelab.metrics`), one entry per layout."""

    step_time_s: np.ndarray
    tokens_per_s: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    model_tflops_per_gpu: np.ndarray
    compute_s: np.ndarray
    exposed_comm_s: np.ndarray
    exposed_comm_fraction: np.ndarray
    dp_all_gather_s: np.ndarray
    dp_all_gather_exposed_s: np.ndarray
    dp_grad_reduce_s: np.ndarray
    dp_grad_reduce_exposed_s: np.ndarray
    zero_param_all_gather_s: np.ndarray
    tp_comm_s: np.ndarray
    cp_comm_exposed_s: np.ndarray
    pp_p2p_s: np.ndarray
    pp_bubble_s: np.ndarray
    moe_all_to_all_s: np.ndarray
    recompute_s: np.ndarray
    optimizer_s: np.ndarray
    overhead_s: np.ndarray
    memory_parameters_bytes: np.ndarray
    memory_gradients_bytes: np.ndarray
    memory_optimizer_bytes: np.ndarray
    memory_activations_bytes: np.ndarray
    memory_fsdp_buffers_bytes: np.ndarray
    memory_reserve_bytes: np.ndarray
    memory_total_bytes: np.ndarray
    memory_capacity_bytes: np.ndarray
    fits: np.ndarray
    power_w_per_gpu: np.ndarray
    energy_j: np.ndarray
    energy_per_token_j: np.ndarray
    tokens_per_j: np.ndarray
    data_parallel: np.ndarray
    dp_shard: np.ndarray
    dp_replicate: np.ndarray
    n_microbatches: np.ndarray

    def __getitem__(self, key: str) -> np.ndarray:
        """The array of a metric, by its name or a documented alias (`tokens_per_joule`)."""
        value: np.ndarray = getattr(self, canonical(key))
        return value

    def keys(self) -> list[str]:
        return [f.name for f in fields(self)]

    @property
    def values(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __len__(self) -> int:
        return len(self.step_time_s)

    def row(self, i: int) -> dict[str, float | bool]:
        out: dict[str, float | bool] = {}
        for key, arr in self.values.items():
            v = arr[i]
            out[key] = bool(v) if arr.dtype == bool else float(v)
        return out


# The context: built once, read by every parallelism's cost. -----------------------------------
@dataclass(frozen=True)
class StepContext:
    """Arrays over layouts that every parallelism's cost reads, computed once per `predict`."""

    model: ModelSpec
    cluster: ClusterSpec
    table: LayoutTable
    n: int
    tp: np.ndarray
    tp_f: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    dp: np.ndarray
    dp_shard: np.ndarray  # ranks parameters are sharded over (`LayoutTable.dp_shard_for`)
    dp_replicate: np.ndarray
    # Context-parallel ranks hold the same weights, so FSDP shards and gradients reduce over
    # dp_shard x cp (torchtitan's `dp_shard_cp` mesh; Megatron-Core's data-parallel group with
    # context parallelism): the ranks one parameter's shards and gradient reduction span.
    shard_ranks: np.ndarray  # FSDP/HSDP: dp_shard x cp; ZeRO/DDP: dp x cp
    dp_cp: np.ndarray  # every data- and context-parallel rank: dp x cp
    micro_batch: np.ndarray
    seq_len: np.ndarray
    n_microbatches: np.ndarray
    m_f: np.ndarray
    virtual_stages: np.ndarray
    sequence_parallel: np.ndarray  # SP in effect (tp > 1)
    layers_per_stage: np.ndarray  # uneven splits put ceil(L / (pp*v)) layers in the slowest chunk
    call_s: float  # the framework's host-side cost of issuing one collective
    compute: LayerCompute
    moe: moe_mod.MoECost | None  # a MoE model's experts, dispatch and combine (None: dense)
    stack: StackSpec  # the framework's behaviour (config/stack.py; `generic` by default)
    # Gradients reduced on every micro-batch (the stack's choice for this sharding), else once.
    grad_reduces_per_step: np.ndarray
    # Layouts grouped by the columns a cost reads, to price it once per group (None: each row):
    # per-layer compute, TP and CP (micro-batch, seq, tp, cp, SP, fp8, attention); data-parallel
    # collectives (sharding, tp, shard ranks, replicas); pipeline send/recv (pp, gpus and the
    # per-layer columns).
    layer_rows: Distinct | None = None
    dp_rows: Distinct | None = None
    p2p_rows: Distinct | None = None

    @property
    def ones(self) -> np.ndarray:
        return np.ones(self.n, dtype=float)


def build_context(
    model: ModelSpec, cluster: ClusterSpec, table: LayoutTable, stack: StackSpec | None = None
) -> StepContext:
    """The arrays every cost reads. `cluster` should already carry the stack's parameters
    (`StackSpec.cluster_for`, as `predict` does)."""
    stack = stack or load_stack()
    t, pp, cp = table.tp, table.pp, table.cp
    dp = table.dp
    ds = table.dp_shard_for(cluster.gpus_per_node)
    m = table.n_microbatches
    v = table.virtual_stages
    sp = table.sequence_parallel & (t > 1)
    layer_groups = layer_rows(
        table.micro_batch, table.seq_len, t, cp, sp, table.is_fp8, table.attention
    )
    shard_ranks = np.where(table.shards_params, ds, dp) * cp
    dp_replicate = np.maximum(1, dp // np.maximum(ds, 1))
    # Send/recv's buffer reads the per-layer columns: their group number where they are grouped.
    per_layer_key = (
        (layer_groups.inverse,)
        if layer_groups is not None
        else (table.micro_batch, table.seq_len, t, cp, sp)
    )
    compute = layer_compute(
        model,
        cluster,
        micro_batch=table.micro_batch,
        seq_len=table.seq_len,
        tp=t,
        cp=cp,
        sequence_parallel=sp,
        fp8=table.is_fp8,
        attention=table.attention,
        eager_norm=stack.norm_kernel == "eager",
        rows=layer_groups,
    )
    return StepContext(
        model=model,
        cluster=cluster,
        table=table,
        n=len(table),
        tp=t,
        tp_f=t.astype(float),
        pp=pp,
        cp=cp,
        dp=dp,
        dp_shard=ds,
        dp_replicate=dp_replicate,
        shard_ranks=shard_ranks,
        dp_cp=dp * cp,
        micro_batch=table.micro_batch,
        seq_len=table.seq_len,
        n_microbatches=m,
        m_f=m.astype(float),
        virtual_stages=v,
        sequence_parallel=sp,
        layers_per_stage=np.ceil(model.n_layers / (pp * v)) * v,
        call_s=cluster.params.collective_overhead_us * 1e-6,
        compute=compute,
        moe=moe_mod.moe_cost(
            model,
            cluster,
            table,
            tp_f=t.astype(float),
            call_s=cluster.params.collective_overhead_us * 1e-6,
        )
        if model.is_moe
        else None,
        stack=stack,
        grad_reduces_per_step=np.where(
            stack.grad_sync_every_microbatch(table), m.astype(float), 1.0
        ),
        layer_rows=layer_groups,
        dp_rows=distinct_rows(table.sharding, t, shard_ranks, dp_replicate),
        p2p_rows=distinct_rows(pp, table.gpus, *per_layer_key),
    )


# One function per parallelism. ----------------------------------------------------------------
def tensor_parallel(ctx: StepContext) -> np.ndarray:
    """Seconds of TP collectives per layer per pass (forward, or backward), on the critical path:
    AllGather + ReduceScatter twice with sequence parallelism, else AllReduce twice."""
    cluster = ctx.cluster
    t, sp, rows = ctx.tp, ctx.sequence_parallel, ctx.layer_rows
    tp_group = comm.group_shape(t, ctx.ones, cluster)
    act_bytes = (
        cluster.params.compute_bytes * ctx.micro_batch * ctx.seq_len / ctx.cp * ctx.model.d_model
    )
    uses_sp, uses_ar = (t > 1) & sp, (t > 1) & ~sp
    tp_sp = 2.0 * (
        comm.collective_time_where(uses_sp, comm.ALL_GATHER, act_bytes, tp_group, cluster, rows)
        + comm.collective_time_where(
            uses_sp, comm.REDUCE_SCATTER, act_bytes, tp_group, cluster, rows
        )
    )
    tp_ar = 2.0 * comm.collective_time_where(
        uses_ar, comm.ALL_REDUCE, act_bytes, tp_group, cluster, rows
    )
    call_s = ctx.call_s
    return np.where(t > 1, np.where(sp, tp_sp + 4.0 * call_s, tp_ar + 2.0 * call_s), 0.0)


def tensor_parallel_exposed(ctx: StepContext, tp_s: np.ndarray, gemm_s: np.ndarray) -> np.ndarray:
    """TP communication left on the critical path: all of it, or with the stack's TP comm
    overlap (Transformer Engine userbuffers, async TP) the part longer than the GEMMs of the
    same pass it is pipelined with."""
    if not ctx.stack.tp_comm_overlap:
        return tp_s
    return np.maximum(0.0, tp_s - gemm_s)


@dataclass(frozen=True)
class ContextParallelCost:
    """Seconds per layer of CP's K/V ring not hidden behind attention."""

    forward_s: np.ndarray
    backward_s: np.ndarray


def context_parallel(ctx: StepContext) -> ContextParallelCost:
    """CP: the K/V ring (an AllGather of K and V) overlapped with the attention it feeds."""
    cp, lc = ctx.cp, ctx.compute
    cp_group = comm.group_shape(cp, ctx.tp, ctx.cluster)
    kv_local = ctx.model.kv_dim * ctx.model.kv_replication(ctx.tp_f) / ctx.tp_f
    kv_bytes = 2.0 * ctx.cluster.params.compute_bytes * ctx.micro_batch * ctx.seq_len * kv_local
    cp_ring = comm.collective_time_where(
        cp > 1, comm.ALL_GATHER, kv_bytes, cp_group, ctx.cluster, ctx.layer_rows
    )
    return ContextParallelCost(
        forward_s=np.where(cp > 1, np.maximum(0.0, cp_ring - lc.attention_forward_s), 0.0),
        backward_s=np.where(
            cp > 1, np.maximum(0.0, 2.0 * cp_ring - 2.5 * lc.attention_forward_s), 0.0
        ),
    )


def recomputation(ctx: StepContext, tp_layer: np.ndarray, cp: ContextParallelCost) -> np.ndarray:
    """Seconds per layer that recomputation adds to backward: the whole forward (with its TP and
    CP communication) for `full`; for `selective`, the attention core and element-wise ops, or
    with the stack's per-op policy (torchtitan) every second matmul, the element-wise ops and
    the TP collectives that feed the matmuls (AllGathers with SP, else the AllReduces; the
    ReduceScatters are saved)."""
    lc, table = ctx.compute, ctx.table
    if ctx.stack.selective_recompute == "alternate-matmuls":
        tp_fed = np.where(ctx.sequence_parallel, 0.5, 1.0) * tp_layer
        selective = lc.alternate_gemm_forward_s + lc.elementwise_forward_s + tp_fed
    else:
        selective = lc.attention_forward_s + lc.elementwise_forward_s
    return np.where(
        table.recompute_full,
        lc.forward_s + tp_layer + cp.forward_s,
        np.where(table.recompute_selective, selective, 0.0),
    )


@dataclass(frozen=True)
class DataParallelCost:
    """Per-layer (and root: embedding, final norm, head) data-parallel collectives."""

    all_gather_s: np.ndarray
    grad_reduce_s: np.ndarray
    root_all_gather_s: np.ndarray
    root_grad_reduce_s: np.ndarray
    shard_group: comm.GroupShape
    root_params: Any  # parameters outside the layers, per TP rank


def data_parallel(ctx: StepContext) -> DataParallelCost:
    """FSDP/HSDP: AllGather each layer's parameters, ReduceScatter its gradients (then HSDP's
    AllReduce across replicas); ZeRO-1/2: ReduceScatter; DDP: AllReduce."""
    model, cluster, table = ctx.model, ctx.cluster, ctx.table
    dp_cp, tp_f = ctx.dp_cp, ctx.tp_f
    full_shard = table.shards_params
    rows = ctx.dp_rows  # what the collectives below read: sharding, tp, shard ranks, replicas
    # The shard group spans dp_shard x cp (cp inside dp_shard in the mesh: stride tp).
    shard_group = comm.group_shape(ctx.shard_ranks, ctx.tp, cluster)
    replica_group = comm.group_shape(ctx.dp_replicate, ctx.tp * ctx.shard_ranks, cluster)
    layer_params = moe_mod.layer_params_per_tp_rank(model, tp_f)  # routed experts: below
    layer_param_bytes = cluster.params.compute_bytes * layer_params  # bf16 on GPUs
    layer_grad_bytes = ctx.stack.grad_reduce_bytes * layer_params
    # Each collective is priced only for the layouts that issue it (0 elsewhere).
    ag = comm.collective_time_where(
        full_shard, comm.ALL_GATHER, layer_param_bytes, shard_group, cluster, rows
    )
    rs_shard = comm.collective_time_where(
        ~table.is_ddp, comm.REDUCE_SCATTER, layer_grad_bytes, shard_group, cluster, rows
    )
    ar_replica = comm.collective_time_where(
        table.is_hsdp,
        comm.ALL_REDUCE,
        layer_grad_bytes / np.maximum(ctx.shard_ranks, 1),
        replica_group,
        cluster,
        rows,
    )
    ar_full = comm.collective_time_where(
        table.is_ddp, comm.ALL_REDUCE, layer_grad_bytes, shard_group, cluster, rows
    )
    zero_reduce = rs_shard
    if ctx.stack.zero1_grad_reduce == "all_reduce":  # the stack's ZeRO-1 all-reduces everything
        zero1 = table.is_zero & ~table.is_zero2
        zero_reduce = np.where(
            zero1,
            comm.collective_time_where(
                zero1, comm.ALL_REDUCE, layer_grad_bytes, shard_group, cluster, rows
            ),
            rs_shard,
        )
    grad_reduce = np.where(
        full_shard,
        rs_shard + np.where(table.is_hsdp, ar_replica, 0.0),
        np.where(table.is_zero, zero_reduce, ar_full),
    )
    grad_reduce = np.where(dp_cp > 1, grad_reduce + ctx.call_s, 0.0)
    # DDP with buckets (`ddp_bucket_mib` > 0, CPU): no per-layer AllReduce (`ddp_buckets`).
    grad_reduce = np.where(bucketed_ddp(ctx), 0.0, grad_reduce)
    ag = np.where((ctx.shard_ranks > 1) & full_shard, ag + ctx.call_s, 0.0)
    root_params = (model.input_embedding_params + model.output_params + model.norm_params) / tp_f
    root_scale = root_params / layer_params
    e = ctx.moe  # a MoE model's experts: their own collectives over expert_dp, on the same stream
    return DataParallelCost(
        all_gather_s=ag if e is None else ag + e.expert_all_gather_s,
        grad_reduce_s=grad_reduce if e is None else grad_reduce + e.expert_grad_reduce_s,
        root_all_gather_s=ag * root_scale,
        root_grad_reduce_s=grad_reduce * root_scale,
        shard_group=shard_group,
        root_params=root_params,
    )


@dataclass(frozen=True)
class StepCost:
    """One step's main loop (without optimizer and fixed overhead)."""

    time_s: np.ndarray
    compute_busy_s: np.ndarray
    dp_exposed_s: np.ndarray
    bubble_s: np.ndarray
    p2p_s: np.ndarray
    interfered_s: np.ndarray  # compute with a data-parallel collective resident beside it


def flat_step(
    ctx: StepContext, fwd: np.ndarray, bwd: np.ndarray, dpc: DataParallelCost
) -> StepCost:
    """No pipeline: micro-batches on the simulated compute and communication streams; gradients
    are reduced with the last one. Simulated only for the layouts without a pipeline (0 for the
    others, which `pipeline_parallel` prices)."""
    lc = ctx.compute
    zeros = np.zeros(ctx.n)
    rows = np.flatnonzero(ctx.pp <= 1)
    if not len(rows):
        return StepCost(zeros, zeros, zeros, zeros, zeros, zeros)
    every = len(rows) == ctx.n

    def take(values: np.ndarray) -> np.ndarray:
        return values if every else values[rows]

    # A stack that reduces gradients after the last backward (`grad_reduce_overlap` False), or
    # on the compute stream (`grad_reduce_overlap_with_model_parallel` False, tp x pp > 1), pays
    # the whole reduction once per reduction, exposed, after the simulated passes.
    overlaps = ctx.stack.grad_reduce_overlaps(ctx.table)
    if isinstance(overlaps, bool):
        overlap: float | np.ndarray = float(overlaps)
        after = (
            0.0
            if overlaps
            else take(ctx.model.n_layers * dpc.grad_reduce_s + dpc.root_grad_reduce_s)
        )
    else:
        overlap = take(overlaps).astype(float)
        after = (1.0 - overlap) * take(
            ctx.model.n_layers * dpc.grad_reduce_s + dpc.root_grad_reduce_s
        )
    common: dict[str, Any] = dict(
        n_layers=ctx.model.n_layers,
        forward_s=take(fwd),
        backward_s=take(bwd),
        head_forward_s=take(lc.head_forward_s),
        head_backward_s=take(lc.head_backward_s),
        all_gather_s=take(dpc.all_gather_s),
        grad_reduce_s=take(dpc.grad_reduce_s) * overlap,
        root_all_gather_s=take(dpc.root_all_gather_s),
        root_grad_reduce_s=take(dpc.root_grad_reduce_s) * overlap,
        gather_in_backward=take(ctx.table.reshard_after_forward),
        interference=ctx.cluster.overlap_interference,
    )
    last, other = simulate_microbatches(**common)  # with and without the gradient reduction
    m_f = take(ctx.m_f)
    # A stack that reduces gradients on every micro-batch runs `last` m times.
    sync_each = take(ctx.grad_reduces_per_step) > 1.0
    other = PassResult(
        **{
            f.name: np.where(sync_each, getattr(last, f.name), getattr(other, f.name))
            for f in fields(PassResult)
        }
    )

    def scatter(values: np.ndarray) -> np.ndarray:
        if every:
            return values
        full = np.zeros(ctx.n)
        full[rows] = values
        return full

    after_total = after * np.where(sync_each, m_f, 1.0)
    return StepCost(
        time_s=scatter(last.time_s + (m_f - 1.0) * other.time_s + after_total),
        compute_busy_s=scatter(last.compute_busy_s + (m_f - 1.0) * other.compute_busy_s),
        dp_exposed_s=scatter(
            last.exposed_comm_s + (m_f - 1.0) * other.exposed_comm_s + after_total
        ),
        bubble_s=zeros,
        p2p_s=zeros,
        interfered_s=scatter(last.interfered_s + (m_f - 1.0) * other.interfered_s),
    )


def pipeline_parallel(
    ctx: StepContext, fwd: np.ndarray, bwd: np.ndarray, dpc: DataParallelCost
) -> StepCost:
    """PP: each stage runs every micro-batch's forward and backward plus the schedule's bubble
    and the activations' send/recv; FSDP's collectives happen once per step and overlap per
    layer (the part that does not, and the slowdown of the part that does, is exposed)."""
    lc, pp, v, m_f = ctx.compute, ctx.pp, ctx.virtual_stages, ctx.m_f
    layers_per_stage = ctx.layers_per_stage
    ag, grad_reduce = dpc.all_gather_s, dpc.grad_reduce_s
    if ctx.stack.pp_partition == "modules":
        # The slowest stage of a uniform split of the module list (the head's stage holds fewer
        # layers); the data-parallel terms below keep ceil(L / (pp*v)) layers.
        stage_layers, stage_head = module_partition_slowest_stage(
            ctx.model.n_layers,
            pp,
            v,
            fwd + bwd,
            lc.head_forward_s + lc.head_backward_s,
        )
    else:
        stage_layers, stage_head = layers_per_stage, np.ones_like(layers_per_stage)
    stage_fwd = stage_layers * fwd + stage_head * lc.head_forward_s
    stage_bwd = stage_layers * bwd + stage_head * lc.head_backward_s
    bubble_units = pipeline_bubble_units(pp, v, ctx.table.pp_schedule)
    bubble = bubble_units * (stage_fwd + stage_bwd)
    p2p_group = comm.group_shape(2 * ctx.ones.astype(np.int64), ctx.table.gpus // pp, ctx.cluster)
    p2p_bytes = (
        ctx.cluster.params.compute_bytes
        * ctx.micro_batch
        * ctx.seq_len
        / ctx.cp
        * ctx.model.d_model
        / np.where(ctx.sequence_parallel, ctx.tp_f, 1.0)
    )
    p2p = comm.collective_time_where(
        pp > 1, comm.SEND_RECV, p2p_bytes, p2p_group, ctx.cluster, ctx.p2p_rows
    )
    if ctx.stack.pp_p2p_overlap:
        # Steady-state transfers hide behind the next micro-batch's chunk (Megatron's
        # overlap_p2p_comm); warm-up and cool-down transfers stay exposed.
        chunk_s = stage_fwd / v
        p2p_total = 2.0 * v * ((pp - 1.0) * p2p + m_f * np.maximum(0.0, p2p - chunk_s))
    else:
        p2p_total = 2.0 * v * (m_f + pp - 1.0) * p2p
    # Compute beside a resident data-parallel collective runs slower (`overlap_interference`);
    # the part of a collective longer than the compute it hides behind is exposed. Gradients
    # reduce once per step, or on every micro-batch where the stack does so.
    reduces = ctx.grad_reduces_per_step
    slow = ctx.cluster.overlap_interference
    # Without `grad_reduce_overlap` the stack reduces every gradient after the last backward
    # (or, for `grad_reduce_overlap_with_model_parallel` False, on the compute stream).
    hidden_reduce = np.where(
        ctx.stack.grad_reduce_overlaps(ctx.table), np.minimum(grad_reduce, bwd), 0.0
    )
    interfered = layers_per_stage * (np.minimum(ag, fwd) + reduces * hidden_reduce)
    dp_exposed = (
        layers_per_stage * (np.maximum(0.0, ag - fwd) + reduces * (grad_reduce - hidden_reduce))
        + dpc.root_all_gather_s
        + reduces * dpc.root_grad_reduce_s
    )
    compute = m_f * (stage_fwd + stage_bwd) + slow * interfered
    return StepCost(
        time_s=compute + bubble + p2p_total + dp_exposed,
        compute_busy_s=compute,
        dp_exposed_s=dp_exposed,
        bubble_s=bubble,
        p2p_s=p2p_total,
        interfered_s=interfered,
    )


def stage_parameters(ctx: StepContext, dpc: DataParallelCost) -> np.ndarray:
    """Parameters one rank holds before data-parallel sharding: its stage's layers and root."""
    is_pp = ctx.pp > 1
    return ctx.layers_per_stage * moe_mod.layer_params_per_tp_rank(ctx.model, ctx.tp_f) + np.where(
        is_pp, dpc.root_params / 2, dpc.root_params
    )


def bucketed_ddp(ctx: StepContext) -> np.ndarray:
    """Layouts whose gradients DDP reduces in buckets (`ddp_bucket_mib` > 0): DDP, and ZeRO-1,
    which the harness runs as DDP with PyTorch's ZeroRedundancyOptimizer."""
    table = ctx.table
    if ctx.cluster.params.ddp_bucket_mib <= 0:
        return np.zeros(ctx.n, dtype=bool)
    return table.is_ddp | (table.is_zero & ~table.is_zero2)


def ddp_buckets(ctx: StepContext, dpc: DataParallelCost) -> np.ndarray:
    """DDP's bucketed gradient AllReduces after the last backward (`ddp_bucket_mib` > 0): one
    per bucket, each with its host call, exposed (small models fill one bucket, issued at the
    end of backward); 0 where DDP reduces per layer (the default) or for other shardings."""
    bucket = ctx.cluster.params.ddp_bucket_mib * 2**20
    if bucket <= 0:
        return np.zeros(ctx.n)
    grad_bytes = ctx.stack.grad_reduce_bytes * stage_parameters(ctx, dpc)
    n_buckets = np.maximum(1.0, np.ceil(grad_bytes / bucket))
    issues = bucketed_ddp(ctx) & (ctx.dp_cp > 1)
    ar = comm.collective_time_where(
        issues, comm.ALL_REDUCE, grad_bytes / n_buckets, dpc.shard_group, ctx.cluster
    )
    return np.where(issues, n_buckets * (ar + ctx.call_s), 0.0) * ctx.grad_reduces_per_step


def optimizer_step(ctx: StepContext, dpc: DataParallelCost) -> tuple[np.ndarray, np.ndarray]:
    """AdamW over the parameters this GPU owns, and ZeRO-1/2's parameter AllGather after it."""
    table = ctx.table
    stage_params = stage_parameters(ctx, dpc)
    opt_div = np.where(table.is_ddp, 1, ctx.shard_ranks)
    local_params = stage_params / opt_div
    if ctx.moe is not None:  # routed experts: sharded over expert_dp
        experts = ctx.layers_per_stage * ctx.moe.expert_params_per_rank
        stage_params = stage_params + experts
        local_params = local_params + experts / np.where(table.is_ddp, 1, ctx.moe.expert_shard)
    optimizer_s = optimizer_time(local_params, ctx.cluster)
    gathers = table.is_zero & (ctx.dp_cp > 1)
    zero_ag = comm.collective_time_where(
        gathers, comm.ALL_GATHER, ctx.cluster.params.compute_bytes * stage_params,
        dpc.shard_group, ctx.cluster,
    )  # fmt: skip
    return optimizer_s, zero_ag + np.where(gathers, ctx.call_s, 0.0)


# The composition. ------------------------------------------------------------------------------
def _select(is_pp: np.ndarray, pipelined: StepCost, flat: StepCost) -> StepCost:
    return StepCost(
        **{
            f.name: np.where(is_pp, getattr(pipelined, f.name), getattr(flat, f.name))
            for f in fields(StepCost)
        }
    )


def predict(
    model: ModelSpec,
    cluster: ClusterSpec,
    table: LayoutTable,
    stack: StackSpec | None = None,
) -> Prediction:
    """Predict step time, throughput, MFU, breakdown, memory and power for every layout, as
    `stack` (default `generic`) runs it: its parameters replace the cluster's where it sets them."""
    stack = stack or load_stack()
    cluster = stack.cluster_for(cluster)
    ctx = build_context(model, cluster, table, stack)
    lc = ctx.compute

    tp_layer = tensor_parallel(ctx)
    tp_forward = tensor_parallel_exposed(ctx, tp_layer, lc.gemm_forward_s)
    tp_backward = tensor_parallel_exposed(ctx, tp_layer, 2.0 * lc.gemm_forward_s)
    cpc = context_parallel(ctx)
    recompute_layer = recomputation(ctx, tp_forward, cpc)
    fwd = lc.forward_s + tp_forward + cpc.forward_s
    bwd = lc.backward_s + tp_backward + cpc.backward_s + recompute_layer
    e = ctx.moe
    if e is not None:  # experts in place of the dense FFN (full recompute reruns them)
        recompute_layer = recompute_layer + np.where(table.recompute_full, e.forward_s, 0.0)
        fwd, bwd = (
            fwd + e.forward_s,
            bwd + e.backward_s + np.where(table.recompute_full, e.forward_s, 0.0),
        )
    dpc = data_parallel(ctx)

    is_pp = ctx.pp > 1
    main = _select(is_pp, pipeline_parallel(ctx, fwd, bwd, dpc), flat_step(ctx, fwd, bwd, dpc))
    optimizer_s, zero_ag = optimizer_step(ctx, dpc)
    overhead_s = np.full(ctx.n, cluster.params.step_overhead_ms * 1e-3)
    ddp_bucketed = ddp_buckets(ctx, dpc)
    step = main.time_s + optimizer_s + zero_ag + overhead_s + ddp_bucketed

    # Totals per step, for the breakdown.
    m_f, layers = ctx.m_f, ctx.layers_per_stage
    tp_total = m_f * layers * (tp_forward * np.where(table.recompute_full, 2.0, 1.0) + tp_backward)
    cp_total = m_f * layers * (cpc.forward_s + cpc.backward_s)
    recompute_total = m_f * layers * recompute_layer
    passes_with_ag = np.where(is_pp, 1.0, m_f) * np.where(table.reshard_after_forward, 2.0, 1.0)
    ag_total = layers * dpc.all_gather_s * passes_with_ag + dpc.root_all_gather_s * np.where(
        is_pp, 1.0, m_f
    )
    reduce_total = (
        layers * dpc.grad_reduce_s + dpc.root_grad_reduce_s
    ) * ctx.grad_reduces_per_step + ddp_bucketed
    dp_total = ag_total + reduce_total
    share_ag = np.where(dp_total > 0, ag_total / np.maximum(dp_total, 1e-30), 0.0)
    a2a_total = np.zeros(ctx.n)
    if e is not None:
        a2a_layer = e.all_to_all_forward_s * np.where(table.recompute_full, 2.0, 1.0)
        a2a_total = m_f * layers * (a2a_layer + e.all_to_all_backward_s)
    exposed_comm = (
        main.dp_exposed_s + tp_total + cp_total + main.p2p_s + zero_ag + a2a_total + ddp_bucketed
    )
    compute_s = main.compute_busy_s - tp_total - cp_total - a2a_total

    # Throughput and utilisation (definitions in scalelab.config.model).
    s = ctx.seq_len
    tokens_per_s = table.global_batch * s / step
    gpus = table.gpus.astype(float)
    peak = np.where(table.is_fp8, cluster.gpu.peak_flops("fp8"), cluster.gpu.peak_flops("bf16"))
    model_flops = model.model_flops_per_token(s)
    hardware_flops = model_flops + model.recompute_flops_per_token(table.recompute, s)

    full_shard = table.shards_params
    mem = memory_per_gpu(
        model,
        cluster,
        tp=ctx.tp,
        pp=ctx.pp,
        cp=ctx.cp,
        dp=ctx.dp_cp,
        dp_shard=ctx.shard_ranks,
        sharding=table.sharding,
        micro_batch=ctx.micro_batch,
        seq_len=s,
        n_microbatches=ctx.n_microbatches,
        virtual_stages=ctx.virtual_stages,
        schedule=table.pp_schedule,
        recompute=table.recompute,
        sequence_parallel=ctx.sequence_parallel,
        math_attention=table.materialises_scores,
        moe=ctx.moe,
        selective_alternate=ctx.stack.selective_recompute == "alternate-matmuls",
        cross_entropy=ctx.stack.cross_entropy,
        tp_saves_gathered_inputs=ctx.stack.tp_saves_gathered_inputs,
        layer_rows=ctx.layer_rows,
    )
    power = average_power_w(
        cluster,
        step_time_s=step,
        compute_s=compute_s + optimizer_s,
        interfered_s=main.interfered_s,
        comm_only_s=exposed_comm,
    )
    energy_per_token = power * gpus / tokens_per_s

    return Prediction(
        step_time_s=step,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / gpus,
        mfu=flops_utilisation(model_flops, tokens_per_s, gpus, peak),
        hfu=flops_utilisation(hardware_flops, tokens_per_s, gpus, peak),
        model_tflops_per_gpu=model_tflops_per_gpu(model_flops, tokens_per_s, gpus),
        compute_s=compute_s,
        exposed_comm_s=exposed_comm,
        exposed_comm_fraction=exposed_comm / step,
        dp_all_gather_s=ag_total,
        dp_all_gather_exposed_s=main.dp_exposed_s * share_ag,
        dp_grad_reduce_s=reduce_total,
        dp_grad_reduce_exposed_s=main.dp_exposed_s * (1.0 - share_ag),
        zero_param_all_gather_s=zero_ag,
        tp_comm_s=tp_total,
        cp_comm_exposed_s=cp_total,
        pp_p2p_s=main.p2p_s,
        pp_bubble_s=main.bubble_s,
        moe_all_to_all_s=a2a_total,
        recompute_s=recompute_total,
        optimizer_s=optimizer_s,
        overhead_s=overhead_s,
        memory_parameters_bytes=mem.parameters_bytes,
        memory_gradients_bytes=mem.gradients_bytes,
        memory_optimizer_bytes=mem.optimizer_bytes,
        memory_activations_bytes=mem.activations_bytes,
        memory_fsdp_buffers_bytes=mem.fsdp_buffers_bytes,
        memory_reserve_bytes=mem.reserve_bytes,
        memory_total_bytes=mem.total_bytes,
        memory_capacity_bytes=np.full(ctx.n, cluster.gpu.hbm_bytes),
        fits=mem.total_bytes <= cluster.gpu.hbm_bytes,
        power_w_per_gpu=power,
        energy_j=power * gpus * step,
        energy_per_token_j=energy_per_token,
        tokens_per_j=1.0 / energy_per_token,
        data_parallel=ctx.dp.astype(float),
        dp_shard=np.where(full_shard, ctx.dp_shard, ctx.dp).astype(float),
        dp_replicate=np.where(table.is_hsdp, ctx.dp_replicate, 1).astype(float),
        n_microbatches=m_f,
    )


def predict_layout(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, stack: StackSpec | None = None
) -> dict[str, Any]:
    """Predict one layout (rule-checked first, then against what the stack offers): a flat dict
    with every field and the assumptions."""
    stack = stack or load_stack()
    check(layout, model, cluster)
    stack.check(layout, model, cluster.gpus_per_node)
    row = predict(model, cluster, LayoutTable.from_layouts([layout]), stack).row(0)
    return {
        "model": model.name,
        "cluster": cluster.name,
        "stack": stack.name,
        "gpu": cluster.gpu.name,
        "layout": layout.model_dump(),
        **row,
        "assumptions": list(ASSUMPTIONS),
    }
