"""ModelSpec: the architecture of a decoder-only transformer, its parameters and FLOPs."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from scalelab.config.options import Recompute
from scalelab.config.strict import StrictNumbers

ArrayLike = int | float | np.ndarray


class ModelSpec(StrictNumbers):
    """A Llama- or GPT-style decoder. Counts follow the Hugging Face implementations exactly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="custom", description="Catalog name or the YAML file's stem.")
    # Upper bounds (far above any real model) keep parameter and FLOP counts exact in int64.
    n_layers: int = Field(gt=0, le=2**16, description="Transformer blocks (count).")
    d_model: int = Field(gt=0, le=2**20, description="Hidden width (elements).")
    n_heads: int = Field(gt=0, le=2**16, description="Query heads (count).")
    n_kv_heads: int = Field(
        gt=0, le=2**16, description="Key/value heads (count; < n_heads for grouped-query)."
    )
    d_ff: int = Field(gt=0, le=2**22, description="Hidden width (elements) of a dense layer's FFN.")
    vocab_size: int = Field(gt=0, le=2**24, description="Tokenizer vocabulary (tokens).")
    ffn: Literal["swiglu", "gelu"] = Field(
        default="swiglu", description="FFN kind: swiglu (3 matrices) or gelu (2 matrices)."
    )
    tied_embeddings: bool = Field(
        default=False, description="The LM head shares the input embedding matrix."
    )
    seq_len: int = Field(
        gt=0, le=2**24, description="Training sequence length (tokens) unless a layout sets one."
    )
    norm: Literal["rmsnorm", "layernorm"] = Field(
        default="rmsnorm", description="Norm kind: rmsnorm (weight) or layernorm (weight, bias)."
    )
    bias: bool = Field(default=False, description="Linear layers carry biases (GPT-style).")
    position: Literal["rope", "learned"] = Field(
        default="rope",
        description="Position encoding: rope (no parameters) or learned (seq_len x d_model).",
    )
    source: str = Field(
        default="", description="Where the shape comes from (model card, config.json, paper)."
    )

    # Attention variants (defaults: standard multi-head / grouped-query attention). -------------
    d_head: int | None = Field(
        default=None,
        gt=0,
        le=2**16,
        description="Width of one Q/K/V head (elements) when it is not d_model / n_heads "
        "(Qwen3: 128 with d_model 2048 and 32 heads); None means d_model / n_heads.",
    )
    qk_norm: bool = Field(
        default=False,
        description="RMSNorm with a learned weight (d_head elements each) on queries and keys "
        "per layer (Qwen3). Llama 4's QK norm is an L2 norm without weights: false.",
    )
    attention: Literal["gqa", "mla"] = Field(
        default="gqa",
        description="gqa: multi-head / grouped-query attention from n_heads, n_kv_heads and the "
        "head width; mla: multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434), shaped by "
        "q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim.",
    )
    q_lora_rank: int = Field(
        default=0,
        ge=0,
        le=2**20,
        description="MLA: rank (elements) of the low-rank query projection d_model -> q_lora_rank "
        "-> heads; 0 means a full-rank query projection.",
    )
    kv_lora_rank: int = Field(
        default=0,
        ge=0,
        le=2**20,
        description="MLA: width (elements) of the compressed key/value latent that is cached.",
    )
    qk_nope_head_dim: int = Field(
        default=0,
        ge=0,
        le=2**16,
        description="MLA: per-head query/key width (elements) without rotary position embedding.",
    )
    qk_rope_head_dim: int = Field(
        default=0,
        ge=0,
        le=2**16,
        description="MLA: per-head query/key width (elements) with rotary embedding; the key part "
        "is one decoupled head shared by all heads.",
    )
    v_head_dim: int = Field(
        default=0, ge=0, le=2**16, description="MLA: per-head value width (elements)."
    )

    # Mixture of experts (defaults: a dense model). ------------------------------------------
    n_experts: int = Field(
        default=0,
        ge=0,
        le=2**16,
        description="Routed experts in each MoE layer (count); 0 means a dense model.",
    )
    experts_per_token: int = Field(
        default=0,
        ge=0,
        le=2**16,
        description="Routed experts each token is sent to (top-k, count).",
    )
    n_shared_experts: int = Field(
        default=0,
        ge=0,
        le=2**16,
        description="Shared experts every token passes through in each MoE layer (count), each "
        "d_ff_expert wide.",
    )
    d_ff_expert: int | None = Field(
        default=None,
        gt=0,
        le=2**22,
        description="Hidden width (elements) of one routed or shared expert's FFN; None means "
        "d_ff. d_ff stays the width of the dense layers' FFN.",
    )
    first_dense_layers: int = Field(
        default=0,
        ge=0,
        le=2**16,
        description="Leading layers (count) with a dense FFN instead of experts (DeepSeek-V3: 3).",
    )
    moe_layer_step: int = Field(
        default=1,
        gt=0,
        le=2**16,
        description="Interleave step after the dense first layers: layer i (0-based) is MoE when "
        "(i - first_dense_layers + 1) % moe_layer_step == 0 (Hugging Face's decoder_sparse_step / "
        "interleave_moe_layer_step); 1 means every layer, 2 every second (Llama 4 Maverick).",
    )
    router: Literal["softmax", "sigmoid"] = Field(
        default="softmax",
        description="Router scoring over the experts: a linear d_model -> n_experts without "
        "bias, then softmax (Mixtral, Qwen3) or sigmoid (DeepSeek-V3, Llama 4) before top-k.",
    )
    router_bias: bool = Field(
        default=False,
        description="A learned per-expert bias added to the scores for top-k selection only "
        "(DeepSeek-V3's auxiliary-loss-free balancing: n_experts parameters per MoE layer).",
    )

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        if self.d_head is None and self.attention == "gqa" and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})"
            )
        if self.attention == "mla":
            for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, f) <= 0:
                    raise ValueError(f"attention mla needs {f} > 0")
        if self.n_experts:
            if not 0 < self.experts_per_token <= self.n_experts:
                raise ValueError(
                    f"experts_per_token ({self.experts_per_token}) must be 1 to n_experts "
                    f"({self.n_experts})"
                )
            if self.n_moe_layers == 0:
                raise ValueError("n_experts > 0 but no layer is MoE (first_dense_layers too large)")
        elif self.experts_per_token or self.n_shared_experts or self.router_bias:
            raise ValueError("experts_per_token, n_shared_experts, router_bias need n_experts > 0")
        return self

    # Mixture of experts. ---------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def is_moe_layer(self, i: int) -> bool:
        """Layer i (0-based) has experts instead of a dense FFN."""
        j = i - self.first_dense_layers
        return self.is_moe and j >= 0 and (j + 1) % self.moe_layer_step == 0

    @property
    def n_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.n_layers)) if self.is_moe else 0

    @property
    def expert_width(self) -> int:
        return self.d_ff if self.d_ff_expert is None else self.d_ff_expert

    @property
    def expert_params(self) -> int:
        """One expert's FFN parameters (routed and shared experts alike)."""
        return self._ffn_params(self.expert_width)

    @property
    def router_params(self) -> int:
        """One MoE layer's router: the d_model x n_experts gate, plus the selection bias."""
        return self.n_experts * self.d_model + (self.n_experts if self.router_bias else 0)

    @property
    def moe_layer_params(self) -> int:
        """One MoE layer: attention, router, every routed and shared expert, two norms."""
        experts = (self.n_experts + self.n_shared_experts) * self.expert_params
        return self.attention_params + self.router_params + experts + 2 * self.norm_params

    @property
    def moe_layer_active_params(self) -> int:
        """One MoE layer's parameters one token uses: the top-k routed and the shared experts."""
        experts = (self.experts_per_token + self.n_shared_experts) * self.expert_params
        return self.attention_params + self.router_params + experts + 2 * self.norm_params

    def identity(self) -> dict[str, Any]:
        """The fields that say which model this is (for sweep point ids): all but `source`, and
        the MoE and attention-variant fields only where they differ from their defaults, so that
        a dense model keeps the id it had before those fields existed."""
        later = ModelSpec.model_fields.keys() - _FIRST_FIELDS
        return {
            k: v
            for k, v in self.model_dump(exclude={"source"}).items()
            if k not in later or v != ModelSpec.model_fields[k].default
        }

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads if self.d_head is None else self.d_head

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
        if self.attention == "mla":
            return self._mla_params
        if self.d_head is None and not self.qk_norm:
            weights = 2 * d * d + 2 * d * self.kv_dim
            biases = (2 * d + 2 * self.kv_dim) if self.bias else 0
            return weights + biases
        q_dim = self.n_heads * self.head_dim
        weights = 2 * d * q_dim + 2 * d * self.kv_dim
        biases = (q_dim + 2 * self.kv_dim + d) if self.bias else 0
        qk_norms = 2 * self.head_dim if self.qk_norm else 0
        return weights + biases + qk_norms

    @property
    def _mla_params(self) -> int:
        """Multi-head latent attention as in Hugging Face's DeepseekV3Attention (no biases)."""
        d, h = self.d_model, self.n_heads
        qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q = d * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * h * qk_head
        else:
            q = d * h * qk_head
        kv_a = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_b = self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
        out = h * self.v_head_dim * d
        return q + kv_a + kv_b + out

    def _ffn_params(self, width: int) -> int:
        n_mats = 3 if self.ffn == "swiglu" else 2
        biases = (width + self.d_model) if self.bias else 0
        return n_mats * self.d_model * width + biases

    @property
    def mlp_params(self) -> int:
        """A dense layer's FFN, d_ff wide."""
        return self._ffn_params(self.d_ff)

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
        """Total parameters (every expert counted)."""
        moe = self.n_moe_layers
        return (
            (self.n_layers - moe) * self.layer_params
            + moe * self.moe_layer_params
            + self.input_embedding_params
            + self.output_params
            + self.norm_params
        )

    @property
    def active_params(self) -> int:
        """Parameters one token uses: total for a dense model; for a MoE model, only its top-k
        routed experts (plus the shared ones) in each MoE layer."""
        moe = self.n_moe_layers
        return (
            (self.n_layers - moe) * self.layer_params
            + moe * self.moe_layer_active_params
            + self.input_embedding_params
            + self.output_params
            + self.norm_params
        )

    # FLOPs, MFU and HFU: defined here once, used by the predictor and the harness. -----------
    @property
    def dense_params(self) -> int:
        """Parameters that do matmul work per token: all ACTIVE parameters (for a MoE model, the
        top-k routed and the shared experts, and the router) but the input embedding (a lookup);
        with tied embeddings the shared matrix still does the LM head's work, so it is counted.
        For a dense model active = total parameters."""
        dense = self.active_params - self.input_embedding_params
        if self.tied_embeddings:
            dense += self.vocab_size * self.d_model
        return dense

    def attention_core_forward_flops_per_token(self, seq_len: ArrayLike | None = None) -> Any:
        """Forward FLOPs per token of the attention core (QK^T and scores x V, scaled-dot-product
        attention) over all layers: 4 · layers · d_model · seq_len (full-attention convention, as
        PaLM, Megatron and torchtitan count it; causal kernels do about half)."""
        s = self.seq_len if seq_len is None else seq_len
        if self.attention == "gqa" and self.d_head is None:
            return 4.0 * self.n_layers * self.d_model * s
        return 2.0 * self.n_layers * self.attention_core_width * s

    @property
    def attention_core_width(self) -> int:
        """Summed per-token widths of QK^T and scores x V over the heads: n_heads · (query/key
        head width + value head width); 2 · d_model for standard attention. For MLA, the
        query/key head is qk_nope_head_dim + qk_rope_head_dim wide, the value head v_head_dim."""
        if self.attention == "mla":
            qk, v = self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim
        else:
            qk = v = self.head_dim
        return self.n_heads * (qk + v)

    def model_flops_per_token(self, seq_len: ArrayLike | None = None) -> Any:
        """Training FLOPs per token: 6·(params − input embedding) + 12·layers·d_model·seq_len.

        Forward and backward (2 + 4 FLOPs per dense parameter) plus three times the attention
        core's forward. The numerator of MFU. `seq_len` may be an array.

        MoE and MLA models, in the same convention: `params` are the ACTIVE parameters (top-k
        routed + shared experts + router; `dense_params`), and the attention term is
        6·layers·seq_len·n_heads·(qk head width + v head width) (`attention_core_width`), which
        is 12·layers·d_model·seq_len when the heads span d_model. Full attention is counted in
        every layer (Llama 4's chunked-attention layers do less).
        """
        s = self.seq_len if seq_len is None else seq_len
        if self.attention == "gqa" and self.d_head is None:
            return 6.0 * self.dense_params + 12.0 * self.n_layers * self.d_model * s
        return 6.0 * self.dense_params + 3.0 * self.attention_core_forward_flops_per_token(s)

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


# ModelSpec's fields before mixture of experts and attention variants were added (issue 16).
_FIRST_FIELDS = frozenset(
    [
        "name",
        "n_layers",
        "d_model",
        "n_heads",
        "n_kv_heads",
        "d_ff",
        "vocab_size",
        "ffn",
        "tied_embeddings",
        "seq_len",
        "norm",
        "bias",
        "position",
        "source",
    ]
)


def flops_utilisation(
    flops_per_token: Any, tokens_per_s: Any, gpus: Any, peak_flops_per_gpu: Any
) -> Any:
    """MFU (with model FLOPs) or HFU (with hardware FLOPs): achieved FLOP/s over GPUs x the GPU's
    dense peak at the training precision (`GPUSpec.peak_flops`)."""
    return flops_per_token * tokens_per_s / (gpus * peak_flops_per_gpu)


def model_tflops_per_gpu(flops_per_token: Any, tokens_per_s: Any, gpus: Any) -> Any:
    """Model TFLOP/s per GPU: the achieved model FLOP/s (the numerator of MFU: 6N + attention
    per token, `ModelSpec.model_flops_per_token`) per GPU, in units of 1e12 FLOP/s. The figure
    NeMo/Megatron performance tables and torchtitan's logs compare by; unlike MFU it needs no
    peak, so a CPU run has one too."""
    return flops_per_token * tokens_per_s / gpus / 1e12
