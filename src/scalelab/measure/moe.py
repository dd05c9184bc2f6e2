"""A torchtitan-style mixture-of-experts FFN: router, routed experts, shared experts, and expert
parallelism by AllToAll.

The layer (`MoE`) replaces a block's dense FFN where `ModelSpec.is_moe_layer(i)`:

- `Router`: a linear d_model -> n_experts without bias, softmax or sigmoid scores in fp32
  (`ModelSpec.router`), top-k per token (with DeepSeek-V3's selection bias added for the choice
  only, when `router_bias`: a buffer, zero here and not updated: the auxiliary-loss-free
  balancing update is not run), the top-k scores renormalised to sum to 1 when k > 1
  (Mixtral, Qwen3, DeepSeek-V3; torchtitan's route_norm).
- Token permutation: the (token, choice) slots sorted by expert (a stable argsort, torchtitan's
  TokenReorderer), the routed experts run on contiguous per-expert row blocks, their outputs
  weighted by the scores and added back to their tokens (scatter_add).
- `GroupedExperts`: every routed expert's SwiGLU as three (experts, ., .) weights; the experts run
  one after another on their row blocks (a loop, torchtitan's for-loop path:
  `torch._grouped_mm` needs 16-byte-aligned groups on CPU and bf16 on sm90 GPUs, so this
  harness does not use it on any device yet; a GPU run therefore times the loop, not grouped GEMMs).
- `SharedExperts`: `n_shared_experts` SwiGLU experts every token passes through, held as one
  SwiGLU n_shared x d_ff_expert wide (torchtitan's shared_experts).

Expert parallelism (`GroupedExperts.ep_group`, set by `parallel.apply_moe`): the experts are split
along their first dimension over the EP ranks. Dispatch: the per-expert token counts are exchanged
first (`all_to_all_single` on counts), then the tokens (`all_to_all_single` with those variable
splits, autograd-aware), the received rows are regrouped by local expert, computed, put back in
arrival order and returned by the reverse AllToAll (combine).

Tensor parallelism inside the layer works on plain tensors (no DTensor), in sequence-parallel
form (`MoE.tp_group`): the block hands the layer this rank's tokens (the sequence shard).
- expert_tp 1: tokens stay local (the experts whole on a rank; EP spans the TP ranks too), the
  router and shared experts are replicated over TP and their gradients, partial per TP rank, are
  summed over TP after backward (`tp_partial_params`).
- expert_tp = tp: the tokens are gathered over TP (AllGather; ReduceScatter in backward), each TP
  rank holds a column slice of w1/w3 and a row slice of w2 of every expert and shared expert (as
  the dense MLP), and the layer's partial output is reduce-scattered back to the sequence shard.
  The router's gradient is partial (each rank's scores see its slice of the experts), summed
  over TP after backward.

Parameters that hold a slice (EP or expert-TP) keep their full shape and slice in
`scalelab_slices`, so `model.materialize` draws exactly the single-process model's values.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

from scalelab.config.model import ModelSpec

# (dim, rank, parts) applied in order to the full tensor: `tensor.chunk(parts, dim)[rank]`.
Slice = tuple[int, int, int]


class _ScaleGrad(torch.autograd.Function):
    """Identity in forward; multiplies the gradient by `scale` in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def _slice_param(module: nn.Module, name: str, slices: list[Slice]) -> None:
    """Replace parameter `name` by its (meta) slice; remember the full shape for materialize."""
    param = getattr(module, name)
    full = param
    for dim, rank, parts in slices:
        full_size = full.shape[dim]
        if full_size % parts:
            raise ValueError(f"{name}: dimension {dim} ({full_size}) not divisible by {parts}")
        full = full.chunk(parts, dim)[rank]
    record: dict[str, tuple[torch.Size, list[Slice]]] = getattr(module, "scalelab_slices", {})
    shape, before = record.get(name, (param.shape, []))
    record[name] = (shape, before + slices)
    module.scalelab_slices = record  # type: ignore[assignment]
    setattr(module, name, nn.Parameter(torch.empty_like(full, device=param.device)))


def slice_value(full: torch.Tensor, slices: list[Slice]) -> torch.Tensor:
    for dim, rank, parts in slices:
        full = full.chunk(parts, dim)[rank]
    return full


def swiglu(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """w2(silu(w1 x) * w3 x) with weights laid out as nn.Linear's (out, in)."""
    return (functional.silu(x @ w1.t()) * (x @ w3.t())) @ w2.t()


class Router(nn.Module):
    """Token-choice top-k router (torchtitan's TokenChoiceTopKRouter)."""

    expert_bias: torch.Tensor | None

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.n_experts, self.top_k = spec.n_experts, spec.experts_per_token
        self.score = spec.router
        self.gate = nn.Linear(spec.d_model, spec.n_experts, bias=False)
        bias = torch.zeros(spec.n_experts) if spec.router_bias else None
        self.register_buffer("expert_bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores (tokens, k) in fp32 and expert indices (tokens, k) of each token's choices."""
        logits = self.gate(x).float()
        scores = torch.sigmoid(logits) if self.score == "sigmoid" else logits.softmax(dim=-1)
        if self.expert_bias is not None:
            _, idx = torch.topk(scores + self.expert_bias, self.top_k, dim=-1)
            top = scores.gather(-1, idx)
        else:
            top, idx = torch.topk(scores, self.top_k, dim=-1)
        if self.top_k > 1:
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return top, idx


class GroupedExperts(nn.Module):
    """The routed experts' SwiGLU weights: w1, w3 (experts, hidden, d_model); w2 (experts,
    d_model, hidden). Under EP this rank holds experts [ep_rank * E/ep, (ep_rank + 1) * E/ep).
    `rows_computed` accumulates the (token, choice) rows this rank's experts ran (no gradient;
    the trainer reads and resets it every step: the EP ranks' load imbalance)."""

    rows_computed: torch.Tensor

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.register_buffer(
            "rows_computed", torch.zeros((), dtype=torch.float64), persistent=False
        )
        e, d, h = spec.n_experts, spec.d_model, spec.expert_width
        self.n_experts = e
        self.w1 = nn.Parameter(torch.empty(e, h, d))
        self.w2 = nn.Parameter(torch.empty(e, d, h))
        self.w3 = nn.Parameter(torch.empty(e, h, d))
        self.ep_group: dist.ProcessGroup | None = None
        self.ep_size = 1
        self.grad_scale = 1.0  # see parallel.apply_moe: expert gradients' divisor under EP

    @property
    def n_local(self) -> int:
        return self.n_experts // self.ep_size

    def _compute(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        w1: torch.Tensor = self.w1
        w2: torch.Tensor = self.w2
        w3: torch.Tensor = self.w3
        if self.grad_scale != 1.0:
            w1, w2, w3 = (
                cast(torch.Tensor, _ScaleGrad.apply(w, self.grad_scale)) for w in (w1, w2, w3)
            )
        outs = [
            swiglu(rows, w1[e], w2[e], w3[e])
            for e, rows in enumerate(torch.split(x, counts, dim=0))
        ]
        return torch.cat(outs, dim=0) if outs else x.new_zeros(0, x.shape[-1])

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """`x`: rows sorted by expert, `counts[e]` rows for expert e (all n_experts)."""
        if self.ep_group is None or self.ep_size == 1:
            self.rows_computed.add_(x.shape[0])
            return self._compute(x, counts.tolist())
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        ep, n_local = self.ep_size, self.n_local
        with torch.no_grad():
            received = torch.empty_like(counts)
            dist.all_to_all_single(received, counts, group=self.ep_group)
            send_splits = counts.view(ep, n_local).sum(dim=1).tolist()
            recv_splits = received.view(ep, n_local).sum(dim=1).tolist()
            # Arrived rows are grouped by source rank, then local expert: regroup by expert.
            segment = torch.repeat_interleave(
                torch.arange(ep * n_local, device=x.device), received.to(x.device)
            )
            key = (segment % n_local) * ep + segment // n_local
            order = torch.argsort(key, stable=True)
            inverse = torch.argsort(order)
            per_expert = received.view(ep, n_local).sum(dim=0).tolist()
            self.rows_computed.add_(sum(per_expert))
        arrived = all_to_all_single_autograd(x, recv_splits, send_splits, self.ep_group)
        out = self._compute(arrived[order], per_expert)[inverse]
        return all_to_all_single_autograd(out, send_splits, recv_splits, self.ep_group)


class SharedExperts(nn.Module):
    """n_shared_experts SwiGLU experts as one SwiGLU n_shared x d_ff_expert wide."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        d, h = spec.d_model, spec.expert_width * spec.n_shared_experts
        self.w1 = nn.Linear(d, h, bias=False)
        self.w2 = nn.Linear(h, d, bias=False)
        self.w3 = nn.Linear(d, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.w2(functional.silu(self.w1(x)) * self.w3(x)))


class MoE(nn.Module):
    """Router, routed experts (optionally expert-parallel) and shared experts; (b, s, d) in and out.

    `tokens_per_expert` accumulates the routed (token, choice) slots per expert of the tokens this
    rank routes (no gradient); the trainer reads and resets it every step (load imbalance)."""

    tokens_per_expert: torch.Tensor

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.top_k = spec.experts_per_token
        self.router = Router(spec)
        self.experts = GroupedExperts(spec)
        self.shared_experts = SharedExperts(spec) if spec.n_shared_experts else None
        self.register_buffer(
            "tokens_per_expert", torch.zeros(spec.n_experts, dtype=torch.float64), persistent=False
        )
        self.tp_group: dist.ProcessGroup | None = None
        self.tp_gather = False  # expert_tp = tp: gather the tokens over TP, reduce-scatter back
        self.experts_tp_partial = False  # experts whole and replicated over TP (ep 1, expert_tp 1)

    def tp_partial_params(self) -> list[nn.Parameter]:
        """Parameters whose gradient each TP rank holds only a part of (summed over TP after
        backward): the router's gate always under TP; the shared experts when they are replicated
        over TP (expert_tp 1); the routed experts too when EP does not span TP (ep 1)."""
        if self.tp_group is None:
            return []
        params = list(self.router.parameters())
        if not self.tp_gather and self.shared_experts is not None:
            params += list(self.shared_experts.parameters())
        if self.experts_tp_partial:
            params += list(self.experts.parameters())
        return params

    def sliced_params(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(routed experts' weights, shared experts' weights) that hold slices of the model's
        parameters (by EP and/or expert TP, `shard`), for the gradient norm."""
        routed = list(self.experts.parameters()) if hasattr(self.experts, "scalelab_slices") else []
        shared = self.shared_experts
        shared_sliced = shared is not None and hasattr(shared.w1, "scalelab_slices")
        return routed, list(shared.parameters()) if shared_sliced and shared is not None else []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        if self.tp_gather:
            from torch.distributed._functional_collectives import all_gather_tensor_autograd

            assert self.tp_group is not None
            tokens = all_gather_tensor_autograd(tokens, 0, self.tp_group)
        scores, idx = self.router(tokens)
        flat = idx.reshape(-1)
        counts = torch.bincount(flat, minlength=self.experts.n_experts)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts.to(self.tokens_per_expert.dtype))
        order = torch.argsort(flat, stable=True)
        token_of_slot = order // self.top_k
        routed = self.experts(tokens[token_of_slot], counts)
        if self.shared_experts is not None:
            out = self.shared_experts(tokens)
        else:
            out = torch.zeros_like(tokens)
        # Under autocast the experts' outputs may be bf16 while the tokens are fp32.
        routed = (routed.float() * scores.reshape(-1)[order].unsqueeze(-1)).to(out.dtype)
        index = token_of_slot.unsqueeze(-1).expand(-1, tokens.shape[-1])
        out = out.scatter_add(0, index, routed)
        if self.tp_gather:
            from torch.distributed._functional_collectives import reduce_scatter_tensor_autograd

            assert self.tp_group is not None
            out = reduce_scatter_tensor_autograd(out, "sum", 0, self.tp_group)
        return out.reshape(shape)

    def shard(self, ep_rank: int, ep_size: int, tp_rank: int, tp_size: int) -> None:
        """Keep this rank's slice (on the meta device, before materialisation): experts
        [ep_rank * E/ep, ...) and, with tp_size > 1 (expert_tp = tp), the TP slices of every
        expert and shared expert (w1/w3 by rows of the hidden dim, w2 by its columns)."""
        experts = self.experts
        if ep_size > 1:
            for name in ("w1", "w2", "w3"):
                _slice_param(experts, name, [(0, ep_rank, ep_size)])
            experts.ep_size = ep_size
        if tp_size > 1:
            _slice_param(experts, "w1", [(1, tp_rank, tp_size)])
            _slice_param(experts, "w3", [(1, tp_rank, tp_size)])
            _slice_param(experts, "w2", [(2, tp_rank, tp_size)])
            if self.shared_experts is not None:
                s = self.shared_experts
                _slice_param(s.w1, "weight", [(0, tp_rank, tp_size)])
                _slice_param(s.w3, "weight", [(0, tp_rank, tp_size)])
                _slice_param(s.w2, "weight", [(1, tp_rank, tp_size)])
