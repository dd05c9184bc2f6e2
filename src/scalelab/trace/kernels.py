"""Per rank: where device time goes by kernel class and kernel, by user annotation, why each
stream sits idle (as Holistic Trace Analysis defines it) and how kernels are launched.

Everything here works on the columns `extract` keeps for a GPU trace (`DeviceDetail`), with
numpy over all device events at once.

Idle causes (HTA's `get_idle_time_breakdown`): on each stream, the gap before a kernel is
* **host wait** (launch-bound) when the kernel's launch call started after the previous kernel on
  the stream ended: the GPU waited for the CPU;
* **kernel wait** when it is not host wait and the gap is under `kernel_wait_ns` (default 30 µs,
  see KERNEL_WAIT_NS): back-to-back launch overhead;
* **other** otherwise: the kernel was queued but waited on something else, typically a
  synchronisation with another stream or an event (e.g. a compute stream waiting on an all-gather).

Launch statistics (HTA's `get_cuda_kernel_launch_stats`): launch delay = kernel start − end of its
launch call (clipped at 0); a *short kernel* runs for less time than its launch call took (and the
call took at most 50 µs): the host cannot keep such kernels fed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.trace import classify
from scalelab.trace.extract import Timeline
from scalelab.trace.intervals import Int64Array, IntervalSet, distinct, percentile

# HTA 0.5's `consecutive_kernel_delay` is 30, documented as nanoseconds
# (hta/trace_analysis.py, get_idle_time_breakdown) but compared with its trace data, which keeps
# Kineto's microseconds (hta/analyzers/breakdown_analysis.py): 30 µs in effect. 30 ns would make
# the column 0 by construction on every trace written in whole microseconds.
KERNEL_WAIT_NS = 30_000
SHORT_KERNEL_RUNTIME_CUTOFF_NS = 50_000  # HTA's runtime_cutoff default (50 µs)
TOP_KERNELS = 5
TOP_ANNOTATIONS = 20


@dataclass(eq=False)
class KernelStat:
    name: str
    count: int
    total_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count, "total_ns": self.total_ns}


@dataclass(eq=False)
class KernelClassStat:
    """One kernel class: the summed durations of its events (not a union: kernels on several
    streams each count), its share of all device time, and its top kernels by time."""

    kernel_class: str
    count: int
    total_ns: int
    share_pct: float
    top: list[KernelStat]

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.kernel_class,
            "count": self.count,
            "total_ns": self.total_ns,
            "share_pct": round(self.share_pct, 2),
            "top": [k.to_dict() for k in self.top],
        }


@dataclass(eq=False)
class AnnotationStat:
    """A device-side user annotation (all its spans together): compute and communication time
    under it and the part of that communication with no compute running (exposed)."""

    name: str
    count: int
    wall_ns: int
    compute_ns: int
    comm_ns: int
    exposed_comm_ns: int
    # Per collective under it: its exposed time (which layer's AllGather is exposed).
    exposed_by_collective: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "count": self.count,
            "wall_ns": self.wall_ns,
            "compute_ns": self.compute_ns,
            "comm_ns": self.comm_ns,
            "exposed_comm_ns": self.exposed_comm_ns,
            "exposed_by_collective_ns": dict(self.exposed_by_collective),
        }


@dataclass(eq=False)
class StreamIdle:
    """Idle time between consecutive events of one stream, by cause (see the module doc)."""

    stream: str
    busy_ns: int
    host_wait_ns: int
    kernel_wait_ns: int
    other_ns: int

    @property
    def idle_ns(self) -> int:
        return self.host_wait_ns + self.kernel_wait_ns + self.other_ns

    def to_dict(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "busy_ns": self.busy_ns,
            "idle_ns": self.idle_ns,
            "host_wait_ns": self.host_wait_ns,
            "kernel_wait_ns": self.kernel_wait_ns,
            "other_ns": self.other_ns,
        }


@dataclass(eq=False)
class LaunchStats:
    """Kernels linked to their launch call: launch delay and kernels shorter than their launch."""

    linked: int
    unlinked: int
    delay_mean_ns: float
    delay_median_ns: float
    delay_p95_ns: float
    delay_max_ns: int
    launch_mean_ns: float
    short_kernels: int
    short_kernel_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "linked": self.linked,
            "unlinked": self.unlinked,
            "launch_delay_ns": {
                "mean": round(self.delay_mean_ns, 1),
                "median": round(self.delay_median_ns, 1),
                "p95": round(self.delay_p95_ns, 1),
                "max": self.delay_max_ns,
            },
            "launch_call_mean_ns": round(self.launch_mean_ns, 1),
            "short_kernels": self.short_kernels,
            "short_kernel_ns": self.short_kernel_ns,
        }


@dataclass(eq=False)
class KernelReport:
    """The kernel-level view of one rank (GPU traces)."""

    classes: list[KernelClassStat]
    annotations: list[AnnotationStat]
    streams: list[StreamIdle]
    launches: LaunchStats
    kernel_wait_ns: int = KERNEL_WAIT_NS  # the threshold the idle causes were split with
    # Per profiler step: summed kernel time of each compute class (GEMM, attention, element-wise,
    # other), kernels assigned to the step window they start in.
    compute_class_ns_by_step: dict[int, dict[str, int]] = field(default_factory=dict)

    @property
    def idle_by_cause(self) -> dict[str, int]:
        return {
            "host_wait_ns": sum(s.host_wait_ns for s in self.streams),
            "kernel_wait_ns": sum(s.kernel_wait_ns for s in self.streams),
            "other_ns": sum(s.other_ns for s in self.streams),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "classes": [c.to_dict() for c in self.classes],
            "annotations": [a.to_dict() for a in self.annotations],
            "idle_by_stream": [s.to_dict() for s in self.streams],
            "idle_by_cause": self.idle_by_cause,
            "kernel_wait_threshold_ns": self.kernel_wait_ns,
            "launches": self.launches.to_dict(),
        }


def kernel_report(
    t: Timeline,
    compute: IntervalSet,
    comm: IntervalSet,
    step_numbers: Int64Array,
    step_start_ns: Int64Array,
    step_end_ns: Int64Array,
    exposed_by_collective: list[tuple[str, IntervalSet]] | None = None,
    exposed: IntervalSet | None = None,
    kernel_wait_ns: int = KERNEL_WAIT_NS,
) -> KernelReport | None:
    """The kernel view of a GPU trace's timeline; None for CPU traces. `exposed`: `comm` less
    `compute`, where the caller has it already."""
    d = t.device
    if d is None:
        return None
    start, end = t.activity_start_ns, t.activity_end_ns
    dur = end - start
    class_index = {c: i for i, c in enumerate(classify.KERNEL_CLASSES)}
    # Classify each distinct (name, kind) once.
    pair = d.name_id.astype(np.int64) * 3 + d.kind
    uniq, inverse = np.unique(pair, return_inverse=True)
    uniq_class = np.asarray(
        [
            class_index[classify.kernel_class(d.names[int(p) // 3], int(p) % 3)]
            for p in uniq.tolist()
        ],
        dtype=np.int8,
    )
    event_class = uniq_class[inverse.reshape(-1)]
    total_all = int(dur.sum())
    by_name_time = np.bincount(d.name_id, weights=dur, minlength=len(d.names))
    by_name_count = np.bincount(d.name_id, minlength=len(d.names))
    classes = []
    for ci, cname in enumerate(classify.KERNEL_CLASSES):
        mine = event_class == ci
        if not mine.any():
            continue
        ids = distinct(d.name_id[mine])
        times = by_name_time[ids]
        top = ids[np.argsort(-times, kind="stable")[:TOP_KERNELS]]
        total = int(dur[mine].sum())
        classes.append(
            KernelClassStat(
                cname,
                int(mine.sum()),
                total,
                100.0 * total / total_all if total_all else 0.0,
                [KernelStat(d.names[i], int(by_name_count[i]), int(by_name_time[i])) for i in top],
            )
        )
    classes.sort(key=lambda c: -c.total_ns)
    return KernelReport(
        classes=classes,
        annotations=_annotations(t, compute, comm, exposed_by_collective or [], exposed),
        streams=_stream_idle(t, kernel_wait_ns),
        launches=_launch_stats(t),
        kernel_wait_ns=kernel_wait_ns,
        compute_class_ns_by_step=_compute_classes_by_step(
            start, dur, event_class, step_numbers, step_start_ns, step_end_ns
        ),
    )


COMPUTE_CLASSES = (
    "GEMM",
    "attention",
    "embedding",
    "quantisation",
    "KV cache",
    "element-wise",
    "other",
)


def _compute_classes_by_step(
    start: Int64Array,
    dur: Int64Array,
    event_class: np.ndarray,
    numbers: Int64Array,
    lo: Int64Array,
    hi: Int64Array,
) -> dict[int, dict[str, int]]:
    if numbers.size == 0:
        return {}
    step = np.searchsorted(lo, start, side="right") - 1
    inside = step >= 0
    inside[inside] = start[inside] < hi[step[inside]]
    n_classes = len(classify.KERNEL_CLASSES)
    table = np.zeros((numbers.size, n_classes), dtype=np.int64)
    np.add.at(table, (step[inside], event_class[inside].astype(np.int64)), dur[inside])
    wanted = [classify.KERNEL_CLASSES.index(c) for c in COMPUTE_CLASSES]
    return {
        int(n): {classify.KERNEL_CLASSES[c]: int(table[i, c]) for c in wanted}
        for i, n in enumerate(numbers.tolist())
    }


def _annotations(
    t: Timeline,
    compute: IntervalSet,
    comm: IntervalSet,
    exposed_by_collective: list[tuple[str, IntervalSet]],
    exposed: IntervalSet | None = None,
) -> list[AnnotationStat]:
    d = t.device
    assert d is not None
    if d.annotation_start_ns.size == 0:
        return []
    lo, hi = d.annotation_start_ns, d.annotation_end_ns
    if exposed is None:
        exposed = comm.difference(compute)
    c_compute = compute.covered_in(lo, hi)
    c_comm = comm.covered_in(lo, hi)
    c_exposed = exposed.covered_in(lo, hi)
    names = d.annotation_names
    index: dict[str, int] = {}
    ids = np.fromiter((index.setdefault(n, len(index)) for n in names), np.int64, len(names))
    k = len(index)

    def total(values: Int64Array) -> np.ndarray:
        return np.bincount(ids, weights=values, minlength=k)

    count = np.bincount(ids, minlength=k)
    wall, comp, com, exp = total(hi - lo), total(c_compute), total(c_comm), total(c_exposed)
    order = np.lexsort((-com, -exp))[:TOP_ANNOTATIONS]
    labels = list(index)
    per_collective = [
        (name, total(exposed_set.covered_in(lo, hi))) for name, exposed_set in exposed_by_collective
    ]
    return [
        AnnotationStat(
            labels[i],
            int(count[i]),
            int(wall[i]),
            int(comp[i]),
            int(com[i]),
            int(exp[i]),
            {name: int(v[i]) for name, v in per_collective if v[i] > 0},
        )
        for i in order.tolist()
    ]


def _stream_idle(t: Timeline, kernel_wait_ns: int) -> list[StreamIdle]:
    d = t.device
    assert d is not None
    order = np.lexsort((t.activity_start_ns, d.lane))
    lane = d.lane[order]
    start = t.activity_start_ns[order]
    end = t.activity_end_ns[order]
    launch = d.launch_start_ns[order]
    same = np.empty(lane.size, dtype=bool)
    if lane.size:
        same[0] = False
        np.equal(lane[1:], lane[:-1], out=same[1:])
    prev_end = np.empty_like(end)
    if end.size:
        prev_end[0] = 0
        prev_end[1:] = end[:-1]
    gap = np.where(same, np.maximum(start - prev_end, 0), 0)
    host_wait = same & (launch >= 0) & (launch > prev_end)
    kernel_wait = same & ~host_wait & (gap < kernel_wait_ns)
    other = same & ~host_wait & ~kernel_wait
    n = len(d.lane_labels)

    def per_lane(mask: np.ndarray) -> np.ndarray:
        return np.bincount(lane[mask], weights=gap[mask], minlength=n)

    hw, kw, ot = per_lane(host_wait), per_lane(kernel_wait), per_lane(other)
    busy = np.bincount(lane, weights=end - start, minlength=n)
    return [
        StreamIdle(d.lane_labels[i], int(busy[i]), int(hw[i]), int(kw[i]), int(ot[i]))
        for i in range(n)
    ]


def _launch_stats(t: Timeline) -> LaunchStats:
    d = t.device
    assert d is not None
    is_kernel = d.kind != classify.COPY
    linked = is_kernel & (d.launch_start_ns >= 0)
    n_linked = int(linked.sum())
    if n_linked == 0:
        return LaunchStats(0, int(is_kernel.sum()), 0.0, 0.0, 0.0, 0, 0.0, 0, 0)
    start = t.activity_start_ns[linked]
    gpu = t.activity_end_ns[linked] - start
    cpu = d.launch_end_ns[linked] - d.launch_start_ns[linked]
    delay = np.maximum(start - d.launch_end_ns[linked], 0)
    short = (cpu <= SHORT_KERNEL_RUNTIME_CUTOFF_NS) & (gpu < cpu)
    return LaunchStats(
        linked=n_linked,
        unlinked=int(is_kernel.sum()) - n_linked,
        delay_mean_ns=float(delay.mean()),
        delay_median_ns=float(np.median(delay)),
        delay_p95_ns=percentile(delay, 95),
        delay_max_ns=int(delay.max()),
        launch_mean_ns=float(cpu.mean()),
        short_kernels=int(short.sum()),
        short_kernel_ns=int(gpu[short].sum()),
    )
