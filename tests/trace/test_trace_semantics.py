"""The definitions on small handmade traces, where every number can be worked out by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from trace_helpers import write_trace, x

from scalelab.trace import analyze, analyze_file
from scalelab.trace.synthetic import synthetic_trace, write_synthetic_trace

HOST, DEVICE = 100, 0

US = 1000  # the handmade traces are in µs; the analyser answers in ns


def _launch(ts: float, corr: int) -> dict:
    return x("cudaLaunchKernel", ts, 2, cat="cuda_runtime", pid=HOST, tid=HOST, correlation=corr)


def _kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict:
    return x(name, ts, dur, cat="kernel", pid=DEVICE, tid=stream, correlation=corr, stream=stream)


def _step(n: int, ts: float, dur: float) -> dict:
    return x(f"ProfilerStep#{n}", ts, dur, cat="user_annotation", pid=HOST, tid=HOST)


def test_gpu_steps_are_laid_on_the_device_timeline(tmp_path: Path) -> None:
    """Host steps [0,100) and [100,200). Step 1 launches a compute kernel that runs [50,150),
    past the host step's end; step 2 launches an all-reduce that runs [160,220)."""
    events = [
        _step(1, 0, 100),
        _step(2, 100, 100),
        _launch(10, 1),
        _launch(110, 2),
        _kernel("gemm", 50, 100, 1),
        _kernel("ncclKernel_AllReduce_RING_LL_Sum_float(x)", 160, 60, 2, stream=20),
    ]
    rank = analyze_file(write_trace(tmp_path / "t.json", events))
    assert rank.mode == "gpu" and rank.step_source == "device"
    one, two = rank.steps
    assert (one.step, one.start_ns, one.wall_ns) == (1, 50 * US, 110 * US)
    assert (one.compute_ns, one.comm_ns, one.idle_ns) == (100 * US, 0, 10 * US)
    assert (two.step, two.start_ns, two.wall_ns) == (2, 160 * US, 60 * US)
    assert (two.comm_ns, two.exposed_comm_ns, two.overlap_ns) == (60 * US, 60 * US, 0)
    assert two.collectives["AllReduce"].count == 1
    assert rank.total.wall_ns == 170 * US and rank.outside_steps.wall_ns == 0
    assert rank.n_lanes == 2


def test_overlap_and_fractional_timestamps_are_kept_to_the_nanosecond(tmp_path: Path) -> None:
    """Compute [0.9, 101.1) µs; comm [49.5, 149.49) µs: overlap 51.6 µs, exposed 48.39 µs, all
    to the nanosecond (flooring to µs, as the first version did, gave 51 and 48)."""
    events = [
        _kernel("gemm", 0.9, 100.2, 1),
        _kernel("ncclDevKernel_AllGather_RING_LL(x)", 49.5, 99.99, 2, stream=20),
        x("Memcpy DtoH", 300.2, 10.7, cat="gpu_memcpy", pid=DEVICE, tid=9),
    ]
    total = analyze_file(write_trace(tmp_path / "t.json", events)).total
    assert (total.compute_ns, total.comm_ns, total.overlap_ns, total.exposed_comm_ns) == (
        100_200,
        99_990,
        51_600,
        48_390,
    )
    assert total.copy_only_ns == 10_700
    assert total.wall_ns == 310_000  # [0.9, 310.9) µs
    assert total.idle_ns == 310_000 - 100_200 - 48_390 - 10_700
    assert total.collectives["AllGather"].exposed_ns == 48_390


def test_steps_fall_back_to_host_windows_without_launch_links(tmp_path: Path) -> None:
    events = [_step(7, 0, 100), _kernel("gemm", 20, 30, -1)]
    rank = analyze_file(write_trace(tmp_path / "t.json", events))
    assert rank.step_source == "host"
    assert [(s.step, s.start_ns, s.wall_ns, s.compute_ns) for s in rank.steps] == [
        (7, 0, 100 * US, 30 * US)
    ]


def test_cpu_trace_definitions(tmp_path: Path) -> None:
    """Main thread: aten::mm [0,100), a blocking wait [100,150) with an op nested in it, aten::add
    [150,200). A gloo thread: gloo:all_reduce [80,150) and gloo's own copy inside it.
    Compute = [0,100) + [150,200) = 150; comm = 70; overlap = [80,100) = 20; exposed = 50."""
    main, gloo = 1, 2
    events = [
        _step(3, 0, 200) | {"pid": 1, "tid": main},
        x("aten::mm", 0, 100, cat="cpu_op", tid=main),
        x("_c10d_functional::wait_tensor", 100, 50, cat="cpu_op", tid=main),
        x("aten::empty", 120, 1, cat="cpu_op", tid=main),
        x("aten::add", 150, 50, cat="cpu_op", tid=main),
        x("gloo:all_reduce", 80, 70, cat="user_annotation", tid=gloo),
        x("aten::copy_", 90, 5, cat="cpu_op", tid=gloo),
    ]
    rank = analyze_file(write_trace(tmp_path / "t.json", events, deviceProperties=[]))
    assert rank.mode == "cpu" and rank.step_source == "host" and rank.n_lanes == 1
    t = rank.total
    assert (t.compute_ns, t.comm_ns, t.overlap_ns, t.exposed_comm_ns, t.idle_ns) == (
        150 * US,
        70 * US,
        20 * US,
        50 * US,
        0,
    )
    assert rank.steps[0].exposed_comm_ns == 50 * US
    assert t.collectives["AllReduce"].count == 1


def test_synthetic_trace_matches_a_naive_count(tmp_path: Path) -> None:
    """The generator used by the speed benchmark, small: totals equal a per-microsecond count."""
    document = synthetic_trace(n_events=3000, n_steps=4, seed=3)
    path = write_synthetic_trace(tmp_path / "s.json", n_events=3000, n_steps=4, seed=3)
    assert path == len(document["traceEvents"])
    device = [
        e for e in document["traceEvents"] if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    lo = min(e["ts"] for e in device)
    hi = max(e["ts"] + e["dur"] for e in device)
    comm = np.zeros(hi - lo, bool)
    compute = np.zeros(hi - lo, bool)
    for e in device:
        if e["cat"] == "kernel":
            target = comm if e["name"].startswith("nccl") else compute
            target[e["ts"] - lo : e["ts"] + e["dur"] - lo] = True
    report = analyze(tmp_path / "s.json")
    (rank,) = report.ranks
    assert rank.total.comm_ns == US * int(comm.sum()) > 0
    assert rank.total.compute_ns == US * int(compute.sum())
    assert rank.total.exposed_comm_ns == US * int((comm & ~compute).sum()) > 0
    assert [s.step for s in rank.steps] == [1, 2, 3, 4, 5]
    assert rank.steps[-1].wall_ns == 0  # the trailing empty step
    assert rank.outside_steps.comm_ns == 0
    assert set(rank.total.collectives) == {"AllGather", "ReduceScatter", "AllReduce"}


def test_ranks_are_sorted_and_the_slowest_is_found(tmp_path: Path) -> None:
    write_trace(
        tmp_path / "b.json",
        [_step(1, 0, 100), _launch(1, 1), _kernel("gemm", 10, 500, 1)],
        distributedInfo={"rank": 1, "world_size": 2},
    )
    write_trace(
        tmp_path / "a.json",
        [_step(1, 0, 100), _launch(1, 1), _kernel("gemm", 10, 50, 1)],
        distributedInfo={"rank": 0, "world_size": 2},
    )
    report = analyze(tmp_path)
    assert [r.rank for r in report.ranks] == [0, 1]
    assert report.summary.slowest_rank == 1
    assert report.summary.metrics["wall_ns"].mean == 275 * US


def test_cpu_collective_on_the_training_thread_only_takes_its_own_span(tmp_path: Path) -> None:
    """A collective that shows up on the thread with the profiler steps does not make that thread
    a gloo worker: its other operators stay compute, the collective's span (and what runs inside
    it) does not. aten::mm [0,100) compute; gloo:broadcast [100,150) with a copy inside it."""
    events = [
        _step(1, 0, 200) | {"pid": 1, "tid": 1},
        x("aten::mm", 0, 100, cat="cpu_op"),
        x("gloo:broadcast", 100, 50, cat="user_annotation"),
        x("aten::copy_", 110, 10, cat="cpu_op"),
        x("aten::add", 150, 30, cat="cpu_op"),
    ]
    rank = analyze_file(write_trace(tmp_path / "t.json", events))
    t = rank.total
    assert rank.n_lanes == 0  # no worker thread
    assert (t.compute_ns, t.comm_ns, t.exposed_comm_ns, t.idle_ns) == (
        130 * US,
        50 * US,
        50 * US,
        20 * US,
    )
    assert t.collectives["Broadcast"].count == 1
