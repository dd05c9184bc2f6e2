import numpy as np
import pytest

from scalelab.config.catalog import load_cluster
from scalelab.perf import comm

H100 = load_cluster("h100-ib")


def group(ranks: int, per_domain: int) -> comm.GroupShape:
    return comm.GroupShape(ranks=np.array([ranks]), ranks_per_domain=np.array([per_domain]))


def test_large_all_gather_inside_a_node_by_hand() -> None:
    """8 ranks on NVLink, 1 GiB: the Simple ring wins; alpha-beta by hand."""
    p = H100.params
    nbytes = 2.0**30
    busbw = (
        H100.gpu.nvlink_gbs
        * 1e9
        * p.nvlink_bus_efficiency
        * nbytes
        / (nbytes + p.bandwidth_ramp_mib * 2**20)
    )
    latency = (p.base_latency_us + 7 * p.nvlink_step_latency_us) * 1e-6
    expected = latency + nbytes * 7 / 8 / busbw
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
