"""Mixture of experts in the predictor (perf/moe.py, issue 16 item 3): AllToAll by hand, expert
sharding over EP and expert_dp, expert gradient reduction over expert_dp, dense predictions
untouched, and sane numbers over random MoE layouts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scalelab.config.catalog import load_cluster, load_model
from scalelab.config.layout import Layout, LayoutTable, violation_masks
from scalelab.perf import comm, moe
from scalelab.perf.predict import predict, predict_layout
from scalelab.search import enumerate_space

H100 = load_cluster("h100-ib")
MIXTRAL = load_model("mixtral-8x7b")
QWEN = load_model("qwen3-30b-a3b")


def _group(ranks: int, per_domain: int) -> comm.GroupShape:
    return comm.GroupShape(ranks=np.array([ranks]), ranks_per_domain=np.array([per_domain]))


def test_all_to_all_inside_one_node_by_hand() -> None:
    """8 ranks on one H100 NVLink domain, each sending 64 MiB: NCCL's 7 point-to-point steps.

    Per protocol (NCCL 2.20 tuning.cc, scaled to the cluster's fitted Simple values): latency =
    base x 9.53/8.4 + 7 x 4.44 µs x (NVLink ratio to Simple), transfer = 64 MiB x 7/8 over
    450 GB/s x 0.786 (NVLink bus efficiency) x ramp 64/(64+1.51), times the protocol's
    single-node bandwidth factor (LL 1/3, LL128 0.92, Simple 1). NCCL takes the fastest."""
    nbytes = 64 * 2**20
    bw = 450e9 * 0.786 * 64 / (64 + 1.51)
    transfer = nbytes * 7 / 8 / bw
    candidates = [
        (6.6 * 9.53 / 8.4 + 7 * 4.44 * 0.6 / 3.4) * 1e-6 + transfer * 3,  # LL
        (14.0 * 9.53 / 8.4 + 7 * 4.44 * 1.9 / 3.4) * 1e-6 + transfer / 0.92,  # LL128
        (8.4 * 9.53 / 8.4 + 7 * 4.44) * 1e-6 + transfer,  # Simple
    ]
    expected = min(candidates)
    assert expected == candidates[2]  # Simple: 40.61 µs + 169.93 µs
    got = moe.all_to_all_time(np.array([float(nbytes)]), _group(8, 8), H100)[0]
    assert got == pytest.approx(expected, rel=1e-12)
    assert got == pytest.approx(40.61e-6 + 169.93e-6, rel=1e-4)  # latency + transfer
    # Inside one domain it is the collective model's own AllToAll.
    same = comm.collective_time(comm.ALL_TO_ALL, np.array([float(nbytes)]), _group(8, 8), H100)
    assert got == pytest.approx(same[0], rel=1e-12)


def test_all_to_all_across_two_nodes_by_hand() -> None:
    """16 ranks, 8 per node: 7 NVLink peers and 8 network peers. The 8/16 of the buffer bound
    off-node crosses this rank's own 400 Gb/s NIC (x 0.954) while 7/16 crosses NVLink; latency is
    NCCL's multi-node ring: base + 7 x max(4.44, 3 x 1 µs host overhead) + 8 x 14 µs (Simple)."""
    nbytes = 256 * 2**20
    ramp = 256 / (256 + 1.51)
    intra = nbytes * 7 / 16 / (450e9 * 0.786 * ramp)
    inter = nbytes * 8 / 16 / (50e9 * 0.954 * ramp)
    simple = (9.53 + 7 * 4.44 + 8 * 14.0) * 1e-6 + max(intra, inter)
    got = moe.all_to_all_time(np.array([float(nbytes)]), _group(16, 8), H100)[0]
    assert got == pytest.approx(simple, rel=1e-12)


def _mixtral(**kw: object) -> dict[str, float]:
    base: dict[str, object] = dict(gpus=64, global_batch=128, seq_len=4096)
    return predict_layout(MIXTRAL, H100, Layout(**(base | kw)))  # type: ignore[arg-type]


def test_ep_shards_expert_memory() -> None:
    """Doubling EP halves the experts a rank holds: parameter memory falls by about the experts'
    share, and the analytic per-rank expert count is n_experts / ep x expert parameters."""
    table = LayoutTable.from_layouts(
        [Layout(gpus=64, global_batch=128, seq_len=4096, ep=e) for e in (1, 2, 4, 8)]
    )
    per_rank = moe.expert_params_per_rank(MIXTRAL, table)
    expected = 8 * MIXTRAL.expert_params / np.array([1, 2, 4, 8])  # every layer is MoE
    np.testing.assert_allclose(per_rank, expected, rtol=1e-12)
    # FSDP over the 64 ranks: experts shard over expert_dp = 64 / ep, so their sharded bytes per
    # rank are the same for every ep (ep x fewer experts over ep x fewer shards), while the
    # unsharded buffers of a layer's local experts shrink with ep.
    pred = predict(MIXTRAL, H100, table)
    np.testing.assert_allclose(pred["memory_parameters_bytes"], pred["memory_parameters_bytes"][0])
    assert np.all(np.diff(pred["memory_fsdp_buffers_bytes"]) < 0)
    # DDP replicates: there EP divides the experts' bytes outright.
    ddp = LayoutTable.from_layouts(
        [Layout(gpus=64, global_batch=128, seq_len=4096, ep=e, sharding="ddp") for e in (1, 8)]
    )
    params = predict(MIXTRAL, H100, ddp)["memory_parameters_bytes"]
    experts_fp32 = 4.0 * 32 * 8 * MIXTRAL.expert_params  # 32 layers x 8 experts, fp32
    assert params[0] - params[1] == pytest.approx(experts_fp32 * (1 - 1 / 8), rel=1e-9)
    # With tp 2 and expert_tp 2 the experts are split in two as well.
    t2 = LayoutTable.from_layouts(
        [Layout(gpus=64, global_batch=128, seq_len=4096, tp=2, ep=4, expert_tp=et) for et in (1, 2)]
    )
    split = moe.expert_params_per_rank(MIXTRAL, t2)
    assert split[1] == pytest.approx(split[0] / 2)


def test_more_ep_never_raises_expert_memory_per_rank() -> None:
    for sharding in ("ddp", "zero1", "fsdp"):
        rows = [_mixtral(ep=e, sharding=sharding, tp=2, micro_batch=1) for e in (1, 2, 4, 8)]
        held = [r["memory_parameters_bytes"] + r["memory_optimizer_bytes"] for r in rows]
        assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(held)), sharding


def test_expert_gradients_reduce_over_expert_dp() -> None:
    """FSDP: the experts' fp32 gradients ReduceScatter over the expert_dp ranks holding the same
    experts (spaced ep apart), once per layer, as priced by the collective model."""
    layout = Layout(gpus=64, global_batch=128, seq_len=4096, ep=8)
    table = LayoutTable.from_layouts([layout])
    assert int(table.expert_dp[0]) == 8
    cost = moe.moe_cost(MIXTRAL, H100, table, tp_f=np.array([1.0]), call_s=0.0)
    group = comm.group_shape(np.array([8]), np.array([8]), H100)
    assert int(group.ranks_per_domain[0]) == 1  # one rank per node: across the network
    expected = comm.collective_time(
        comm.REDUCE_SCATTER, 4.0 * 8 / 8 * MIXTRAL.expert_params * np.ones(1), group, H100
    )
    assert cost.expert_grad_reduce_s[0] == pytest.approx(expected[0], rel=1e-12)
    # With every rank in the EP group nothing is left to reduce the experts over.
    full = LayoutTable.from_layouts([Layout(gpus=8, global_batch=8, seq_len=4096, ep=8)])
    c8 = moe.moe_cost(MIXTRAL, H100, full, tp_f=np.array([1.0]), call_s=0.0)
    assert c8.expert_grad_reduce_s[0] == 0.0 and c8.expert_all_gather_s[0] == 0.0


def test_ep_adds_all_to_all_and_ep1_has_none() -> None:
    assert _mixtral(ep=1)["moe_all_to_all_s"] == 0.0
    assert _mixtral(ep=8)["moe_all_to_all_s"] > 0.0
    # Across nodes (ep 16 on 8-GPU nodes) the dispatch is slower than inside one node.
    across = _mixtral(ep=8, tp=2, expert_tp=2)["moe_all_to_all_s"]  # stride 2: two nodes
    inside = _mixtral(ep=4, tp=2, expert_tp=2)["moe_all_to_all_s"]  # stride 2: one node
    assert across > inside


def test_compute_follows_active_not_total_experts() -> None:
    """Expert FLOPs are top-k's: more routed experts at the same top-k (more total, same active
    parameters) leave the compute time about the same; a larger top-k raises it."""
    base = QWEN
    more = base.model_copy(update={"n_experts": 256})
    topk = base.model_copy(update={"experts_per_token": 16})
    layout = Layout(gpus=8, global_batch=64, seq_len=4096, micro_batch=8, ep=8)
    c = {m.name + str(m.n_experts) + str(m.experts_per_token): predict_layout(m, H100, layout)
         for m in (base, more, topk)}  # fmt: skip
    b, m2, k2 = c["qwen3-30b-a3b1288"], c["qwen3-30b-a3b2568"], c["qwen3-30b-a3b12816"]
    assert m2["compute_s"] == pytest.approx(b["compute_s"], rel=0.1)
    assert k2["compute_s"] > 1.3 * b["compute_s"]
    assert m2["mfu"] == pytest.approx(b["mfu"], rel=0.1)


def test_dense_models_never_reach_the_moe_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense predictions keep their bits: the MoE cost is never computed for them and the
    parameter count per layer is the dense one."""

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("moe_cost called for a dense model")

    monkeypatch.setattr(moe, "moe_cost", boom)
    llama = load_model("llama2-7b")
    row = predict_layout(llama, H100, Layout(gpus=16, global_batch=32, seq_len=4096))
    assert row["moe_all_to_all_s"] == 0.0
    tp = np.array([1.0, 2.0, 8.0])
    np.testing.assert_array_equal(
        moe.layer_params_per_tp_rank(llama, tp), llama.layer_params_per_tp_rank(tp)
    )


@pytest.mark.parametrize(
    ("name", "gpus"), [("mixtral-8x7b", 64), ("qwen3-30b-a3b", 128), ("deepseek-v3", 512)]
)
def test_random_moe_layouts_are_sane(name: str, gpus: int) -> None:
    model = load_model(name)
    space = enumerate_space(model, H100, gpus, 2 * gpus, 4096)
    invalid = np.stack(list(violation_masks(space, model, H100).values())).any(axis=0)
    valid = space.take(~invalid)
    rng = np.random.default_rng(16)
    table = valid.take(np.sort(rng.choice(len(valid), size=min(400, len(valid)), replace=False)))
    assert (table.ep > 1).any()
    pred = predict(model, H100, table)
    for key, arr in pred.values.items():
        assert np.all(np.isfinite(arr.astype(float))), key
    assert np.all(pred["mfu"] <= 1.0) and np.all(pred["mfu"] > 0)
    assert np.all(pred["moe_all_to_all_s"] >= 0)
    assert np.all(pred["moe_all_to_all_s"][table.ep == 1] == 0)
    assert np.all(pred["compute_s"] > 0) and np.all(pred["memory_total_bytes"] > 0)


def test_search_ranks_ep_layouts_and_refuses_ep_on_dense() -> None:
    from scalelab.errors import InputError
    from scalelab.search import Constraints, search

    result = search(QWEN, H100, gpus=16, global_batch=32, seq_len=4096, top_k=3)
    assert result.top and "moe_stages" in result.to_dict()
    only = search(
        QWEN, H100, gpus=16, global_batch=32, seq_len=4096, constraints=Constraints(ep=[4])
    )
    assert only.top and all(r["layout"]["ep"] == 4 for r in only.top)
    with pytest.raises(InputError, match="mixture-of-experts models only"):
        search(load_model("llama2-7b"), H100, gpus=16, global_batch=32, seq_len=4096,
               constraints=Constraints(ep=[2]))  # fmt: skip


def test_attention_with_its_own_head_width_is_priced_at_its_flops() -> None:
    """Qwen3's 64 heads of 128 span 8192 columns, twice d_model: the projections cost 2 FLOPs per
    attention parameter per token and the core runs at n_heads x (qk + v) width (causal half)."""
    from scalelab.config.options import AttentionKernel
    from scalelab.perf.compute import layer_compute

    one = np.array([1])
    tokens, s = 4096.0, 4096
    lc = layer_compute(
        load_model("qwen3-235b-a22b"),
        H100,
        micro_batch=one,
        seq_len=np.array([s]),
        tp=one,
        cp=one,
        sequence_parallel=np.array([False]),
        fp8=np.array([False]),
        attention=np.array([AttentionKernel.FLASH.code]),
    )
    m = load_model("qwen3-235b-a22b")
    gemm = 2.0 * tokens * (m.attention_params + 3 * m.d_model * m.d_ff)
    core = 2.0 * s * s * m.attention_core_width / 2.0
    assert m.attention_core_width == 64 * 256
    assert lc.forward_flops[0] == pytest.approx(gemm + core, rel=1e-12)


def test_moe_search_with_a_stack_that_offers_no_fsdp() -> None:
    """The first stage takes the leanest sharding the stack offers (DDP on Megatron-LM 2021)."""
    from scalelab.config.catalog import load_stack
    from scalelab.search import search

    result = search(
        QWEN, H100, gpus=16, global_batch=32, seq_len=4096, stack=load_stack("megatron-lm-2021")
    )
    assert result.top and all(r["layout"]["sharding"] == "ddp" for r in result.top)
    assert "ddp" in result.to_dict()["moe_stages"]


def test_moe_search_counts_each_invalid_layout_once_by_its_first_rule() -> None:
    """The two stages keep each layout's first failing rule; recomputing every rule on the whole
    priced space gives the same counts."""
    from scalelab.config.catalog import load_stack
    from scalelab.search import _count_reasons, _first_reasons, _masks, _moe_space, search

    stack = load_stack()
    staged, _ = _moe_space(QWEN, H100, 64, 256, 4096, None, "throughput", stack)
    first, reasons = _first_reasons(_masks(staged.space, QWEN, H100, stack))
    assert staged.by_reason and staged.by_reason == _count_reasons(first, reasons)
    assert np.array_equal(staged.invalid, first >= 0)
    result = search(QWEN, H100, gpus=64, global_batch=256, seq_len=4096)
    assert sum(result.invalid_by_reason.values()) == result.invalid == int(staged.invalid.sum())
