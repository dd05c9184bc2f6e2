"""Memory per GPU by category, and whether a layout fits in HBM.

Mixed-precision AdamW, bytes per parameter as each framework keeps them:
- DDP (PyTorch AMP): fp32 parameters 4 + fp32 gradients 4 + two fp32 moments 8 = 16;
- ZeRO-1 (Megatron's distributed optimizer, DeepSpeed stage 1): bf16 parameters 2 + bf16
  gradients 2 + (fp32 master 4 + moments 8) / dp; ZeRO-2 also shards the gradients;
- FSDP/HSDP (FSDP2 with MixedPrecisionPolicy): fp32 parameters, gradients and moments, all
  divided by the shard group, plus two layers' bf16 parameters unsharded (the current one and
  the prefetched one). Activations per layer follow Korthikanti et al. (arXiv
2205.05198) for a Llama block with flash attention (no score matrix), divided by TP with
sequence parallelism and by CP; selective recompute frees only the score-sized tensors (none with a
flash kernel); a pipeline's first stage holds up to `pp` micro-batches in flight (1F1B and ZB-V;
more with the interleaved schedule, all of them with GPipe). A layer recomputed in backward holds
its activations once, for one micro-batch. The logits and the loss hold `LOSS_BYTES_PER_LOGIT`
bytes per logit element at the loss's peak, by how the stack computes the loss.

"Peak" here is what the job's tensors need (the allocator's allocated bytes) plus
`memory_reserve_gib`, the memory the cluster entry holds back for what is not a tensor (CUDA
context, communication buffers, the caching allocator's free cached blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from scalelab.config.hardware import ClusterSpec
from scalelab.config.model import ModelSpec
from scalelab.config.options import PipelineSchedule, Recompute, Sharding
from scalelab.perf import moe as moe_mod
from scalelab.perf.distinct import Distinct
from scalelab.perf.moe import MoECost

# Bytes per logit element alive at the peak of the loss (config/stack.py `cross_entropy`), each
# from the framework's code:
# - fp32-upcast, `F.cross_entropy(logits.float(), labels)` in eager PyTorch (torchtitan's train.py
#   at 9dec370; components/loss.py at e7c0cae): at the start of backward the saved fp32
#   log-softmax output (log_softmax's backward needs it), nll_loss's dense fp32 gradient and
#   log_softmax's fp32 gradient are alive together, 3 x 4 bytes (the bf16 logits are freed
#   before backward, `del pred`; the forward's bf16 + fp32 copy + log-softmax is 10 bytes);
# - vocab-parallel-fp32, Megatron's `vocab_parallel_cross_entropy(output.float(), ...)`
#   (megatron/core/tensor_parallel/cross_entropy.py): exp, softmax and then the gradient are
#   computed in place in the fp32 copy (`exp_logits.div_(...)`, `grad_input = softmax`), 4
#   bytes, and the cast's backward makes the bf16 gradient while it is alive, 2 more;
# - fused, one kernel on the bf16 logits (flash-attn's `losses.cross_entropy`, llm-foundry's
#   default `loss_fn: fused_crossentropy` at 5e85bd6 modeling_mpt.py): the bf16 logits it saves
#   and their bf16 gradient, 2 + 2 bytes (its per-token fp32 log-sum-exp is negligible).
LOSS_BYTES_PER_LOGIT = {"fp32-upcast": 12.0, "vocab-parallel-fp32": 6.0, "fused": 4.0}


@dataclass(frozen=True)
class MemoryBreakdown:
    parameters_bytes: np.ndarray
    gradients_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    fsdp_buffers_bytes: np.ndarray
    reserve_bytes: np.ndarray

    @property
    def total_bytes(self) -> np.ndarray:
        return (
            self.parameters_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.fsdp_buffers_bytes
            + self.reserve_bytes
        )


def activation_bytes_per_layer(
    model: ModelSpec,
    tokens: np.ndarray,
    tp: np.ndarray,
    sequence_parallel: np.ndarray,
    math_attention: np.ndarray,
    heads_seq_elems: np.ndarray,
    gathered_inputs: bool = False,
) -> np.ndarray:
    """Bytes a layer keeps for backward per micro-batch (bf16), without recompute.

    Outside the TP-sharded matmuls a block keeps four token x d_model tensors (Korthikanti et
    al.'s 10 s·b·h less the two dropout masks): the two norms' inputs and the two norm outputs
    that feed the QKV and FFN-in matmuls. Sequence parallelism shards all four when the
    framework saves the local shard and gathers it again in backward (Megatron's
    LinearWithGradAccumulationAndAsyncCommunication); with `gathered_inputs` the matmuls keep
    the all-gathered full-sequence input (DTensor TP: the mm saves what it was given)."""
    d, kv, ff = model.d_model, model.kv_dim, model.d_ff
    n_up = 2 if model.ffn == "swiglu" else 1
    tp_f = tp.astype(float)
    norm_inputs = 2.0 * tokens * 2.0 * d
    matmul_inputs = 2.0 * tokens * 2.0 * d
    kv_local = kv * model.kv_replication(tp_f) / tp_f  # K/V heads replicated past n_kv_heads
    sharded = 2.0 * tokens * ((2.0 * d + (n_up + 1.0) * ff) / tp_f + 2.0 * kv_local)
    sp_matmul = matmul_inputs if gathered_inputs else matmul_inputs / tp_f
    replicated = np.where(
        sequence_parallel, norm_inputs / tp_f + sp_matmul, norm_inputs + matmul_inputs
    )
    scores = np.where(math_attention, 2.0 * 2.5 * heads_seq_elems, 0.0)
    return replicated + sharded + scores


def alternate_matmul_bytes_per_layer(
    model: ModelSpec, tokens: np.ndarray, tp: np.ndarray, sequence_parallel: np.ndarray
) -> np.ndarray:
    """Bytes a layer keeps under torchtitan's per-op selective checkpointing (bf16): the block's
    input, the outputs of every other matmul (wq, wv, w1, w2: w2's before its ReduceScatter), the
    attention output and, with SP, the two ReduceScatter outputs; everything else is recomputed
    (parallelize_llama.py `_save_list`: mm, SDPA, reduce_scatter_tensor)."""
    d, ff = model.d_model, model.d_ff
    tp_f = tp.astype(float)
    kv_local = model.kv_dim * model.kv_replication(tp_f) / tp_f
    sp_tokens = np.where(sequence_parallel, tokens / tp_f, tokens)
    saved_mm = d / tp_f + kv_local + ff / tp_f + d  # wq, wv, w1, w2 (local partial sums)
    attention_out = d / tp_f
    reduce_scatter = np.where(sequence_parallel & (tp > 1), 2.0 * d, 0.0)
    return 2.0 * (tokens * (saved_mm + attention_out) + sp_tokens * (d + reduce_scatter))


def pipeline_microbatches_in_flight(
    pp: np.ndarray, n_microbatches: np.ndarray, virtual_stages: np.ndarray, schedule: np.ndarray
) -> np.ndarray:
    """Micro-batches whose activations the first stage holds at its peak, in units of a
    micro-batch over all of the stage's layers (1 without a pipeline).

    - GPipe: every micro-batch's forward runs before any backward: all of them;
    - 1F1B (one chunk per rank): the first stage runs pp - 1 warm-up forwards and one more before
      its first backward, pp micro-batches (Narayanan et al. 2021, PipeDream-Flush; Megatron's
      non-interleaved schedule, num_warmup_microbatches = pp - rank - 1): its L/pp layers for pp
      micro-batches, the L layers of Korthikanti et al. 2022 (section 4);
    - interleaved 1F1B with v chunks: L (1 + (pp - 1) / (pp v)) layers (Korthikanti et al.
      2022, section 4), i.e. pp (1 + (pp - 1) / (pp v)) micro-batches of L/pp layers;
    - ZB-V (two chunks per rank): the same peak activation memory as 1F1B (Qi et al. 2024,
      arXiv 2401.10241, ZB-V; "almost zero pipeline bubbles while maintaining the same
      activation memory as 1F1B", Qi et al., NeurIPS 2024): pp micro-batches.
    Fewer micro-batches than that in a step cap each of them."""
    m = n_microbatches.astype(float)
    warm = np.minimum(m, pp)
    interleaved = (schedule == PipelineSchedule.INTERLEAVED.code) & (virtual_stages > 1)
    held = np.where(
        schedule == PipelineSchedule.GPIPE.code,
        m,
        np.where(
            interleaved,
            np.minimum(m, warm * (1.0 + (pp - 1.0) / (pp * virtual_stages))),
            warm,
        ),
    )
    return np.where(pp > 1, held, 1.0)


class LayerActivations(NamedTuple):
    """Activation bytes of one layer per micro-batch: all of them, with selective recompute,
    its input alone (full recompute); and the logits (no pipeline)."""

    per_layer: np.ndarray
    selective: np.ndarray
    layer_input: np.ndarray
    logits: np.ndarray


def _layer_activations(
    model: ModelSpec,
    *,
    micro_batch: np.ndarray,
    seq_len: np.ndarray,
    cp: np.ndarray,
    tp: np.ndarray,
    sequence_parallel: np.ndarray,
    math_attention: np.ndarray,
    selective_alternate: bool,
    loss_bytes_per_logit: float,
    gathered_inputs: bool,
) -> LayerActivations:
    tp_f = tp.astype(float)
    tokens = micro_batch * seq_len / cp
    score_elems = micro_batch * (model.n_heads / tp_f) * (seq_len / cp) * seq_len
    per_layer = activation_bytes_per_layer(
        model, tokens, tp, sequence_parallel, math_attention, score_elems, gathered_inputs
    )
    layer_input = 2.0 * tokens * model.d_model / np.where(sequence_parallel, tp_f, 1.0)
    # Selective recompute (Korthikanti et al. 2022) recomputes the attention core, so it frees the
    # score-sized tensors (the 5·a·s/h term): with a flash kernel they are never stored, so nothing.
    selective = activation_bytes_per_layer(
        model,
        tokens,
        tp,
        sequence_parallel,
        np.zeros_like(math_attention),
        score_elems,
        gathered_inputs,
    )
    if selective_alternate:
        selective = alternate_matmul_bytes_per_layer(model, tokens, tp, sequence_parallel)
    # The LM head's input (the final norm's output), kept for its weight gradient: sharded along
    # the sequence only where the framework gathers it again in backward.
    head_input = 2.0 * tokens * model.d_model
    head_input = np.where(sequence_parallel & (not gathered_inputs), head_input / tp_f, head_input)
    logits = loss_bytes_per_logit * tokens * model.vocab_size / tp_f + head_input
    return LayerActivations(per_layer, selective, layer_input, logits)


def memory_per_gpu(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    tp: np.ndarray,
    pp: np.ndarray,
    cp: np.ndarray,
    dp: np.ndarray,
    dp_shard: np.ndarray,
    sharding: np.ndarray,
    micro_batch: np.ndarray,
    seq_len: np.ndarray,
    n_microbatches: np.ndarray,
    virtual_stages: np.ndarray,
    schedule: np.ndarray,
    recompute: np.ndarray,
    sequence_parallel: np.ndarray,
    math_attention: np.ndarray,
    moe: MoECost | None = None,
    selective_alternate: bool = False,
    cross_entropy: str = "fp32-upcast",
    tp_saves_gathered_inputs: bool = False,
    layer_rows: Distinct | None = None,
) -> MemoryBreakdown:
    """Peak memory per GPU (bytes) on the most loaded pipeline stage (the first). A MoE model's
    routed experts (`moe`) are held n_experts / ep per rank and sharded over expert_dp ranks.
    `layer_rows`: the layouts grouped by (at least) micro-batch, sequence, CP, TP, SP and the
    attention kernel, to compute each layer's activations once per group."""
    tp_f = tp.astype(float)
    layers_per_stage = np.ceil(model.n_layers / (pp * virtual_stages)) * virtual_stages
    stage_params = (
        layers_per_stage * moe_mod.layer_params_per_tp_rank(model, tp_f)
        + np.where(
            pp > 1, model.input_embedding_params, model.input_embedding_params + model.output_params
        )
        / tp_f
    )
    stage_params = stage_params + model.norm_params
    is_z1, is_z2 = sharding == Sharding.ZERO1.code, sharding == Sharding.ZERO2.code
    full_shard = (sharding == Sharding.FSDP.code) | (sharding == Sharding.HSDP.code)
    zero = is_z1 | is_z2
    parameters = np.where(full_shard, 4.0 / dp_shard, np.where(zero, 2.0, 4.0)) * stage_params
    gradients = (
        np.where(full_shard, 4.0 / dp_shard, np.where(is_z2, 2.0 / dp, np.where(zero, 2.0, 4.0)))
        * stage_params
    )
    optimizer = np.where(full_shard, 8.0 / dp_shard, np.where(zero, 12.0 / dp, 8.0)) * stage_params
    fsdp_buffers = np.where(full_shard, 2.0 * 2.0 * model.layer_params_per_tp_rank(tp_f), 0.0)
    if moe is not None:
        e, eds = layers_per_stage * moe.expert_params_per_rank, moe.expert_shard
        parameters = parameters + np.where(full_shard, 4.0 / eds, np.where(zero, 2.0, 4.0)) * e
        gradients = gradients + e * np.where(
            full_shard, 4.0 / eds, np.where(is_z2, 2.0 / eds, np.where(zero, 2.0, 4.0))
        )
        optimizer = optimizer + np.where(full_shard, 8.0 / eds, np.where(zero, 12.0 / eds, 8.0)) * e
        # Unsharded: the current and the prefetched MoE layer's local experts, in bf16.
        whole_layer = moe.expert_params_per_rank / max(moe_mod.moe_fraction(model), 1e-9)
        fsdp_buffers = np.where(
            full_shard,
            2.0 * 2.0 * (moe_mod.layer_params_per_tp_rank(model, tp_f) + whole_layer),
            0.0,
        )

    columns = dict(
        micro_batch=micro_batch,
        seq_len=seq_len,
        cp=cp,
        tp=tp,
        sequence_parallel=sequence_parallel,
        math_attention=math_attention,
    )
    # With `layer_rows`: once per distinct combination of the columns, spread back to every row.
    layer = _layer_activations(
        model,
        selective_alternate=selective_alternate,
        loss_bytes_per_logit=LOSS_BYTES_PER_LOGIT[cross_entropy],
        gathered_inputs=tp_saves_gathered_inputs,
        **(columns if layer_rows is None else layer_rows.take_columns(columns)),
    )
    if layer_rows is not None:
        layer = LayerActivations(*(layer_rows.back(values) for values in layer))
    per_layer, selective, layer_input = layer.per_layer, layer.selective, layer.layer_input
    if moe is not None:
        per_layer = per_layer + moe.activation_bytes
        selective = selective + moe.activation_bytes
    full = recompute == Recompute.FULL.code
    sel = recompute == Recompute.SELECTIVE.code
    kept = np.where(full, layer_input, np.where(sel, selective, per_layer))
    # In backward one layer at a time is recomputed, for one micro-batch: it holds what its
    # checkpoint did not keep until its backward is done, once on the stage, not once per
    # micro-batch in flight (the recomputation runs inside that layer's backward).
    recomputed = np.where(full, per_layer - layer_input, np.where(sel, per_layer - selective, 0.0))
    in_flight = pipeline_microbatches_in_flight(pp, n_microbatches, virtual_stages, schedule)
    logits = np.where(pp > 1, 0.0, layer.logits)
    activations = kept * layers_per_stage * in_flight + recomputed + logits
    if moe is not None:
        activations = activations + moe.dispatch_buffer_bytes
    reserve = np.full(tp.shape, cluster.params.memory_reserve_gib * 2**30)
    return MemoryBreakdown(
        parameters_bytes=parameters,
        gradients_bytes=gradients,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        fsdp_buffers_bytes=fsdp_buffers,
        reserve_bytes=reserve,
    )
