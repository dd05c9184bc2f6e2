"""Collective names and nccl-tests bandwidth factors (scalelab.collectives), and the cost tables."""

from __future__ import annotations

import numpy as np
import pytest

from scalelab import collectives
from scalelab.config import load_cluster
from scalelab.errors import InputError
from scalelab.perf import comm


@pytest.mark.parametrize(
    ("name", "n", "factor"),
    [
        ("all_reduce", 8, 2 * 7 / 8),
        ("all_gather", 8, 7 / 8),
        ("reduce_scatter", 4, 3 / 4),
        ("all_to_all", 16, 15 / 16),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("send_recv", 2, 1.0),
    ],
)
def test_bus_factors_are_nccl_tests(name: str, n: int, factor: float) -> None:
    assert collectives.bus_factor(name, n) == pytest.approx(factor)
    # 1 GB in 10 ms: algbw 100 GB/s, busbw = algbw x factor.
    assert collectives.algbw(1e9, 0.01) == pytest.approx(1e11)
    assert collectives.busbw(name, 1e9, 0.01, n) == pytest.approx(1e11 * factor)


def test_unknown_collective_names_the_allowed() -> None:
    with pytest.raises(InputError, match="all_reduce, all_gather"):
        collectives.collective("allreduce")


def test_collective_time_is_the_fastest_algorithm_and_protocol() -> None:
    cluster = load_cluster("h100-ib")
    group = comm.group_shape(np.array([64]), np.array([1]), cluster)
    for size in (1e3, 1e6, 1e9):
        nbytes = np.array([size])
        t = comm.collective_time(comm.ALL_REDUCE, nbytes, group, cluster)
        n = group.ranks.astype(float)
        case = comm.CollectiveCase(
            collective=comm.ALL_REDUCE, nbytes=nbytes, ranks=n, domains=group.domains.astype(float),
            ranks_per_domain=group.ranks_per_domain.astype(float), multi=group.domains > 1,
            busbw=comm.bus_bandwidth(comm.ALL_REDUCE, group, cluster)
            * (nbytes / (nbytes + cluster.params.bandwidth_ramp_mib * 2**20)),
            factor=comm.bus_factor(comm.ALL_REDUCE, n), steps=2.0 * (n - 1.0),
            inter_steps=np.minimum(2.0 * group.domains, 2.0 * (n - 1.0)), cluster=cluster,
        )  # fmt: skip
        candidates = [a.time(case, p)[0] for a in comm.ALGORITHMS for p in comm.PROTOCOLS]
        assert t[0] == min(candidates)
    # All-gather has no tree: a ring, NVLS inside one NVSwitch domain, or PAT (NCCL 2.23+).
    ag = [a.name for a in comm.ALGORITHMS if comm.ALL_GATHER in a.collectives]
    assert ag == ["ring", "nvls", "pat"]


def test_collective_time_where_prices_only_the_selected_layouts() -> None:
    cluster = load_cluster("h100-ib")
    group = comm.group_shape(np.array([2, 8, 64, 512]), np.array([1, 1, 8, 1]), cluster)
    nbytes = np.array([1e6, 1e7, 1e8, 1e9])
    full = comm.collective_time(comm.ALL_REDUCE, nbytes, group, cluster)
    mask = np.array([True, False, True, False])
    part = comm.collective_time_where(mask, comm.ALL_REDUCE, nbytes, group, cluster)
    assert part.tolist() == [full[0], 0.0, full[2], 0.0]  # the same bits where selected
    none = comm.collective_time_where(~mask & False, comm.ALL_REDUCE, nbytes, group, cluster)
    assert not none.any()
