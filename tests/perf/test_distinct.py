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


def test_grouped_predictions_equal_ungrouped_ones() -> None:
    """A batch large enough to be grouped (each layout repeated) predicts exactly what the
    same layouts predict one small, ungrouped batch at a time."""
    from scalelab.config.catalog import load_cluster, load_model
    from scalelab.config.layout import Layout, LayoutTable
    from scalelab.perf.predict import predict

    pool = [
        Layout(gpus=64, global_batch=256, seq_len=s, tp=t, pp=p, sharding=sh, recompute=r)
        for s in (2048, 4096)
        for t in (1, 4)
        for p in (1, 2)
        for sh in ("fsdp", "hsdp", "ddp", "zero1", "zero2")
        for r in ("none", "selective", "full")
    ]
    model, cluster = load_model("llama2-7b"), load_cluster("h100-ib")
    table = LayoutTable.from_layouts(pool)
    index = np.arange(len(pool) * 4) % len(pool)
    grouped = predict(model, cluster, table.take(index))
    for start in range(0, len(pool), 40):  # under 64 rows: never grouped
        part = np.arange(start, min(start + 40, len(pool)))
        alone = predict(model, cluster, table.take(part))
        for key in alone.values:
            assert np.array_equal(grouped[key][part], alone[key]), key
