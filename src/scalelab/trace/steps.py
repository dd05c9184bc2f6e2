"""Split a trace's timeline into profiler steps (`ProfilerStep#N`) that add up.

`ProfilerStep#N` annotations live on the host, but a GPU runs behind its host: the kernels a
step launches execute partly after the host has moved on. So on a GPU trace a step's window is
laid on the *device* timeline: step N starts where the first device activity launched during
host step N starts (launches are linked to device events by their `correlation` id) and ends
where step N+1's does; the last step ends with the last device activity it launched. The windows
are contiguous and disjoint, so per-step lengths add up exactly, and whatever lies outside every
window (work launched before the first or after the last step) is reported as `outside_steps`.

Without links (no launch calls, or a CPU trace) the host windows are used as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from scalelab.trace.extract import Timeline, us_to_ns
from scalelab.trace.intervals import Int64Array

StepSource = Literal["device", "host", "none"]


@dataclass(eq=False)
class StepWindows:
    """Disjoint, sorted [start, end) windows, one per profiler step, and where they came from."""

    numbers: Int64Array
    start_ns: Int64Array
    end_ns: Int64Array
    source: StepSource


def step_windows(timeline: Timeline) -> StepWindows:
    """The step windows of a trace (see the module doc for the rule)."""
    numbers, host_start, host_end = (
        timeline.step_numbers,
        timeline.step_start_ns,
        timeline.step_end_ns,
    )
    if numbers.size == 0:
        empty = np.zeros(0, np.int64)
        return StepWindows(empty, empty, empty, "none")
    if timeline.mode == "gpu":
        device = _device_windows(timeline, host_start, host_end)
        if device is not None:
            return StepWindows(numbers, device[0], device[1], "device")
    return StepWindows(numbers, host_start, host_end, "host")


def _device_windows(
    timeline: Timeline, host_start: Int64Array, host_end: Int64Array
) -> tuple[Int64Array, Int64Array] | None:
    launch = timeline.activity_launch_ts
    linked = np.flatnonzero(~np.isnan(launch))
    if linked.size == 0:
        return None
    t = launch[linked]
    # Host steps are integer nanoseconds; a launch at t belongs to the step with start <= t < end.
    t_ns = us_to_ns(t)
    step = np.searchsorted(host_start, t_ns, side="right") - 1
    ok = step >= 0
    ok[ok] = t_ns[ok] < host_end[step[ok]]
    if not ok.any():
        return None
    rows, step = linked[ok], step[ok]
    n = host_start.size
    big = np.iinfo(np.int64).max
    first = np.full(n, big, dtype=np.int64)
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, step, timeline.activity_start_ns[rows])
    np.maximum.at(last, step, timeline.activity_end_ns[rows])
    has = first != big
    final_end = int(last[has].max())  # the last window ends when all stepped work has
    # A step without device work gets an empty window where the next step with work begins.
    with_work = np.where(has, np.arange(n), n)
    next_with_work = np.minimum.accumulate(with_work[::-1])[::-1]
    boundary = np.where(
        next_with_work < n, first[np.minimum(next_with_work, n - 1)], final_end
    ).astype(np.int64)
    # Activity of a later step can start before an earlier step's on another stream: keep order.
    start = np.maximum.accumulate(boundary)
    end = np.append(start[1:], final_end)
    end = np.maximum(end, start)
    return start, end
