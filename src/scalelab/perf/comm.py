"""Collective cost models, vectorised over layouts.

Follows NCCL's own tuning model (src/graph/tuning.cc of the NCCL release the stack ships: 2.20.5
with PyTorch 2.3.1; the cluster's `nccl_version` and `host_cpu`): for every algorithm (ring,
tree, NVLS) and protocol (LL, LL128, Simple) a collective costs

    time = latency(algorithm, protocol, ranks, nodes) + bytes / algorithm_bandwidth

and NCCL runs the fastest candidate. A ring's latency is NCCL's: a base, plus one hardware latency
per step inside a node (at least the network post overhead once the ring spans nodes, since
v2.18.1) and one per step across nodes (`ring_latency_us`). Trees and NVLSTree (v2.18.1+) serve
AllReduce across nodes; NVLS serves AllReduce, AllGather and ReduceScatter inside one NVSwitch
domain; PAT (v2.23+) serves AllGather and ReduceScatter at one rank per node; AllToAll is n-1
point-to-point transfers. What each NCCL release has follows the cluster's `nccl_version`. Bus bandwidth is the slowest tier a ring crosses: NVLink inside an
NVLink domain; between domains, the NICs that the communicator's ranks in one domain drive
together, degraded slowly with the number of nodes as the study's Figure 2 shows. Bus bandwidth
follows the nccl-tests definitions (`scalelab.collectives`). Algorithms and protocols are tables
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
from scalelab.perf.distinct import Distinct

COLLECTIVES = collectives.BENCHMARKED


@dataclass(frozen=True)
class Protocol:
    """One NCCL protocol's constants, as NCCL 2.20.5 (bundled with PyTorch 2.3.1) has them in
    src/graph/tuning.cc.

    Ring latencies: `baseLat[RING]` = 6.6 / 14.0 / 8.4 µs (LL / LL128 / Simple); per ring step
    `hwLat[NVLINK][RING]` = 0.6 / 1.9 / 3.4 µs and `hwLat[NET][RING]` = 2.7 / 4.0 / 14.0 µs. The
    cluster's parameters give the Simple values (`nvlink_step_latency_us`,
    `net_step_latency_us`, `base_latency_us`); the factors here are NCCL's ratios to Simple.
    `net_overhead_factor`: NCCL multiplies the network post overhead by 3 for Simple (v2.18.1+).
    Bandwidth factors are the fraction of the bus bandwidth a ring (inside one node or across
    nodes) or a tree achieves (the same file's "model refinements").
    """

    name: str
    nvlink_latency_factor: float
    net_latency_factor: float
    # hwLat[NET][TREE] / 14: since NCCL 2.23 a ring with one rank per node pays the tree's network
    # latency (5.0 / 8.5 / 14 µs), "with ppn=1 latencies are fully exposed" (tuning.cc v2.23.4).
    net_tree_latency_factor: float
    base_latency_us: float
    net_overhead_factor: float
    ring_bw_factor_multi_node: float
    ring_bw_factor_single_node: float
    tree_bw_factor: float


PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("LL", 0.6 / 3.4, 2.7 / 14.0, 5.0 / 14.0, 6.6, 1.0, 1 / 4, 1 / 3, 0.9 / 3.8),
    Protocol("LL128", 1.9 / 3.4, 4.0 / 14.0, 8.5 / 14.0, 14.0, 1.0, 0.92, 0.92, 0.9 * 0.915),
    Protocol("Simple", 1.0, 1.0, 1.0, 8.4, 3.0, 1.0, 1.0, 0.9),
)
SIMPLE = PROTOCOLS[2]
_SIMPLE_BASE_LATENCY_US = 8.4
# NVLS (NVLink SHARP): hwLat[NVLINK][NVLS][SIMPLE] = 23 µs and no base latency (tuning.cc 2.20);
# the all-reduce gain is the H200 nccl-tests ratio NVLS 482 / ring 367 GB/s (stas00/ml-engineering
# collectives_busbw.csv). Without CollNet, NCCL 2.20 runs NVLS inside one NVLink domain only.
_NVLS_LATENCY_US = 23.0
_NVLS_GAIN = 1.30

# What each NCCL release's src/graph/tuning.cc has (NVIDIA/nccl tags, read 2026-12-03):
# - NVLSTree (AllReduce: NVLS inside each node under a tree across nodes) from v2.18.1;
#   latency hwLat[NVLINK][NVLSTree] + 2·log2i(nNodes)·interLat, bandwidth
#   nChannels·min(bwIntra, nNodes <= 2 ? bwInter : bwInter/2) x 5/6 (algorithm bandwidth);
#   disabled on one node, and on multi-node NVLink (MNNVL) before v2.21.
# - NVLS's NVLink latency hwLat[NVLINK][NVLS] is 0 in v2.18, 23 µs in v2.19-v2.20, 25 µs from v2.21.
# - PAT (AllGather / ReduceScatter, Simple only) from v2.23.4, enabled only when nNodes == nRanks
#   ("PAT only supports 1 GPU per node"): latency 8 + log2i(nNodes)·interLat/3.5 + 2.8·nRanks µs
#   with interLat = hwLat[NET][TREE][SIMPLE] = 14 µs, bus bandwidth x 0.85 (v2.23), x 0.75 (v2.24+).
# - From v2.23 a ring with one rank per node pays the tree's network latency, and AllReduce's
#   ring crosses the network 2·(nNodes - 1) times (2·nNodes before).
NVLS_TREE_SINCE = (2, 18, 1)
PAT_SINCE = (2, 23)
_PAT_BASE_US = 8.0
_PAT_PER_RANK_US = 2.8
_PAT_LOG_DIVISOR = 3.5


def nvls_latency_us(version: tuple[int, ...]) -> float:
    """hwLat[NVLINK][NVLS][SIMPLE] (and NVLSTree's) in this NCCL release's tuning.cc."""
    if version >= (2, 21):
        return 25.0
    if version >= (2, 19):
        return _NVLS_LATENCY_US
    return 0.0


def pat_bw_factor(version: tuple[int, ...]) -> float:
    """PAT's bus bandwidth refinement: x 0.85 in v2.23, x 0.75 from v2.24."""
    return 0.75 if version >= (2, 24) else 0.85


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


def net_tier_bandwidth(
    ranks_per_domain: np.ndarray, domains: np.ndarray, cluster: ClusterSpec
) -> np.ndarray:
    """Bus bandwidth (bytes/s) of the network tier: each of the group's ranks in an NVLink domain
    drives its own NIC(s) (a ring that leaves a GB200 NVL72 rack uses the rack's NICs, 72 GPUs'
    worth, not one compute tray's 4), degraded slowly with the number of domains."""
    p = cluster.params
    nics_per_domain_rank = cluster.nic_bytes_per_s_per_gpu * np.asarray(ranks_per_domain, float)
    return (
        nics_per_domain_rank
        * p.net_bus_efficiency
        / (1.0 + p.net_scale_degradation * np.log2(np.maximum(domains, 1)))
    )


def bus_bandwidth(collective: str, group: GroupShape, cluster: ClusterSpec) -> np.ndarray:
    """Achievable bus bandwidth (bytes/s) of the slowest tier the collective crosses (Simple ring)."""
    p = cluster.params
    gpu = cluster.gpu
    # AllReduce's NVLink tier carries the NVLS gain on NVSwitch-3 GPUs for every algorithm: NVLS
    # inside one domain, NVLSTree (intra-node NVLS under the inter-node tree) across domains.
    nvls = collective == ALL_REDUCE and gpu.nvls
    key = (id(cluster), nvls)
    hit = group._bus_cache.get(key)
    if hit is not None and hit[0] is cluster:
        return hit[1]
    nvlink = gpu.nvlink_bytes_per_s * p.nvlink_bus_efficiency * np.ones(group.ranks.shape)
    if cluster.nvlink_pair_fraction < 1.0:
        # Without an NVLink switch two GPUs share only the links joining them (`ClusterSpec`).
        nvlink = np.where(
            np.asarray(group.ranks_per_domain) == 2, nvlink * cluster.nvlink_pair_fraction, nvlink
        )
    if nvls:
        nvlink = nvlink * _NVLS_GAIN
    domains = group.domains
    net = net_tier_bandwidth(group.ranks_per_domain, domains, cluster)
    bw = np.where(domains > 1, np.minimum(nvlink, net), nvlink)
    group._bus_cache[key] = (cluster, bw)
    return bw


@dataclass(frozen=True)
class CollectiveCase:
    """What every algorithm needs to cost one collective call, computed once per call."""

    collective: str
    nbytes: np.ndarray
    ranks: np.ndarray
    domains: np.ndarray
    ranks_per_domain: np.ndarray
    multi: np.ndarray
    busbw: np.ndarray
    factor: np.ndarray
    steps: np.ndarray
    inter_steps: np.ndarray
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
    def tree_chain_latency_us(self) -> np.ndarray:
        return (self.ranks_per_domain - 1.0) * self.cluster.params.nvlink_step_latency_us

    @cached_property
    def tree_levels_latency_us(self) -> np.ndarray:
        return np.log2(np.maximum(self.domains, 1.0)) * self.cluster.params.tree_level_latency_us

    @cached_property
    def version(self) -> tuple[int, ...]:
        return self.cluster.nccl_version_tuple

    @cached_property
    def one_rank_per_node(self) -> np.ndarray:
        """NCCL's nNodes == nRanks on a multi-node communicator (NVLink domains as nodes)."""
        return self.multi & (self.ranks_per_domain <= 1)

    @cached_property
    def net_busbw(self) -> np.ndarray:
        """The network tier's bus bandwidth alone (bytes/s), with the buffer's ramp."""
        p = self.cluster.params
        ramp = self.nbytes / (self.nbytes + p.bandwidth_ramp_mib * 2**20)
        return net_tier_bandwidth(self.ranks_per_domain, self.domains, self.cluster) * ramp

    def base_latency_us(self, proto: Protocol) -> np.ndarray:
        p = self.cluster.params
        return (
            proto.base_latency_us * p.base_latency_us / _SIMPLE_BASE_LATENCY_US
            + self.net_base_latency_us
        )


def ring_latency_us(c: CollectiveCase, proto: Protocol) -> np.ndarray:
    """NCCL 2.20's ring latency (src/graph/tuning.cc, ncclTopoTuneModel):

        lat = baseLat + (nsteps - nInterSteps) * max(intraLat, netOverhead) + nInterSteps * interLat

    with netOverhead = 1 µs (Intel host) or 2 µs (AMD), x3 for Simple, on multi-node rings only
    (v2.18.1 and later). nsteps = n-1 for AllGather/ReduceScatter, 2(n-1) for AllReduce;
    nInterSteps = nodes-1, or 2·nodes for AllReduce (v2.20; 2·(nodes-1) from v2.23). From v2.23
    a ring with one rank per node pays the tree's network latency. NVLink domains count as
    nodes."""
    p = c.cluster.params
    intra = p.nvlink_step_latency_us * proto.nvlink_latency_factor
    net_overhead = c.cluster.net_overhead_us * proto.net_overhead_factor
    intra_multi = max(intra, net_overhead)
    inter = p.net_step_latency_us * np.where(
        c.one_rank_per_node & (c.version >= PAT_SINCE),
        proto.net_tree_latency_factor,
        proto.net_latency_factor,
    )
    return c.base_latency_us(proto) + np.where(
        c.multi,
        (c.steps - c.inter_steps) * intra_multi + c.inter_steps * inter,
        c.steps * intra,
    )


def _ring_time(c: CollectiveCase, proto: Protocol) -> np.ndarray:
    """A ring: NCCL's latency, then the traffic over the slowest tier's bus bandwidth."""
    if proto.ring_bw_factor_multi_node == proto.ring_bw_factor_single_node:
        ring_bw = c.busbw * proto.ring_bw_factor_multi_node
    else:
        ring_bw = c.busbw * np.where(
            c.multi, proto.ring_bw_factor_multi_node, proto.ring_bw_factor_single_node
        )
    return ring_latency_us(c, proto) * 1e-6 + c.traffic / ring_bw


def _tree_time(c: CollectiveCase, proto: Protocol) -> np.ndarray:
    """NCCL's tree: NVLink chain inside the node, a binary tree across nodes (multi-node only)."""
    tree_latency_us = c.base_latency_us(proto) + 2.0 * (
        c.tree_chain_latency_us * proto.nvlink_latency_factor
        + c.tree_levels_latency_us * proto.net_latency_factor
    )
    tree = tree_latency_us * 1e-6 + c.traffic / (c.busbw * proto.tree_bw_factor)
    return np.where(c.multi, tree, np.inf)


def _nvls_time(c: CollectiveCase, proto: Protocol) -> np.ndarray:
    """NVLS inside one NVSwitch domain for AllGather and ReduceScatter (Simple only): NCCL's
    latency is hwLat[NVLINK][NVLS] alone (23 µs in v2.20, 25 µs from v2.21; `nvls_latency_us`),
    and the ring's bus bandwidth."""
    if proto is not SIMPLE or not c.cluster.gpu.nvls:
        return np.full(c.nbytes.shape, np.inf)
    t = nvls_latency_us(c.version) * 1e-6 + c.traffic / c.busbw
    return np.where(c.multi, np.inf, t)


def _nvls_tree_time(c: CollectiveCase, proto: Protocol) -> np.ndarray:
    """NVLSTree AllReduce across NVLink domains (NCCL v2.18.1+ on NVSwitch-3 GPUs, Simple only):
    NCCL's latency, hwLat[NVLINK][NVLSTree] + 2·log2(nodes)·interLat, with the cluster's fitted
    network tree level (`tree_level_latency_us`, as the tree uses) for interLat; NCCL's bandwidth,
    the network tier halved beyond two nodes, x 5/6 (an algorithm bandwidth: the buffer crosses
    it), and the NVLink tier with NVLS for the bus traffic: time = latency + max(bytes / (5/6 x
    network), traffic / NVLink)."""
    version = c.version
    cluster = c.cluster
    if (
        proto is not SIMPLE
        or not cluster.gpu.nvls
        or version < NVLS_TREE_SINCE
        or (version < (2, 21) and cluster.nvlink_domain > cluster.gpus_per_node)
    ):
        return np.full(c.nbytes.shape, np.inf)
    latency_us = nvls_latency_us(version) + 2.0 * c.tree_levels_latency_us
    # NCCL's algorithm bandwidth over the network: 5/6 of the network tier, halved beyond two
    # nodes; the buffer itself (not the bus traffic) crosses it, as in NCCL's time = bytes / bw.
    net = np.where(c.domains > 2, c.net_busbw / 2.0, c.net_busbw) * 5.0 / 6.0
    ramp = c.nbytes / (c.nbytes + cluster.params.bandwidth_ramp_mib * 2**20)
    nvlink = cluster.gpu.nvlink_bytes_per_s * cluster.params.nvlink_bus_efficiency * _NVLS_GAIN
    transfer = np.maximum(c.nbytes / net, c.traffic / (nvlink * ramp))
    return np.where(c.multi, latency_us * 1e-6 + transfer, np.inf)


def _pat_time(c: CollectiveCase, proto: Protocol) -> np.ndarray:
    """PAT for AllGather / ReduceScatter (NCCL v2.23+, Simple only, one rank per node):
    latency 8 + log2i(nodes)·interLat/3.5 + 2.8·ranks µs (interLat: the network's Simple step,
    hwLat[NET][TREE][SIMPLE] = 14 µs = the ring's), bus bandwidth x 0.85 (v2.23) or x 0.75."""
    if proto is not SIMPLE or c.version < PAT_SINCE:
        return np.full(c.nbytes.shape, np.inf)
    levels = np.floor(np.log2(np.maximum(c.domains, 1.0)))
    latency_us = (
        _PAT_BASE_US
        + levels * c.cluster.params.net_step_latency_us / _PAT_LOG_DIVISOR
        + _PAT_PER_RANK_US * c.ranks
    )
    # NCCL converts no bus bandwidth to an algorithm bandwidth for PAT: time = bytes / (busBw x f).
    t = latency_us * 1e-6 + c.nbytes / (c.busbw * pat_bw_factor(c.version))
    return np.where(c.one_rank_per_node, t, np.inf)


@dataclass(frozen=True)
class Algorithm:
    """One NCCL algorithm: the collectives it implements and its cost for a protocol. `time`
    returns inf where the algorithm does not apply; `simple_only` and `applies` let
    `collective_time` skip pricing it at all where it cannot win (search's speed)."""

    name: str
    collectives: tuple[str, ...]
    time: Callable[[CollectiveCase, Protocol], np.ndarray]
    simple_only: bool = False
    applies: Callable[[CollectiveCase], bool] = lambda c: True


ALGORITHMS: tuple[Algorithm, ...] = (
    # AllToAll is n-1 point-to-point transfers (NCCL's grouped send/recv): priced as a "ring" whose
    # steps are its peers, the ones outside the NVLink domain paying network latency.
    Algorithm("ring", collectives.NAMES, _ring_time),
    Algorithm("tree", (ALL_REDUCE,), _tree_time, applies=lambda c: bool(c.multi.any())),
    # AllReduce's NVLS is its NVLink tier's gain with the ring's fitted latency: the 8-GPU H200
    # nccl-tests all_reduce sweep is fitted better so (5.4 % against 9.9 % with NCCL's 23 µs).
    Algorithm(
        "nvls",
        (ALL_GATHER, REDUCE_SCATTER),
        _nvls_time,
        simple_only=True,
        applies=lambda c: c.cluster.gpu.nvls and not bool(c.multi.all()),
    ),
    Algorithm(
        "nvls_tree",
        (ALL_REDUCE,),
        _nvls_tree_time,
        simple_only=True,
        applies=lambda c: (
            c.cluster.gpu.nvls and c.version >= NVLS_TREE_SINCE and bool(c.multi.any())
        ),
    ),
    Algorithm(
        "pat",
        (ALL_GATHER, REDUCE_SCATTER),
        _pat_time,
        simple_only=True,
        applies=lambda c: c.version >= PAT_SINCE and bool(c.one_rank_per_node.any()),
    ),
)


def _inter_steps(
    collective: str,
    n: np.ndarray,
    domains: np.ndarray,
    per_domain: np.ndarray,
    version: tuple[int, ...] = (2, 20, 5),
) -> np.ndarray:
    """NCCL's nInterSteps: ring steps that cross the network (NVLink domains as nodes); for
    AllReduce 2·nodes up to v2.22, 2·(nodes - 1) from v2.23."""
    if collective == ALL_REDUCE:
        steps = 2.0 * np.where(domains > 1, domains - (version >= PAT_SINCE), 0.0)
        cap = 2.0 * (n - 1.0)
    elif collective == ALL_TO_ALL:
        return np.maximum(n - per_domain, 0.0)  # peers outside this rank's domain
    elif collective == SEND_RECV:
        return np.ones_like(n)
    else:
        steps = domains - 1.0
        cap = n - 1.0
    return np.minimum(steps, cap)


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
    per_domain = np.asarray(group.ranks_per_domain, dtype=float)
    case = CollectiveCase(
        collective=collective,
        nbytes=nbytes,
        ranks=n,
        domains=domains,
        ranks_per_domain=per_domain,
        multi=domains > 1,
        busbw=busbw,
        factor=bus_factor(collective, n),
        steps=np.asarray(collectives.collective(collective).ring_steps(n)),
        inter_steps=_inter_steps(collective, n, domains, per_domain, cluster.nccl_version_tuple),
        cluster=cluster,
    )
    best = np.full(nbytes.shape, np.inf)
    for algorithm in ALGORITHMS:
        if collective in algorithm.collectives and algorithm.applies(case):
            for proto in (SIMPLE,) if algorithm.simple_only else PROTOCOLS:
                best = np.minimum(best, algorithm.time(case, proto))
    return np.where(n <= 1, 0.0, best)


def collective_time_where(
    mask: np.ndarray,
    collective: str,
    nbytes: np.ndarray,
    group: GroupShape,
    cluster: ClusterSpec,
    rows: Distinct | None = None,
) -> np.ndarray:
    """`collective_time` on the layouts `mask` selects, 0 elsewhere: the same numbers there,
    without pricing a collective for layouts that never issue it (search's speed). `rows`, a
    grouping of the layouts within which `mask`, `nbytes` and `group` do not vary
    (`distinct_rows` of the columns they derive from), prices one layout per group."""
    mask = np.asarray(mask, dtype=bool)
    if rows is not None:
        first = rows.first
        few_group = GroupShape(
            ranks=group.ranks[first], ranks_per_domain=group.ranks_per_domain[first]
        )
        few_nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), mask.shape)[first]
        return rows.back(
            collective_time_where(mask[first], collective, few_nbytes, few_group, cluster)
        )
    if mask.all():
        return collective_time(collective, nbytes, group, cluster)
    out = np.zeros(mask.shape)
    if not mask.any():
        return out
    idx = np.flatnonzero(mask)
    sub = GroupShape(ranks=group.ranks[idx], ranks_per_domain=group.ranks_per_domain[idx])
    nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), mask.shape)[idx]
    out[idx] = collective_time(collective, nbytes, sub, cluster)
    return out


def bus_bandwidth_achieved(
    collective: str, nbytes: np.ndarray, group: GroupShape, cluster: ClusterSpec
) -> np.ndarray:
    """nccl-tests' busbw (bytes/s) the model predicts for a buffer of `nbytes`."""
    t = collective_time(collective, nbytes, group, cluster)
    return (
        np.asarray(nbytes, dtype=float) * bus_factor(collective, group.ranks) / np.maximum(t, 1e-30)
    )
