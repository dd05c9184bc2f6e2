"""Synthetic Kineto traces of any size, for the speed benchmark and for tests.

The shape follows a real GPU trace closely enough for both scalelab and Holistic Trace Analysis to
read it: host `ProfilerStep#N` annotations; for every device event a host operator (`cpu_op`)
enclosing a launch call (`cuda_runtime`, linked by `correlation`); compute kernels on several
compute streams, NCCL kernels on communication streams running concurrently, memcpy/memset.
A final, empty profiler step is appended, as a profiler often leaves one; it also makes HTA's
default (drop the last step) see every kernel, so both tools measure the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

_COMPUTE_KERNELS = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_"
    "segment_k_off_kernel__5x_cublas",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3>)",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
    "cutlass::bfloat16_t> >(Flash_fwd_params)",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
)
_COMM_KERNELS = (
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "_allgather_base"),
    (
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "_reduce_scatter_base",
    ),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allreduce"),
)
_COPY_STREAM = 30
_COPIES = (("gpu_memcpy", "Memcpy DtoD (Device -> Device)"), ("gpu_memset", "Memset (Device)"))


def synthetic_trace(
    *,
    n_events: int,
    n_compute_streams: int = 2,
    n_comm_streams: int = 2,
    n_steps: int = 10,
    rank: int = 0,
    world_size: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    """A trace document with about `n_events` events (three per device event, plus a few)."""
    rng = np.random.default_rng(seed + 7919 * rank)
    n_device = max(n_events // 3, n_steps)
    per_step = n_device // n_steps
    n_device = per_step * n_steps
    pid, device = 4242 + rank, rank
    compute_streams = [7 + i for i in range(n_compute_streams)]
    comm_streams = [20 + i for i in range(n_comm_streams)]

    # Kind of each device event: 0 compute, 1 communication, 2 copy.
    kind = rng.choice(3, size=n_device, p=[0.88, 0.04, 0.08])
    dur = np.where(
        kind == 0,
        rng.integers(2, 120, n_device),
        np.where(kind == 1, rng.integers(20, 600, n_device), rng.integers(1, 30, n_device)),
    )
    # Mostly back-to-back kernels, with now and then a long gap (host-bound stretches, waits).
    gap = np.where(
        rng.random(n_device) < 0.03,
        rng.integers(100, 2000, n_device),
        rng.integers(0, 10, n_device),
    )
    stream = np.where(
        kind == 1,
        rng.choice(comm_streams, n_device),
        np.where(kind == 2, _COPY_STREAM, _pick(rng, compute_streams, n_device)),
    )
    variant = rng.integers(0, 1 << 30, n_device)

    start = np.zeros(n_device, dtype=np.int64)
    host_step_start = np.zeros(n_steps + 1, dtype=np.int64)
    t0 = 1_700_000_000_000 + 3_000_000 * rank % 997
    cursor = t0
    for k in range(n_steps):
        rows = slice(k * per_step, (k + 1) * per_step)
        step_start = np.full(len(stream[rows]), cursor)
        end_of_step = cursor
        for s in (*compute_streams, *comm_streams, _COPY_STREAM):
            mine = stream[rows] == s
            lengths = gap[rows][mine] + dur[rows][mine]
            ends = np.cumsum(lengths)
            step_start[mine] = cursor + ends - dur[rows][mine]
            if ends.size:
                end_of_step = max(end_of_step, cursor + int(ends[-1]))
        start[rows] = step_start
        host_step_start[k] = cursor - 150
        cursor = end_of_step + int(rng.integers(50, 400))
    host_step_start[n_steps] = cursor - 150

    # Launch calls: evenly over each host step, in device-start order within the step.
    launch = np.zeros(n_device, dtype=np.int64)
    for k in range(n_steps):
        in_step = np.arange(k * per_step, (k + 1) * per_step)
        order = in_step[np.argsort(start[in_step], kind="stable")]
        span = host_step_start[k + 1] - host_step_start[k] - 20
        launch[order] = host_step_start[k] + 5 + (np.arange(per_step) * span) // per_step

    events: list[dict[str, Any]] = []
    for k in range(n_steps + 1):
        end = host_step_start[k + 1] if k < n_steps else host_step_start[k] + 60
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{k + 1}",
                "pid": pid,
                "tid": pid,
                "ts": int(host_step_start[k]),
                "dur": int(end - host_step_start[k]),
                "args": {"External id": k + 1},
            }
        )
    corr0 = 1000
    for i, (knd, ts, d, st, lt, v) in enumerate(
        zip(
            kind.tolist(),
            start.tolist(),
            dur.tolist(),
            stream.tolist(),
            launch.tolist(),
            variant.tolist(),
            strict=True,
        )
    ):
        corr = corr0 + i
        if knd == 1:
            name, label = _COMM_KERNELS[v % len(_COMM_KERNELS)]
            cat, op = "kernel", "c10d::" + label
        elif knd == 2:
            cat, name = _COPIES[v % len(_COPIES)]
            op = "aten::copy_"
        else:
            cat, name = "kernel", _COMPUTE_KERNELS[v % len(_COMPUTE_KERNELS)]
            op = "aten::mm"
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": op,
                "pid": pid,
                "tid": pid,
                "ts": lt - 2,
                "dur": 6,
                "args": {"External id": corr},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync",
                "pid": pid,
                "tid": pid,
                "ts": lt,
                "dur": 3,
                "args": {"External id": corr, "cbid": 211, "correlation": corr},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": device,
                "tid": st,
                "ts": ts,
                "dur": d,
                "args": {
                    "External id": corr,
                    "device": device,
                    "stream": st,
                    "correlation": corr,
                },
            }
        )
    return {
        "schemaVersion": 1,
        "deviceProperties": [],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
        "traceName": f"synthetic-rank{rank}",
        "displayTimeUnit": "ms",
        "traceEvents": events,
    }


def _pick(rng: np.random.Generator, streams: list[int], n: int) -> Any:
    """Compute streams: a main one takes most kernels, side streams the rest."""
    if len(streams) == 1:
        return np.full(n, streams[0])
    p = np.full(len(streams), 0.15 / (len(streams) - 1))
    p[0] = 0.85
    return rng.choice(streams, n, p=p)


def write_synthetic_trace(path: str | Path, **kwargs: Any) -> int:
    """Write `synthetic_trace(**kwargs)` as JSON (gzipped when the name ends in .gz); return the
    number of events."""
    import gzip

    document = synthetic_trace(**kwargs)
    data = msgspec.json.encode(document)
    path = Path(path)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=1)
    path.write_bytes(data)
    return len(document["traceEvents"])


_ARGS_READ = (
    "correlation",
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "dtype",
    "Process Group Name",
    "Seq",
)


def write_job(
    source: str | Path,
    folder: str | Path,
    n_ranks: int,
    *,
    late_rank: int | None = None,
    late_us: float = 0.0,
    keep_categories: frozenset[str] | None = None,
) -> list[Path]:
    """A whole job's rank files made from one real trace: rank `r` is the source with its rank id
    and world size rewritten (`distributedInfo`, and each collective's `Group size`, so that its
    collectives span the job) and its clock shifted by a few microseconds ((r * 7919) % 97 µs),
    `late_rank` by `late_us` more: that rank then starts every collective last.
    `keep_categories`: keep only events of these categories, with only the args the analysis
    reads (smaller files, the same analysis of what is kept; None keeps all).
    Returns the files written, `rank<r>.json.gz`."""
    import gzip

    from scalelab.trace.load import read_bytes

    document = msgspec.json.decode(read_bytes(source))
    events = document["traceEvents"]
    if keep_categories is not None:
        events = [e for e in events if e.get("cat") in keep_categories]
        document["traceEvents"] = events
        read = set(_ARGS_READ)
        for e in events:  # and only the args the analysis reads
            if isinstance(e.get("args"), dict):
                e["args"] = {k: v for k, v in e["args"].items() if k in read}
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    original = [e["ts"] for e in timed]
    sized = [
        e["args"] for e in events if isinstance(e.get("args"), dict) and "Group size" in e["args"]
    ]
    for args in sized:
        args["Group size"] = n_ranks
    info = document.get("distributedInfo")
    info = dict(info) if isinstance(info, dict) else {"backend": "nccl"}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for rank in range(n_ranks):
        shift = float((rank * 7919) % 97) + (late_us if rank == late_rank else 0.0)
        for event, ts in zip(timed, original, strict=True):
            event["ts"] = ts + shift
        document["distributedInfo"] = {**info, "rank": rank, "world_size": n_ranks}
        path = folder / f"rank{rank}.json.gz"
        path.write_bytes(gzip.compress(msgspec.json.encode(document), compresslevel=1))
        written.append(path)
    return written
