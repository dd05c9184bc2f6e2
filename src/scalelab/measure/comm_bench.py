"""An nccl-tests-style collective sweep on PyTorch distributed (NCCL on GPUs, gloo on CPU).

Definitions are nccl-tests' (NVIDIA/nccl-tests src/common.cu `TimeTest`/`BenchTime`, and each
collective's `GetCollByteCount` and `GetBw`; doc/PERFORMANCE.md):

- `size` is max(send, receive) bytes of one rank: the whole gathered output for all_gather, the
  whole input for reduce_scatter and all_to_all, the buffer for all_reduce, what each rank sends
  for send_recv; `count` is the operation's element-count argument (the per-rank chunk for
  all_gather, reduce_scatter and all_to_all, the buffer for all_reduce and send_recv).
- Each size runs out-of-place, then in-place (nccl-tests' `in_place` 0 then 1): in-place sends
  from and receives into one buffer, at the rank's offset for all_gather and reduce_scatter.
  PyTorch's all_reduce is in-place only, so the out-of-place one copies the input into the
  output buffer first (the copy is timed with it).
- The result check (nccl-tests' `-c`): after timing, each mode fills the inputs with known values,
  runs the operation `check` times and counts the elements that differ from the values computed
  here (`#wrong`, summed over ranks). The values are small integers (exact in float32 sums), so
  the check is exact. As in nccl-tests, in-place all_to_all and send_recv are timed but not
  checked (nccl-tests: "We don't support in-place ..."); their `#wrong` is None.
- algbw = size / time; busbw = algbw x factor: all_reduce 2(n-1)/n, all_gather, reduce_scatter
  and all_to_all (n-1)/n, send_recv 1 (`scalelab.collectives`).

Timing: the time of one iteration is the slowest rank's (an all-reduce of MAX over ranks; nccl-
tests averages over ranks by default, `-a 1`); the reported time is the median over the measured
iterations. On GPUs, as nccl-tests does, the measured iterations run back to back after one barrier
and are timed together with CUDA events (`timing: cuda_events_batched`); on CPU each iteration is
timed on the host clock after a barrier (`host_per_iter`), the only clock gloo has.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from scalelab import collectives as coll

COLLECTIVES = coll.BENCHMARKED
# Element type of every buffer, and its name as nccl-tests prints it (`ncclFloat` -> "float").
DTYPE = torch.float32
DTYPE_NAME = "float"
_ELEMENT_BYTES = 4
# Largest pattern value of the check: values 1..modulus, so that a sum over `n` ranks stays
# below 2**24 (every partial sum exact in float32, whatever the reduction order).
_PATTERN_MODULUS = 8191
# A rank's pattern is shifted by this many elements, so that each rank's data differs.
_RANK_SHIFT = 1021


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw (defined once, in `scalelab.collectives`)."""
    return float(coll.bus_factor(collective, n))


def _all_gather(out: torch.Tensor, src: torch.Tensor) -> None:
    """All-gather into one tensor by the name this PyTorch offers (`all_gather_single` from 2.11;
    `all_gather_into_tensor` before, deprecated since with a warning on every call)."""
    if hasattr(dist, "all_gather_single"):
        dist.all_gather_single(out, src)
    else:  # pragma: no cover - older PyTorch
        dist.all_gather_into_tensor(out, src)


def _reduce_scatter(out: torch.Tensor, src: torch.Tensor) -> None:
    """Reduce-scatter (SUM) from one tensor (`reduce_scatter_single` where PyTorch has it)."""
    if hasattr(dist, "reduce_scatter_single"):
        dist.reduce_scatter_single(out, src)
    else:  # pragma: no cover - older PyTorch
        dist.reduce_scatter_tensor(out, src)


def pattern(rank: int, start: int, count: int, world: int, device: torch.device) -> torch.Tensor:
    """The check's value of elements `start .. start+count` of rank `rank`'s input: small
    integers, different on every rank, whose sum over `world` ranks is exact in float32."""
    modulus = max(2, min(_PATTERN_MODULUS, (2**24 - 1) // max(world, 1)))
    index_type = torch.int32 if start + count + _RANK_SHIFT * (rank + 1) < 2**31 else torch.int64
    index = torch.arange(start, start + count, dtype=index_type, device=device)
    return ((index + _RANK_SHIFT * rank) % modulus + 1).to(DTYPE)


def _summed(start: int, count: int, world: int, device: torch.device) -> torch.Tensor:
    """The SUM over ranks of `pattern(r, start, count)`."""
    total = torch.zeros(count, dtype=DTYPE, device=device)
    for r in range(world):
        total += pattern(r, start, count, world, device)
    return total


@dataclass
class Case:
    """One collective at one size in one mode: what nccl-tests prints in front of the times
    (`size`, `count`, `redop`) and the three things the sweep does with it."""

    size_bytes: int
    count: int
    redop: str
    run: Callable[[], None]
    # Fills the inputs with the check's values; None: this mode is not checked (nccl-tests' N/A).
    fill: Callable[[], None] | None
    # Elements of this rank's result that differ from the expected values.
    wrong: Callable[[], int]


def _no_wrong() -> int:
    return 0


def make_case(
    collective: str, nbytes: int, world: int, rank: int, device: torch.device, in_place: bool
) -> Case:
    """Buffers and closures for one collective of about `nbytes` (float32 elements; at least one
    element per rank), out-of-place or in-place."""
    elements = max(1, nbytes // _ELEMENT_BYTES)
    chunk = max(1, elements // world)  # per-rank chunk of the chunked collectives

    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=DTYPE, device=device)

    def count_wrong(got: torch.Tensor, expected: Callable[[], torch.Tensor]) -> Callable[[], int]:
        return lambda: int((got != expected()).sum().item())

    if collective == "all_reduce":
        buf, src = zeros(elements), zeros(elements)

        def run_all_reduce() -> None:
            if not in_place:
                buf.copy_(src)
            dist.all_reduce(buf)

        def fill_all_reduce() -> None:
            (buf if in_place else src).copy_(pattern(rank, 0, elements, world, device))

        return Case(
            elements * _ELEMENT_BYTES,
            elements,
            "sum",
            run_all_reduce,
            fill_all_reduce,
            count_wrong(buf, lambda: _summed(0, elements, world, device)),
        )
    if collective == "all_gather":
        out = zeros(chunk * world)
        src = out.narrow(0, rank * chunk, chunk) if in_place else zeros(chunk)

        def fill_all_gather() -> None:
            out.zero_()
            src.copy_(pattern(rank, rank * chunk, chunk, world, device))

        def expected_gather() -> torch.Tensor:
            return torch.cat([pattern(r, r * chunk, chunk, world, device) for r in range(world)])

        return Case(
            chunk * world * _ELEMENT_BYTES,
            chunk,
            "none",
            lambda: _all_gather(out, src),
            fill_all_gather,
            count_wrong(out, expected_gather),
        )
    if collective == "reduce_scatter":
        src = zeros(chunk * world)
        out = src.narrow(0, rank * chunk, chunk) if in_place else zeros(chunk)

        def fill_reduce_scatter() -> None:
            out.zero_()
            src.copy_(pattern(rank, 0, chunk * world, world, device))

        return Case(
            chunk * world * _ELEMENT_BYTES,
            chunk,
            "sum",
            lambda: _reduce_scatter(out, src),
            fill_reduce_scatter,
            count_wrong(out, lambda: _summed(rank * chunk, chunk, world, device)),
        )
    if collective == "all_to_all":
        src = zeros(chunk * world)
        out = src if in_place else zeros(chunk * world)

        def fill_all_to_all() -> None:
            out.zero_()
            src.copy_(pattern(rank, 0, chunk * world, world, device))

        def expected_all_to_all() -> torch.Tensor:
            # Block j of the result is block `rank` of rank j's input.
            return torch.cat([pattern(j, rank * chunk, chunk, world, device) for j in range(world)])

        return Case(
            chunk * world * _ELEMENT_BYTES,
            chunk,
            "none",
            lambda: dist.all_to_all_single(out, src),
            None if in_place else fill_all_to_all,
            count_wrong(out, expected_all_to_all) if not in_place else _no_wrong,
        )
    if collective == "send_recv":
        recv = zeros(elements)
        send = recv if in_place else zeros(elements)
        peer_next, peer_prev = (rank + 1) % world, (rank - 1) % world

        def run_send_recv() -> None:
            ops = [
                dist.P2POp(dist.isend, send, peer_next),
                dist.P2POp(dist.irecv, recv, peer_prev),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        def fill_send_recv() -> None:
            recv.zero_()
            send.copy_(pattern(rank, 0, elements, world, device))

        return Case(
            elements * _ELEMENT_BYTES,
            elements,
            "sum",  # nccl-tests' sendrecv takes an op argument it does not use; it prints "sum"
            run_send_recv,
            None if in_place else fill_send_recv,
            count_wrong(recv, lambda: pattern(peer_prev, 0, elements, world, device))
            if not in_place
            else _no_wrong,
        )
    raise ValueError(collective)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _batched_cuda(op: Callable[[], None], iters: int, device: torch.device) -> list[float]:
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


def _time(case: Case, iters: int, warmup: int, device: torch.device) -> list[float]:
    """Per-iteration times of the slowest rank (seconds)."""
    for _ in range(warmup):
        case.run()
    _sync(device)
    times = _batched_cuda(case.run, iters, device) if device.type == "cuda" else []
    for _ in range(0 if times else iters):
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        case.run()
        _sync(device)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return [float(t) for t in slowest.cpu().tolist()]


def _check(case: Case, check_iters: int, device: torch.device) -> int | None:
    """nccl-tests' CheckData: fill, run once, count wrong elements over all ranks; repeated
    `check_iters` times, stopping at the first wrong result. None: not checked."""
    if case.fill is None or check_iters == 0:
        return None
    wrong_total = 0
    for _ in range(check_iters):
        case.fill()
        case.run()
        _sync(device)
        wrong = torch.tensor([case.wrong()], dtype=torch.int64, device=device)
        dist.all_reduce(wrong)
        wrong_total = int(wrong.item())
        if wrong_total:
            break
    return wrong_total


def _mode_row(
    case: Case, per_iter: list[float], wrong: int | None, collective: str, world: int
) -> dict[str, Any]:
    median = statistics.median(per_iter)
    algbw = case.size_bytes / median
    return {
        "time_s": median,
        "time_s_min": min(per_iter),
        "time_s_max": max(per_iter),
        "algbw_GBps": algbw / 1e9,
        "busbw_GBps": algbw * bus_factor(collective, world) / 1e9,
        "wrong": wrong,
    }


def sweep(
    collectives: list[str],
    sizes: list[int],
    iters: int,
    warmup: int,
    device: torch.device,
    check_iters: int = 1,
) -> list[dict[str, Any]]:
    """Run the sweep on the initialised default group; every rank returns the same rows.

    A row holds the out-of-place figures at its top level (`time_s`, `algbw_GBps`, ..., `wrong`)
    and the in-place ones under `in_place`."""
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for collective in collectives:
        if collective == "send_recv" and world < 2:
            continue
        for nbytes in sizes:
            modes = {}
            for in_place in (False, True):
                # One mode's buffers at a time (the out-of-place ones are freed first).
                case = make_case(collective, nbytes, world, rank, device, in_place)
                size_bytes, count, redop = case.size_bytes, case.count, case.redop
                per_iter = _time(case, iters, warmup, device)
                wrong = _check(case, check_iters, device)
                modes[in_place] = _mode_row(case, per_iter, wrong, collective, world)
                del case
            rows.append(
                {
                    "collective": collective,
                    "bytes": size_bytes,
                    "requested_bytes": nbytes,
                    "count": count,
                    "type": DTYPE_NAME,
                    "redop": redop,
                    "root": -1,
                    **modes[False],
                    "in_place": modes[True],
                    "iters": iters,
                    "check_iters": check_iters,
                    "timing": "cuda_events_batched" if device.type == "cuda" else "host_per_iter",
                }
            )
    return rows
