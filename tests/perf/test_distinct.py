"""`distinct_rows`: grouping layouts by integer columns gives back every row's values."""

from __future__ import annotations

import numpy as np

from scalelab.perf.distinct import distinct_rows


def test_groups_spread_back_to_every_row() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(1, 9, 1000)
    b = rng.integers(0, 2, 1000).astype(bool)
    c = rng.choice([1024, 4096, 131072], 1000)
    groups = distinct_rows(a, b, c)
    assert groups is not None and len(groups) <= 8 * 2 * 3
    for column in (a, b, c):
        assert np.array_equal(groups.back(groups.take(column)), column)


def test_wide_keys_use_a_sort() -> None:
    a = np.tile(np.array([1, 2**40], dtype=np.int64), 100)
    groups = distinct_rows(a)
    assert groups is not None and len(groups) == 2
    assert np.array_equal(groups.back(groups.take(a)), a)


def test_not_worth_it_or_not_integer() -> None:
    assert distinct_rows(np.arange(1000)) is None  # every row distinct
    assert distinct_rows(np.ones(10, dtype=np.int64)) is None  # too few rows
    assert distinct_rows(np.ones(1000)) is None  # floats
