"""Compute time of one transformer layer, the LM head and the optimizer on one GPU.

Vectorised over layouts. GEMMs cost `(flops + half) / (peak * efficiency)`, a size-dependent
efficiency that reaches `gemm_efficiency` for large GEMMs and halves at `gemm_half_gflop`, or
their HBM traffic when that is slower. Causal flash attention runs at `attention_efficiency` of
peak (backward does 2.5x the forward's FLOPs, as FlashAttention-2 recomputes the scores); the
"math" kernel (unfused PyTorch attention) and the "fused" kernel (Megatron's fused
scale-mask-softmax) materialise the score matrix and pay its HBM traffic; FlashAttention v1
("flash1") runs at half FlashAttention-2's rate (Dao 2023, arXiv 2307.08691). Element-wise and norm ops
are bound by HBM bandwidth. An RMSNorm the stack runs as eager PyTorch ops (no fused kernel, no
torch.compile) pays the HBM passes of its composite ops in fp32 (`EAGER_RMSNORM_*_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from scalelab.config.hardware import ClusterSpec
from scalelab.config.model import ModelSpec
from scalelab.config.options import AttentionKernel
from scalelab.perf.distinct import Distinct, distinct_rows

ArrayOrScalar = np.ndarray | float

BF16_BYTES = 2.0
FP32_BYTES = 4.0
FLASH_BACKWARD_FLOP_RATIO = 2.5
FLASH1_RELATIVE_RATE = 0.5
ADAMW_BYTES_PER_PARAM = 40.0
# HBM bytes per element an eager RMSNorm moves beyond a fused kernel's read + write (2 + 2 B in
# bf16). Counted from the composite ops of torch.nn.functional.rms_norm in PyTorch 2.4-2.7
# (aten/src/ATen/native/layer_norm.cpp, rms_norm_symint; the same ops as Hugging Face's
# LlamaRMSNorm): upcast to fp32 (read 2, write 4), pow (4, 4), mean (4), multiply by the rsqrt
# (4, 4), cast back (4, 2), multiply by the weight (2, 2) = 36 B forward; autograd's backward of
# the same ops (weight 2+2+2, cast 2+4, multiply 4+4+4+4, pow 4+4+4, sum of the two gradient
# paths 4+4+4, cast 4+2) = 60 B against a fused kernel's ~8 B. PyTorch 2.8 added a fused
# rms_norm; Transformer Engine, Apex and flash-attn's rms_norm are one kernel each.
EAGER_RMSNORM_FORWARD_BYTES = 36.0 - 4.0
EAGER_RMSNORM_BACKWARD_BYTES = 60.0 - 8.0
NORMS_PER_LAYER = 2


@dataclass(frozen=True)
class LayerCompute:
    """Seconds per micro-batch on one GPU for one layer (and the model's ends)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    attention_forward_s: np.ndarray
    elementwise_forward_s: np.ndarray
    gemm_forward_s: np.ndarray
    # Every second matmul of the layer's forward, in the order a Llama block issues them (wq, wk,
    # wv, wo, w1, w3, w2): what torchtitan's per-op selective checkpointing recomputes.
    alternate_gemm_forward_s: np.ndarray
    head_forward_s: np.ndarray
    head_backward_s: np.ndarray
    forward_flops: np.ndarray
    head_forward_flops: np.ndarray


def gemm_time(
    m: ArrayOrScalar,
    k: ArrayOrScalar,
    n: ArrayOrScalar,
    peak_flops: ArrayOrScalar,
    cluster: ClusterSpec,
) -> np.ndarray:
    """Seconds for an (m x k) @ (k x n) GEMM in bf16 at the cluster's efficiency curve."""
    p = cluster.params
    flops = 2.0 * m * k * n
    compute = (flops + p.gemm_half_gflop * 1e9) / (peak_flops * p.gemm_efficiency)
    traffic = p.compute_bytes * (m * k + k * n + m * n)
    memory = traffic / (cluster.gpu.hbm_bytes_per_s * p.hbm_efficiency)
    return np.asarray(np.maximum(compute, memory))


def layer_compute(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    micro_batch: np.ndarray,
    seq_len: np.ndarray,
    tp: np.ndarray,
    cp: np.ndarray,
    sequence_parallel: np.ndarray,
    fp8: np.ndarray,
    attention: np.ndarray,
    eager_norm: bool = False,
    rows: Distinct | None = None,
) -> LayerCompute:
    """Forward and backward compute of one layer per micro-batch on one GPU. `eager_norm`: the
    stack runs RMSNorm as eager PyTorch ops (`StackSpec.norm_kernel`). Computed once per
    distinct combination of the columns it reads, then spread to every row: `rows`, that
    grouping (`layer_rows`), is computed here when not given."""
    columns = dict(
        micro_batch=micro_batch,
        seq_len=seq_len,
        tp=tp,
        cp=cp,
        sequence_parallel=sequence_parallel,
        fp8=fp8,
        attention=attention,
    )
    groups = rows if rows is not None else layer_rows(**columns)
    given = columns if groups is None else groups.take_columns(columns)
    computed = _layer_compute(model, cluster, eager_norm=eager_norm, **given)
    if groups is None:
        return computed
    return LayerCompute(
        **{f.name: groups.back(getattr(computed, f.name)) for f in fields(computed)}
    )


def layer_rows(
    micro_batch: np.ndarray,
    seq_len: np.ndarray,
    tp: np.ndarray,
    cp: np.ndarray,
    sequence_parallel: np.ndarray,
    fp8: np.ndarray,
    attention: np.ndarray,
) -> Distinct | None:
    """Layouts grouped by the columns `layer_compute` reads (None where grouping does not pay)."""
    return distinct_rows(micro_batch, seq_len, tp, cp, sequence_parallel, fp8, attention)


def _layer_compute(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    micro_batch: np.ndarray,
    seq_len: np.ndarray,
    tp: np.ndarray,
    cp: np.ndarray,
    sequence_parallel: np.ndarray,
    fp8: np.ndarray,
    attention: np.ndarray,
    eager_norm: bool,
) -> LayerCompute:
    """`layer_compute` on every row given."""
    p = cluster.params
    gpu = cluster.gpu
    d, kv, ff, heads = model.d_model, model.kv_dim, model.d_ff, model.n_heads
    tokens = micro_batch * seq_len / cp
    tp_f = tp.astype(float)
    bf16_peak = gpu.peak_flops("bf16")
    linear_peak = np.where(fp8, gpu.peak_flops("fp8") * p.fp8_efficiency_ratio, bf16_peak)
    n_up = 2 if model.ffn == "swiglu" else 1
    # K/V columns per TP rank: replicated once tp exceeds the K/V heads (Megatron-Core).
    kv_local = kv * model.kv_replication(tp_f) / tp_f

    # Attention whose heads do not span d_model (a d_head of its own: Qwen3; MLA: DeepSeek-V3):
    # its projections as one GEMM of the same FLOPs (2 per projection parameter per token) and
    # its core at its own width (`ModelSpec.attention_core_width`). Standard attention (every
    # dense catalog model) keeps the original terms.
    standard = model.attention == "gqa" and model.d_head is None
    if standard:
        gemm_fwd = (
            gemm_time(tokens, d, d / tp_f + 2 * kv_local, linear_peak, cluster)
            + gemm_time(tokens, d / tp_f, d, linear_peak, cluster)
            + n_up * gemm_time(tokens, d, ff / tp_f, linear_peak, cluster)
            + gemm_time(tokens, ff / tp_f, d, linear_peak, cluster)
        )
        gemm_flops = (
            2.0 * tokens * (d * (d / tp_f + 2 * kv_local) + (d * d + (n_up + 1) * d * ff) / tp_f)
        )
        attn_flops_causal = 2.0 * micro_batch * seq_len * seq_len * d / (tp_f * cp)
        # wk, wo, then w3 (SwiGLU: w1, w3, w2) or w2 (GELU: w1, w2).
        alternate_fwd = (
            gemm_time(tokens, d, kv_local, linear_peak, cluster)
            + gemm_time(tokens, d / tp_f, d, linear_peak, cluster)
            + (
                gemm_time(tokens, d, ff / tp_f, linear_peak, cluster)
                if n_up == 2
                else gemm_time(tokens, ff / tp_f, d, linear_peak, cluster)
            )
        )
    else:
        proj_params = model.attention_params / tp_f
        gemm_fwd = (
            gemm_time(tokens, d, proj_params / d, linear_peak, cluster)
            + n_up * gemm_time(tokens, d, ff / tp_f, linear_peak, cluster)
            + gemm_time(tokens, ff / tp_f, d, linear_peak, cluster)
        )
        gemm_flops = 2.0 * tokens * (proj_params + (n_up + 1) * d * ff / tp_f)
        alternate_fwd = 0.5 * gemm_fwd  # projections of their own shape: about half
        core_width = model.attention_core_width / 2.0
        attn_flops_causal = 2.0 * micro_batch * seq_len * seq_len * core_width / (tp_f * cp)
    flash_rate = (
        np.where(attention == AttentionKernel.FLASH1.code, FLASH1_RELATIVE_RATE, 1.0)
        * p.attention_efficiency
    )
    flash_fwd = attn_flops_causal / (bf16_peak * flash_rate)
    score_elems = micro_batch * (heads / tp_f) * (seq_len / cp) * seq_len
    score_passes = np.where(attention == AttentionKernel.FUSED.code, 3.0, 6.0)
    materialised_fwd = 2.0 * attn_flops_causal / (bf16_peak * p.gemm_efficiency) + (
        score_passes * p.compute_bytes * score_elems / (gpu.hbm_bytes_per_s * p.hbm_efficiency)
    )
    materialised = (attention == AttentionKernel.MATH.code) | (
        attention == AttentionKernel.FUSED.code
    )
    attn_fwd = np.where(materialised, materialised_fwd, flash_fwd)
    attn_bwd = np.where(materialised, 2.0 * materialised_fwd, FLASH_BACKWARD_FLOP_RATIO * flash_fwd)

    sp_tokens = np.where(sequence_parallel, tokens / tp_f, tokens)
    elem_bytes = p.compute_bytes * (
        sp_tokens * 10.0 * d + tokens * (2.0 * (d / tp_f + kv_local) + 4.0 * ff / tp_f)
    )
    elem_fwd = elem_bytes / (gpu.hbm_bytes_per_s * p.hbm_efficiency)
    elem_bwd = 2.0 * elem_fwd
    if eager_norm and model.norm == "rmsnorm":
        # The layer's two RMSNorms see the sequence-parallel shard of the tokens.
        norm_elems = NORMS_PER_LAYER * sp_tokens * d / (gpu.hbm_bytes_per_s * p.hbm_efficiency)
        elem_fwd = elem_fwd + EAGER_RMSNORM_FORWARD_BYTES * norm_elems
        elem_bwd = elem_bwd + EAGER_RMSNORM_BACKWARD_BYTES * norm_elems
    overhead = (p.layer_overhead_us + np.where(tp > 1, p.tp_layer_overhead_us, 0.0)) * 1e-6

    forward = gemm_fwd + attn_fwd + elem_fwd + overhead
    backward = 2.0 * gemm_fwd + attn_bwd + elem_bwd + 2.0 * overhead

    vocab = model.vocab_size
    # The host cost of a micro-batch outside the layers (0 on GPU), a third in forward as for
    # the layers, is carried with the head (once per micro-batch, per pipeline stage).
    micro = p.microbatch_overhead_us * 1e-6
    head_fwd = gemm_time(tokens, d, vocab / tp_f, bf16_peak, cluster) + (
        tokens * vocab / tp_f * 10.0 / (gpu.hbm_bytes_per_s * p.hbm_efficiency) + micro / 3.0
    )
    head_bwd = 2.0 * gemm_time(tokens, d, vocab / tp_f, bf16_peak, cluster) + (
        tokens * vocab / tp_f * 10.0 / (gpu.hbm_bytes_per_s * p.hbm_efficiency) + 2.0 * micro / 3.0
    )
    return LayerCompute(
        forward_s=forward,
        backward_s=backward,
        attention_forward_s=attn_fwd,
        elementwise_forward_s=elem_fwd,
        gemm_forward_s=gemm_fwd,
        alternate_gemm_forward_s=np.asarray(alternate_fwd),
        head_forward_s=head_fwd,
        head_backward_s=head_bwd,
        forward_flops=gemm_flops + attn_flops_causal,
        head_forward_flops=2.0 * tokens * d * vocab / tp_f,
    )


def optimizer_time(local_params: np.ndarray, cluster: ClusterSpec) -> np.ndarray:
    """AdamW over the parameters this GPU owns: bound by HBM traffic."""
    bw = cluster.gpu.hbm_bytes_per_s * cluster.params.hbm_efficiency
    return local_params * ADAMW_BYTES_PER_PARAM / bw
