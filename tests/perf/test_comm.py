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
