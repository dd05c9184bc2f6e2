"""Collective operations: their names and the nccl-tests bandwidth definitions, once.

Used by the predictor (`perf.comm`), the collective benchmark (`measure.comm_bench`), trace
analysis and the CLI. No torch, no numpy required by callers (the factors accept numbers or numpy
arrays).

nccl-tests (doc/PERFORMANCE.md) reports, for a collective over `n` ranks on a buffer of `size`
bytes (the whole gathered output for all_gather, the whole input for reduce_scatter, what one
rank sends for send/recv) taking `time` seconds:

- algorithm bandwidth `algbw = size / time`;
- bus bandwidth `busbw = algbw x factor`, the factor making the number comparable with the
  hardware's link rate whatever `n` is: all_reduce 2(n-1)/n; all_gather, reduce_scatter and
  all_to_all (n-1)/n; broadcast, reduce and send/recv 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

ALL_REDUCE: Final = "all_reduce"
ALL_GATHER: Final = "all_gather"
REDUCE_SCATTER: Final = "reduce_scatter"
ALL_TO_ALL: Final = "all_to_all"
BROADCAST: Final = "broadcast"
REDUCE: Final = "reduce"
SEND_RECV: Final = "send_recv"


@dataclass(frozen=True)
class Collective:
    """One collective: its name, its display name (as traces and figures write it), its nccl-tests
    bus factor `busbw_scale · (n-1)/n` (or 1 when `busbw_scale` is None) and the latency steps of
    its ring implementation, `ring_step_scale · (n-1)` (or 1 for a point-to-point send)."""

    name: str
    display: str
    busbw_scale: float | None
    ring_step_scale: float | None

    def bus_factor(self, n_ranks: Any) -> Any:
        """nccl-tests' busbw / algbw for `n_ranks` ranks (a number or a numpy array)."""
        if self.busbw_scale is None:
            return n_ranks * 0 + 1.0
        return self.busbw_scale * (n_ranks - 1.0) / n_ranks

    def ring_steps(self, n_ranks: Any) -> Any:
        """Latency steps of one call on a ring of `n_ranks` ranks."""
        if self.ring_step_scale is None:
            return n_ranks * 0 + 1.0
        return self.ring_step_scale * (n_ranks - 1.0)


TABLE: Final[tuple[Collective, ...]] = (
    Collective(ALL_REDUCE, "AllReduce", 2.0, 2.0),
    Collective(ALL_GATHER, "AllGather", 1.0, 1.0),
    Collective(REDUCE_SCATTER, "ReduceScatter", 1.0, 1.0),
    Collective(ALL_TO_ALL, "AllToAll", 1.0, 1.0),
    Collective(BROADCAST, "Broadcast", None, 1.0),
    Collective(REDUCE, "Reduce", None, 1.0),
    Collective(SEND_RECV, "SendRecv", None, None),
)
BY_NAME: Final[dict[str, Collective]] = {c.name: c for c in TABLE}
NAMES: Final[tuple[str, ...]] = tuple(BY_NAME)
# What the collective benchmark and the predictor model today (broadcast/reduce are trace-only).
BENCHMARKED: Final[tuple[str, ...]] = (
    ALL_REDUCE,
    ALL_GATHER,
    REDUCE_SCATTER,
    ALL_TO_ALL,
    SEND_RECV,
)


def collective(name: str) -> Collective:
    """The collective called `name`, or an `InputError` naming the allowed ones."""
    if name not in BY_NAME:
        from scalelab.errors import InputError

        raise InputError("collective", f"'{name}' is not one of {', '.join(NAMES)}")
    return BY_NAME[name]


def bus_factor(name: str, n_ranks: Any) -> Any:
    """nccl-tests' busbw / algbw factor of collective `name` on `n_ranks` ranks."""
    return collective(name).bus_factor(n_ranks)


def algbw(size_bytes: Any, time_s: Any) -> Any:
    """Algorithm bandwidth, bytes/s: the buffer size over the time."""
    return size_bytes / time_s


def busbw(name: str, size_bytes: Any, time_s: Any, n_ranks: Any) -> Any:
    """Bus bandwidth, bytes/s: algbw x the collective's bus factor."""
    return algbw(size_bytes, time_s) * bus_factor(name, n_ranks)
