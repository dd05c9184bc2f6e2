"""Interval-set operations agree with marking every microsecond of a small timeline."""

from __future__ import annotations

import numpy as np
import pytest

from scalelab.trace.intervals import IntervalSet

HORIZON = 400


def _random_events(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    starts = rng.integers(0, HORIZON - 1, n)
    return starts, starts + rng.integers(0, 40, n)  # includes zero-length events


def _bitmap(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    marked = np.zeros(HORIZON + 64, dtype=bool)
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        marked[s:e] = True
    return marked


def _as_bitmap(iv: IntervalSet) -> np.ndarray:
    return _bitmap(iv.starts, iv.ends)


@pytest.mark.parametrize("seed", range(25))
def test_union_intersection_difference_match_a_bitmap(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a_s, a_e = _random_events(rng, int(rng.integers(0, 30)))
    b_s, b_e = _random_events(rng, int(rng.integers(0, 30)))
    a, b = IntervalSet.union_of(a_s, a_e), IntervalSet.union_of(b_s, b_e)
    bits_a, bits_b = _bitmap(a_s, a_e), _bitmap(b_s, b_e)

    for result, expected in (
        (a, bits_a),
        (a.union(b), bits_a | bits_b),
        (a.intersection(b), bits_a & bits_b),
        (a.difference(b), bits_a & ~bits_b),
        (b.difference(a), bits_b & ~bits_a),
    ):
        assert (_as_bitmap(result) == expected).all()
        assert result.total_ns() == int(expected.sum())
        # Canonical form: sorted, disjoint, not touching, no empty pieces.
        assert (result.ends > result.starts).all()
        assert (result.starts[1:] > result.ends[:-1]).all()


@pytest.mark.parametrize("seed", range(10))
def test_covered_in_many_windows_at_once(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    s, e = _random_events(rng, 40)
    iv = IntervalSet.union_of(s, e)
    bits = _bitmap(s, e)
    lo = rng.integers(-20, HORIZON, 30)
    hi = lo + rng.integers(0, 120, 30)
    got = iv.covered_in(lo, hi)
    expected = [
        int(bits[max(a, 0) : max(b, 0)].sum())
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
    ]
    assert got.tolist() == expected
    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        assert iv.clip(a, b).total_ns() == int(bits[max(a, 0) : max(b, 0)].sum())


def test_touching_intervals_merge_and_empty_sets_are_harmless() -> None:
    iv = IntervalSet.union_of([0, 5, 20], [5, 10, 20])
    assert iv.starts.tolist() == [0] and iv.ends.tolist() == [10]
    empty = IntervalSet.empty()
    assert iv.intersection(empty).total_ns() == 0
    assert iv.difference(empty).total_ns() == 10
    assert empty.difference(iv).total_ns() == 0
    assert empty.covered_in([0], [100]).tolist() == [0]


def test_large_timestamps_stay_exact() -> None:
    base = 1_712_195_495_502_094  # real Kineto timestamps are ~1.7e15 µs
    iv = IntervalSet.union_of([base, base + 3], [base + 2, base + 7])
    assert iv.total_ns() == 6
    assert iv.covered_in([base + 1], [base + 4]).tolist() == [2]
