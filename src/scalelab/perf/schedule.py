"""One training step: compute and communication streams, layer by layer.

Without pipelining, data-parallel collectives run on one communication stream beside the compute
stream, in the order FSDP2 issues them: the next layer's AllGather is issued (prefetched) when a
layer's forward starts; in backward the previous layer's AllGather is issued when a layer's
backward starts and its gradient ReduceScatter (then HSDP's AllReduce across replicas, or DDP's
bucketed AllReduce) when it ends. Compute waits for its layer's parameters; the time it waits is
the exposed communication. Compute that overlaps communication runs `overlap_slowdown` slower
(the kernels share SMs and HBM). The layers are identical, so the first few are simulated exactly
and the rest continue the steady state they reach.

With pipelining, each stage runs `n_microbatches` forward and backward passes plus the schedule's
bubble; FSDP's collectives happen once per step (first micro-batch forward, last backward) and
overlap per layer. Tensor-parallel collectives sit on the critical path; context parallelism's
K/V ring overlaps the attention it feeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_EXACT_LAYERS = 6


@dataclass
class PassResult:
    """Seconds for one micro-batch (forward + backward) from an idle start."""

    time_s: np.ndarray
    compute_busy_s: np.ndarray
    exposed_comm_s: np.ndarray


def _extrapolate(values_k: np.ndarray, values_k1: np.ndarray, remaining: int) -> np.ndarray:
    return values_k + remaining * (values_k - values_k1)


def simulate_microbatch(
    *,
    n_layers: int,
    forward_s: np.ndarray,
    backward_s: np.ndarray,
    head_forward_s: np.ndarray,
    head_backward_s: np.ndarray,
    all_gather_s: np.ndarray,
    grad_reduce_s: np.ndarray,
    root_all_gather_s: np.ndarray,
    root_grad_reduce_s: np.ndarray,
    gather_in_backward: np.ndarray,
    sync_grads: bool,
    overlap_slowdown: float,
) -> PassResult:
    """Forward and backward of one micro-batch with data-parallel comm overlapped by prefetch."""
    has_ag = all_gather_s > 0
    zeros = np.zeros_like(forward_s)
    exact = min(n_layers, _EXACT_LAYERS)
    remaining = n_layers - exact

    # Forward: the root's parameters (embedding, final norm, head) first, then the layers.
    t = root_all_gather_s.copy()
    comm = root_all_gather_s.copy()
    wait = root_all_gather_s.copy()
    busy = zeros.copy()
    ag_done = np.where(has_ag, comm + all_gather_s, zeros)
    comm = np.where(has_ag, ag_done, comm)
    history = []
    for i in range(exact):
        start = np.maximum(t, ag_done)
        wait = wait + (start - t)
        if i < n_layers - 1:
            nxt_start = np.maximum(comm, start)
            nxt_done = np.where(has_ag, nxt_start + all_gather_s, zeros)
            comm = np.where(has_ag, nxt_done, comm)
            ag_done = nxt_done
        overlap = np.clip(comm - start, 0.0, forward_s)
        duration = forward_s + overlap_slowdown * overlap
        busy = busy + duration
        t = start + duration
        history.append((t, comm, wait, busy))
    if remaining > 0:
        (t, comm, wait, busy), prev = history[-1], history[-2]
        t, comm, wait, busy = (
            _extrapolate(a, b, remaining) for a, b in zip((t, comm, wait, busy), prev, strict=True)
        )
    t = t + head_forward_s + head_backward_s
    busy = busy + head_forward_s + head_backward_s

    # Backward: layers in reverse; gather again if resharded, then reduce the gradients.
    bwd_ag = has_ag & gather_in_backward
    ag_done = np.where(bwd_ag, np.maximum(comm, t - head_backward_s) + all_gather_s, zeros)
    comm = np.where(bwd_ag, ag_done, comm)
    history = []
    for j in range(exact):
        start = np.maximum(t, ag_done)
        wait = wait + (start - t)
        if j < n_layers - 1:
            nxt_start = np.maximum(comm, start)
            nxt_done = np.where(bwd_ag, nxt_start + all_gather_s, zeros)
            comm = np.where(bwd_ag, nxt_done, comm)
            ag_done = nxt_done
        overlap = np.clip(comm - start, 0.0, backward_s)
        duration = backward_s + overlap_slowdown * overlap
        busy = busy + duration
        t = start + duration
        if sync_grads:
            comm = np.maximum(comm, t) + grad_reduce_s
        history.append((t, comm, wait, busy))
    if remaining > 0:
        (t, comm, wait, busy), prev = history[-1], history[-2]
        t, comm, wait, busy = (
            _extrapolate(a, b, remaining) for a, b in zip((t, comm, wait, busy), prev, strict=True)
        )
    if sync_grads:
        comm = np.maximum(comm, t) + root_grad_reduce_s
        end = np.maximum(t, comm)
        wait = wait + (end - t)
        t = end
    return PassResult(time_s=t, compute_busy_s=busy, exposed_comm_s=wait)


def pipeline_bubble_units(
    pp: np.ndarray, virtual_stages: np.ndarray, schedule: np.ndarray
) -> np.ndarray:
    """Idle micro-batch slots (in units of one micro-batch's forward+backward) per step.

    GPipe and 1F1B: pp-1; interleaved 1F1B: (pp-1)/v (Narayanan et al. 2021); ZB-V: the backward
    for weights fills most of the bubble, leaving about a third of it (Qi et al. 2024).
    """
    base = (pp - 1.0) / np.where(np.isin(schedule, (2, 3)), virtual_stages, 1)
    return np.where(schedule == 3, base / 3.0, base)
