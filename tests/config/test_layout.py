import numpy as np
import pytest

from scalelab.config.catalog import load_cluster, load_model
from scalelab.config.layout import Layout, LayoutTable, rule_violations, violation_masks

MODEL = load_model("llama2-70b")
CLUSTER = load_cluster("h100-ib")


def fields_of(layout: Layout) -> list[str]:
    return [e.field for e in rule_violations(layout, MODEL, CLUSTER)]


def test_a_sound_layout_has_no_violation() -> None:
    layout = Layout(gpus=64, global_batch=64, seq_len=4096, tp=8, pp=2, micro_batch=1)
    assert rule_violations(layout, MODEL, CLUSTER) == []
    assert layout.dp == 4 and layout.n_microbatches == 16


@pytest.mark.parametrize(
    ("kwargs", "field", "needle"),
    [
        ({"tp": 3}, "tp", "n_heads"),
        ({"tp": 128, "gpus": 128}, "tp", "n_kv_heads"),
        ({"gpus": 100, "tp": 8}, "gpus", "divide the GPU count"),
        ({"global_batch": 30}, "global_batch", "multiple of data-parallel ranks"),
        ({"pp": 4, "global_batch": 16, "gpus": 64}, "micro_batch", "micro-batches"),
        ({"virtual_stages": 2}, "virtual_stages", "interleaved"),
        ({"cp": 2, "seq_len": 4098, "gpus": 64}, "cp", "divisible"),
        ({"hsdp_shard_size": 8}, "hsdp_shard_size", "only for sharding hsdp"),
        ({"sharding": "hsdp", "hsdp_shard_size": 6}, "hsdp_shard_size", "must divide"),
        (
            {
                "pp": 64,
                "virtual_stages": 2,
                "pp_schedule": "interleaved",
                "gpus": 128,
                "global_batch": 256,
            },
            "pp",
            "at most n_layers",
        ),
    ],
)
def test_each_violation_is_named(kwargs: dict, field: str, needle: str) -> None:
    base = {"gpus": 32, "global_batch": 32, "seq_len": 4096}
    layout = Layout(**{**base, **kwargs})
    errors = rule_violations(layout, MODEL, CLUSTER)
    assert any(e.field == field and needle in e.message for e in errors), errors


def test_hsdp_defaults_to_sharding_inside_a_node() -> None:
    layout = Layout(gpus=64, global_batch=64, seq_len=4096, sharding="hsdp", tp=2)
    assert layout.dp_shard_on(8) == 4
    assert rule_violations(layout, MODEL, CLUSTER) == []


def test_masks_match_scalar_validation() -> None:
    layouts = [
        Layout(gpus=32, global_batch=32, seq_len=4096, tp=t, pp=p, micro_batch=mb)
        for t in (1, 2, 3, 8)
        for p in (1, 2, 4)
        for mb in (1, 2, 4)
    ]
    table = LayoutTable.from_layouts(layouts)
    masks = violation_masks(table, MODEL, CLUSTER)
    invalid = np.any(np.stack(list(masks.values())), axis=0)
    assert invalid.tolist() == [bool(rule_violations(L, MODEL, CLUSTER)) for L in layouts]


def test_table_round_trips_layouts() -> None:
    layouts = [
        Layout(gpus=16, global_batch=32, seq_len=2048, sharding="hsdp", hsdp_shard_size=8),
        Layout(
            gpus=16,
            global_batch=32,
            seq_len=2048,
            pp=2,
            pp_schedule="interleaved",
            virtual_stages=2,
            recompute="full",
        ),
    ]
    table = LayoutTable.from_layouts(layouts)
    assert [table.layout(i) for i in range(2)] == layouts
