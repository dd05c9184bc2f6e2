"""The predictor: one training step of many layouts at once, and its breakdown.

`predict(model, cluster, table)` evaluates every layout in a `LayoutTable` with numpy arrays and
returns a `Prediction` of named arrays; `predict_layout` is the one-layout convenience that
returns a flat, JSON-ready dict (the fields `scalelab predict --json` prints).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout, LayoutTable, check
from scalelab.config.model import ModelSpec, flops_utilisation
from scalelab.metrics import canonical
from scalelab.perf import comm
from scalelab.perf.compute import BF16_BYTES, FP32_BYTES, layer_compute, optimizer_time
from scalelab.perf.memory import memory_per_gpu
from scalelab.perf.power import average_power_w
from scalelab.perf.schedule import pipeline_bubble_units, simulate_microbatch

GRAD_REDUCE_BYTES = FP32_BYTES
PARAM_GATHER_BYTES = BF16_BYTES

ASSUMPTIONS = (
    "bf16 compute with fp32 master weights, gradients reduced in fp32, AdamW (torchtitan defaults)",
    "FSDP2 prefetches one layer ahead; collectives of one data-parallel group share one stream",
    "mesh order pp > dp_replicate > dp_shard > cp > tp (tp innermost, inside NVLink first)",
    "causal flash attention unless --attention math; MFU counts 6N + 12·L·d·s FLOPs per token",
    "with gradient accumulation, gradients are reduced once per step (no_sync on earlier micro-batches)",
    "power is GPU board power only (as NVML reports), not CPU, memory or network",
)


@dataclass
class Prediction:
    """Named arrays, one entry per layout."""

    values: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.values[canonical(key)]

    def keys(self) -> list[str]:
        return list(self.values)

    def __len__(self) -> int:
        return len(next(iter(self.values.values())))

    def row(self, i: int) -> dict[str, float | bool]:
        out: dict[str, float | bool] = {}
        for key, arr in self.values.items():
            v = arr[i]
            out[key] = bool(v) if arr.dtype == bool else float(v)
        return out


def _ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=float)


def predict(model: ModelSpec, cluster: ClusterSpec, table: LayoutTable) -> Prediction:
    """Predict step time, throughput, MFU, breakdown, memory and power for every layout."""
    p = cluster.params
    n = len(table)
    L = model.n_layers
    t, pp, cp = table.tp, table.pp, table.cp
    dp = table.dp
    ds = table.dp_shard_for(cluster.gpus_per_node)
    dr = np.maximum(1, dp // np.maximum(ds, 1))
    m = table.n_microbatches
    v = table.virtual_stages
    mb, s = table.micro_batch, table.seq_len
    sharding = table.sharding
    sp = table.sequence_parallel & (t > 1)
    fp8 = table.is_fp8
    materialised_scores = table.materialises_scores
    recompute = table.recompute
    tp_f = t.astype(float)

    lc = layer_compute(
        model,
        cluster,
        micro_batch=mb,
        seq_len=s,
        tp=t,
        cp=cp,
        sequence_parallel=sp,
        fp8=fp8,
        attention=table.attention,
    )

    # Tensor parallelism: collectives of the activations on the critical path.
    tp_group = comm.group_shape(t, _ones(n), cluster)
    act_bytes = BF16_BYTES * mb * s / cp * model.d_model
    tp_sp = 2.0 * (
        comm.collective_time(comm.ALL_GATHER, act_bytes, tp_group, cluster)
        + comm.collective_time(comm.REDUCE_SCATTER, act_bytes, tp_group, cluster)
    )
    tp_ar = 2.0 * comm.collective_time(comm.ALL_REDUCE, act_bytes, tp_group, cluster)
    # The framework's host-side cost of issuing one collective (hooks, copies, launch).
    call_s = p.collective_overhead_us * 1e-6
    tp_layer = np.where(t > 1, np.where(sp, tp_sp + 4.0 * call_s, tp_ar + 2.0 * call_s), 0.0)

    # Context parallelism: K/V ring overlapped with attention.
    cp_group = comm.group_shape(cp, t, cluster)
    kv_bytes = 2.0 * BF16_BYTES * mb * s * model.kv_dim / tp_f
    cp_ring = comm.collective_time(comm.ALL_GATHER, kv_bytes, cp_group, cluster)
    cp_fwd = np.where(cp > 1, np.maximum(0.0, cp_ring - lc.attention_forward_s), 0.0)
    cp_bwd = np.where(cp > 1, np.maximum(0.0, 2.0 * cp_ring - 2.5 * lc.attention_forward_s), 0.0)

    # Recomputation in backward.
    recompute_layer = np.where(
        table.recompute_full,
        lc.forward_s + tp_layer + cp_fwd,
        np.where(table.recompute_selective, lc.attention_forward_s + lc.elementwise_forward_s, 0.0),
    )
    fwd = lc.forward_s + tp_layer + cp_fwd
    bwd = lc.backward_s + tp_layer + cp_bwd + recompute_layer

    # Data parallelism.
    full_shard = table.shards_params
    zero12 = table.is_zero
    shard_group = comm.group_shape(np.where(full_shard, ds, dp), t * cp, cluster)
    replica_group = comm.group_shape(dr, t * cp * ds, cluster)
    layer_param_bytes = PARAM_GATHER_BYTES * model.layer_params / tp_f
    layer_grad_bytes = GRAD_REDUCE_BYTES * model.layer_params / tp_f
    ag = np.where(
        full_shard,
        comm.collective_time(comm.ALL_GATHER, layer_param_bytes, shard_group, cluster),
        0.0,
    )
    rs_shard = comm.collective_time(comm.REDUCE_SCATTER, layer_grad_bytes, shard_group, cluster)
    ar_replica = comm.collective_time(
        comm.ALL_REDUCE, layer_grad_bytes / np.maximum(ds, 1), replica_group, cluster
    )
    ar_full = comm.collective_time(comm.ALL_REDUCE, layer_grad_bytes, shard_group, cluster)
    grad_reduce = np.where(
        full_shard,
        rs_shard + np.where(table.is_hsdp, ar_replica, 0.0),
        np.where(zero12, rs_shard, ar_full),
    )
    grad_reduce = np.where(dp > 1, grad_reduce + call_s, 0.0)
    ag = np.where((dp > 1) & full_shard, ag + call_s, 0.0)
    root_params = (model.input_embedding_params + model.output_params + model.norm_params) / tp_f
    root_scale = root_params / model.layer_params * tp_f
    root_ag = ag * root_scale
    root_rs = grad_reduce * root_scale

    # Non-pipelined step: simulated streams.
    common: dict[str, Any] = dict(
        n_layers=L,
        forward_s=fwd,
        backward_s=bwd,
        head_forward_s=lc.head_forward_s,
        head_backward_s=lc.head_backward_s,
        all_gather_s=ag,
        grad_reduce_s=grad_reduce,
        root_all_gather_s=root_ag,
        root_grad_reduce_s=root_rs,
        gather_in_backward=table.reshard_after_forward,
        overlap_slowdown=p.overlap_slowdown,
    )
    last = simulate_microbatch(sync_grads=True, **common)
    other = simulate_microbatch(sync_grads=False, **common)
    m_f = m.astype(float)
    flat_time = last.time_s + (m_f - 1.0) * other.time_s
    flat_busy = last.compute_busy_s + (m_f - 1.0) * other.compute_busy_s
    flat_exposed = last.exposed_comm_s + (m_f - 1.0) * other.exposed_comm_s

    # Pipelined step.
    # Uneven splits put ceil(L / (pp*v)) layers in the slowest chunk.
    layers_per_stage = np.ceil(L / (pp * v)) * v
    stage_fwd = layers_per_stage * fwd + lc.head_forward_s
    stage_bwd = layers_per_stage * bwd + lc.head_backward_s
    bubble_units = pipeline_bubble_units(pp, v, table.pp_schedule)
    bubble = bubble_units * (stage_fwd + stage_bwd)
    p2p_group = comm.group_shape(2 * _ones(n).astype(np.int64), table.gpus // pp, cluster)
    p2p_bytes = BF16_BYTES * mb * s / cp * model.d_model / np.where(sp, tp_f, 1.0)
    p2p = comm.collective_time(comm.SEND_RECV, p2p_bytes, p2p_group, cluster)
    p2p_total = 2.0 * v * (m_f + pp - 1.0) * p2p
    slow = p.overlap_slowdown
    dp_exposed_pp = (
        layers_per_stage
        * (
            np.maximum(0.0, ag - fwd)
            + slow * np.minimum(ag, fwd)
            + np.maximum(0.0, grad_reduce - bwd)
            + slow * np.minimum(grad_reduce, bwd)
        )
        + root_ag
        + root_rs
    )
    pp_compute = m_f * (stage_fwd + stage_bwd)
    pp_time = pp_compute + bubble + p2p_total + dp_exposed_pp

    is_pp = pp > 1
    main_time = np.where(is_pp, pp_time, flat_time)
    compute_busy = np.where(is_pp, pp_compute, flat_busy)
    dp_exposed = np.where(is_pp, dp_exposed_pp, flat_exposed)
    bubble_s = np.where(is_pp, bubble, 0.0)
    p2p_s = np.where(is_pp, p2p_total, 0.0)

    # Optimizer, ZeRO's parameter AllGather, fixed per-step overhead.
    stage_params = layers_per_stage * model.layer_params / tp_f + np.where(
        is_pp, root_params / 2, root_params
    )
    opt_div = np.where(table.is_ddp, 1, np.where(zero12, dp, ds))
    optimizer_s = optimizer_time(stage_params / opt_div, cluster)
    zero_ag = np.where(
        zero12 & (dp > 1),
        comm.collective_time(
            comm.ALL_GATHER, PARAM_GATHER_BYTES * stage_params, shard_group, cluster
        ),
        0.0,
    )
    overhead_s = np.full(n, p.step_overhead_ms * 1e-3)
    step = main_time + optimizer_s + zero_ag + overhead_s

    tp_total = m_f * layers_per_stage * tp_layer * np.where(table.recompute_full, 3.0, 2.0)
    cp_total = m_f * layers_per_stage * (cp_fwd + cp_bwd)
    recompute_total = m_f * layers_per_stage * recompute_layer
    passes_with_ag = np.where(is_pp, 1.0, m_f) * np.where(table.reshard_after_forward, 2.0, 1.0)
    ag_total = layers_per_stage * ag * passes_with_ag + root_ag * np.where(is_pp, 1.0, m_f)
    reduce_total = layers_per_stage * grad_reduce + root_rs
    dp_total = ag_total + reduce_total
    share_ag = np.where(dp_total > 0, ag_total / np.maximum(dp_total, 1e-30), 0.0)
    exposed_comm = dp_exposed + tp_total + cp_total + p2p_s + zero_ag
    compute_s = compute_busy - tp_total - cp_total

    tokens_per_step = table.global_batch * s
    tokens_per_s = tokens_per_step / step
    gpus = table.gpus.astype(float)
    peak = np.where(fp8, cluster.gpu.peak_flops("fp8"), cluster.gpu.peak_flops("bf16"))
    model_flops = model.model_flops_per_token(s)
    hardware_flops = model_flops + model.recompute_flops_per_token(recompute, s)
    mfu = flops_utilisation(model_flops, tokens_per_s, gpus, peak)
    hfu = flops_utilisation(hardware_flops, tokens_per_s, gpus, peak)

    mem = memory_per_gpu(
        model,
        cluster,
        tp=t,
        pp=pp,
        cp=cp,
        dp=dp,
        dp_shard=np.where(full_shard, ds, dp),
        sharding=sharding,
        micro_batch=mb,
        seq_len=s,
        n_microbatches=m,
        virtual_stages=v,
        schedule=table.pp_schedule,
        recompute=recompute,
        sequence_parallel=sp,
        math_attention=materialised_scores,
    )
    memory_total = mem.total_bytes
    power = average_power_w(cluster, step, compute_busy + optimizer_s, exposed_comm)
    energy_per_token = power * gpus / tokens_per_s

    values = {
        "step_time_s": step,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / gpus,
        "mfu": mfu,
        "hfu": hfu,
        "compute_s": compute_s,
        "exposed_comm_s": exposed_comm,
        "exposed_comm_fraction": exposed_comm / step,
        "dp_all_gather_s": ag_total,
        "dp_all_gather_exposed_s": dp_exposed * share_ag,
        "dp_grad_reduce_s": reduce_total,
        "dp_grad_reduce_exposed_s": dp_exposed * (1.0 - share_ag),
        "zero_param_all_gather_s": zero_ag,
        "tp_comm_s": tp_total,
        "cp_comm_exposed_s": cp_total,
        "pp_p2p_s": p2p_s,
        "pp_bubble_s": bubble_s,
        "recompute_s": recompute_total,
        "optimizer_s": optimizer_s,
        "overhead_s": overhead_s,
        "memory_parameters_bytes": mem.parameters_bytes,
        "memory_gradients_bytes": mem.gradients_bytes,
        "memory_optimizer_bytes": mem.optimizer_bytes,
        "memory_activations_bytes": mem.activations_bytes,
        "memory_fsdp_buffers_bytes": mem.fsdp_buffers_bytes,
        "memory_reserve_bytes": mem.reserve_bytes,
        "memory_total_bytes": memory_total,
        "memory_capacity_bytes": np.full(n, cluster.gpu.hbm_bytes),
        "fits": memory_total <= cluster.gpu.hbm_bytes,
        "power_w_per_gpu": power,
        "energy_per_token_j": energy_per_token,
        "energy_j": power * gpus * step,
        "tokens_per_j": 1.0 / energy_per_token,
        "data_parallel": dp.astype(float),
        "dp_shard": np.where(full_shard, ds, dp).astype(float),
        "dp_replicate": np.where(table.is_hsdp, dr, 1).astype(float),
        "n_microbatches": m_f,
    }
    return Prediction(values)


def predict_layout(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> dict[str, Any]:
    """Predict one layout (validated first): a flat dict with every field and the assumptions."""
    check(layout, model, cluster)
    row = predict(model, cluster, LayoutTable.from_layouts([layout])).row(0)
    return {
        "model": model.name,
        "cluster": cluster.name,
        "gpu": cluster.gpu.name,
        "layout": layout.model_dump(),
        **row,
        "assumptions": list(ASSUMPTIONS),
    }
