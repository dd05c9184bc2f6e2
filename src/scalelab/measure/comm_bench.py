"""An nccl-tests-style collective sweep on PyTorch distributed (NCCL on GPUs, gloo on CPU).

Definitions are nccl-tests' (doc/PERFORMANCE.md): `size` is the buffer that sizes the
operation — the whole gathered output for all_gather, the whole input for reduce_scatter and
all_to_all, the buffer for all_reduce, what each rank sends for send_recv. Operations are
out-of-place. The time of one iteration is the slowest rank's (an all-reduce of MAX over ranks);
the reported time is the median over the measured iterations. On GPUs, as nccl-tests does, the
measured iterations run back to back after one barrier and are timed together with CUDA events
(`timing: cuda_events_batched`); on CPU each iteration is timed on the host clock after a
barrier (`host_per_iter`), the only clock gloo has. algbw = size / time; busbw =
algbw x factor: all_reduce 2(n-1)/n, all_gather, reduce_scatter and all_to_all (n-1)/n,
send_recv 1.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from scalelab import collectives as coll

COLLECTIVES = coll.BENCHMARKED


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw (defined once, in `scalelab.collectives`)."""
    return float(coll.bus_factor(collective, n))


def _operation(collective: str, nbytes: int, world: int, rank: int, device: torch.device) -> Any:
    """A closure running one out-of-place collective of `nbytes` (float32 elements)."""
    elems = max(world, nbytes // 4)
    elems -= elems % world
    if collective == "all_reduce":
        src = torch.ones(elems, device=device)
        dst = torch.empty_like(src)

        def run() -> None:
            dst.copy_(src)
            dist.all_reduce(dst)

        return run
    if collective == "all_gather":
        src = torch.ones(elems // world, device=device)
        out = torch.empty(elems, device=device)
        return lambda: dist.all_gather_into_tensor(out, src)
    if collective == "reduce_scatter":
        src = torch.ones(elems, device=device)
        out = torch.empty(elems // world, device=device)
        return lambda: dist.reduce_scatter_tensor(out, src)
    if collective == "all_to_all":
        src = torch.ones(elems, device=device)
        out = torch.empty_like(src)
        return lambda: dist.all_to_all_single(out, src)
    if collective == "send_recv":
        buf_send = torch.ones(max(1, nbytes // 4), device=device)
        buf_recv = torch.empty_like(buf_send)
        peer_next, peer_prev = (rank + 1) % world, (rank - 1) % world

        def run() -> None:
            ops = [
                dist.P2POp(dist.isend, buf_send, peer_next),
                dist.P2POp(dist.irecv, buf_recv, peer_prev),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        return run
    raise ValueError(collective)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _batched_cuda(op: Any, iters: int, device: torch.device) -> list[float]:
    """nccl-tests' timing: one barrier, then `iters` operations back to back between two CUDA
    events on the current stream; each iteration's time is the batch's average (the same value
    `iters` times, so the MAX over ranks and the median are the batch's)."""
    dist.barrier()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        op()
    end.record()
    end.synchronize()
    per_iter = start.elapsed_time(end) / 1e3 / iters
    return [per_iter] * iters


def sweep(
    collectives: list[str], sizes: list[int], iters: int, warmup: int, device: torch.device
) -> list[dict[str, Any]]:
    """Run the sweep on the initialised default group; every rank returns the same rows."""
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for collective in collectives:
        if collective == "send_recv" and world < 2:
            continue
        for nbytes in sizes:
            op = _operation(collective, nbytes, world, rank, device)
            for _ in range(warmup):
                op()
            _sync(device)
            times = _batched_cuda(op, iters, device) if device.type == "cuda" else []
            for _ in range(0 if times else iters):
                dist.barrier()
                _sync(device)
                start = time.perf_counter()
                op()
                _sync(device)
                times.append(time.perf_counter() - start)
            slowest = torch.tensor(times, dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            per_iter = slowest.cpu().tolist()
            median = statistics.median(per_iter)
            algbw = nbytes / median
            rows.append(
                {
                    "collective": collective,
                    "bytes": nbytes,
                    "time_s": median,
                    "time_s_min": min(per_iter),
                    "time_s_max": max(per_iter),
                    "algbw_GBps": algbw / 1e9,
                    "busbw_GBps": algbw * bus_factor(collective, world) / 1e9,
                    "iters": iters,
                    "timing": "cuda_events_batched" if device.type == "cuda" else "host_per_iter",
                }
            )
    return rows
