"""Collective cost models, vectorised over layouts.

Follows the structure of NCCL's tuning model (src/graph/tuning.cc): for every algorithm (ring,
tree, NVLS) and protocol (LL, LL128, Simple) a collective costs

    time = latency(algorithm, protocol, ranks, nodes) + bytes / algorithm_bandwidth

and NCCL runs the fastest candidate. Latencies are a base plus one hardware latency per ring step
(NVLink steps inside a node, network steps between nodes) or per tree level. Bus bandwidth is the
slowest tier a ring crosses: NVLink inside an NVLink domain; between domains, the NICs that the
communicator's ranks in one node drive together (one NIC per GPU on DGX-like nodes), degraded
slowly with the number of nodes as the study's Figure 2 shows. Bus bandwidth follows the
nccl-tests definitions (`scalelab.collectives`). Algorithms and protocols are tables
(`ALGORITHMS`, `PROTOCOLS`); `collective_time` takes the fastest pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from scalelab import collectives
from scalelab.collectives import ALL_GATHER as ALL_GATHER
from scalelab.collectives import ALL_REDUCE as ALL_REDUCE
from scalelab.collectives import ALL_TO_ALL as ALL_TO_ALL
from scalelab.collectives import REDUCE_SCATTER as REDUCE_SCATTER
from scalelab.collectives import SEND_RECV as SEND_RECV
from scalelab.config.hardware import ClusterSpec

COLLECTIVES = collectives.BENCHMARKED


@dataclass(frozen=True)
class Protocol:
    """One NCCL protocol's constants (src/graph/tuning.cc).

    Per-step latencies are relative to the Simple protocol's (NCCL's hwLat: ring NVLink
    LL/LL128/Simple = 0.47/1.9/3.4 µs, ring network 2.7/4.0/9.6 µs; the cluster's parameters give
    the Simple values and tree levels use the network ratios); `base_latency_us` is NCCL's
    baseLat (scaled by the cluster's `base_latency_us` / 8.4); bandwidth factors are the fraction
    of the bus bandwidth a ring (inside one node or across nodes) or a tree achieves.
    """

    name: str
    nvlink_latency_factor: float
    net_latency_factor: float
    base_latency_us: float
    ring_bw_factor_multi_node: float
    ring_bw_factor_single_node: float
    tree_bw_factor: float


PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("LL", 0.47 / 3.4, 2.7 / 9.6, 3.6, 1 / 4, 1 / 3, 0.9 / 3.8),
    Protocol("LL128", 1.9 / 3.4, 4.0 / 9.6, 10.0, 0.92, 0.92, 0.9 * 0.915),
    Protocol("Simple", 1.0, 1.0, 8.4, 1.0, 1.0, 0.9),
)
_SIMPLE_BASE_LATENCY_US = 8.4
_NVLS_GAIN = 1.30


def bus_factor(collective: str, n_ranks: np.ndarray) -> np.ndarray:
    """nccl-tests' busbw / algbw factor (`scalelab.collectives`), for at least one rank."""
    n = np.maximum(np.asarray(n_ranks, dtype=float), 1.0)
    return np.asarray(collectives.bus_factor(collective, n))


@dataclass(frozen=True)
class GroupShape:
    """A communicator: `ranks` in total, `ranks_per_domain` of them inside each NVLink domain."""

    ranks: np.ndarray
    ranks_per_domain: np.ndarray
    # Bus bandwidths already computed for this group, by (cluster, NVLS gain applied): the TP and
    # data-parallel groups serve several collectives each.
    _bus_cache: dict[tuple[int, bool], tuple[ClusterSpec, np.ndarray]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @cached_property
    def domains(self) -> np.ndarray:
        return np.maximum(1, np.ceil(self.ranks / np.maximum(self.ranks_per_domain, 1)))


def group_shape(size: np.ndarray, stride: np.ndarray, cluster: ClusterSpec) -> GroupShape:
    """Shape of a group of `size` ranks spaced `stride` apart, ranks numbered node by node."""
    size = np.asarray(size, dtype=np.int64)
    stride = np.asarray(stride, dtype=np.int64)
    domain = cluster.nvlink_domain
    per_domain = np.where(
        stride >= domain, 1, np.minimum(size, np.maximum(1, domain // np.maximum(stride, 1)))
    )
    return GroupShape(ranks=size, ranks_per_domain=np.maximum(per_domain, 1))


def bus_bandwidth(collective: str, group: GroupShape, cluster: ClusterSpec) -> np.ndarray:
    """Achievable bus bandwidth (bytes/s) of the slowest tier the collective crosses (Simple ring)."""
    p = cluster.params
    gpu = cluster.gpu
    nvls = collective == ALL_REDUCE and gpu.nvls
    key = (id(cluster), nvls)
    hit = group._bus_cache.get(key)
    if hit is not None and hit[0] is cluster:
        return hit[1]
    nvlink = gpu.nvlink_bytes_per_s * p.nvlink_bus_efficiency * np.ones(group.ranks.shape)
    if nvls:
        nvlink = nvlink * _NVLS_GAIN
    domains = group.domains
    nics_per_domain_rank = cluster.nic_bytes_per_s_per_gpu * np.minimum(
        group.ranks_per_domain, cluster.gpus_per_node
    )
    net = (
        nics_per_domain_rank
        * p.net_bus_efficiency
        / (1.0 + p.net_scale_degradation * np.log2(np.maximum(domains, 1)))
    )
    bw = np.where(domains > 1, np.minimum(nvlink, net), nvlink)
    group._bus_cache[key] = (cluster, bw)
    return bw


@dataclass(frozen=True)
class CollectiveCase:
    """What every algorithm needs to cost one collective call, computed once per call."""

    nbytes: np.ndarray
    ranks: np.ndarray
    domains: np.ndarray
    ranks_per_domain: np.ndarray
    multi: np.ndarray
    busbw: np.ndarray
    factor: np.ndarray
    steps: np.ndarray
    cluster: ClusterSpec

    # Terms every protocol shares, computed once (the same arithmetic, so the same bits).
    @cached_property
    def traffic(self) -> np.ndarray:
        """Bytes over the bus: the buffer times the bus factor."""
        return self.nbytes * self.factor

    @cached_property
    def net_base_latency_us(self) -> np.ndarray:
        return np.where(self.multi, self.cluster.params.net_base_latency_us, 0.0)

    @cached_property
    def nvlink_steps_latency_us(self) -> np.ndarray:
        return self.steps * self.cluster.params.nvlink_step_latency_us

    @cached_property
    def tree_chain_latency_us(self) -> np.ndarray:
        return (self.ranks_per_domain - 1.0) * self.cluster.params.nvlink_step_latency_us

    @cached_property
    def tree_levels_latency_us(self) -> np.ndarray:
        return np.log2(np.maximum(self.domains, 1.0)) * self.cluster.params.tree_level_latency_us

    def base_latency_us(self, proto: Protocol) -> np.ndarray:
        p = self.cluster.params
        return (
            proto.base_latency_us * p.base_latency_us / _SIMPLE_BASE_LATENCY_US
            + self.net_base_latency_us
        )


def _ring_time(c: CollectiveCase, proto: Protocol) -> np.ndarray:
    """A ring is a pipeline: once it spans nodes, every step waits on the slowest hop."""
    p = c.cluster.params
    nvl_lat, net_lat = p.nvlink_step_latency_us, p.net_step_latency_us
    if proto.ring_bw_factor_multi_node == proto.ring_bw_factor_single_node:
        ring_bw = c.busbw * proto.ring_bw_factor_multi_node
    else:
        ring_bw = c.busbw * np.where(
            c.multi, proto.ring_bw_factor_multi_node, proto.ring_bw_factor_single_node
        )
    latency_us = c.base_latency_us(proto) + np.where(
        c.multi,
        c.steps
        * np.maximum(nvl_lat * proto.nvlink_latency_factor, net_lat * proto.net_latency_factor),
        c.nvlink_steps_latency_us * proto.nvlink_latency_factor,
    )
    return latency_us * 1e-6 + c.traffic / ring_bw


def _tree_time(c: CollectiveCase, proto: Protocol) -> np.ndarray:
    """NCCL's tree: NVLink chain inside the node, a binary tree across nodes (multi-node only)."""
    tree_latency_us = c.base_latency_us(proto) + 2.0 * (
        c.tree_chain_latency_us * proto.nvlink_latency_factor
        + c.tree_levels_latency_us * proto.net_latency_factor
    )
    tree = tree_latency_us * 1e-6 + c.traffic / (c.busbw * proto.tree_bw_factor)
    return np.where(c.multi, tree, np.inf)


@dataclass(frozen=True)
class Algorithm:
    """One NCCL algorithm: the collectives it implements and its cost for a protocol."""

    name: str
    collectives: tuple[str, ...]
    time: Callable[[CollectiveCase, Protocol], np.ndarray]


ALGORITHMS: tuple[Algorithm, ...] = (
    Algorithm("ring", collectives.NAMES, _ring_time),
    Algorithm("tree", (ALL_REDUCE,), _tree_time),
)


def collective_time(
    collective: str, nbytes: np.ndarray, group: GroupShape, cluster: ClusterSpec
) -> np.ndarray:
    """Seconds for one collective on a buffer of `nbytes` (the gathered / reduced buffer size):
    the fastest (algorithm, protocol) pair, as NCCL's tuner picks.

    For send/recv, `nbytes` is what one rank sends to its peer; `group.ranks` is 2.
    """
    nbytes = np.asarray(nbytes, dtype=float)
    n = np.asarray(group.ranks, dtype=float)
    domains = np.asarray(group.domains, dtype=float)
    # NCCL spreads a buffer over more channels as it grows: bandwidth ramps up with size.
    busbw = bus_bandwidth(collective, group, cluster) * (
        nbytes / (nbytes + cluster.params.bandwidth_ramp_mib * 2**20)
    )
    case = CollectiveCase(
        nbytes=nbytes,
        ranks=n,
        domains=domains,
        ranks_per_domain=np.asarray(group.ranks_per_domain, dtype=float),
        multi=domains > 1,
        busbw=busbw,
        factor=bus_factor(collective, n),
        steps=np.asarray(collectives.collective(collective).ring_steps(n)),
        cluster=cluster,
    )
    best = np.full(nbytes.shape, np.inf)
    for algorithm in ALGORITHMS:
        if collective in algorithm.collectives:
            for proto in PROTOCOLS:
                best = np.minimum(best, algorithm.time(case, proto))
    return np.where(n <= 1, 0.0, best)


def bus_bandwidth_achieved(
    collective: str, nbytes: np.ndarray, group: GroupShape, cluster: ClusterSpec
) -> np.ndarray:
    """nccl-tests' busbw (bytes/s) the model predicts for a buffer of `nbytes`."""
    t = collective_time(collective, nbytes, group, cluster)
    return (
        np.asarray(nbytes, dtype=float) * bus_factor(collective, group.ranks) / np.maximum(t, 1e-30)
    )
