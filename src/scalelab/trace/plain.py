"""The default `scalelab trace FILE` report of a GPU trace, in plain Python (no numpy).

A command's start-up is part of its time: numpy's import alone (0.1-0.17 s on a busy machine) is
longer than reading, decoding and analysing a 40,000-event trace. This module computes what the
default table shows (`RankReport.total`, steps, before/after the steps, collectives, launches
before profiling, notes) from the columns `columns.gather` pulls out of a trace, with lists,
`sorted` and `bisect` instead of arrays: the same rules as `extract`, `steps` and `analyze`,
step by step, and the same integer nanoseconds (tests compare both paths on every test trace).

It covers the common case only and says so by raising `UnsupportedError` for anything else (a CPU
trace, a trace of an unmodelled device, fields of unexpected types or values, several ranks to
match for stragglers): the caller then runs the full analysis (`analyze`), which also reports
every error.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from itertools import accumulate, compress, islice, repeat
from operator import add, eq, ge, gt, lt, mul, ne, sub
from typing import TYPE_CHECKING, Any

from scalelab.trace import background, classify, load
from scalelab.trace.columns import Columns, gather
from scalelab.trace.load import RawTrace, read_trace, trace_files
from scalelab.trace.report import Breakdown, CollectiveStats, RankReport, TraceReport, summarise

if TYPE_CHECKING:
    from pathlib import Path

# (starts, ends): disjoint, sorted, half-open intervals in integer nanoseconds.
Intervals = tuple[list[int], list[int]]

_MAX_TIME_US = float(2**53)  # as extract.MAX_TIME_US
_COLLECTIVE_INDEX = classify.COLLECTIVE_INDEX


class UnsupportedError(Exception):
    """Not a case this path covers: run the full analysis."""


def report(paths: Iterable[str | Path], *, split: bool | None = None) -> TraceReport:
    """The default report of one typed GPU trace file (`UnsupportedError` for anything else,
    including several files: their ranks are matched for stragglers by the full analysis).

    `split`: decode a large file in two processes (`background.gather_in_two`; default: where
    a core is spare now, as the library does: on a busy machine the fork, the copies of the
    halves and the pipe cost more than the second process saves)."""
    files = trace_files(paths)
    if len(files) != 1:
        raise UnsupportedError("several files")
    (path,) = files
    if split is None:
        split = background.spare_core()
    gathered = background.gather_in_two(path) if split else None
    if gathered is None:
        raw = read_trace(path)
        if not raw.typed:
            raise UnsupportedError("not a typed trace")
        found = gather(raw)
        if not isinstance(found, Columns):
            raise UnsupportedError("a CPU trace")
        if load.keep_parsed is not None:  # a command about to exit: not worth freeing
            load.keep_parsed.append(raw)
        gathered = found, raw.metadata
    ranks = [rank_report(*gathered)]
    return TraceReport(ranks=ranks, summary=summarise(ranks))


def rank_report(c: Columns, metadata: dict[str, Any]) -> RankReport:
    """The default report's numbers for one GPU trace's columns (see the module doc)."""
    if not c.typed or c.refusal is not None:
        raise UnsupportedError("not a typed GPU trace")
    meta = RawTrace(c.path, [], metadata)
    step_numbers, host_start, host_end = _steps(c.steps)
    n_kernels = c.n_kernels
    start, end = _ns_times(c.device_ts[0], c.device_dur[0])
    comm_rows = c.comm_rows
    not_comm = [True] * n_kernels
    for i in comm_rows:
        not_comm[i] = False
    compute = _union(
        list(compress(start[:n_kernels], not_comm)), list(compress(end[:n_kernels], not_comm))
    )
    comm_start = [start[i] for i in comm_rows]
    comm_end = [end[i] for i in comm_rows]
    comm = _union(comm_start, comm_end)
    copy = _union(start[n_kernels:], end[n_kernels:])

    lenient = (c.device_ts, c.device_dur, c.runtime_ts, c.runtime_dur, c.annotation_ts)
    if any(column[1] for column in (*lenient, c.annotation_dur)):
        raise UnsupportedError("an event lacks a time")
    _check(c.annotation_ts[0], "annotation timestamps")  # checked as extract checks them
    _check_durations(c.annotation_dur[0])
    rt_ts = c.runtime_ts[0]
    rt_total = _total(rt_ts, "launch call timestamps")  # (a launch call's time is a number)
    launch_row = _launch_rows(_ints(c.device_corr), _ints(c.runtime_corr))
    # Device events linked to their launch call, and the call's time (µs, as in the trace)
    linked = list(compress(range(len(launch_row)), map(ge, launch_row, repeat(0))))
    if linked:  # extract then converts every launch call's times (and refuses odd ones)
        if not math.isfinite(rt_total):
            raise UnsupportedError("launch call timestamps: not all finite numbers")
        if rt_ts and (min(rt_ts) < -_MAX_TIME_US or max(rt_ts) > _MAX_TIME_US):
            raise UnsupportedError("launch call timestamps: out of range")
        _check_durations(c.runtime_dur[0])
    launch_us = list(map(rt_ts.__getitem__, map(launch_row.__getitem__, linked)))
    runtime_tid = c.runtime_tid
    codes = classify.collective_codes(
        [str(c.kernel_names[i]) for i in comm_rows],
        c.comm_labels,
        [rt_ts[launch_row[i]] if launch_row[i] >= 0 else math.nan for i in comm_rows],
        [runtime_tid[launch_row[i]] if launch_row[i] >= 0 else None for i in comm_rows],
        classify.host_collective_spans(c.host_colls, _float_only),
    )

    # Step windows on the device timeline (steps.step_windows)
    numbers = step_numbers
    if not numbers:
        win_start: list[int] = []
        win_end: list[int] = []
        source = "none"
    else:
        device = _device_windows(start, end, linked, launch_us, host_start, host_end)
        if device is None:
            win_start, win_end, source = host_start, host_end, "host"
        else:
            win_start, win_end = device
            source = "device"

    # The sets every window is measured against (analyze._Sets), as unions only: within any
    # window, |A and B| = |A| + |B| - |A or B| and |A - B| = |A or B| - |B|, exactly (integers).
    compute_or_comm = _union(compute[0] + comm[0], compute[1] + comm[1])
    busy = _union(compute_or_comm[0] + copy[0], compute_or_comm[1] + copy[1])
    covered_by_compute = _Coverage(compute)
    collectives = []
    for code in sorted(set(codes)):
        mine = [x == code for x in codes]
        s, e = list(compress(comm_start, mine)), list(compress(comm_end, mine))
        union = _union(s, e)
        collectives.append(
            (
                classify.COLLECTIVES[code],
                _Coverage(union),
                _Exposed(union, covered_by_compute),
                sorted(s),
            )
        )
    sets = (
        covered_by_compute,
        _Coverage(comm),
        _Coverage(compute_or_comm),
        _Coverage(busy),
        collectives,
    )

    first = min([min(start), *win_start])
    last = max([max(end), *win_end])
    (total,) = _measure(sets, [first], [last], count_all=True)
    if numbers:
        first_step, last_step = win_start[0], win_end[-1]
        before, after = _measure(
            sets, [first, max(last_step, first)], [min(first_step, last), last]
        )
    else:
        before = after = Breakdown.sum([])
    steps = [
        b.as_step(n, s)
        for n, s, b in zip(numbers, win_start, _measure(sets, win_start, win_end), strict=True)
    ]

    # Device events launched before profiling started (analyze._launched_before_profiling)
    launched_before = 0
    if numbers and linked:
        # unlinked: no launch call, or one at a negative time (extract marks both -1)
        negative = _threshold(0)  # a launch call before it is at a negative time in ns
        w0 = win_start[0]
        early = map(lt, start, repeat(w0))
        if min(launch_us) >= negative:  # every linked one is linked (the usual case)
            launched_before = sum(early) - sum(map(lt, map(start.__getitem__, linked), repeat(w0)))
        elif max(launch_us) >= negative:
            unlinked = [True] * len(start)
            for i, t in zip(linked, launch_us, strict=True):
                unlinked[i] = t < negative
            launched_before = sum(compress(early, unlinked))
    notes = [] if comm_rows else ["no NCCL/RCCL communication kernels: communication is zero"]
    return RankReport(
        path=c.path,
        rank=meta.rank,
        world_size=meta.world_size,
        mode="gpu",
        step_source=source,  # type: ignore[arg-type]
        n_events=c.n_events,
        n_lanes=_n_lanes(c.device_pid, c.device_tid),
        total=total,
        steps=steps,
        outside_steps=total.minus(Breakdown.sum(list(steps))),
        before_steps=before,
        after_steps=after,
        launched_before_profiling=launched_before,
        notes=notes,
    )


# Times ---------------------------------------------------------------------------------------


def _us_to_ns(t: float) -> int:
    """extract.us_to_ns for one value: whole microseconds and the fraction converted apart
    (Python's round, like numpy's rint, rounds halves to even)."""
    whole = math.floor(t)
    return whole * 1000 + round((t - whole) * 1000.0)


def _to_ns(ts: list[float], low: float | None = None) -> list[int]:
    """`_us_to_ns` of many finite floats (`low`: their minimum, if known); for non-negative
    ones (every real trace) `int` splits them as `floor` does, and C-level maps do the rest."""
    if ts and (min(ts) if low is None else low) >= 0.0:
        # int() truncates, which is floor for t >= 0; t - whole is exact (whole < 2^53 is a
        # float exactly, and within a factor of two of t when t >= 1), as modf's fraction.
        whole = list(map(int, ts))
        return list(
            map(
                add,
                map(mul, whole, repeat(1000)),
                map(round, map(mul, map(sub, ts, whole), repeat(1000.0))),
            )
        )
    return list(map(_us_to_ns, ts))


def _total(values: list[Any], what: str) -> float:
    """The sum of a typed column's values, which are floats or None (msgspec makes a float of
    an integer and refuses anything else), at C level: UnsupportedError for a None; not finite
    exactly where a value is not (NaN or infinity; finite values within 2^53 cannot overflow).
    One pass instead of a type test and a finiteness test per value."""
    try:
        total = sum(values, 0.0)
    except TypeError:
        raise UnsupportedError(f"{what}: not all numbers") from None
    if total.__class__ is not float:
        raise UnsupportedError(f"{what}: not all numbers")
    return total


def _check(values: list[Any], what: str) -> tuple[float, float]:
    """Finite floats within ±2^53 µs (what extract accepts of typed events), else
    UnsupportedError; their minimum and maximum (0.0, 0.0 for none)."""
    if not values:
        return 0.0, 0.0
    if not math.isfinite(_total(values, what)):
        raise UnsupportedError(f"{what}: not all finite numbers")
    low, high = min(values), max(values)
    if low < -_MAX_TIME_US or high > _MAX_TIME_US:
        raise UnsupportedError(f"{what}: out of range")
    return low, high


def _check_durations(dur: list[Any]) -> None:
    """Durations as extract accepts them: numbers (NaN counts as an instant) within 2^53 µs."""
    if not dur:
        return
    if math.isfinite(_total(dur, "durations")):
        if max(dur) > _MAX_TIME_US or min(dur) < -_MAX_TIME_US:
            raise UnsupportedError("a duration is out of range")
        return
    if any(d == d and abs(d) > _MAX_TIME_US for d in dur):  # NaN is allowed, infinity not
        raise UnsupportedError("a duration is out of range")


def _ns_times(ts: list[Any], dur: list[Any]) -> tuple[list[int], list[int]]:
    """extract._ns_times: start = round(ts * 1000), end = start + round(dur * 1000); bad
    (negative or NaN) durations are 0."""
    low, _ = _check(ts, "timestamps")
    start = _to_ns(ts, low)
    if len(dur) != len(ts):
        raise UnsupportedError("durations and timestamps differ in number")
    if not dur:
        return start, []
    if math.isfinite(_total(dur, "durations")) and min(dur) >= 0.0:
        if max(dur) > _MAX_TIME_US:
            raise UnsupportedError("a duration is out of range")
        return start, list(map(add, start, map(round, map(mul, dur, repeat(1000.0)))))
    ends = []
    for s, d in zip(start, dur, strict=True):
        if d != d:  # NaN: an instant
            ends.append(s)
            continue
        if abs(d) > _MAX_TIME_US:
            raise UnsupportedError("a duration is out of range")
        n = round(d * 1000.0)
        ends.append(s + n if n > 0 else s)
    return start, ends


def _steps(steps: list[tuple[Any, Any, Any]]) -> tuple[list[int], list[int], list[int]]:
    """extract._steps: host ProfilerStep#N windows, sorted and made disjoint."""
    numbered = []
    prefix = len(classify.PROFILER_STEP_PREFIX)
    for name, ts, dur in steps:
        try:
            numbered.append((int(name[prefix:]), ts, dur))
        except ValueError:
            continue
    if not numbered:
        return [], [], []
    start, end = _ns_times([s[1] for s in numbered], [s[2] for s in numbered])
    order = sorted(range(len(start)), key=start.__getitem__)  # stable, as numpy's
    numbers = [numbered[i][0] for i in order]
    start = [start[i] for i in order]
    end = [end[i] for i in order]
    # a step starts after every earlier one (in start order) has ended
    out_start, out_end = [], []
    reach: int | None = None
    for s, e in zip(start, end, strict=True):
        s2 = s if reach is None else max(s, reach)
        out_start.append(s2)
        out_end.append(max(e, s2))
        reach = e if reach is None else max(reach, e)
    return numbers, out_start, out_end


def _ints(values: list[Any]) -> list[int]:
    """Correlation ids (extract._ints): -1 where absent or not an integer."""
    if not values or set(map(type, values)) == {int}:
        return values
    return [v if v.__class__ is int else -1 for v in values]


def _launch_rows(dev_corr: list[int], rt_corr: list[int]) -> list[int]:
    """For each device event, the row of the first launch call with its correlation, or -1
    (extract._launch_calls)."""
    # later rows first, so that the first row of a correlation is the one kept
    first = dict(zip(reversed(rt_corr), range(len(rt_corr) - 1, -1, -1), strict=True))
    if first and min(first) < 0:  # a device event without a correlation links to nothing
        for key in [k for k in first if k < 0]:
            del first[key]
    return list(map(first.get, dev_corr, repeat(-1)))


def _threshold(ns: int) -> float:
    """The smallest float time t (µs) with `_us_to_ns(t) >= ns`: `_us_to_ns` never decreases,
    so comparing a float time with it is comparing its nanoseconds with `ns`."""
    lo, hi = ns / 1000.0 - 1.0, ns / 1000.0 + 1.0
    if not _us_to_ns(lo) < ns <= _us_to_ns(hi):
        raise UnsupportedError("a time beyond a float's whole microseconds")
    while True:  # bisection between adjacent floats: at most ~60 steps
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            return hi
        if _us_to_ns(mid) >= ns:
            hi = mid
        else:
            lo = mid


def _device_windows(
    start: list[int],
    end: list[int],
    linked: list[int],
    launch_us: list[float],
    host_start: list[int],
    host_end: list[int],
) -> tuple[list[int], list[int]] | None:
    """steps._device_windows: step N's window starts where the first device activity launched
    in host step N starts (`linked`: device rows with a launch call at `launch_us`)."""
    n = len(host_start)
    # A launch at t is in host step k when host_start[k] <= ns(t) < host_end[k]; both are
    # sorted and the windows disjoint, so that is: as many ends as starts, less one, are <= t.
    after_start = list(map(_threshold, host_start))
    before_end = list(map(_threshold, host_end))
    k_start = map(bisect_right, repeat(after_start), launch_us)
    k_end = list(map(bisect_right, repeat(before_end), launch_us))
    inside = list(map(eq, map(sub, k_start, repeat(1)), k_end))
    big = 1 << 80
    first = [big] * n
    last = [-big] * n
    any_ok = any(inside)
    rows = list(compress(linked, inside))
    for k, s, e in zip(
        compress(k_end, inside),
        map(start.__getitem__, rows),
        map(end.__getitem__, rows),
        strict=True,
    ):
        if s < first[k]:
            first[k] = s
        if e > last[k]:
            last[k] = e
    if not any_ok:
        return None
    final_end = max(last)
    boundary = [0] * n
    upcoming: int | None = None  # the first start of the next step with work
    for k in range(n - 1, -1, -1):
        if first[k] != big:
            upcoming = first[k]
        boundary[k] = upcoming if upcoming is not None else final_end
    out_start = []
    reach: int | None = None
    for b in boundary:
        reach = b if reach is None else max(reach, b)
        out_start.append(reach)
    out_end = [max(e, s) for s, e in zip(out_start, [*out_start[1:], final_end], strict=True)]
    return out_start, out_end


def _n_lanes(pids: list[Any], tids: list[Any]) -> int:
    """Distinct (device, stream) pairs (extract._lanes), for ids of the usual range."""
    for ids, top in ((pids, 2**31), (tids, 2**32)):
        if ids and (set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) >= top):
            raise UnsupportedError("a device or stream id is unusual")
    return len(set(zip(pids, tids, strict=True)))


# Collectives (classify.collective_codes) -------------------------------------------------------


def _float_only(value: Any) -> float:
    """A trace time the plain path takes as it is: a float (anything else: the full analysis)."""
    if value.__class__ is not float:
        raise UnsupportedError("a host annotation's time is not a number")
    return float(value)


# Interval sets (intervals.IntervalSet) ----------------------------------------------------------


def _union(starts: list[int], ends: list[int]) -> Intervals:
    """The union of intervals (each end >= its start), merged where they overlap or touch.

    With the starts and the ends sorted apart, the k-th smallest start is at most the k-th
    smallest end, and the union has a gap after the k-th end exactly where the (k+1)-th start
    lies beyond it: no Python-level loop, only sorts and C-level maps."""
    n = len(starts)
    if n == 0:
        return [], []
    s_sorted = sorted(starts)
    e_sorted = sorted(ends)
    gaps = list(compress(range(n - 1), map(gt, islice(s_sorted, 1, None), e_sorted)))
    out_s = [s_sorted[0], *map(s_sorted.__getitem__, map(add, gaps, repeat(1)))]
    out_e = [*map(e_sorted.__getitem__, gaps), e_sorted[-1]]
    if any(map(eq, out_s, out_e)):  # empty intervals on their own: no time, dropped
        keep = list(map(ne, out_s, out_e))
        out_s, out_e = list(compress(out_s, keep)), list(compress(out_e, keep))
    return out_s, out_e


class _Coverage:
    """Covered length of a set inside windows (IntervalSet.covered_in)."""

    __slots__ = ("ends", "prefix", "starts")

    def __init__(self, sets: Intervals) -> None:
        self.starts, self.ends = sets
        self.prefix = list(accumulate(map(sub, self.ends, self.starts), initial=0))

    def before(self, t: int) -> int:
        k = bisect_right(self.starts, t)
        if k == 0:
            return 0
        return self.prefix[k] - max(self.ends[k - 1] - t, 0)

    def within(self, lo: int, hi: int) -> int:
        return max(self.before(hi) - self.before(lo), 0)


class _Exposed:
    """Length of a set U less a set C inside windows (|U - C|, a collective's exposed time),
    for U disjoint and sorted and C's coverage: each interval of U's exposed length once (its
    length less C's part of it), prefix sums over them, and the two intervals a window cuts
    corrected at its edges. The same integers as |U or C| - |C|, without a union of U with
    all of C (thousands of intervals) per collective."""

    __slots__ = ("compute", "ends", "prefix", "starts")

    def __init__(self, sets: Intervals, compute: _Coverage) -> None:
        self.starts, self.ends = sets
        self.compute = compute
        self.prefix = list(accumulate(map(self._part, self.starts, self.ends), initial=0))

    def _part(self, lo: int, hi: int) -> int:
        """Exposed length of [lo, hi), a piece of one interval of U."""
        return hi - lo - self.compute.within(lo, hi)

    def within(self, lo: int, hi: int) -> int:
        i = bisect_right(self.ends, lo)  # the first interval ending after lo
        j = bisect_left(self.starts, hi)  # intervals before j start before hi
        if i >= j:
            return 0
        total = self.prefix[j] - self.prefix[i]
        if self.starts[i] < lo:
            total -= self._part(self.starts[i], lo)
        if self.ends[j - 1] > hi:
            total -= self._part(hi, self.ends[j - 1])
        return total


def _measure(
    sets: tuple[Any, ...], lo: list[int], hi: list[int], *, count_all: bool = False
) -> list[Breakdown]:
    """analyze._measure: breakdowns of windows [lo, hi)."""
    compute, comm, compute_or_comm, busy, collectives = sets
    out = []
    for a, b in zip(lo, hi, strict=True):
        c = compute.within(a, b)
        per = {}
        for name, union, exposed, starts in collectives:
            count = len(starts) if count_all else bisect_left(starts, b) - bisect_left(starts, a)
            total = union.within(a, b)
            if count or total:
                per[name] = CollectiveStats(count, total, exposed.within(a, b))
        m, cm, u = comm.within(a, b), compute_or_comm.within(a, b), busy.within(a, b)
        wall = b - a
        out.append(
            Breakdown(
                wall_ns=wall,
                compute_ns=c,
                comm_ns=m,
                overlap_ns=c + m - cm,
                exposed_comm_ns=cm - c,
                copy_only_ns=u - cm,
                idle_ns=wall - u,
                collectives=per,
            )
        )
    return out
