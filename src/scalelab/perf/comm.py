"""Collective cost models, vectorised over layouts.

Follows the structure of NCCL's tuning model (src/graph/tuning.cc): for every algorithm (ring,
tree, NVLS) and protocol (LL, LL128, Simple) a collective costs

    time = latency(algorithm, protocol, ranks, nodes) + bytes / algorithm_bandwidth

and NCCL runs the fastest candidate. Latencies are a base plus one hardware latency per ring step
(NVLink steps inside a node, network steps between nodes) or per tree level. Bus bandwidth is the
slowest tier a ring crosses: NVLink inside an NVLink domain; between domains, the NICs that the
communicator's ranks in one node drive together (one NIC per GPU on DGX-like nodes), degraded
slowly with the number of nodes as the study's Figure 2 shows. Bus bandwidth follows the
nccl-tests definitions: all-reduce moves 2(n-1)/n of the buffer per rank, all-gather and
reduce-scatter (n-1)/n of the gathered buffer, send/recv the buffer itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scalelab.config.hardware import ClusterSpec

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
ALL_TO_ALL = "all_to_all"
SEND_RECV = "send_recv"
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SEND_RECV)

# Per-step latencies relative to the Simple protocol's, from NCCL's hwLat table (tuning.cc): ring
# NVLink LL/LL128/Simple = 0.47/1.9/3.4 µs, ring network 2.7/4.0/9.6 µs. The cluster's parameters
# give the Simple-protocol values; tree levels use the network ring ratios.
_PROTOCOLS = ("LL", "LL128", "Simple")
_RING_NVLINK_LAT_FACTOR = {"LL": 0.47 / 3.4, "LL128": 1.9 / 3.4, "Simple": 1.0}
_RING_NET_LAT_FACTOR = {"LL": 2.7 / 9.6, "LL128": 4.0 / 9.6, "Simple": 1.0}
_BASE_LAT_US = {"LL": 3.6, "LL128": 10.0, "Simple": 8.4}
_RING_BW_FACTOR_MULTI = {"LL": 1 / 4, "LL128": 0.92, "Simple": 1.0}
_RING_BW_FACTOR_SINGLE = {"LL": 1 / 3, "LL128": 0.92, "Simple": 1.0}
_TREE_BW_FACTOR = {"LL": 0.9 / 3.8, "LL128": 0.9 * 0.915, "Simple": 0.9}
_NVLS_GAIN = 1.30


def bus_factor(collective: str, n_ranks: np.ndarray) -> np.ndarray:
    """nccl-tests' busbw / algbw factor."""
    n = np.maximum(np.asarray(n_ranks, dtype=float), 1.0)
    if collective == ALL_REDUCE:
        return 2.0 * (n - 1.0) / n
    if collective in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        return (n - 1.0) / n
    return np.ones_like(n)


@dataclass(frozen=True)
class GroupShape:
    """A communicator: `ranks` in total, `ranks_per_domain` of them inside each NVLink domain."""

    ranks: np.ndarray
    ranks_per_domain: np.ndarray

    @property
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
    nvlink = gpu.nvlink_bytes_per_s * p.nvlink_bus_efficiency * np.ones(group.ranks.shape)
    if collective == ALL_REDUCE and gpu.nvls:
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
    return np.where(domains > 1, np.minimum(nvlink, net), nvlink)


def collective_time(
    collective: str, nbytes: np.ndarray, group: GroupShape, cluster: ClusterSpec
) -> np.ndarray:
    """Seconds for one collective on a buffer of `nbytes` (the gathered / reduced buffer size).

    For send/recv, `nbytes` is what one rank sends to its peer; `group.ranks` is 2.
    """
    nbytes = np.asarray(nbytes, dtype=float)
    n = np.asarray(group.ranks, dtype=float)
    domains = np.asarray(group.domains, dtype=float)
    ppn = np.asarray(group.ranks_per_domain, dtype=float)
    multi = domains > 1
    p = cluster.params
    # NCCL spreads a buffer over more channels as it grows: bandwidth ramps up with size.
    busbw = bus_bandwidth(collective, group, cluster) * (
        nbytes / (nbytes + p.bandwidth_ramp_mib * 2**20)
    )
    factor = bus_factor(collective, n)
    net_lat = p.net_step_latency_us
    nvl_lat = p.nvlink_step_latency_us
    if collective == ALL_REDUCE:
        steps = 2.0 * (n - 1.0)
    elif collective == SEND_RECV:
        steps = np.ones_like(n)
    else:
        steps = n - 1.0

    best = np.full(nbytes.shape, np.inf)
    for proto in _PROTOCOLS:
        bw_factor = np.where(multi, _RING_BW_FACTOR_MULTI[proto], _RING_BW_FACTOR_SINGLE[proto])
        ring_bw = busbw * bw_factor
        base_us = _BASE_LAT_US[proto] * p.base_latency_us / 8.4 + np.where(
            multi, p.net_base_latency_us, 0.0
        )
        # A ring is a pipeline: once it spans nodes, every step waits on the slowest hop.
        latency_us = base_us + np.where(
            multi,
            steps
            * np.maximum(
                nvl_lat * _RING_NVLINK_LAT_FACTOR[proto], net_lat * _RING_NET_LAT_FACTOR[proto]
            ),
            steps * nvl_lat * _RING_NVLINK_LAT_FACTOR[proto],
        )
        ring = latency_us * 1e-6 + nbytes * factor / ring_bw
        best = np.minimum(best, ring)
        if collective == ALL_REDUCE:
            tree_latency_us = base_us + 2.0 * (
                (ppn - 1.0) * nvl_lat * _RING_NVLINK_LAT_FACTOR[proto]
                + np.log2(np.maximum(domains, 1.0))
                * p.tree_level_latency_us
                * _RING_NET_LAT_FACTOR[proto]
            )
            tree = tree_latency_us * 1e-6 + nbytes * factor / (busbw * _TREE_BW_FACTOR[proto])
            best = np.minimum(best, np.where(multi, tree, np.inf))
    return np.where(n <= 1, 0.0, best)


def bus_bandwidth_achieved(
    collective: str, nbytes: np.ndarray, group: GroupShape, cluster: ClusterSpec
) -> np.ndarray:
    """nccl-tests' busbw (bytes/s) the model predicts for a buffer of `nbytes`."""
    t = collective_time(collective, nbytes, group, cluster)
    return (
        np.asarray(nbytes, dtype=float) * bus_factor(collective, group.ranks) / np.maximum(t, 1e-30)
    )
