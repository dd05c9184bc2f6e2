"""ModelSpec: the architecture of a decoder-only transformer, its parameters and FLOPs."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from scalelab.config.options import Recompute

ArrayLike = int | float | np.ndarray


class ModelSpec(BaseModel):
    """A Llama- or GPT-style decoder. Counts follow the Hugging Face implementations exactly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    # Upper bounds (far above any real model) keep parameter and FLOP counts exact in int64.
    n_layers: int = Field(gt=0, le=2**16)
    d_model: int = Field(gt=0, le=2**20)
    n_heads: int = Field(gt=0, le=2**16)
    n_kv_heads: int = Field(gt=0, le=2**16)
    d_ff: int = Field(gt=0, le=2**22)
    vocab_size: int = Field(gt=0, le=2**24)
    ffn: Literal["swiglu", "gelu"] = "swiglu"
    tied_embeddings: bool = False
    seq_len: int = Field(gt=0, le=2**24)
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    bias: bool = False
    position: Literal["rope", "learned"] = "rope"
    source: str = ""

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def kv_replication(self, tp: Any) -> Any:
        """How many TP ranks hold each K/V head: 1 while tp divides n_kv_heads; tp / n_kv_heads
        when tp exceeds the K/V heads (Megatron-Core replicates K/V heads across the TP ranks that
        share them, so TP16 on a GQA model with 8 K/V heads is valid). `tp` may be an array."""
        return np.maximum(1.0, np.asarray(tp, dtype=float) / self.n_kv_heads)

    def layer_params_per_tp_rank(self, tp: Any) -> Any:
        """One layer's parameters held by one TP rank (K/V projections replicated past n_kv_heads)."""
        tp_f = np.asarray(tp, dtype=float)
        kv_extra = 2 * self.d_model * self.kv_dim * (self.kv_replication(tp_f) - 1.0)
        return (self.layer_params + kv_extra) / tp_f

    @property
    def attention_params(self) -> int:
        d = self.d_model
        weights = 2 * d * d + 2 * d * self.kv_dim
        biases = (2 * d + 2 * self.kv_dim) if self.bias else 0
        return weights + biases

    @property
    def mlp_params(self) -> int:
        n_mats = 3 if self.ffn == "swiglu" else 2
        biases = (self.d_ff + self.d_model) if self.bias else 0
        return n_mats * self.d_model * self.d_ff + biases

    @property
    def norm_params(self) -> int:
        """Parameters of one norm (weight, plus bias for LayerNorm)."""
        return self.d_model * (2 if self.norm == "layernorm" else 1)

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.norm_params

    @property
    def input_embedding_params(self) -> int:
        positions = self.seq_len * self.d_model if self.position == "learned" else 0
        return self.vocab_size * self.d_model + positions

    @property
    def output_params(self) -> int:
        """LM head weights (zero when tied to the input embedding)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.d_model

    @property
    def n_params(self) -> int:
        return (
            self.n_layers * self.layer_params
            + self.input_embedding_params
            + self.output_params
            + self.norm_params
        )

    # FLOPs, MFU and HFU: defined here once, used by the predictor and the harness. -----------
    @property
    def dense_params(self) -> int:
        """Parameters that do matmul work per token: all but the input embedding (a lookup); with
        tied embeddings the shared matrix still does the LM head's work, so it is counted."""
        dense = self.n_params - self.input_embedding_params
        if self.tied_embeddings:
            dense += self.vocab_size * self.d_model
        return dense

    def attention_core_forward_flops_per_token(self, seq_len: ArrayLike | None = None) -> Any:
        """Forward FLOPs per token of the attention core (QK^T and scores x V, scaled-dot-product
        attention) over all layers: 4 · layers · d_model · seq_len (full-attention convention, as
        PaLM, Megatron and torchtitan count it; causal kernels do about half)."""
        s = self.seq_len if seq_len is None else seq_len
        return 4.0 * self.n_layers * self.d_model * s

    def model_flops_per_token(self, seq_len: ArrayLike | None = None) -> Any:
        """Training FLOPs per token: 6·(params − input embedding) + 12·layers·d_model·seq_len.

        Forward and backward (2 + 4 FLOPs per dense parameter) plus three times the attention
        core's forward. The numerator of MFU. `seq_len` may be an array.
        """
        s = self.seq_len if seq_len is None else seq_len
        return 6.0 * self.dense_params + 12.0 * self.n_layers * self.d_model * s

    def recompute_flops_per_token(
        self, recompute: str | np.ndarray, seq_len: ArrayLike | None = None
    ) -> Any:
        """FLOPs per token that activation recomputation adds in backward.

        `none` adds nothing; `selective` recomputes the attention core only (scaled-dot-product
        attention, Korthikanti et al. 2022): its forward, 4·layers·d_model·seq_len; `full`
        recomputes the forward: 2 FLOPs per dense parameter plus the attention core's forward.
        `recompute` is a `Recompute` name or an array of `Recompute` codes (`LayoutTable.recompute`).
        """
        s = self.seq_len if seq_len is None else seq_len
        code = Recompute(recompute).code if isinstance(recompute, str) else recompute
        core = self.attention_core_forward_flops_per_token(s)
        out = np.where(
            code == Recompute.FULL.code,
            2.0 * self.dense_params + core,
            np.where(code == Recompute.SELECTIVE.code, core, 0.0),
        )
        scalar = isinstance(recompute, str) and not np.ndim(out)
        return float(out) if scalar else out

    def hardware_flops_per_token(
        self, recompute: str | np.ndarray, seq_len: ArrayLike | None = None
    ) -> Any:
        """Model FLOPs plus the recomputed ones per token: the numerator of HFU."""
        return self.model_flops_per_token(seq_len) + self.recompute_flops_per_token(
            recompute, seq_len
        )


def flops_utilisation(
    flops_per_token: Any, tokens_per_s: Any, gpus: Any, peak_flops_per_gpu: Any
) -> Any:
    """MFU (with model FLOPs) or HFU (with hardware FLOPs): achieved FLOP/s over GPUs x the GPU's
    dense peak at the training precision (`GPUSpec.peak_flops`)."""
    return flops_per_token * tokens_per_s / (gpus * peak_flops_per_gpu)
