"""A Llama decoder in PyTorch, built from the predictor's `ModelSpec`.

RMSNorm, rotary embeddings (real cos/sin tables), grouped-query attention through
`scaled_dot_product_attention` with a causal mask, SwiGLU. The model is created on the meta device,
parallelised, and only then materialised and initialised (`materialize`), so a 70B model on a
cluster never exists whole on one rank.

Layers live in a `ModuleDict` keyed by their global index and the embedding, final norm and output
may be `None`: a pipeline stage deletes what it does not own and keeps the fully qualified names of
the rest. Initialisation draws each parameter from a generator seeded by its canonical name, so any
layout (sharded, split into stages, wrapped for checkpointing or compilation) starts from exactly
the parameters of the single-process model.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from typing import cast

import torch
from torch import nn
from torch.nn import functional

from scalelab.config.model import ModelSpec

# Prefixes that wrappers add to parameter names; dropped to get the canonical name.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module", "module")


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 and cast back to the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(
    seq_len: int, head_dim: int, theta: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (seq_len, head_dim // 2), fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, seq, heads, head_dim) by position; pairs are (even, odd) channels."""
    x32 = x.float().unflatten(-1, (-1, 2))
    x_even, x_odd = x32[..., 0], x32[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    rotated = torch.stack((x_even * c - x_odd * s, x_even * s + x_odd * c), dim=-1)
    return rotated.flatten(-2).type_as(x)


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # Looked up on the module at call time so that context parallelism can patch it.
    return functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """Grouped-query attention. Head counts are inferred from the (possibly TP-local) shapes.

    `recompute_core` (selective recompute, set by `parallel.apply_ac`): the attention core
    (scaled_dot_product_attention: scores, softmax, attention over values) keeps only its inputs
    and runs again in backward; everything else in the block keeps its activations.
    """

    recompute_core: bool = False

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        self.n_rep = spec.n_heads // spec.n_kv_heads
        self.wq = nn.Linear(spec.d_model, spec.n_heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(spec.d_model, spec.kv_dim, bias=False)
        self.wv = nn.Linear(spec.d_model, spec.kv_dim, bias=False)
        self.wo = nn.Linear(spec.n_heads * spec.head_dim, spec.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.n_rep > 1:
            k = k.repeat_interleave(self.n_rep, dim=2)
            v = v.repeat_interleave(self.n_rep, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.recompute_core:
            from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

            # The whole core runs again (no early stop), whichever SDPA backend runs it.
            with set_checkpoint_early_stop(False):
                out = checkpoint(_attention_core, q, k, v, use_reentrant=False)
        else:
            out = _attention_core(q, k, v)
        return cast(torch.Tensor, self.wo(out.transpose(1, 2).reshape(b, s, -1)))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.w1 = nn.Linear(spec.d_model, spec.d_ff, bias=False)
        self.w2 = nn.Linear(spec.d_ff, spec.d_model, bias=False)
        self.w3 = nn.Linear(spec.d_model, spec.d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.w2(functional.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    """Pre-norm decoder block: a dense FFN (`feed_forward`), or where `spec.is_moe_layer(layer)`
    a mixture of experts (`moe`, measure/moe.py)."""

    def __init__(self, spec: ModelSpec, layer: int = 0) -> None:
        super().__init__()
        from scalelab.measure.moe import MoE

        self.attention_norm = RMSNorm(spec.d_model)
        self.attention = Attention(spec)
        self.ffn_norm = RMSNorm(spec.d_model)
        self.moe_enabled = spec.is_moe_layer(layer)
        if self.moe_enabled:  # torchtitan's name for the MoE FFN
            self.moe = MoE(spec)
        else:
            self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        ffn = self.moe if self.moe_enabled else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class Transformer(nn.Module):
    """The decoder, or one pipeline stage of it (missing parts are `None`).

    Input: token ids (batch, seq) on the first stage, hidden states otherwise. Output: logits
    (batch, seq, vocab) on the last stage, hidden states otherwise.
    """

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(
        self,
        spec: ModelSpec,
        seq_len: int,
        layers: Iterable[int] | None = None,
        embedding: bool = True,
        head: bool = True,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.seq_len = seq_len
        self.tok_embeddings: nn.Embedding | None = (
            nn.Embedding(spec.vocab_size, spec.d_model) if embedding else None
        )
        indices = range(spec.n_layers) if layers is None else layers
        # Keyed by the global layer index, so that a stage's names (and initial values) are
        # the whole model's.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec, i) for i in indices})
        self.norm: RMSNorm | None = RMSNorm(spec.d_model) if head else None
        self.output: nn.Linear | None = (
            nn.Linear(spec.d_model, spec.vocab_size, bias=False) if head else None
        )
        cos, sin = rope_tables(seq_len, spec.head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        h = (
            self.tok_embeddings(tokens_or_hidden)
            if self.tok_embeddings is not None
            else tokens_or_hidden
        )
        for block in self.layers.values():
            h = block(h, self.rope_cos, self.rope_sin)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h


def build_model(
    spec: ModelSpec,
    seq_len: int,
    device: str | torch.device = "meta",
    layers: Iterable[int] | None = None,
    embedding: bool = True,
    head: bool = True,
) -> Transformer:
    """The whole model on `device` (meta by default: shapes only, no memory), or one pipeline
    stage of it: only `layers` (global indices), with or without the embedding and the head."""
    with torch.device(device):
        return Transformer(spec, seq_len, layers, embedding, head)


def canonical_name(fqn: str) -> str:
    """A parameter's name with wrapper prefixes removed (the single-process model's name)."""
    return ".".join(part for part in fqn.split(".") if part not in _WRAPPER_PARTS)


def _init_std(name: str, spec: ModelSpec) -> float | None:
    """Standard deviation of a parameter's normal init; None for norm weights (ones)."""
    if name.endswith("norm.weight"):
        return None
    if name.endswith(("attention.wo.weight", "feed_forward.w2.weight", "moe.experts.w2")):
        return 0.02 / math.sqrt(2.0 * spec.n_layers)
    if name.endswith("moe.shared_experts.w2.weight"):
        return 0.02 / math.sqrt(2.0 * spec.n_layers)
    return 0.02


def init_value(
    name: str, shape: torch.Size, spec: ModelSpec, seed: int, device: torch.device
) -> torch.Tensor:
    """The full initial value of the parameter `name`, the same for every layout."""
    std = _init_std(name, spec)
    if std is None:
        return torch.ones(shape, dtype=torch.float32, device=device)
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=generator, dtype=torch.float32, device=device) * std


@torch.no_grad()
def materialize(model: nn.Module, spec: ModelSpec, seed: int, device: torch.device) -> None:
    """Allocate a (possibly sharded, meta) model on `device` and initialise it deterministically.

    Each parameter's full value is drawn on the device, one parameter at a time, and only the
    local shard is kept (for a DTensor, the same slicing `distribute_tensor` does). A parameter
    that holds a slice of the model's (experts split by expert parallelism or expert TP,
    `moe.MoE.shard`) is drawn at its full shape and sliced first.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    from scalelab.measure.moe import MoE, slice_value

    model.to_empty(device=device)
    sliced: dict[int, tuple[torch.Size, list[tuple[int, int, int]]]] = {}
    for module in model.modules():
        for pname, (shape, slices) in getattr(module, "scalelab_slices", {}).items():
            sliced[id(getattr(module, pname))] = (shape, slices)
    for fqn, param in model.named_parameters():
        name = canonical_name(fqn)
        shape, slices = sliced.get(id(param), (param.shape, []))
        full = slice_value(init_value(name, shape, spec, seed, device), slices)
        if isinstance(param, DTensor):
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(local.to_local())
        else:
            param.copy_(full)
    for module in model.modules():
        if isinstance(module, MoE):
            module.tokens_per_expert.zero_()
            module.experts.rows_computed.zero_()
            if module.router.expert_bias is not None:
                module.router.expert_bias.zero_()
        if isinstance(module, Transformer):
            cos, sin = rope_tables(module.seq_len, module.spec.head_dim)
            module.rope_cos.copy_(cos.to(device))
            module.rope_sin.copy_(sin.to(device))
