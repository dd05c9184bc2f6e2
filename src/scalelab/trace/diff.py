"""`scalelab trace diff A B`: what grew between two runs (e.g. 8 and 64 GPUs), per step.

Each run is summarised as its mean profiler step (over all its ranks and steps; the whole trace
where a rank has no steps). A step's time splits exactly into compute + exposed communication +
copy only + idle (`Breakdown`), so the difference in step time splits exactly into the
differences of those parts. Each part is broken down further:

* compute by kernel class (GEMM, attention, element-wise, other): each class gets the share of
  the step's compute time that its summed kernel time has (kernels of several streams overlap,
  so the shares, not the sums, add up to the compute time);
* exposed communication by collective, in the same way (each collective's exposed time, scaled
  so that they add up to the step's exposed communication).

The rows therefore add up to the step-time difference, and are ranked by the size of their
contribution. Each collective's total (not only exposed) time is shown beside, for context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scalelab.trace.report import RankReport, StepBreakdown, TraceReport


@dataclass(eq=False)
class DiffRow:
    part: str  # "compute: GEMM", "exposed comm: AllGather", "copy only", "idle"
    a_ns: float
    b_ns: float
    total_a_ns: float | None = None  # collectives: their whole time (hidden + exposed)
    total_b_ns: float | None = None

    @property
    def delta_ns(self) -> float:
        return self.b_ns - self.a_ns

    def to_dict(self, wall_delta: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "part": self.part,
            "a_ns": round(self.a_ns, 1),
            "b_ns": round(self.b_ns, 1),
            "delta_ns": round(self.delta_ns, 1),
            "share_of_step_delta_pct": round(100.0 * self.delta_ns / wall_delta, 2)
            if wall_delta
            else None,
        }
        if self.total_a_ns is not None:
            out["comm_total_a_ns"] = round(self.total_a_ns, 1)
            out["comm_total_b_ns"] = round(self.total_b_ns or 0.0, 1)
        return out


@dataclass(eq=False)
class TraceDiff:
    a_label: str
    b_label: str
    a_steps: int  # (rank, step) pairs averaged
    b_steps: int
    a_step_ns: float
    b_step_ns: float
    rows: list[DiffRow]  # ranked by |delta|, largest first; they add up to b_step - a_step

    @property
    def delta_ns(self) -> float:
        return self.b_step_ns - self.a_step_ns

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "scalelab.trace-diff/1",
            "units": "nanoseconds per step (mean over ranks and steps)",
            "a": {
                "label": self.a_label,
                "steps": self.a_steps,
                "step_ns": round(self.a_step_ns, 1),
            },
            "b": {
                "label": self.b_label,
                "steps": self.b_steps,
                "step_ns": round(self.b_step_ns, 1),
            },
            "step_delta_ns": round(self.delta_ns, 1),
            "rows": [r.to_dict(self.delta_ns) for r in self.rows],
        }


def _mean_step(report: TraceReport) -> tuple[int, dict[str, float], dict[str, float]]:
    """(samples, additive parts, collective totals) of the mean step of a run."""
    parts: dict[str, float] = {}
    totals: dict[str, float] = {}
    n = 0
    for rank in report.ranks:
        samples: list[tuple[StepBreakdown | Any, dict[str, int] | None]] = []
        if rank.steps:
            by_step = rank.kernels.compute_class_ns_by_step if rank.kernels else {}
            samples = [(s, by_step.get(s.step)) for s in rank.steps]
        else:
            samples = [(rank.total, _whole_trace_classes(rank))]
        for b, classes in samples:
            n += 1
            _add(parts, "wall", b.wall_ns)
            _split(parts, "compute", b.compute_ns, classes)
            exposed = {k: v.exposed_ns for k, v in b.collectives.items()}
            _split(parts, "exposed comm", b.exposed_comm_ns, exposed)
            _add(parts, "copy only", b.copy_only_ns)
            _add(parts, "idle", b.idle_ns)
            for k, v in b.collectives.items():
                _add(totals, f"exposed comm: {k}", v.total_ns)
    if n == 0:
        return 0, {}, {}
    return (
        n,
        {k: v / n for k, v in parts.items()},
        {k: v / n for k, v in totals.items()},
    )


def _whole_trace_classes(rank: RankReport) -> dict[str, int] | None:
    if rank.kernels is None:
        return None
    out: dict[str, int] = {}
    for per in rank.kernels.compute_class_ns_by_step.values():
        for k, v in per.items():
            out[k] = out.get(k, 0) + v
    return out or None


def _add(d: dict[str, float], key: str, value: float) -> None:
    d[key] = d.get(key, 0.0) + value


def _split(d: dict[str, float], head: str, amount: int, weights: dict[str, int] | None) -> None:
    """Add `amount` under `head: part`, split in proportion to `weights` (or unsplit)."""
    total = sum(weights.values()) if weights else 0
    if not weights or total <= 0:
        if amount:
            _add(d, head, amount)
        return
    for k, w in weights.items():
        if w:
            _add(d, f"{head}: {k}", amount * w / total)


def diff(a: TraceReport, b: TraceReport, a_label: str = "A", b_label: str = "B") -> TraceDiff:
    """Compare the mean steps of two runs (see the module doc)."""
    na, pa, ta = _mean_step(a)
    nb, pb, tb = _mean_step(b)
    keys = sorted((set(pa) | set(pb)) - {"wall"})
    rows = []
    for k in keys:
        is_collective = k.startswith("exposed comm: ")
        rows.append(
            DiffRow(
                k,
                pa.get(k, 0.0),
                pb.get(k, 0.0),
                ta.get(k, 0.0) if is_collective else None,
                tb.get(k, 0.0) if is_collective else None,
            )
        )
    rows.sort(key=lambda r: (-abs(r.delta_ns), r.part))
    return TraceDiff(a_label, b_label, na, nb, pa.get("wall", 0.0), pb.get("wall", 0.0), rows)
