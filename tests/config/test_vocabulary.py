"""The vocabulary (issue 10): options, labels, default batch, FLOPs and metric names, each once."""

from __future__ import annotations

import numpy as np
import pytest

from scalelab import metrics
from scalelab.config import (
    ClusterParams,
    ClusterSpec,
    GPUSpec,
    Layout,
    LayoutTable,
    load_cluster,
    load_model,
)
from scalelab.config.layout import violation_masks
from scalelab.config.model import flops_utilisation
from scalelab.config.options import OPTIONS, PipelineSchedule, Recompute, Sharding
from scalelab.errors import InputError
from scalelab.perf import predict


def _layout(**kw: object) -> Layout:
    base: dict[str, object] = {"gpus": 64, "global_batch": 64, "seq_len": 4096}
    return Layout(**(base | kw))  # type: ignore[arg-type]


def test_codes_follow_declaration_order_and_round_trip() -> None:
    assert [m.code for m in Sharding] == [0, 1, 2, 3, 4]
    assert Sharding.from_code(Sharding.HSDP.code) is Sharding.HSDP
    layouts = [
        _layout(
            sharding=s,
            pp=2,
            pp_schedule=ps,
            virtual_stages=2 if ps in ("interleaved", "zbv") else 1,
        )
        for s in Sharding.names()
        for ps in PipelineSchedule.names()
    ]
    table = LayoutTable.from_layouts(layouts)
    assert [table.layout(i) for i in range(len(table))] == layouts


def test_predicates_name_the_codes() -> None:
    table = LayoutTable.from_layouts(
        [
            _layout(sharding=s, recompute=r)
            for s, r in zip(
                Sharding.names(), ["none", "selective", "full", "none", "full"], strict=True
            )
        ]
    )
    assert table.is_ddp.tolist() == [True, False, False, False, False]
    assert table.is_zero.tolist() == [False, True, True, False, False]
    assert table.shards_params.tolist() == [False, False, False, True, True]
    assert table.is_hsdp.tolist() == [False, False, False, False, True]
    assert table.recompute_full.tolist() == [False, False, True, False, True]
    assert table.recompute_selective.tolist() == [False, True, False, False, False]


def test_layout_holds_plain_names() -> None:
    layout = _layout(sharding=Sharding.HSDP)
    assert type(layout.sharding) is str and layout.sharding == "hsdp"
    assert type(layout.pp_schedule) is str and layout.model_dump()["recompute"] == "none"


def test_parse_names_the_field_and_the_choices() -> None:
    with pytest.raises(InputError) as err:
        Recompute.parse("recompute", "some")
    assert err.value.field == "recompute"
    assert "none, selective, full" in str(err.value)


def test_labels() -> None:
    layout = _layout(
        sharding="hsdp",
        hsdp_shard_size=4,
        tp=2,
        pp=4,
        recompute="full",
        micro_batch=2,
        global_batch=128,
    )
    assert layout.parallelism_label == "hsdp4 tp2 pp4"
    assert layout.label == "hsdp4 tp2sp pp4-1f1b mb2 ac-full"
    assert layout.slug == "hsdp4-tp2sp-pp4-1f1b-mb2-ac-full"
    assert layout.description == "HSDP(shard 4) TP2+SP PP4 1f1b mb2 AC full"
    assert _layout().label == "fsdp" and _layout().description == "FSDP mb1"


def test_default_global_batch() -> None:
    assert Layout.default_global_batch(128) == 128
    assert Layout.default_global_batch(128, micro_batch=2) == 256
    # 128 GPUs, TP 2 x PP 4: 16 data-parallel ranks, 4 micro-batches each (the pipeline's minimum).
    assert Layout.default_global_batch(128, tp=2, pp=4) == 64
    model, cluster = load_model("llama2-7b"), load_cluster("h100-ib")
    for kw in ({"tp": 2, "pp": 4}, {"cp": 2, "micro_batch": 2}, {}):
        batch = Layout.default_global_batch(128, **kw)  # type: ignore[arg-type]
        table = LayoutTable.from_layouts([Layout(gpus=128, global_batch=batch, seq_len=4096, **kw)])  # type: ignore[arg-type]
        assert not any(m[0] for m in violation_masks(table, model, cluster).values())


def test_every_layout_and_cluster_field_is_documented() -> None:
    for cls in (Layout, ClusterParams, ClusterSpec, GPUSpec):
        for name, info in cls.model_fields.items():
            assert info.description and len(info.description) > 20, f"{cls.__name__}.{name}"
    assert set(OPTIONS) <= set(Layout.model_fields)


def test_flops_by_recompute_mode_by_hand() -> None:
    model = load_model("llama2-7b")
    s, L, d = 4096, model.n_layers, model.d_model
    dense = model.n_params - model.vocab_size * d
    assert model.model_flops_per_token(s) == 6.0 * dense + 12.0 * L * d * s
    assert model.hardware_flops_per_token("none", s) == model.model_flops_per_token(s)
    assert (
        model.hardware_flops_per_token("selective", s)
        == model.model_flops_per_token(s) + 4.0 * L * d * s
    )
    assert (
        model.hardware_flops_per_token("full", s)
        == model.model_flops_per_token(s) + 2.0 * dense + 4.0 * L * d * s
    )
    codes = np.array([Recompute.NONE.code, Recompute.SELECTIVE.code, Recompute.FULL.code])
    by_code = model.hardware_flops_per_token(codes, s)
    assert by_code.tolist() == [model.hardware_flops_per_token(r, s) for r in Recompute.names()]
    assert flops_utilisation(2.0, 3.0, 4, 1.5) == 1.0


def test_predictor_hfu_uses_the_model_definition() -> None:
    model, cluster = load_model("llama2-7b"), load_cluster("h100-ib")
    layouts = [_layout(recompute=r, micro_batch=1) for r in Recompute.names()]
    pred = predict(model, cluster, LayoutTable.from_layouts(layouts))
    for i, r in enumerate(Recompute.names()):
        ratio = pred["hfu"][i] / pred["mfu"][i]
        expected = model.hardware_flops_per_token(r, 4096) / model.model_flops_per_token(4096)
        assert ratio == pytest.approx(expected, rel=1e-12)


def test_predictor_speaks_the_metric_names() -> None:
    model, cluster = load_model("llama2-7b"), load_cluster("h100-ib")
    pred = predict(model, cluster, LayoutTable.from_layouts([_layout()]))
    assert set(pred.keys()) == set(metrics.NAMES)
    assert pred["tokens_per_joule"][0] == pred["tokens_per_j"][0]  # the documented alias
    row = pred.row(0)
    assert row["energy_j"] == pytest.approx(row["power_w_per_gpu"] * 64 * row["step_time_s"])
    assert row["tokens_per_j"] == pytest.approx(64 * 4096 / row["energy_j"])
    for m in metrics.METRICS:
        assert m.scope in ("job", "per_gpu") and m.unit and m.description
    assert metrics.metric("tokens_per_joule").name == "tokens_per_j"


def test_cuda_device_names_map_to_catalog_clusters() -> None:
    from scalelab.config.catalog import cluster_for_device, gpu_for_device

    assert cluster_for_device("NVIDIA H100 80GB HBM3") == "h100-ib"
    assert cluster_for_device("nvidia  h200") == "h200-ib"
    assert cluster_for_device("Tesla V100-SXM2-32GB") == "v100-ib"
    assert gpu_for_device("NVIDIA A100-SXM4-40GB") == "A100-SXM4-40GB"
    assert cluster_for_device("NVIDIA A100-SXM4-40GB") is None  # no catalog cluster uses it
    assert cluster_for_device("NVIDIA GeForce RTX 4090") is None


def test_the_array_form_has_every_layout_field() -> None:
    # A new Layout field needs its LayoutTable column (from_layouts / layout() / search fill the
    # rest generically); this keeps the two in step.
    assert LayoutTable.column_names() == list(Layout.model_fields)
    assert LayoutTable.default_code("sharding") == Sharding.FSDP.code
    assert LayoutTable.default_code("hsdp_shard_size") == 0
