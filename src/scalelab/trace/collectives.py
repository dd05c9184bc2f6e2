"""Every communication operation of a rank, and the bandwidth the trace itself shows.

Recent PyTorch writes each collective's message size, dtype and group size on its NCCL kernel and
on `record_param_comms`; `extract` turns them into bytes (`CommDetail`). Here they become
algorithm and bus bandwidth with nccl-tests' definitions (PERFORMANCE.md of nccl-tests):

    algbw = size / time,   busbw = algbw x factor(collective, n ranks)

with `size` the larger of the input and output buffer (all-gather: the gathered buffer,
reduce-scatter: the buffer before the scatter) and the factors below. `time` is a collective's
kernel time after the last rank arrived: where the ranks' traces are analysed together, the time
a rank spent waiting for a late rank (`stragglers`) is taken off; on one rank alone, its kernel
duration, which includes any such wait: a row from such times says it is a lower bound.

The collective names and bus factors are `scalelab.collectives`' (the predictor and the collective
benchmark use the same table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.collectives import BENCHMARKED, BY_NAME, TABLE
from scalelab.trace.classify import COLLECTIVES
from scalelab.trace.extract import Timeline
from scalelab.trace.intervals import Int64Array

# A trace's collective (its display name, e.g. "AllGather") -> scalelab's collective name, from the
# one table in `scalelab.collectives`; Barrier and Other have no bandwidth definition.
PREDICTOR_NAME: dict[str, str] = {c.display: c.name for c in TABLE}
# Those the predictor and the collective benchmark model (broadcast and reduce are trace-only).
MODELLED_NAME: dict[str, str] = {d: n for d, n in PREDICTOR_NAME.items() if n in BENCHMARKED}


def bus_factor(collective: str, n: int) -> float | None:
    """nccl-tests' busbw / algbw; None for collectives without a definition (Barrier, Other)."""
    name = PREDICTOR_NAME.get(collective)
    if name is None or n < 1:
        return None
    return float(BY_NAME[name].bus_factor(n))


@dataclass(eq=False)
class CommOps:
    """A rank's communication events, sorted by start (arrays, one row per event)."""

    collective: np.ndarray  # index into classify.COLLECTIVES
    group: tuple[str, ...]
    seq: Int64Array
    start_ns: Int64Array
    end_ns: Int64Array
    nbytes: Int64Array
    group_size: Int64Array
    # Time after the last rank arrived (end - latest start across ranks); set by `stragglers`
    # when several ranks are analysed together, else the event's own duration.
    effective_ns: Int64Array = field(default_factory=lambda: np.zeros(0, np.int64))
    # Whether `effective_ns` is after the last arrival (matched across ranks by `stragglers`);
    # where not, it includes any wait for late peers and the bandwidth is a lower bound.
    matched: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    @classmethod
    def of(cls, t: Timeline) -> CommOps:
        order = np.argsort(t.comm_start_ns, kind="stable")
        detail = t.comm_detail
        n = order.size
        if detail is None or len(detail.group) != n:
            from scalelab.trace.extract import CommDetail

            detail = CommDetail.unknown(n)
        start, end = t.comm_start_ns[order], t.comm_end_ns[order]
        return cls(
            collective=t.comm_collective[order],
            group=tuple(detail.group[i] for i in order.tolist()),
            seq=detail.seq[order],
            start_ns=start,
            end_ns=end,
            nbytes=detail.nbytes[order],
            group_size=detail.group_size[order],
            effective_ns=end - start,
            matched=np.zeros(n, dtype=bool),
        )

    def __len__(self) -> int:
        return int(self.start_ns.size)


@dataclass(eq=False)
class BandwidthRow:
    """One collective at one message size and group size on one rank: nccl-tests' figures."""

    collective: str
    nbytes: int
    group_size: int
    count: int
    time_median_ns: float
    time_min_ns: int
    algbw_gbps: float  # GB/s = 1e9 bytes/s, from the median time
    busbw_gbps: float
    busbw_best_gbps: float  # from the fastest occurrence
    predicted_busbw_gbps: float | None = None  # the cluster profile's, where asked for
    # The times include waiting for late peers (one rank's trace, or collectives not matched
    # across ranks): the real bandwidth is at least this.
    lower_bound: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "collective": self.collective,
            "bytes": self.nbytes,
            "group_size": self.group_size,
            "count": self.count,
            "time_median_ns": round(self.time_median_ns, 1),
            "time_min_ns": self.time_min_ns,
            "algbw_gbps": round(self.algbw_gbps, 3),
            "busbw_gbps": round(self.busbw_gbps, 3),
            "busbw_best_gbps": round(self.busbw_best_gbps, 3),
            "predicted_busbw_gbps": None
            if self.predicted_busbw_gbps is None
            else round(self.predicted_busbw_gbps, 3),
            "lower_bound": self.lower_bound,
        }


def bandwidth_rows(ops: CommOps) -> list[BandwidthRow]:
    """Group the events that carry size metadata by (collective, bytes, group size)."""
    known = (ops.nbytes > 0) & (ops.group_size > 0) & (ops.effective_ns > 0)
    if not known.any():
        return []
    idx = np.flatnonzero(known)
    keys: dict[tuple[int, int, int], list[int]] = {}
    for i, c, b, g in zip(
        idx.tolist(),
        ops.collective[idx].tolist(),
        ops.nbytes[idx].tolist(),
        ops.group_size[idx].tolist(),
        strict=True,
    ):
        keys.setdefault((c, b, g), []).append(i)
    rows = []
    for (c, nbytes, n), members in keys.items():
        name = COLLECTIVES[c]
        factor = bus_factor(name, n)
        if factor is None:
            continue
        times = ops.effective_ns[members]
        median = float(np.median(times))
        best = int(times.min())
        algbw = nbytes / (median * 1e-9) / 1e9
        rows.append(
            BandwidthRow(
                collective=name,
                nbytes=nbytes,
                group_size=n,
                count=len(members),
                time_median_ns=median,
                time_min_ns=best,
                algbw_gbps=algbw,
                busbw_gbps=algbw * factor,
                busbw_best_gbps=nbytes / (best * 1e-9) / 1e9 * factor,
                lower_bound=not bool(ops.matched[members].all()) if ops.matched.size else True,
            )
        )
    rows.sort(key=lambda r: (r.collective, r.group_size, r.nbytes))
    return rows


@dataclass(eq=False)
class CollectiveObservation:
    """One (collective, size, group size) from a trace, as `scalelab calibrate` takes a `comm`
    record's row: `nbytes` sized as nccl-tests sizes it, `time_s` the median time."""

    collective: str  # the predictor's name: all_reduce, all_gather, ...
    nbytes: int
    ranks: int
    time_s: float
    count: int
    source: str


def calibration_observations(report: Any) -> list[CollectiveObservation]:
    """Every bandwidth row of every rank of a `TraceReport` whose collective the predictor
    models, one observation each."""
    out = []
    for rank in report.ranks:
        for row in rank.bandwidth:
            name = MODELLED_NAME.get(row.collective)
            if name is None:
                continue
            out.append(
                CollectiveObservation(
                    collective=name,
                    nbytes=row.nbytes,
                    ranks=row.group_size,
                    time_s=row.time_median_ns * 1e-9,
                    count=row.count,
                    source=f"{rank.file} rank {rank.rank}",
                )
            )
    return out
