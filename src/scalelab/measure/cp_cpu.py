"""Ring attention for PyTorch's context parallelism on CPU.

On CPU, `scaled_dot_product_attention` runs `aten._scaled_dot_product_flash_attention_for_cpu`,
for which the stock context-parallel dispatcher has neither a DTensor sharding rule nor a ring
implementation, so `context_parallel` fails with "does not have a sharding strategy registered".
The CPU kernel returns (output, logsumexp) and its backward takes (grad_out, out, logsumexp),
which is all torch's own `_templated_ring_attention[_backward]` needs; this module registers the
sharding rules (replicate, batch, heads, sequence) and routes both ops to those functions.

It uses private PyTorch APIs (checked against torch 2.13); if they move, `install_cpu_ring_attention`
raises a clear error instead of training wrongly.
"""

from __future__ import annotations

from typing import Any

import torch

_installed = False


class CPUContextParallelError(RuntimeError):
    """The private APIs the CPU ring attention relies on are missing in this torch."""


def _strategies(n_outputs: int, n_inputs: int) -> list[list[Any]]:
    from torch.distributed.tensor import Replicate, Shard

    rows: list[list[Any]] = []
    for placement in (Replicate(), Shard(0), Shard(1), Shard(2)):
        rows.append([placement] * (n_outputs + n_inputs))
    return rows


def install_cpu_ring_attention() -> None:
    """Register the CPU flash-attention op (forward and backward) with context parallelism."""
    global _installed
    if _installed:
        return
    try:
        import torch.distributed.tensor.experimental._context_parallel._attention as cp_attention
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._op_schema import OpSchema, OpStrategy, RuntimeSchemaInfo
        from torch.distributed.tensor._ops.utils import (
            expand_to_full_mesh_op_strategy,
            register_op_strategy,
        )

        ring_forward = cp_attention._templated_ring_attention
        ring_backward = cp_attention._templated_ring_attention_backward
        custom_ops = cp_attention.custom_ops
    except (ImportError, AttributeError) as exc:
        raise CPUContextParallelError(
            f"context parallelism on CPU needs torch's private ring-attention API ({exc}); "
            "run CP on GPUs or with torch 2.13"
        ) from exc

    aten = torch.ops.aten
    fwd_op = aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd_op = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def forward_strategy(op_schema: OpSchema) -> OpStrategy:
        mesh = op_schema.get_mesh_from_args()
        return expand_to_full_mesh_op_strategy(mesh, op_schema, _strategies(2, 3), input_index=2)

    def backward_strategy(op_schema: OpSchema) -> OpStrategy:
        mesh = op_schema.get_mesh_from_args(validate=False)
        return expand_to_full_mesh_op_strategy(mesh, op_schema, _strategies(3, 6), input_index=3)

    register_op_strategy(fwd_op, schema_info=RuntimeSchemaInfo(3, ["scale"]))(forward_strategy)
    register_op_strategy(bwd_op, schema_info=RuntimeSchemaInfo(6, ["scale"]))(backward_strategy)

    def handler(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        dispatcher = DTensor._op_dispatcher
        op_info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
        dispatcher.sharding_propagator.propagate(op_info)
        output_sharding = op_info.output_sharding
        if output_sharding is None or output_sharding.needs_redistribute:
            raise RuntimeError("context parallelism expects q, k, v sharded on the sequence")
        local_args: Any = op_info.local_args
        local_kwargs: Any = dict(op_info.local_kwargs)
        if local_kwargs.get("attn_mask") is not None:
            raise NotImplementedError("context parallelism on CPU supports causal masks only")
        group = op_info.compute_mesh.get_group()
        if op_call is fwd_op:
            q, k, v, *rest = local_args
            dropout_p = rest[0] if len(rest) > 0 else local_kwargs.get("dropout_p", 0.0)
            is_causal = rest[1] if len(rest) > 1 else local_kwargs.get("is_causal", False)
            result = ring_forward(
                group,
                2,
                fwd_op,
                q,
                k,
                v,
                is_causal=is_causal,
                dropout_p=dropout_p,
                scale=local_kwargs.get("scale"),
            )
        else:
            grad_out, q, k, v, out, lse, dropout_p, is_causal = local_args[:8]
            result = ring_backward(
                group,
                2,
                bwd_op,
                grad_out=grad_out,
                grad_out_name="grad_out",
                query=q,
                key=k,
                value=v,
                out=out,
                logsumexp=lse,
                is_causal=is_causal,
                dropout_p=dropout_p,
                scale=local_kwargs.get("scale"),
            )
        return dispatcher.wrap(tuple(result), output_sharding.output_spec)

    custom_ops[fwd_op] = handler
    custom_ops[bwd_op] = handler
    _installed = True
