"""The predictor's parts: one cost function per parallelism over one context."""

from __future__ import annotations

import numpy as np

from scalelab.config import Layout, LayoutTable, load_cluster, load_model
from scalelab.perf.predict import (
    Prediction,
    build_context,
    context_parallel,
    data_parallel,
    predict,
    tensor_parallel,
)


def _table(*layouts: dict[str, object]) -> LayoutTable:
    return LayoutTable.from_layouts([Layout(seq_len=4096, **kw) for kw in layouts])  # type: ignore[arg-type]


def test_each_parallelism_costs_nothing_when_off() -> None:
    model, cluster = load_model("llama2-7b"), load_cluster("h100-ib")
    table = _table(
        {"gpus": 1, "global_batch": 1},
        {"gpus": 16, "global_batch": 8, "tp": 2},
        {"gpus": 16, "global_batch": 8, "cp": 2},
    )
    ctx = build_context(model, cluster, table)
    tp = tensor_parallel(ctx)
    cp = context_parallel(ctx)
    dp = data_parallel(ctx)
    assert tp[0] == 0 and tp[1] > 0 and tp[2] == 0
    assert cp.forward_s[0] == 0 and cp.forward_s[1] == 0 and cp.backward_s[2] >= 0
    assert dp.all_gather_s[0] == 0 and dp.grad_reduce_s[0] == 0
    assert (dp.all_gather_s[1:] > 0).all() and (dp.grad_reduce_s[1:] > 0).all()


def test_hsdp_adds_the_replica_all_reduce() -> None:
    model, cluster = load_model("llama2-7b"), load_cluster("h100-ib")
    table = _table(
        {"gpus": 64, "global_batch": 64, "sharding": "fsdp"},
        {"gpus": 64, "global_batch": 64, "sharding": "hsdp", "hsdp_shard_size": 8},
    )
    pred = predict(model, cluster, table)
    assert isinstance(pred, Prediction)
    assert pred.dp_shard.tolist() == [64.0, 8.0]
    assert pred.dp_replicate.tolist() == [1.0, 8.0]
    assert np.all(pred.step_time_s > 0)
