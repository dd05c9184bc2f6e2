import numpy as np
import pytest

from scalelab.config.catalog import load_cluster, load_model
from scalelab.config.layout import Layout, LayoutTable
from scalelab.perf.predict import predict, predict_layout

H100 = load_cluster("h100-ib")
L7 = load_model("llama2-7b")


def fsdp(gpus: int, per_gpu: int = 1, **kw) -> Layout:
    return Layout(gpus=gpus, global_batch=per_gpu * gpus, seq_len=4096, micro_batch=per_gpu, **kw)


def test_every_field_is_reported() -> None:
    r = predict_layout(L7, H100, fsdp(128))
    for key in (
        "step_time_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "mfu",
        "hfu",
        "compute_s",
        "exposed_comm_s",
        "dp_all_gather_s",
        "dp_all_gather_exposed_s",
        "dp_grad_reduce_s",
        "tp_comm_s",
        "pp_bubble_s",
        "recompute_s",
        "optimizer_s",
        "memory_total_bytes",
        "memory_activations_bytes",
        "fits",
        "power_w_per_gpu",
        "tokens_per_j",
        "assumptions",
    ):
        assert key in r
    assert r["tokens_per_s"] == pytest.approx(r["tokens_per_s_per_gpu"] * 128)
    assert r["tokens_per_s"] == pytest.approx(128 * 4096 / r["step_time_s"])


def test_mfu_follows_the_design_convention() -> None:
    r = predict_layout(L7, H100, fsdp(8))
    flops = L7.model_flops_per_token(4096) * r["tokens_per_s"]
    assert r["mfu"] == pytest.approx(flops / (8 * 989.4e12))
    assert r["hfu"] == pytest.approx(r["mfu"])
    full = predict_layout(L7, H100, fsdp(8, recompute="full"))
    assert full["hfu"] > full["mfu"] * 1.25


def test_memory_of_a_known_configuration() -> None:
    """llama2-7b, FSDP over 8 GPUs: fp32 params + grads + Adam moments, sharded 8 ways."""
    r = predict_layout(L7, H100, fsdp(8))
    stage_params = L7.n_params
    assert r["memory_parameters_bytes"] == pytest.approx(4 * stage_params / 8)
    assert r["memory_gradients_bytes"] == pytest.approx(4 * stage_params / 8)
    assert r["memory_optimizer_bytes"] == pytest.approx(8 * stage_params / 8)
    assert r["memory_fsdp_buffers_bytes"] == pytest.approx(2 * 2 * L7.layer_params)
    ddp = predict_layout(L7, H100, fsdp(8, sharding="ddp"))
    assert ddp["memory_optimizer_bytes"] == pytest.approx(8 * stage_params)


def test_a_layout_that_does_not_fit_says_so() -> None:
    big = load_model("llama2-70b")
    r = predict_layout(big, H100, Layout(gpus=8, global_batch=8, seq_len=4096, sharding="ddp"))
    assert r["fits"] is False
    assert r["memory_total_bytes"] > r["memory_capacity_bytes"]
    fits = Layout(gpus=64, global_batch=64, seq_len=4096, recompute="full")
    assert predict_layout(big, H100, fits)["fits"] is True


def test_fsdp_exposed_communication_grows_with_data_parallel_size() -> None:
    exposed = [predict_layout(L7, H100, fsdp(g))["exposed_comm_s"] for g in (16, 128, 512, 2048)]
    assert exposed == sorted(exposed)
    assert exposed[-1] > 10 * exposed[0]


def test_per_gpu_throughput_falls_at_scale_and_tp_recovers_it() -> None:
    """The study's headline mechanism, qualitatively."""
    t128 = predict_layout(L7, H100, fsdp(128))["tokens_per_s_per_gpu"]
    t2048 = predict_layout(L7, H100, fsdp(2048))["tokens_per_s_per_gpu"]
    tp2 = predict_layout(
        L7, H100, Layout(gpus=2048, global_batch=2048, seq_len=4096, tp=2, micro_batch=2)
    )
    assert t2048 < 0.8 * t128
    assert tp2["tokens_per_s_per_gpu"] > 1.2 * t2048


def test_more_bandwidth_is_never_slower() -> None:
    layouts = [fsdp(g) for g in (8, 64, 512)] + [
        Layout(gpus=64, global_batch=128, seq_len=4096, tp=t, pp=p, micro_batch=1)
        for t in (1, 2, 8)
        for p in (1, 2, 4)
    ]
    table = LayoutTable.from_layouts(layouts)
    base = predict(L7, H100, table)["step_time_s"]
    gpu = H100.gpu.model_copy(update={"nvlink_gbs": 900.0})
    faster = H100.model_copy(update={"nic_gbps": 800.0, "gpu": gpu})
    assert np.all(predict(L7, faster, table)["step_time_s"] <= base + 1e-12)


def test_pipeline_bubble_by_schedule() -> None:
    def bubble(schedule: str, v: int) -> float:
        layout = Layout(
            gpus=32, global_batch=64, seq_len=4096, pp=4, pp_schedule=schedule, virtual_stages=v
        )
        return predict_layout(L7, H100, layout)["pp_bubble_s"]

    assert bubble("interleaved", 2) == pytest.approx(bubble("1f1b", 1) / 2, rel=0.02)
    assert bubble("zbv", 2) < bubble("interleaved", 2)
    assert bubble("gpipe", 1) == pytest.approx(bubble("1f1b", 1))


def test_vectorised_rows_equal_single_predictions() -> None:
    layouts = [
        fsdp(64),
        fsdp(64, sharding="hsdp"),
        fsdp(64, sharding="ddp"),
        fsdp(64, sharding="zero1"),
        Layout(gpus=64, global_batch=64, seq_len=4096, tp=2, micro_batch=2, cp=2),
        Layout(
            gpus=64,
            global_batch=256,
            seq_len=4096,
            pp=4,
            pp_schedule="interleaved",
            virtual_stages=2,
        ),
    ]
    table = predict(L7, H100, LayoutTable.from_layouts(layouts))
    for i, layout in enumerate(layouts):
        single = predict_layout(L7, H100, layout)
        assert table["step_time_s"][i] == pytest.approx(single["step_time_s"])


def test_power_sits_between_idle_and_tdp_and_drops_when_comm_bound() -> None:
    r128 = predict_layout(L7, H100, fsdp(128))
    r2048 = predict_layout(L7, H100, fsdp(2048))
    assert H100.gpu.idle_w < r2048["power_w_per_gpu"] < r128["power_w_per_gpu"] < H100.gpu.tdp_w
    assert r2048["tokens_per_j"] < r128["tokens_per_j"]


def test_hsdp_shards_inside_the_node() -> None:
    r = predict_layout(L7, H100, fsdp(256, sharding="hsdp"))
    assert r["dp_shard"] == 8 and r["dp_replicate"] == 32
