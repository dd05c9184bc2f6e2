"""Mixture of experts in the predictor: expert parallelism's mechanisms, vectorised over layouts.

A MoE layer replaces the dense FFN by a router, `n_experts` routed experts of which each token
uses `experts_per_token` (top-k), and `n_shared_experts` experts every token uses. With expert
parallelism (`ep`) each rank holds n_experts / ep routed experts (each split `expert_tp` ways)
and tokens reach their experts by AllToAll. What this module prices, per micro-batch on one GPU
(the slowest rank of the EP group):

- **dispatch and combine** (`all_to_all_time`): two AllToAll per MoE layer in forward (tokens to
  their experts, results back) and two in backward (their gradients), as torchtitan's
  `ExpertParallel` and Megatron-Core's `MoEAlltoAllTokenDispatcher` issue them. NCCL implements
  AllToAll as n-1 grouped point-to-point send/recv: NCCL's ring latency with one step per peer
  (`comm.ring_latency_us`, peers outside the NVLink domain pay the network step), the peers inside
  the domain over NVLink and the peers outside over this rank's own NIC(s), concurrently. Each
  rank sends every token once per chosen expert (top-k copies, no per-node de-duplication);
- **grouped GEMM** (`grouped_gemm_time`): the local experts as one grouped GEMM per matrix; each
  expert's token count is padded to the kernel's row tile (`GROUPED_GEMM_TILE_M`), and small
  per-expert batches become bound by reading the expert weights from HBM;
- **router and permutation**: the router GEMM (d_model x n_experts), then its scores and top-k
  and the token permutation / un-permutation, memory-bound (bytes over HBM bandwidth);
- **load imbalance** (`LOAD_IMBALANCE`): the slowest rank's experts get that factor times the
  mean tokens, which slows its expert GEMMs and its AllToAll (everyone waits for it);
- **overlap** of dispatch with compute: none (`DISPATCH_OVERLAP`, the default of torchtitan and
  Megatron-Core; DeepSeek-V3's DualPipe overlaps it, not modelled);
- **expert parameters**: sharded over `LayoutTable.expert_dp` ranks (FSDP over the ranks holding
  the same experts) with their gradients reduced over that group; dense parameters as before;
- **memory**: n_experts / ep experts per rank, / expert_tp, and the dispatched tokens' buffers.

A model's layers are priced as one average layer (MoE layers weigh n_moe_layers / n_layers), as
the rest of the predictor prices a stage as layers x one layer. Dense models never reach this
module's arithmetic (`layer_params_per_tp_rank` returns the dense count unchanged), so their
predictions keep their bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import LayoutTable
from scalelab.config.model import ModelSpec
from scalelab.perf import comm
from scalelab.perf.compute import BF16_BYTES, FP32_BYTES, gemm_time

# Parameters, each with its source. -------------------------------------------------------------
# Load imbalance: the slowest EP rank processes this times the mean tokens per rank. Switch
# Transformer (Fedus et al. 2021, arXiv 2101.03961, section 2.2 and Table 1) and GShard (Lepikhin
# et al. 2020, arXiv 2006.16668) train with a capacity factor of 1.25: an expert accepts at most
# 1.25x its mean share, so 1.25 is the slowest expert's load when the router saturates it.
# DeepSeek-V3 (arXiv 2412.19437, section 2.1.2) balances without a capacity (auxiliary-loss-free
# bias) and reports "good load balance" without a figure: 1.25 is kept for every model.
LOAD_IMBALANCE = 1.25
# Grouped-GEMM row tile: ASSUMED 128, the M tile of CUTLASS's grouped GEMM kernels that
# Megatron-Core's GroupedMLP (grouped_gemm / Transformer Engine GroupedLinear) and torchtitan's
# `torch._grouped_mm` launch on Hopper; each expert's rows are padded to it (torchtitan pads each
# expert's tokens to a multiple of ALIGN_SIZE_M as well).
GROUPED_GEMM_TILE_M = 128.0
# Fraction of dispatch/combine hidden behind compute: none, the default of torchtitan and
# Megatron-Core (their overlap options, e.g. Megatron's --overlap-moe-expert-parallel-comm and
# DeepSeek-V3's DualPipe, are off by default / not modelled).
DISPATCH_OVERLAP = 0.0
# Router scores and top-k: ASSUMED 4 passes over an fp32 tokens x n_experts score matrix (logits
# written, softmax/sigmoid read+write, top-k read).
ROUTER_SCORE_PASSES = 4.0
# Permutation: each routed token copy is read and written once when permuted before dispatch and
# once when un-permuted (and weighted) after combine (torchtitan's `_permute`/`_unpermute`,
# Megatron-Core's `permute`/`unpermute`): 2 x (read + write).
PERMUTE_PASSES = 4.0

ASSUMPTIONS = (
    "MoE: dispatch and combine are AllToAll (2 in forward, 2 in backward per MoE layer), not "
    "overlapped with compute; the slowest EP rank gets 1.25x the mean tokens (Switch/GShard "
    "capacity factor); experts' FSDP shards and gradient reduction span the expert_dp ranks",
)


# Parameters per rank. ---------------------------------------------------------------------------
def moe_fraction(model: ModelSpec) -> float:
    """Share of the layers that are MoE layers."""
    return model.n_moe_layers / model.n_layers if model.is_moe else 0.0


def layer_params_per_tp_rank(model: ModelSpec, tp: Any) -> Any:
    """One average layer's parameters outside the routed experts held by one TP rank (sharded
    over the data-parallel ranks like a dense layer): the dense count for a dense model; for a
    MoE model attention, router, shared experts and norms in MoE layers, the dense FFN in the
    others. Routed experts: `expert_params_per_rank`."""
    if not model.is_moe:
        return model.layer_params_per_tp_rank(tp)
    tp_f = np.asarray(tp, dtype=float)
    f = moe_fraction(model)
    moe_dense = model.moe_layer_params - model.n_experts * model.expert_params
    average = (1.0 - f) * model.layer_params + f * moe_dense
    kv_extra = 2 * model.d_model * model.kv_dim * (model.kv_replication(tp_f) - 1.0)
    return (average + kv_extra) / tp_f


def expert_params_per_rank(model: ModelSpec, table: LayoutTable) -> np.ndarray:
    """One average layer's routed-expert parameters on one rank, before FSDP sharding: the
    n_experts / ep local experts, each split expert_tp ways."""
    per_layer = model.n_experts * model.expert_params * moe_fraction(model)
    return per_layer / (table.ep * np.maximum(table.expert_tp, 1)).astype(float)


# AllToAll. ---------------------------------------------------------------------------------------
def all_to_all_time(nbytes: np.ndarray, group: comm.GroupShape, cluster: ClusterSpec) -> np.ndarray:
    """Seconds for one AllToAll where each rank sends `nbytes` in all (nccl-tests' all_to_all
    size), split evenly over the group's ranks, as NCCL runs it: n-1 point-to-point transfers.

    Latency: NCCL's ring latency (`comm.ring_latency_us`) with n-1 steps, of which the peers
    outside this rank's NVLink domain are network steps. Bandwidth: the (per_domain - 1) / n of
    the buffer bound for peers inside the domain over NVLink, the (n - per_domain) / n bound
    outside over this rank's own NIC share, both at once; the same protocol bandwidth factors and
    size ramp as the other collectives. The fastest protocol wins, as NCCL's tuner picks."""
    p = cluster.params
    nbytes = np.asarray(nbytes, dtype=float)
    n = np.asarray(group.ranks, dtype=float)
    per = np.minimum(np.asarray(group.ranks_per_domain, dtype=float), n)
    domains = np.asarray(group.domains, dtype=float)
    ramp = nbytes / (nbytes + p.bandwidth_ramp_mib * 2**20)
    nvlink = cluster.gpu.nvlink_bytes_per_s * p.nvlink_bus_efficiency * ramp
    net = (
        cluster.nic_bytes_per_s_per_gpu
        * p.net_bus_efficiency
        / (1.0 + p.net_scale_degradation * np.log2(np.maximum(domains, 1.0)))
        * ramp
    )
    n_safe = np.maximum(n, 1.0)
    intra_s = nbytes * (per - 1.0) / n_safe / np.maximum(nvlink, 1e-30)
    inter_s = nbytes * (n - per) / n_safe / np.maximum(net, 1e-30)
    transfer = np.maximum(intra_s, inter_s)
    multi = domains > 1
    case = comm.CollectiveCase(
        collective=comm.ALL_TO_ALL,
        nbytes=nbytes,
        ranks=n,
        domains=domains,
        ranks_per_domain=per,
        multi=multi,
        busbw=nvlink,
        factor=comm.bus_factor(comm.ALL_TO_ALL, n),
        steps=n - 1.0,
        inter_steps=np.maximum(n - per, 0.0),
        cluster=cluster,
    )
    best = np.full(nbytes.shape, np.inf)
    for proto in comm.PROTOCOLS:
        bw_factor = np.where(
            multi, proto.ring_bw_factor_multi_node, proto.ring_bw_factor_single_node
        )
        best = np.minimum(best, comm.ring_latency_us(case, proto) * 1e-6 + transfer / bw_factor)
    return np.where(n <= 1, 0.0, best)


def ep_group(table: LayoutTable, cluster: ClusterSpec) -> comm.GroupShape:
    """The EP group: ep ranks borrowed from tp/expert_tp (innermost), then cp, then dp_shard,
    spaced expert_tp apart (torchtitan's and Megatron-Core's mesh order)."""
    return comm.group_shape(table.ep, np.maximum(table.expert_tp, 1), cluster)


# Compute. ----------------------------------------------------------------------------------------
def grouped_gemm_time(
    groups: np.ndarray,
    m: np.ndarray,
    k: np.ndarray | float,
    n: np.ndarray | float,
    peak_flops: np.ndarray | float,
    cluster: ClusterSpec,
) -> np.ndarray:
    """Seconds for one grouped GEMM: `groups` experts, each (m x k) @ (k x n). Rows are padded to
    the kernel's tile per expert (efficiency m / padded m); one launch pays the cluster's
    small-GEMM constant once; the weights and activations must cross HBM at least once."""
    p = cluster.params
    padded = np.ceil(np.maximum(m, 1e-9) / GROUPED_GEMM_TILE_M) * GROUPED_GEMM_TILE_M
    flops = 2.0 * groups * padded * k * n
    compute = (flops + p.gemm_half_gflop * 1e9) / (peak_flops * p.gemm_efficiency)
    traffic = BF16_BYTES * groups * (m * k + k * n + m * n)
    memory = traffic / (cluster.gpu.hbm_bytes_per_s * p.hbm_efficiency)
    return np.asarray(np.maximum(compute, memory))


@dataclass(frozen=True)
class MoECost:
    """Seconds per average layer per micro-batch that MoE adds (or removes) on one GPU, and the
    per-layer expert data-parallel collectives."""

    forward_s: np.ndarray  # compute + dispatch/combine, in place of the dense FFN
    backward_s: np.ndarray
    all_to_all_forward_s: np.ndarray  # the dispatch/combine part of forward_s
    all_to_all_backward_s: np.ndarray
    expert_all_gather_s: np.ndarray
    expert_grad_reduce_s: np.ndarray
    expert_params_per_rank: np.ndarray  # after ep and expert_tp, before FSDP
    expert_shard: np.ndarray  # expert_dp: the ranks the experts' shards (FSDP, ZeRO) span
    activation_bytes: np.ndarray  # per average layer per micro-batch, in place of the dense FFN's
    dispatch_buffer_bytes: np.ndarray  # one layer's send + receive buffers (transient)


def tokens_per_rank(table: LayoutTable, tp_f: np.ndarray) -> np.ndarray:
    """Tokens one rank routes per micro-batch: its sequence shard of the TP group's tokens when EP
    spans the TP ranks (expert_tp 1), all the TP group's tokens when the experts are TP-split."""
    tokens = table.micro_batch * table.seq_len / table.cp
    return np.where(table.expert_tp > 1, tokens, tokens / tp_f)


def moe_cost(
    model: ModelSpec,
    cluster: ClusterSpec,
    table: LayoutTable,
    *,
    tp_f: np.ndarray,
    call_s: float,
) -> MoECost:
    """Price the MoE layers of a MoE model for every layout (see the module docstring)."""
    p, gpu = cluster.params, cluster.gpu
    linear_peak = np.where(
        table.is_fp8, gpu.peak_flops("fp8") * p.fp8_efficiency_ratio, gpu.peak_flops("bf16")
    )
    hbm = gpu.hbm_bytes_per_s * p.hbm_efficiency
    f = moe_fraction(model)
    d, ff, w = model.d_model, model.d_ff, model.expert_width
    n_up = 2 if model.ffn == "swiglu" else 1
    ep = table.ep.astype(float)
    etp = np.maximum(table.expert_tp, 1).astype(float)
    k, n_exp = float(model.experts_per_token), float(model.n_experts)
    tokens = table.micro_batch * table.seq_len / table.cp
    routed = tokens_per_rank(table, tp_f)

    # The dense FFN that layer_compute priced for every layer, taken back out of the MoE layers.
    dense_ffn = n_up * gemm_time(tokens, d, ff / tp_f, linear_peak, cluster) + gemm_time(
        tokens, ff / tp_f, d, linear_peak, cluster
    )
    dense_ffn_elem = BF16_BYTES * tokens * 4.0 * ff / tp_f / hbm
    # Shared experts: one TP-sharded FFN n_shared x d_ff_expert wide.
    shared_w = model.n_shared_experts * w
    shared = np.zeros_like(tp_f)
    if shared_w:
        shared = n_up * gemm_time(tokens, d, shared_w / tp_f, linear_peak, cluster) + gemm_time(
            tokens, shared_w / tp_f, d, linear_peak, cluster
        )
        shared = shared + BF16_BYTES * tokens * 4.0 * shared_w / tp_f / hbm
    # Router GEMM, scores and top-k, permutation: memory-bound except the GEMM.
    router = gemm_time(routed, d, n_exp, gpu.peak_flops("bf16"), cluster) + (
        ROUTER_SCORE_PASSES * FP32_BYTES * routed * n_exp / hbm
    )
    permute = PERMUTE_PASSES * BF16_BYTES * routed * k * d / hbm
    # Routed experts on the slowest rank: n_experts / ep local experts, imbalance x mean rows.
    local = n_exp / ep
    rows = LOAD_IMBALANCE * routed * k * ep / n_exp  # per local expert
    w_local = w / etp
    experts = n_up * grouped_gemm_time(local, rows, d, w_local, linear_peak, cluster)
    experts = experts + grouped_gemm_time(local, rows, w_local, d, linear_peak, cluster)
    experts_elem = BF16_BYTES * local * rows * 4.0 * w_local / hbm
    # Dispatch and combine: each rank sends its top-k token copies; the slowest receives more.
    group = ep_group(table, cluster)
    a2a_bytes = LOAD_IMBALANCE * BF16_BYTES * routed * k * d
    a2a = np.where(table.ep > 1, all_to_all_time(a2a_bytes, group, cluster) + call_s, 0.0)
    a2a_exposed = (1.0 - DISPATCH_OVERLAP) * 2.0 * a2a

    moe_fwd = shared + router + permute + experts + experts_elem
    moe_bwd = 2.0 * (shared + experts) + experts_elem * 2.0 + router + permute
    fwd = f * (moe_fwd + a2a_exposed - dense_ffn - dense_ffn_elem)
    bwd = f * (moe_bwd + a2a_exposed - 2.0 * dense_ffn - 2.0 * dense_ffn_elem)

    # Expert data parallelism: FSDP over the expert_dp ranks holding the same experts.
    expert_params = expert_params_per_rank(model, table)
    expert_dp = table.expert_dp
    dp_group = comm.group_shape(expert_dp, table.ep * etp.astype(np.int64), cluster)
    many = expert_dp > 1
    ag = comm.collective_time_where(
        many & table.shards_params, comm.ALL_GATHER, BF16_BYTES * expert_params, dp_group, cluster
    )
    rs = comm.collective_time_where(
        many & ~table.is_ddp, comm.REDUCE_SCATTER, FP32_BYTES * expert_params, dp_group, cluster
    )
    ar = comm.collective_time_where(
        many & table.is_ddp, comm.ALL_REDUCE, FP32_BYTES * expert_params, dp_group, cluster
    )
    ag = np.where(many & table.shards_params, ag + call_s, 0.0)
    reduce = np.where(many, rs + ar + call_s, 0.0)

    # Activations kept for backward in place of the dense FFN's: the routed copies' inputs and
    # expert intermediates (imbalanced), the shared experts', the router's scores.
    dense_ffn_act = 2.0 * tokens * (n_up + 1.0) * ff / tp_f
    routed_act = BF16_BYTES * LOAD_IMBALANCE * routed * k * (d + (n_up + 1.0) * w_local)
    shared_act = 2.0 * tokens * (n_up + 1.0) * shared_w / tp_f
    router_act = FP32_BYTES * routed * n_exp
    activations = f * (routed_act + shared_act + router_act - dense_ffn_act)
    buffers = np.where(table.ep > 1, 2.0 * a2a_bytes, 0.0) * (f > 0)
    return MoECost(
        forward_s=fwd,
        backward_s=bwd,
        all_to_all_forward_s=f * a2a_exposed,
        all_to_all_backward_s=f * a2a_exposed,
        expert_all_gather_s=ag,
        expert_grad_reduce_s=reduce,
        expert_params_per_rank=expert_params,
        expert_shard=expert_dp,
        activation_bytes=activations,
        dispatch_buffer_bytes=buffers,
    )
