"""ModelSpec: the architecture of a decoder-only transformer, its parameters and FLOPs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelSpec(BaseModel):
    """A Llama- or GPT-style decoder. Counts follow the Hugging Face implementations exactly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    n_layers: int = Field(gt=0)
    d_model: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    d_ff: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    ffn: Literal["swiglu", "gelu"] = "swiglu"
    tied_embeddings: bool = False
    seq_len: int = Field(gt=0)
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

    def model_flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: 6·(params − input embedding) + 12·layers·d_model·seq_len.

        With tied embeddings the shared matrix still does the LM head's work, so it is counted.
        """
        s = self.seq_len if seq_len is None else seq_len
        dense = self.n_params - self.input_embedding_params
        if self.tied_embeddings:
            dense += self.vocab_size * self.d_model
        return 6.0 * dense + 12.0 * self.n_layers * self.d_model * s
