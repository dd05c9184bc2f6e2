import dataclasses

import numpy as np
import pytest

from scalelab.config.catalog import load_cluster
from scalelab.perf import comm

H100 = load_cluster("h100-ib")


def group(ranks: int, per_domain: int) -> comm.GroupShape:
    return comm.GroupShape(ranks=np.array([ranks]), ranks_per_domain=np.array([per_domain]))


def test_large_all_gather_inside_a_node_by_hand() -> None:
    """8 ranks on NVLink, 1 GiB: NVLS (H100 has NVSwitch 3) wins; NCCL 2.20's NVLS latency is
    hwLat[NVLINK][NVLS] = 23 µs with no base; alpha-beta by hand."""
    p = H100.params
    nbytes = 2.0**30
    busbw = (
        H100.gpu.nvlink_gbs
        * 1e9
        * p.nvlink_bus_efficiency
        * nbytes
        / (nbytes + p.bandwidth_ramp_mib * 2**20)
    )
    expected = 23e-6 + nbytes * 7 / 8 / busbw
    got = comm.collective_time(comm.ALL_GATHER, np.array([nbytes]), group(8, 8), H100)[0]
    assert got == pytest.approx(expected, rel=1e-9)


def test_bus_factors_are_nccl_tests_definitions() -> None:
    n = np.array([8.0])
    assert comm.bus_factor(comm.ALL_REDUCE, n)[0] == pytest.approx(2 * 7 / 8)
    assert comm.bus_factor(comm.ALL_GATHER, n)[0] == pytest.approx(7 / 8)
    assert comm.bus_factor(comm.REDUCE_SCATTER, n)[0] == pytest.approx(7 / 8)
    assert comm.bus_factor(comm.SEND_RECV, n)[0] == 1.0


def test_one_rank_costs_nothing() -> None:
    assert comm.collective_time(comm.ALL_REDUCE, np.array([1e9]), group(1, 1), H100)[0] == 0.0


def test_ring_latency_grows_with_ranks() -> None:
    small = np.array([1e6])
    t128 = comm.collective_time(comm.ALL_GATHER, small, group(128, 8), H100)[0]
    t2048 = comm.collective_time(comm.ALL_GATHER, small, group(2048, 8), H100)[0]
    assert t2048 > 8 * t128


def test_allreduce_trees_scale_better_than_allgather_rings() -> None:
    """The study's Figure 2 mechanism: AllReduce busbw holds up at scale, AllGather's does not."""
    size = np.array([64 * 2.0**20])
    ar = comm.bus_bandwidth_achieved(comm.ALL_REDUCE, size, group(4096, 8), H100)[0]
    ag = comm.bus_bandwidth_achieved(comm.ALL_GATHER, size, group(4096, 8), H100)[0]
    assert ar > 3 * ag


def test_more_network_bandwidth_is_never_slower() -> None:
    fast = H100.model_copy(update={"nic_gbps": 800.0})
    sizes = np.logspace(3, 10, 30)
    for coll in comm.COLLECTIVES:
        g = comm.GroupShape(ranks=np.full(30, 256), ranks_per_domain=np.full(30, 8))
        assert np.all(
            comm.collective_time(coll, sizes, g, fast) <= comm.collective_time(coll, sizes, g, H100)
        )


def test_figure2_allreduce_points_within_15_percent_on_average() -> None:
    import csv
    from importlib import resources

    text = resources.files("scalelab").joinpath("data/paper_fig2_allreduce_busbw.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    size = np.array([float(r["message_bytes"]) for r in rows])
    nodes = np.array([int(r["num_nodes"]) for r in rows])
    measured = np.array([float(r["busbw_GBps"]) for r in rows]) * 1e9
    g = comm.GroupShape(ranks=nodes * 8, ranks_per_domain=np.full(len(rows), 8))
    predicted = comm.bus_bandwidth_achieved(comm.ALL_REDUCE, size, g, H100)
    assert np.mean(np.abs(predicted / measured - 1)) < 0.15


def test_multi_node_all_gather_ring_latency_is_nccl_220s_formula() -> None:
    """NCCL 2.20.5 src/graph/tuning.cc, ring AllGather over 16 ranks in 2 nodes of 8 on an Intel
    host, tiny buffer (latency only), by hand per protocol:
    lat = baseLat + (nsteps - nInterSteps) * max(intraLat, netOverhead) + nInterSteps * interLat,
    nsteps = 15, nInterSteps = 1, netOverhead = 1 µs (x3 for Simple)."""
    plain = H100.model_copy(
        update={
            "params": H100.params.model_copy(
                update={
                    "base_latency_us": 8.4,
                    "net_base_latency_us": 0.0,
                    "nvlink_step_latency_us": 3.4,
                    "net_step_latency_us": 14.0,
                    "bandwidth_ramp_mib": 0.0,
                }
            )
        }
    )
    assert plain.nccl_version == "2.20.5" and plain.host_cpu == "intel"
    case_group = group(16, 8)
    by_hand = {
        "LL": 6.6 + 14 * max(0.6, 1.0) + 1 * 2.7,
        "LL128": 14.0 + 14 * max(1.9, 1.0) + 1 * 4.0,
        "Simple": 8.4 + 14 * max(3.4, 3.0) + 1 * 14.0,
    }
    nbytes = np.array([1.0])
    n = np.array([16.0])
    case = comm.CollectiveCase(
        collective=comm.ALL_GATHER, nbytes=nbytes, ranks=n, domains=np.array([2.0]),
        ranks_per_domain=np.array([8.0]), multi=np.array([True]),
        busbw=comm.bus_bandwidth(comm.ALL_GATHER, case_group, plain),
        factor=comm.bus_factor(comm.ALL_GATHER, n), steps=n - 1.0, inter_steps=np.array([1.0]),
        cluster=plain,
    )  # fmt: skip
    for proto in comm.PROTOCOLS:
        assert comm.ring_latency_us(case, proto)[0] == pytest.approx(by_hand[proto.name])
    # On an AMD host the overhead is 2 µs: x3 = 6 µs beats Simple's 3.4 µs NVLink step.
    amd = plain.model_copy(update={"host_cpu": "amd"})
    amd_case = dataclasses.replace(case, cluster=amd)
    assert comm.ring_latency_us(amd_case, comm.SIMPLE)[0] == pytest.approx(8.4 + 14 * 6.0 + 14.0)
    # The cheapest protocol is what collective_time charges for a tiny buffer.
    t = comm.collective_time(comm.ALL_GATHER, nbytes, case_group, plain)[0]
    assert t == pytest.approx(min(by_hand.values()) * 1e-6, rel=1e-3)


def test_tp2_shortens_fsdps_all_gather_at_2048_ranks() -> None:
    """TP2 halves the FSDP group (2048 -> 1024 ranks, stride 2) and the message: NCCL's ring pays
    max(intraLat, netOverhead) per intra-node step, and TP2 halves those steps."""
    layer = 2.0 * 202e6  # llama2-7b layer in bf16
    fsdp = comm.group_shape(np.array([2048]), np.array([1]), H100)
    tp2 = comm.group_shape(np.array([1024]), np.array([2]), H100)
    t_fsdp = comm.collective_time(comm.ALL_GATHER, np.array([layer]), fsdp, H100)[0]
    t_tp2 = comm.collective_time(comm.ALL_GATHER, np.array([layer / 2]), tp2, H100)[0]
    assert t_tp2 < 0.75 * t_fsdp
    # The same holds for a latency-bound buffer: fewer ranks, fewer steps.
    tiny = np.array([1e3])
    assert (
        comm.collective_time(comm.ALL_GATHER, tiny, tp2, H100)[0]
        < 0.65 * (comm.collective_time(comm.ALL_GATHER, tiny, fsdp, H100)[0])
    )


def test_all_to_all_pays_network_latency_for_every_off_node_peer() -> None:
    """AllToAll is n-1 point-to-point transfers: with 16 ranks in 2 nodes, 8 peers are remote,
    unlike a ring's single network step."""
    tiny = np.array([1.0])
    g = group(16, 8)
    a2a = comm.collective_time(comm.ALL_TO_ALL, tiny, g, H100)[0]
    ag = comm.collective_time(comm.ALL_GATHER, tiny, g, H100)[0]
    assert a2a > ag


def _plain(version: str) -> object:
    """h100-ib with NCCL's nominal Simple constants and no bandwidth ramp, at `version`."""
    return H100.model_copy(
        update={
            "nccl_version": version,
            "params": H100.params.model_copy(
                update={
                    "base_latency_us": 8.4,
                    "net_base_latency_us": 0.0,
                    "nvlink_step_latency_us": 3.4,
                    "net_step_latency_us": 14.0,
                    "bandwidth_ramp_mib": 0.0,
                }
            ),
        }
    )


def test_pat_serves_one_rank_per_node_all_gathers_from_nccl_223() -> None:
    """NCCL v2.23.4 src/graph/tuning.cc: PAT (Simple only, nNodes == nRanks) costs
    8 + log2i(nNodes)·interLat/3.5 + 2.8·nRanks µs, interLat = hwLat[NET][TREE][SIMPLE] = 14;
    bus bandwidth x 0.85. 256 ranks, one per node (FSDP beside TP8), 1 KB: by hand."""
    v223, v220 = _plain("2.23.4"), _plain("2.20.5")
    g = group(256, 1)
    tiny = np.array([1e3])
    busbw = comm.bus_bandwidth(comm.ALL_GATHER, g, v223)[0]
    pat = (8.0 + 8 * 14.0 / 3.5 + 2.8 * 256) * 1e-6 + 1e3 / (busbw * 0.85)
    # The v2.23 ring with one rank per node pays the tree's network latency (LL 5.0 µs) on all
    # 255 steps: 6.6 + 255 x 5.0 = 1281.6 µs, so PAT (756.8 µs) wins.
    assert comm.collective_time(comm.ALL_GATHER, tiny, g, v223)[0] == pytest.approx(pat, rel=1e-6)
    assert comm.collective_time(comm.REDUCE_SCATTER, tiny, g, v223)[0] == pytest.approx(
        pat, rel=1e-6
    )
    # v2.20.5 (PyTorch 2.3.1's NCCL) has no PAT: its ring, LL: 6.6 + 255 x 2.7 µs.
    ring_220 = comm.collective_time(comm.ALL_GATHER, tiny, g, v220)[0]
    assert ring_220 == pytest.approx((6.6 + 255 * 2.7) * 1e-6, rel=1e-3)
    # With 8 ranks per node PAT is off: v2.23 prices AllGather as v2.20 does (its ring).
    g8 = group(2048, 8)
    assert comm.collective_time(comm.ALL_GATHER, tiny, g8, v223)[0] == pytest.approx(
        comm.collective_time(comm.ALL_GATHER, tiny, g8, v220)[0], rel=1e-12
    )


def test_nvls_tree_all_reduce_across_two_nodes_from_nccl_218() -> None:
    """NCCL v2.20.5 tuning.cc: NVLSTree latency hwLat[NVLINK][NVLSTree] (23 µs) +
    2·log2(nNodes)·interLat (here the cluster's fitted network tree level), algorithm bandwidth
    nChannels·min(bwIntra, bwInter) x 5/6 on two nodes, the buffer over it: time = latency +
    max(bytes / (5/6 x network tier), bus traffic / NVLink tier with NVLS). 16 ranks, 1 GiB: by hand."""
    v220 = _plain("2.20.5")
    p = v220.params
    nbytes = 2.0**30
    g = group(16, 8)
    net = v220.nic_bytes_per_s_per_gpu * 8 * p.net_bus_efficiency
    nvlink = v220.gpu.nvlink_bytes_per_s * p.nvlink_bus_efficiency * 1.30
    transfer = max(nbytes / (5 / 6 * net), nbytes * 2 * 15 / 16 / nvlink)
    expected = (23.0 + 2 * 1 * p.tree_level_latency_us) * 1e-6 + transfer
    got = comm.collective_time(comm.ALL_REDUCE, np.array([nbytes]), g, v220)[0]
    assert got == pytest.approx(expected, rel=1e-9)
    # Before v2.18.1 there is no NVLSTree: the ring (network-bound) is slower.
    old = v220.model_copy(update={"nccl_version": "2.17.1"})
    assert comm.collective_time(comm.ALL_REDUCE, np.array([nbytes]), g, old)[0] > 1.1 * got
    # No NVLS on A100 (NVSwitch 2): no NVLSTree either.
    a100 = load_cluster("a100-ib")
    c = comm.collective_time(comm.ALL_REDUCE, np.array([nbytes]), g, a100)[0]
    assert c >= nbytes * 2 * 15 / 16 / (a100.nic_bytes_per_s_per_gpu * 8)


def test_a_switchless_mesh_joins_a_pair_by_its_own_links() -> None:
    """DGX-1's hybrid cube-mesh (v100-ib, `nvlink_pair_fraction` 1/6): a two-GPU group inside
    the node has one of a V100's six NVLinks (GPU 0 and 1 are NV1), so a bandwidth-bound
    AllReduce takes about 6x as long as with a switch; groups of 4 and 8 are unchanged."""
    mesh = load_cluster("v100-ib")
    assert mesh.nvlink_pair_fraction == pytest.approx(1 / 6, rel=1e-3)
    switched = mesh.model_copy(update={"nvlink_pair_fraction": 1.0})
    nbytes = np.array([1e9])
    for ranks, ratio in ((2, 6.0), (4, 1.0), (8, 1.0)):
        group = comm.group_shape(np.array([ranks]), np.array([1]), mesh)
        slow = comm.collective_time(comm.ALL_REDUCE, nbytes, group, mesh)[0]
        group = comm.group_shape(np.array([ranks]), np.array([1]), switched)
        fast = comm.collective_time(comm.ALL_REDUCE, nbytes, group, switched)[0]
        assert slow / fast == pytest.approx(ratio, rel=0.02)
