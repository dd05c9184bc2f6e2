"""The analyser's answer: per-rank, per-step time breakdowns and a summary across ranks.

All times are integer nanoseconds (`*_ns`), so that sums are exact: the steps of a rank plus its
`outside_steps` add up to its `total`, field by field. `to_dict()` gives plain JSON-ready data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from msgspec import Struct, field

from scalelab.trace.classify import COLLECTIVES

if TYPE_CHECKING:
    from scalelab.trace.collectives import BandwidthRow, CommOps
    from scalelab.trace.intervals import IntervalSet
    from scalelab.trace.kernels import KernelReport
    from scalelab.trace.stragglers import StragglerReport

Mode = Literal["gpu", "cpu"]
StepSource = Literal["device", "host", "none"]

# The additive time fields of a Breakdown, in display order.
TIME_FIELDS = (
    "wall_ns",
    "compute_ns",
    "comm_ns",
    "overlap_ns",
    "exposed_comm_ns",
    "copy_only_ns",
    "idle_ns",
)


class CollectiveStats(Struct, frozen=True):
    """One collective (AllReduce, AllGather, ...) in a window.

    `count`: events that start in the window; `total_ns`: length of the union of its events;
    `exposed_ns`: the part of that with no compute running. Collectives that run at the same time
    (on different streams or threads) each count that time, so they can add up to more than the
    window's `comm_ns`.
    """

    count: int
    total_ns: int
    exposed_ns: int

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "total_ns": self.total_ns, "exposed_ns": self.exposed_ns}


class Breakdown(Struct, frozen=True, kw_only=True):
    """Where the time of one window (a step, the whole trace, or the rest) went.

    `compute_ns`, `comm_ns`: lengths of the unions of compute and of communication activity.
    `overlap_ns`: communication while compute runs. `exposed_comm_ns` = comm - overlap: communication
    with no compute running. `copy_only_ns`: memcpy/memset with neither running. `idle_ns`: nothing
    running. compute + exposed_comm + copy_only + idle = wall, exactly.
    """

    wall_ns: int
    compute_ns: int
    comm_ns: int
    overlap_ns: int
    exposed_comm_ns: int
    copy_only_ns: int
    idle_ns: int
    collectives: dict[str, CollectiveStats] = field(default_factory=dict)

    @property
    def overlap_pct(self) -> float | None:
        """Share of communication hidden under compute; None without communication."""
        return 100.0 * self.overlap_ns / self.comm_ns if self.comm_ns else None

    @property
    def exposed_comm_pct_of_wall(self) -> float | None:
        """Share of the window lost to exposed communication; None for an empty window."""
        return 100.0 * self.exposed_comm_ns / self.wall_ns if self.wall_ns else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in TIME_FIELDS}
        out["overlap_pct"] = _round(self.overlap_pct)
        out["exposed_comm_pct_of_wall"] = _round(self.exposed_comm_pct_of_wall)
        out["collectives"] = {name: c.to_dict() for name, c in self.collectives.items()}
        return out

    def as_step(self, step: int, start_ns: int) -> StepBreakdown:
        """The same numbers as the breakdown of profiler step `step` starting at `start_ns`."""
        return StepBreakdown(
            step=step,
            start_ns=start_ns,
            wall_ns=self.wall_ns,
            compute_ns=self.compute_ns,
            comm_ns=self.comm_ns,
            overlap_ns=self.overlap_ns,
            exposed_comm_ns=self.exposed_comm_ns,
            copy_only_ns=self.copy_only_ns,
            idle_ns=self.idle_ns,
            collectives=self.collectives,
        )

    def minus(self, other: Breakdown) -> Breakdown:
        """Field-by-field difference (the time outside all steps is the total minus the steps)."""
        return _add(self, other, -1)

    @staticmethod
    def sum(parts: list[Breakdown]) -> Breakdown:
        """Field-by-field sum."""
        total = _make([0] * len(TIME_FIELDS), {})
        for part in parts:
            total = _add(total, part, 1)
        return total


def _add(a: Breakdown, b: Breakdown, sign: int) -> Breakdown:
    zero = CollectiveStats(0, 0, 0)
    collectives = {}
    for name in sorted(set(a.collectives) | set(b.collectives), key=_collective_order):
        x, y = a.collectives.get(name, zero), b.collectives.get(name, zero)
        combined = CollectiveStats(
            x.count + sign * y.count,
            x.total_ns + sign * y.total_ns,
            x.exposed_ns + sign * y.exposed_ns,
        )
        if combined != zero:
            collectives[name] = combined
    return _make([getattr(a, n) + sign * getattr(b, n) for n in TIME_FIELDS], collectives)


def _make(values: list[int], collectives: dict[str, CollectiveStats]) -> Breakdown:
    wall, compute, comm, overlap, exposed, copy_only, idle = values
    return Breakdown(
        wall_ns=wall,
        compute_ns=compute,
        comm_ns=comm,
        overlap_ns=overlap,
        exposed_comm_ns=exposed,
        copy_only_ns=copy_only,
        idle_ns=idle,
        collectives=collectives,
    )


class StepBreakdown(Breakdown, frozen=True, kw_only=True):
    """One profiler step: `ProfilerStep#<step>`, its window starting at `start_ns`."""

    step: int
    start_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "start_ns": self.start_ns, **super().to_dict()}


class RankIntervals(Struct, eq=False):
    """A rank's activity as interval sets (what plots draw); kept only on request."""

    compute: IntervalSet
    comm: IntervalSet
    exposed_comm: IntervalSet
    first_ns: int
    last_ns: int


class RankReport(Struct, eq=False, kw_only=True):
    """The analysis of one trace file (one rank)."""

    path: str
    rank: int | None
    world_size: int | None
    mode: Mode  # gpu: device kernels; cpu: host (gloo) collectives, see `extract`
    step_source: StepSource  # how step windows were laid: on device activity, host time, or none
    n_events: int
    n_lanes: int  # gpu: device streams with activity; cpu: threads that ran collectives
    total: Breakdown
    steps: list[StepBreakdown]
    outside_steps: Breakdown
    # outside_steps = before_steps + after_steps: device work before the first step's window
    # (on a GPU, mostly kernels of earlier steps still running when the profiler started) and
    # after the last one.
    before_steps: Breakdown = field(default_factory=lambda: Breakdown.sum([]))
    after_steps: Breakdown = field(default_factory=lambda: Breakdown.sum([]))
    # Device events whose launch is not in the trace, starting before the first step.
    launched_before_profiling: int = 0
    # The trace's first start and last end (its clock, integer ns): where it was profiled.
    first_ns: int = 0
    last_ns: int = 0
    notes: list[str] = field(default_factory=list)
    kernels: KernelReport | None = None  # gpu traces: kernel classes, idle causes, launches
    # Collective bandwidth from the trace's own metadata (nccl-tests' definitions).
    bandwidth: list[BandwidthRow] = field(default_factory=list)
    intervals: RankIntervals | None = None
    comm_ops: CommOps | None = None

    @property
    def file(self) -> str:
        return self.path.replace("\\", "/").rsplit("/", 1)[-1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "rank": self.rank,
            "world_size": self.world_size,
            "mode": self.mode,
            "step_source": self.step_source,
            "n_events": self.n_events,
            "n_lanes": self.n_lanes,
            "notes": list(self.notes),
            "total": self.total.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "outside_steps": self.outside_steps.to_dict(),
            "before_steps": self.before_steps.to_dict(),
            "after_steps": self.after_steps.to_dict(),
            "launched_before_profiling": self.launched_before_profiling,
            "kernels": None if self.kernels is None else self.kernels.to_dict(),
            "bandwidth": [b.to_dict() for b in self.bandwidth],
        }


class MetricSummary(Struct, eq=False):
    """One metric across ranks: mean, max, and which trace has the max."""

    mean: float
    max: float
    max_rank: int | None
    max_file: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": round(self.mean, 3),
            "max": round(self.max, 3),
            "max_rank": self.max_rank,
            "max_file": self.max_file,
        }


class Summary(Struct, eq=False, kw_only=True):
    """Across ranks. `basis` says what each rank contributes: its mean per step when every rank
    has steps, else its whole trace. The slowest rank is the one with the largest `wall_ns`: often
    not the cause but a rank that waited; the straggler (the rank whose collectives start last,
    see `stragglers`) is the cause, where ranks could be matched."""

    basis: Literal["mean per step", "whole trace"]
    n_ranks: int
    slowest_rank: int | None
    slowest_file: str
    metrics: dict[str, MetricSummary]
    straggler_rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "basis": self.basis,
            "n_ranks": self.n_ranks,
            "straggler_rank": self.straggler_rank,
            "slowest_rank": self.slowest_rank,
            "slowest_file": self.slowest_file,
            "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
        }


class TraceReport(Struct, eq=False, kw_only=True):
    """What `scalelab.trace.analyze` returns: one RankReport per trace file and a Summary."""

    ranks: list[RankReport]
    summary: Summary
    stragglers: StragglerReport | None = None  # two or more ranks with matched collectives
    # files left out with `skip_bad` (path, why), in the order given; empty otherwise
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        document = {
            "schema": "scalelab.trace/2",
            "units": "nanoseconds (integers) where the name ends in _ns; GB/s = 1e9 bytes/s",
            "ranks": [r.to_dict() for r in self.ranks],
            "summary": self.summary.to_dict(),
            "stragglers": None if self.stragglers is None else self.stragglers.to_dict(),
        }
        if self.skipped:
            document["skipped"] = [{"path": p, "reason": why} for p, why in self.skipped]
        return document

    def model_dump(self) -> dict[str, Any]:
        """The JSON-ready document (`to_dict`), under the name the bench harness stores."""
        return self.to_dict()

    def to_pandas(self, table: str | None = None) -> Any:
        """The report's tables as pandas DataFrames: one table by name (`steps`, `collectives`,
        `stragglers`, `idle`, `kernels`, `bandwidth`), or all of them in a dict (see `frames`)."""
        from scalelab.trace import frames

        return frames.frames(self) if table is None else frames.frame(self, table)


def summarise(ranks: list[RankReport], *, straggler: int | None = None) -> Summary:
    """Mean and max of each time metric across ranks, and the slowest rank."""
    per_step = all(r.steps for r in ranks)
    values: dict[str, list[float]] = {name: [] for name in TIME_FIELDS}
    for r in ranks:
        for name in TIME_FIELDS:
            if per_step:
                values[name].append(sum(getattr(s, name) for s in r.steps) / len(r.steps))
            else:
                values[name].append(float(getattr(r.total, name)))
    metrics = {}
    for name, vals in values.items():
        i = max(range(len(vals)), key=vals.__getitem__)
        metrics[name] = MetricSummary(sum(vals) / len(vals), vals[i], ranks[i].rank, ranks[i].file)
    slowest = max(range(len(ranks)), key=values["wall_ns"].__getitem__)
    return Summary(
        basis="mean per step" if per_step else "whole trace",
        n_ranks=len(ranks),
        slowest_rank=ranks[slowest].rank,
        slowest_file=ranks[slowest].file,
        metrics=metrics,
        straggler_rank=straggler,
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _collective_order(name: str) -> int:
    return COLLECTIVES.index(name) if name in COLLECTIVES else len(COLLECTIVES)
