"""Evaluate a per-layout function once per distinct combination of the integer columns it reads.

Many predictor quantities (per-layer compute, a collective's group and buffer) depend on a few
integer columns (micro-batch, sequence length, TP, CP...) that take few distinct values across a
batch of layouts: computing on one row per combination and indexing back gives the same numbers
(the same element-wise arithmetic on the same inputs) for a fraction of the work.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# Keys spanning at most this many values are grouped with a lookup table (no sort).
_TABLE_SPAN = 1 << 22
_MAX_SPAN = 1 << 62
# Columns spanning more values than this are renumbered densely before they are combined.
_DENSE_WIDTH = 64


class Distinct:
    """Rows grouped by equal values of some integer or boolean columns: `first` holds one row
    per distinct combination, `inverse` every row's combination (`values[first][inverse]`
    equals `values` for any column the grouping read)."""

    def __init__(self, first: np.ndarray, inverse: np.ndarray) -> None:
        self.first = first
        self.inverse = inverse

    def __len__(self) -> int:
        return len(self.first)

    def take(self, column: np.ndarray) -> np.ndarray:
        """One value per distinct combination."""
        return np.asarray(column)[self.first]

    def take_columns(self, columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`take` of each named column."""
        return {name: self.take(column) for name, column in columns.items()}

    def back(self, values: np.ndarray) -> np.ndarray:
        """Per-combination values spread back to every row."""
        return np.asarray(values)[self.inverse]


def _dense_codes(offsets: np.ndarray, width: int) -> tuple[np.ndarray, int]:
    """Non-negative integers below `width` renumbered 0, 1, ... in order, and how many."""
    seen = np.zeros(width, dtype=bool)
    seen[offsets] = True
    slot = np.cumsum(seen, dtype=np.int64) - 1
    return slot[offsets], int(slot[-1]) + 1


def distinct_rows(*columns: np.ndarray, max_share: float = 0.5) -> Distinct | None:
    """The grouping of the rows by `columns` (equal-length integer or boolean arrays), or None
    where it would not pay: a column of another kind, keys too wide, or more than `max_share`
    of the rows distinct."""
    n = len(columns[0])
    if n < 64:
        return None
    key = np.zeros(n, dtype=np.int64)
    span = 1
    for column in columns:
        if column.dtype.kind not in "biu" or column.shape != (n,):
            return None
        values = column.astype(np.int64, copy=False)
        low = int(values.min())
        width = int(values.max()) - low + 1
        if _DENSE_WIDTH < width <= _TABLE_SPAN:  # sparse values (GPU counts): dense codes
            values, width = _dense_codes(values - low, width)
            low = 0
        if span * width > _MAX_SPAN:
            return None
        if width > 1:
            key += (values - low) * span
        span *= width
    if span <= _TABLE_SPAN:
        inverse, count = _dense_codes(key, span)
        first = np.empty(count, dtype=np.int64)
        first[inverse] = np.arange(n)
    else:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        count = len(first)
    if count > max_share * n:
        return None
    return Distinct(first, inverse.reshape(n))
