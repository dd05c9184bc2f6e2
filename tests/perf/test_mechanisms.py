"""Mechanisms of predictor v2 (issue 11), each pinned by a value that is false if it is broken."""

import numpy as np
import pytest

from scalelab.config.catalog import load_cluster, load_model
from scalelab.config.layout import Layout, rule_violations
from scalelab.perf.predict import predict_layout

H100 = load_cluster("h100-ib")
L3_8B = load_model("llama3-8b")
L2_70B = load_model("llama2-70b")


def test_context_parallel_ranks_shard_and_reduce_with_the_data_parallel_ranks() -> None:
    """llama3-8b on 8 GPUs with cp 8: no data parallelism, yet FSDP shards over the 8 CP ranks
    (they hold the same weights) and their gradients are reduced (torchtitan's dp_shard_cp)."""
    layout = Layout(gpus=8, global_batch=1, seq_len=8192, cp=8, micro_batch=1)
    assert layout.dp == 1
    r = predict_layout(L3_8B, H100, layout)
    assert r["dp_grad_reduce_s"] > 0
    assert r["dp_all_gather_s"] > 0
    assert r["memory_parameters_bytes"] == pytest.approx(4 * L3_8B.n_params / 8)
    assert r["memory_optimizer_bytes"] == pytest.approx(8 * L3_8B.n_params / 8)
    assert r["memory_total_bytes"] < 80 * 2**30  # it fits an 80 GB H100, as torchtitan runs it


def test_tp_past_the_kv_heads_replicates_them() -> None:
    """TP16 on llama2-70b (8 K/V heads) is valid: each K/V head lives on two TP ranks."""
    layout = Layout(gpus=64, global_batch=64, seq_len=4096, tp=16, micro_batch=1)
    assert rule_violations(layout, L2_70B, H100) == []
    r = predict_layout(L2_70B, H100, layout)
    assert np.isfinite(r["tokens_per_s_per_gpu"]) and r["tokens_per_s_per_gpu"] > 0
    # The per-rank layer holds its share of Q/O/MLP plus a whole K/V head (2 ranks per head).
    d, kv = L2_70B.d_model, L2_70B.kv_dim
    per_rank = L2_70B.layer_params_per_tp_rank(16)
    assert per_rank == pytest.approx((L2_70B.layer_params - 2 * d * kv) / 16 + 2 * d * kv / 8)
    assert L2_70B.layer_params_per_tp_rank(8) == pytest.approx(L2_70B.layer_params / 8)


def test_a_131072_gpu_layout_is_predicted() -> None:
    """No 65,536-GPU cap: llama3-405b on 131,072 GPUs (tp8 pp16 and 1,024 data-parallel ranks)."""
    model = load_model("llama3-405b")
    layout = Layout(gpus=131_072, global_batch=16_384, seq_len=8192, tp=8, pp=16, micro_batch=1)
    assert rule_violations(layout, model, H100) == []
    r = predict_layout(model, H100, layout)
    assert np.isfinite(r["step_time_s"]) and r["step_time_s"] > 0
    assert 0 < r["mfu"] < 1


def _fsdp7b(gpus: int) -> Layout:
    return Layout(gpus=gpus, global_batch=gpus, seq_len=4096, micro_batch=1)


def test_interference_comes_from_the_collectives_sm_and_hbm_shares() -> None:
    """24 channels of 132 SMs plus 2 x 50 GB/s of 3,350 GB/s HBM on an H100 cluster."""
    assert H100.overlap_interference == pytest.approx(24 / 132 + 2 * 50 / 3350)
    a100 = load_cluster("a100-ib")
    assert a100.overlap_interference == pytest.approx(24 / 108 + 2 * 25 / 2039)


def test_power_sits_between_idle_and_tdp_and_f2s_sign_comes_from_the_states() -> None:
    """Per-GPU power of llama2-7b FSDP on h100-ib falls from 128 to 2048 GPUs (the study's F2
    sign), from the time-weighted states alone, and every value lies between idle and TDP."""
    from scalelab.perf.power import state_powers_w

    l7 = load_model("llama2-7b")
    w = state_powers_w(H100)
    assert H100.gpu.idle_w == w["idle"] < w["comm_only"] < w["compute"] <= H100.gpu.tdp_w
    powers = {}
    for gpus in (8, 128, 512, 2048):
        r = predict_layout(l7, H100, _fsdp7b(gpus))
        assert H100.gpu.idle_w <= r["power_w_per_gpu"] <= H100.gpu.tdp_w
        powers[gpus] = r["power_w_per_gpu"]
    assert powers[2048] < powers[128]


def test_a_ring_leaving_an_nvl72_rack_uses_the_racks_nics() -> None:
    """144 ranks over two GB200 NVL72 racks: the cross-rack tier is 72 GPUs' NICs (capped by
    NVLink), not one 4-GPU compute tray's."""
    from scalelab.perf import comm

    nvl72 = load_cluster("gb200-nvl72")
    group = comm.group_shape(np.array([144]), np.array([1]), nvl72)
    assert group.ranks_per_domain[0] == 72 and group.domains[0] == 2
    busbw = comm.bus_bandwidth(comm.ALL_GATHER, group, nvl72)[0]
    one_tray = nvl72.nic_bytes_per_s_per_gpu * 4 * nvl72.params.net_bus_efficiency
    rack = nvl72.nic_bytes_per_s_per_gpu * 72 * nvl72.params.net_bus_efficiency
    nvlink = nvl72.gpu.nvlink_bytes_per_s * nvl72.params.nvlink_bus_efficiency
    assert busbw == pytest.approx(min(rack, nvlink))
    assert busbw >= 4 * one_tray  # one tray's NICs alone would give one_tray


def test_selective_recompute_with_flash_attention_frees_nothing() -> None:
    """Korthikanti et al.'s selective recompute drops the score-sized tensors, which a flash
    kernel never stores; with the math kernel it frees exactly the scores."""
    l7 = load_model("llama2-7b")
    base = dict(gpus=8, global_batch=8, seq_len=4096, micro_batch=1)
    for attention, frees in (("flash", False), ("math", True)):
        none = predict_layout(l7, H100, Layout(**base, attention=attention))
        sel = predict_layout(l7, H100, Layout(**base, attention=attention, recompute="selective"))
        if frees:
            assert sel["memory_activations_bytes"] < none["memory_activations_bytes"]
        else:
            assert sel["memory_activations_bytes"] == none["memory_activations_bytes"]


def test_the_comm_only_power_a_power_ratio_needs_is_solved_by_hand() -> None:
    """Power is linear in the communication-only draw P: with shares (busy, comm, idle) before
    and after, (0.6·Pc + 0.35·P + 0.05·Pi) / (0.9·Pc + 0.05·P + 0.05·Pi) = 0.9 solves for P."""
    from scalelab.perf.power import comm_only_power_for_ratio, state_powers_w

    w = state_powers_w(H100)
    pc, pi = w["compute"], w["idle"]
    p = comm_only_power_for_ratio(H100, (0.9, 0.05, 0.05), (0.6, 0.35, 0.05), 0.9)
    assert p == pytest.approx(
        (0.9 * (0.9 * pc + 0.05 * pi) - (0.6 * pc + 0.05 * pi)) / (0.35 - 0.045)
    )
    assert (0.6 * pc + 0.35 * p + 0.05 * pi) / (0.9 * pc + 0.05 * p + 0.05 * pi) == pytest.approx(
        0.9
    )
