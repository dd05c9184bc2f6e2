"""Sets of time intervals on integer nanoseconds, with union, intersection and difference in numpy.

Every analysis in `trace/` reduces to these operations: "communication time" is the length of the
union of communication intervals, "overlap" the length of its intersection with the compute union,
"exposed communication" the length of their difference. Working on whole arrays (sort, running
maximum, cumulative sums) instead of per-event Python loops is what makes million-event traces fast.
Integer nanoseconds keep every sum exact, so per-step numbers add up to whole-trace numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # numpy.typing costs an import at run time; annotations only need it here
    from numpy.typing import ArrayLike, NDArray

    Int64Array = NDArray[np.int64]
else:
    Int64Array = np.ndarray


def distinct(values: NDArray[Any]) -> NDArray[Any]:
    """The sorted distinct values of a 1-d integer array: `np.unique` without its first call's
    cost (numpy 2 imports `numpy.ma`, ~20 ms, the first time `np.unique` runs without indices)."""
    if values.size == 0:
        return values.copy()
    s = np.sort(values, kind="stable")
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def percentile(values: Int64Array, q: float) -> float:
    """`np.percentile(values, q)` (its default 'linear' method, same float result) without the
    `numpy.ma` import its first call costs (see `distinct`); for integer arrays, not empty."""
    s = np.sort(values)
    n = int(s.size)
    virtual = (n - 1) * (q / 100)
    if virtual >= n - 1:
        return float(s[-1])
    lo = math.floor(virtual)
    a, b = int(s[lo]), int(s[lo + 1])
    t = virtual - lo
    diff = b - a
    # numpy's _lerp: from the nearer end, so that t = 1 gives b exactly
    return float(b - diff * (1 - t)) if t >= 0.5 else float(a + diff * t)


def _as_int64(values: ArrayLike) -> Int64Array:
    return np.ascontiguousarray(np.asarray(values, dtype=np.int64).reshape(-1))


@dataclass(frozen=True)
class IntervalSet:
    """Disjoint, sorted, half-open intervals [start, end) in integer nanoseconds.

    Build one with `IntervalSet.union_of(starts, ends)` from raw (overlapping, unsorted) events;
    the constructor itself trusts its arguments to be already disjoint and sorted.
    """

    starts: Int64Array
    ends: Int64Array

    @classmethod
    def empty(cls) -> IntervalSet:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))

    @classmethod
    def union_of(cls, starts: ArrayLike, ends: ArrayLike) -> IntervalSet:
        """The union of arbitrary intervals: sort by start, merge every run that overlaps or touches."""
        s = _as_int64(starts)
        e = _as_int64(ends)
        if s.shape != e.shape:
            raise ValueError("starts and ends differ in length")
        keep = e > s
        if not keep.all():
            s, e = s[keep], e[keep]
        if s.size == 0:
            return cls.empty()
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        reach = np.maximum.accumulate(e)
        # A new merged interval starts wherever an event begins after everything before it ended.
        new = np.empty(s.size, dtype=bool)
        new[0] = True
        np.greater(s[1:], reach[:-1], out=new[1:])
        first = np.flatnonzero(new)
        last = np.append(first[1:] - 1, s.size - 1)
        return cls(s[first], reach[last])

    def __len__(self) -> int:
        return int(self.starts.size)

    def total_ns(self) -> int:
        """Total covered length."""
        return int((self.ends - self.starts).sum())

    def union(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet.union_of(
            np.concatenate([self.starts, other.starts]), np.concatenate([self.ends, other.ends])
        )

    def intersection(self, other: IntervalSet) -> IntervalSet:
        """Time covered by both sets."""
        return _combine(self, other, keep_other=True)

    def difference(self, other: IntervalSet) -> IntervalSet:
        """Time covered by this set and not by `other`."""
        return _combine(self, other, keep_other=False)

    def clip(self, lo: int, hi: int) -> IntervalSet:
        """The part of the set inside [lo, hi)."""
        a = int(np.searchsorted(self.ends, lo, side="right"))
        b = int(np.searchsorted(self.starts, hi, side="left"))
        if b <= a:
            return IntervalSet.empty()
        s = np.maximum(self.starts[a:b], lo)
        e = np.minimum(self.ends[a:b], hi)
        keep = e > s
        return IntervalSet(s[keep], e[keep])

    @cached_property
    def _prefix(self) -> Int64Array:
        """Covered length before each interval (and in all, last): made on first use, once."""
        prefix: Int64Array = np.zeros(self.starts.size + 1, dtype=np.int64)
        np.cumsum(self.ends - self.starts, out=prefix[1:])
        return prefix

    def covered_before(self, t: ArrayLike) -> Int64Array:
        """For each time t, the covered length in (-inf, t): a cumulative coverage function."""
        times = _as_int64(t)
        k = np.searchsorted(self.starts, times, side="right")  # intervals starting at or before t
        covered = self._prefix[k]
        has = k > 0
        # The last interval that started at or before t may still be running at t.
        overhang = np.zeros(times.size, dtype=np.int64)
        overhang[has] = np.maximum(self.ends[k[has] - 1] - times[has], 0)
        result: Int64Array = covered - overhang
        return result

    def covered_in(self, lo: ArrayLike, hi: ArrayLike) -> Int64Array:
        """Covered length inside each window [lo[i], hi[i]), all windows at once."""
        lo_a, hi_a = _as_int64(lo), _as_int64(hi)
        result: Int64Array = np.maximum(self.covered_before(hi_a) - self.covered_before(lo_a), 0)
        return result


def _combine(a: IntervalSet, b: IntervalSet, *, keep_other: bool) -> IntervalSet:
    """Sweep both sets' boundaries once; keep segments in `a` and (in `b` or not in `b`)."""
    if len(a) == 0 or (keep_other and len(b) == 0):
        return IntervalSet.empty()
    if len(b) == 0:
        return a
    na, nb = len(a), len(b)
    pos = np.concatenate([a.starts, a.ends, b.starts, b.ends])
    delta_a = np.concatenate(
        [np.ones(na, np.int8), -np.ones(na, np.int8), np.zeros(2 * nb, np.int8)]
    )
    delta_b = np.concatenate(
        [np.zeros(2 * na, np.int8), np.ones(nb, np.int8), -np.ones(nb, np.int8)]
    )
    order = np.argsort(pos, kind="stable")
    pos = pos[order]
    in_a = np.cumsum(delta_a[order]) > 0
    in_b = np.cumsum(delta_b[order]) > 0
    # Segment i is [pos[i], pos[i+1]) with the state after boundary i; zero-length ones drop out.
    keep = in_a[:-1] & (in_b[:-1] if keep_other else ~in_b[:-1]) & (pos[1:] > pos[:-1])
    return IntervalSet.union_of(pos[:-1][keep], pos[1:][keep])
