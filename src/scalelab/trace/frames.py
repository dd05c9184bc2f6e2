"""A trace report's tables as pandas DataFrames, for notebooks (`TraceReport.to_pandas`).

One row per thing, integer nanoseconds as in `--json` (columns end in `_ns`), ranks and files as
columns so that frames of many ranks filter and group as usual. pandas is imported here only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scalelab.trace.report import TIME_FIELDS

if TYPE_CHECKING:
    import pandas as pd

    from scalelab.trace.report import TraceReport

TABLES = ("steps", "collectives", "stragglers", "idle", "kernels", "bandwidth")


def frames(report: TraceReport) -> dict[str, pd.DataFrame]:
    """Every table, by name (`TABLES`)."""
    return {name: frame(report, name) for name in TABLES}


def frame(report: TraceReport, table: str) -> pd.DataFrame:
    """One table: `steps` (per rank and profiler step: the breakdown), `collectives` (per rank,
    step and collective; step None: the whole trace), `stragglers` (per rank: arrival lag, time
    waited and caused), `idle` (per rank and stream: idle time by cause), `kernels` (per rank,
    kernel class and top kernel), `bandwidth` (per rank, collective and message size)."""
    import pandas as pd

    if table not in TABLES:
        from scalelab.errors import InputError

        raise InputError("table", f"must be one of {', '.join(TABLES)}, not {table!r}")
    rows: list[dict[str, Any]] = list(_ROWS[table](report))
    return pd.DataFrame(rows, columns=_COLUMNS[table])


def _steps(report: TraceReport) -> Any:
    for r in report.ranks:
        for s in r.steps:
            yield {
                "rank": r.rank,
                "file": r.file,
                "step": s.step,
                "start_ns": s.start_ns,
                **{f: getattr(s, f) for f in TIME_FIELDS},
                "overlap_pct": s.overlap_pct,
            }


def _collectives(report: TraceReport) -> Any:
    for r in report.ranks:
        windows = [(None, r.total), *((s.step, s) for s in r.steps)]
        for step, b in windows:
            for name, c in b.collectives.items():
                yield {
                    "rank": r.rank,
                    "file": r.file,
                    "step": step,
                    "collective": name,
                    "count": c.count,
                    "total_ns": c.total_ns,
                    "exposed_ns": c.exposed_ns,
                }


def _stragglers(report: TraceReport) -> Any:
    s = report.stragglers
    if s is None:
        return
    for lag in s.ranks:
        yield {**lag.to_dict(), "straggler": lag.rank == s.straggler}


def _idle(report: TraceReport) -> Any:
    for r in report.ranks:
        if r.kernels is None:
            continue
        for s in r.kernels.streams:
            yield {"rank": r.rank, "file": r.file, **s.to_dict()}


def _kernels(report: TraceReport) -> Any:
    for r in report.ranks:
        if r.kernels is None:
            continue
        for c in r.kernels.classes:
            for k in c.top:
                yield {
                    "rank": r.rank,
                    "file": r.file,
                    "class": c.kernel_class,
                    "class_share_pct": c.share_pct,
                    "class_total_ns": c.total_ns,
                    "kernel": k.name,
                    "count": k.count,
                    "total_ns": k.total_ns,
                }


def _bandwidth(report: TraceReport) -> Any:
    for r in report.ranks:
        for b in r.bandwidth:
            yield {"rank": r.rank, "file": r.file, **b.to_dict()}


_ROWS = {
    "steps": _steps,
    "collectives": _collectives,
    "stragglers": _stragglers,
    "idle": _idle,
    "kernels": _kernels,
    "bandwidth": _bandwidth,
}
_COLUMNS = {
    "steps": ["rank", "file", "step", "start_ns", *TIME_FIELDS, "overlap_pct"],
    "collectives": ["rank", "file", "step", "collective", "count", "total_ns", "exposed_ns"],
    "stragglers": [
        "rank",
        "collectives",
        "times_last",
        "mean_lag_ns",
        "max_lag_ns",
        "waited_ns",
        "caused_ns",
        "straggler",
    ],
    "idle": [
        "rank",
        "file",
        "stream",
        "busy_ns",
        "idle_ns",
        "host_wait_ns",
        "kernel_wait_ns",
        "other_ns",
    ],
    "kernels": [
        "rank",
        "file",
        "class",
        "class_share_pct",
        "class_total_ns",
        "kernel",
        "count",
        "total_ns",
    ],
    "bandwidth": [
        "rank",
        "file",
        "collective",
        "bytes",
        "group_size",
        "count",
        "time_median_ns",
        "time_min_ns",
        "algbw_gbps",
        "busbw_gbps",
        "busbw_best_gbps",
        "predicted_busbw_gbps",
        "lower_bound",
    ],
}
