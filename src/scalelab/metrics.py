"""Every metric scalelab reports, defined once: name, unit, scope and meaning.

Both engines use these names: the predictor's result (`scalelab.perf.Prediction`) has exactly
these keys, and bench records store the measured values under the same names, so report,
calibrate and validate compare them without a translation table. The unit is in the name
(`_s`, `_bytes`, `_w`, `_j`) and so is the scope where it could be read either way
(`tokens_per_s` is the whole job, `tokens_per_s_per_gpu` one GPU, `power_w_per_gpu` one GPU).

Scope `job` is the whole job (all GPUs); `per_gpu` is one GPU (one rank: for times, the critical
path of a rank's step). FLOPs and MFU/HFU are defined next to the model's FLOP counts in
`scalelab.config.model`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["job", "per_gpu"]


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    scope: Scope
    description: str
    # Only the predictor computes it (a breakdown of its model), or both engines do.
    predicted_only: bool = False


_M = Metric
METRICS: tuple[Metric, ...] = (
    # Throughput and utilisation.
    _M("step_time_s", "s", "job", "wall time of one optimizer step"),
    _M("tokens_per_s", "tokens/s", "job", "tokens trained per second by the whole job (the study's words per second)"),
    _M("tokens_per_s_per_gpu", "tokens/s", "per_gpu", "tokens_per_s divided by the GPU count"),
    _M("mfu", "fraction", "job", "model FLOPs utilisation: model FLOPs/s over GPUs x dense peak at the training precision (config.model.model_flops_per_token)"),
    _M("hfu", "fraction", "job", "hardware FLOPs utilisation: as mfu, counting recomputed FLOPs (config.model.hardware_flops_per_token)"),
    _M("model_tflops_per_gpu", "TFLOP/s", "per_gpu", "model TFLOP/s per GPU: tokens/s per GPU x scalelab's model FLOPs per token, 6N + attention (config.model.model_flops_per_token, as mfu uses), / 1e12; the figure NeMo/Megatron tables and torchtitan's logs give"),
    # Where the step goes (one rank's critical path).
    _M("compute_s", "s", "per_gpu", "time the compute stream is busy per step, without the TP and CP communication on it"),
    _M("exposed_comm_s", "s", "per_gpu", "time per step when communication runs and no compute runs"),
    _M("exposed_comm_fraction", "fraction", "per_gpu", "exposed_comm_s / step_time_s"),
    _M("dp_all_gather_s", "s", "per_gpu", "FSDP/HSDP parameter AllGather time per step (total, overlapped or not)", True),
    _M("dp_all_gather_exposed_s", "s", "per_gpu", "the exposed part of dp_all_gather_s", True),
    _M("dp_grad_reduce_s", "s", "per_gpu", "gradient ReduceScatter/AllReduce time per step (total)", True),
    _M("dp_grad_reduce_exposed_s", "s", "per_gpu", "the exposed part of dp_grad_reduce_s", True),
    _M("zero_param_all_gather_s", "s", "per_gpu", "ZeRO-1/2 parameter AllGather after the optimizer step", True),
    _M("tp_comm_s", "s", "per_gpu", "tensor-parallel collectives per step (on the critical path)", True),
    _M("cp_comm_exposed_s", "s", "per_gpu", "context-parallel K/V exchange not hidden behind attention", True),
    _M("pp_p2p_s", "s", "per_gpu", "pipeline send/recv of activations and gradients per step", True),
    _M("pp_bubble_s", "s", "per_gpu", "pipeline bubble (idle) per step", True),
    _M("moe_all_to_all_s", "s", "per_gpu", "MoE token dispatch and combine (AllToAll over the EP group) per step, not overlapped", True),
    _M("recompute_s", "s", "per_gpu", "activation recomputation in backward per step", True),
    _M("optimizer_s", "s", "per_gpu", "AdamW step over the parameters this GPU owns", True),
    _M("overhead_s", "s", "per_gpu", "fixed per-step host overhead", True),
    # Memory (peak, on the most loaded pipeline stage).
    _M("memory_parameters_bytes", "bytes", "per_gpu", "parameters held (fp32 master or bf16, sharded as the layout says)"),
    _M("memory_gradients_bytes", "bytes", "per_gpu", "gradients held"),
    _M("memory_optimizer_bytes", "bytes", "per_gpu", "AdamW moments (and ZeRO's fp32 master copy)"),
    _M("memory_activations_bytes", "bytes", "per_gpu", "activations kept for backward, micro-batches in flight included"),
    _M("memory_fsdp_buffers_bytes", "bytes", "per_gpu", "FSDP's unsharded parameter buffers (current and prefetched layer)"),
    _M("memory_reserve_bytes", "bytes", "per_gpu", "CUDA context, allocator fragmentation and workspace (cluster parameter)"),
    _M("memory_total_bytes", "bytes", "per_gpu", "sum of the memory_* categories: peak memory per GPU"),
    _M("memory_capacity_bytes", "bytes", "per_gpu", "the GPU's HBM capacity"),
    _M("fits", "bool", "per_gpu", "memory_total_bytes <= memory_capacity_bytes"),
    # Power and energy: GPU board power only (NVML), never the whole node.
    _M("power_w_per_gpu", "W", "per_gpu", "average GPU board power of one GPU over the step (NVML: not CPU, memory or network)"),
    _M("energy_j", "J", "job", "GPU energy of one optimizer step, all GPUs together"),
    _M("energy_per_token_j", "J/token", "job", "GPU energy per trained token: energy_j / tokens per step"),
    _M("tokens_per_j", "tokens/J", "job", "tokens trained per joule of GPU energy: 1 / energy_per_token_j"),
    # The layout as the predictor resolved it.
    _M("data_parallel", "ranks", "job", "data-parallel degree: GPUs / (tp x pp x cp)", True),
    _M("dp_shard", "ranks", "job", "ranks a parameter is sharded over (1 for DDP, the group for HSDP)", True),
    _M("dp_replicate", "ranks", "job", "HSDP replica groups (1 otherwise)", True),
    _M("n_microbatches", "count", "job", "micro-batches per step per data-parallel rank", True),
)  # fmt: skip

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
NAMES: tuple[str, ...] = tuple(BY_NAME)

# Names used by older records and predictions, read as today's name. Documented here only.
ALIASES: dict[str, str] = {
    "tokens_per_joule": "tokens_per_j",  # the predictor's name before issue 10
}


def canonical(name: str) -> str:
    """Today's name for a metric name found in old data (`tokens_per_joule` -> `tokens_per_j`)."""
    return ALIASES.get(name, name)


def metric(name: str) -> Metric:
    """The definition of a metric, by its name or an alias."""
    return BY_NAME[canonical(name)]
