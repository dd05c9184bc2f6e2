"""One training step: compute and communication streams, layer by layer.

Without pipelining, data-parallel collectives run on one communication stream beside the compute
stream, in the order FSDP2 issues them: the next layer's AllGather is issued (prefetched) when a
layer's forward starts; in backward the previous layer's AllGather is issued when a layer's
backward starts and its gradient ReduceScatter (then HSDP's AllReduce across replicas, or DDP's
bucketed AllReduce) when it ends. Compute waits for its layer's parameters; the time it waits is
the exposed communication. Compute that runs while a collective is resident runs `interference`
slower (`ClusterSpec.overlap_interference`: the SMs the collective's channels hold and the HBM
bandwidth its copies take, for as long as the kernel is resident, latency-bound or not); that time
is also counted, as the "compute under interference" power state. The layers are identical, so the first few are simulated exactly
and the rest continue the steady state they reach.

With pipelining, each stage runs `n_microbatches` forward and backward passes plus the schedule's
bubble; FSDP's collectives happen once per step (first micro-batch forward, last backward) and
overlap per layer. Tensor-parallel collectives sit on the critical path; context parallelism's
K/V ring overlaps the attention it feeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from scalelab.config.options import PipelineSchedule

_EXACT_LAYERS = 6


@dataclass
class PassResult:
    """Seconds for one micro-batch (forward + backward) from an idle start."""

    time_s: np.ndarray
    compute_busy_s: np.ndarray
    exposed_comm_s: np.ndarray
    interfered_s: np.ndarray  # compute time with a collective resident beside it


def _extrapolate(values_k: np.ndarray, values_k1: np.ndarray, remaining: int) -> np.ndarray:
    return values_k + remaining * (values_k - values_k1)


def _layers(
    state: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    *,
    n_layers: int,
    compute_s: np.ndarray,
    gather_s: np.ndarray,
    gathers: np.ndarray,
    gather_done: np.ndarray,
    interference: float,
    reduce_s: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One pass over the layers: each waits for its parameters, prefetches the next layer's and,
    in backward, issues its gradient reduction. State: compute-stream time, comm-stream free
    time, exposed wait, compute busy time and compute time under interference."""
    t, comm, wait, busy, hit = state
    zeros = np.zeros_like(t)
    exact = min(n_layers, _EXACT_LAYERS)
    history = []
    for i in range(exact):
        start = np.maximum(t, gather_done)
        wait = wait + (start - t)
        if i < n_layers - 1:
            nxt_done = np.where(gathers, np.maximum(comm, start) + gather_s, zeros)
            comm = np.where(gathers, nxt_done, comm)
            gather_done = nxt_done
        overlap = np.clip(comm - start, 0.0, compute_s)
        duration = compute_s + interference * overlap
        busy = busy + duration
        hit = hit + overlap
        t = start + duration
        if reduce_s is not None:
            comm = np.maximum(comm, t) + reduce_s
        history.append((t, comm, wait, busy, hit))
    remaining = n_layers - exact
    if remaining > 0:
        return tuple(  # type: ignore[return-value]
            _extrapolate(a, b, remaining) for a, b in zip(history[-1], history[-2], strict=True)
        )
    return history[-1]


_State = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class MicrobatchInputs:
    """Per-layout seconds a micro-batch's simulation reads (see `simulate_microbatch`)."""

    n_layers: int
    forward_s: np.ndarray
    backward_s: np.ndarray
    head_forward_s: np.ndarray
    head_backward_s: np.ndarray
    all_gather_s: np.ndarray
    grad_reduce_s: np.ndarray
    root_all_gather_s: np.ndarray
    root_grad_reduce_s: np.ndarray
    gather_in_backward: np.ndarray
    interference: float


def _forward(x: MicrobatchInputs) -> tuple[_State, np.ndarray, np.ndarray]:
    """The forward pass and the head: the state backward starts from, when the first backward
    layer's parameters are gathered, and which layouts gather them again in backward."""
    has_ag = x.all_gather_s > 0
    zeros = np.zeros_like(x.forward_s)
    # Forward: the root's parameters (embedding, final norm, head) first, then the layers.
    comm = np.where(has_ag, x.root_all_gather_s + x.all_gather_s, x.root_all_gather_s)
    root = x.root_all_gather_s
    t, comm, wait, busy, hit = _layers(
        (root.copy(), comm, root.copy(), zeros.copy(), zeros.copy()),
        n_layers=x.n_layers, compute_s=x.forward_s, gather_s=x.all_gather_s, gathers=has_ag,
        gather_done=np.where(has_ag, comm, zeros), interference=x.interference, reduce_s=None,
    )  # fmt: skip
    t = t + x.head_forward_s + x.head_backward_s
    busy = busy + x.head_forward_s + x.head_backward_s
    # Backward gathers again if resharded.
    bwd_ag = has_ag & x.gather_in_backward
    first_done = np.where(bwd_ag, np.maximum(comm, t - x.head_backward_s) + x.all_gather_s, zeros)
    return (t, np.where(bwd_ag, first_done, comm), wait, busy, hit), first_done, bwd_ag


def _backward(
    x: MicrobatchInputs, state: _State, first_done: np.ndarray, bwd_ag: np.ndarray, sync: bool
) -> PassResult:
    """Backward: layers in reverse, then (`sync`) the gradient reductions."""
    t, comm, wait, busy, hit = _layers(
        state,
        n_layers=x.n_layers, compute_s=x.backward_s, gather_s=x.all_gather_s, gathers=bwd_ag,
        gather_done=first_done, interference=x.interference,
        reduce_s=x.grad_reduce_s if sync else None,
    )  # fmt: skip
    if sync:
        comm = np.maximum(comm, t) + x.root_grad_reduce_s
        end = np.maximum(t, comm)
        wait = wait + (end - t)
        t = end
    return PassResult(time_s=t, compute_busy_s=busy, exposed_comm_s=wait, interfered_s=hit)


def simulate_microbatch(*, sync_grads: bool, **inputs: Any) -> PassResult:
    """Forward and backward of one micro-batch with data-parallel comm overlapped by prefetch
    (`MicrobatchInputs`' fields as keywords); `sync_grads`: reduce the gradients."""
    x = MicrobatchInputs(**inputs)
    return _backward(x, *_forward(x), sync=sync_grads)


def simulate_microbatches(**inputs: Any) -> tuple[PassResult, PassResult]:
    """`simulate_microbatch` with and without the gradient reduction (the last micro-batch and
    the others), simulating the forward they share once."""
    x = MicrobatchInputs(**inputs)
    state, first_done, bwd_ag = _forward(x)
    return (
        _backward(x, state, first_done, bwd_ag, sync=True),
        _backward(x, state, first_done, bwd_ag, sync=False),
    )


def pipeline_bubble_units(
    pp: np.ndarray, virtual_stages: np.ndarray, schedule: np.ndarray
) -> np.ndarray:
    """Idle micro-batch slots (in units of one micro-batch's forward+backward) per step.

    GPipe and 1F1B: pp-1; interleaved 1F1B: (pp-1)/v (Narayanan et al. 2021); ZB-V: the backward
    for weights fills most of the bubble, leaving about a third of it (Qi et al. 2024).
    """
    zbv = schedule == PipelineSchedule.ZBV.code
    chunked = (schedule == PipelineSchedule.INTERLEAVED.code) | zbv
    base = (pp - 1.0) / np.where(chunked, virtual_stages, 1)
    return np.where(zbv, base / 3.0, base)


def module_partition_slowest_stage(
    n_layers: int,
    pp: np.ndarray,
    virtual_stages: np.ndarray,
    layer_s: np.ndarray,
    head_s: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Layers and head (0 or 1) of the slowest stage when the framework splits the model's module
    list [embedding, n_layers transformer layers, final norm, LM head] uniformly over the
    pp x v chunks: each chunk gets (L + 3) // chunks modules and the first (L + 3) % chunks one
    more (`pipe_partition_uniform` of Aleph-Alpha/scaling, its default `pipe_partition_method`);
    stage s holds chunks s, s + pp, ... The stage holding the head then has fewer transformer
    layers than the others. `layer_s` and `head_s` (per layout: one layer's and the head's
    forward+backward seconds) pick the slowest stage; the embedding and norm cost nothing here.
    """
    n = len(pp)
    layers_out = np.zeros(n)
    head_out = np.zeros(n)
    modules = n_layers + 3
    pairs = np.stack([pp, virtual_stages], axis=1).astype(np.int64)
    for p, v in np.unique(pairs, axis=0):
        rows = np.flatnonzero((pairs[:, 0] == p) & (pairs[:, 1] == v))
        chunks = int(p * v)
        base, extra = divmod(modules, chunks)
        j = np.arange(chunks)
        start = j * base + np.minimum(j, extra)
        end = start + base + (j < extra)
        # Transformer layers are modules 1..n_layers.
        chunk_layers = np.maximum(0, np.minimum(end, n_layers + 1) - np.maximum(start, 1))
        stage_layers = chunk_layers.reshape(int(v), int(p)).sum(axis=0)
        stage_head = (np.arange(int(p)) == (chunks - 1) % int(p)).astype(float)
        # Seconds of every stage for every layout of this (pp, v): rows x stages.
        seconds = (
            stage_layers[None, :] * layer_s[rows, None] + stage_head[None, :] * head_s[rows, None]
        )
        slowest = np.argmax(seconds, axis=1)
        layers_out[rows] = stage_layers[slowest]
        head_out[rows] = stage_head[slowest]
    return layers_out, head_out
