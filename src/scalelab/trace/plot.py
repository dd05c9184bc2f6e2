"""Per-rank pictures: a timeline of one step (compute, communication, exposed communication) and
stacked bars of every step's breakdown. matplotlib (Agg) is imported only when plotting."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from scalelab.errors import InputError
from scalelab.trace.intervals import IntervalSet
from scalelab.trace.report import Breakdown, RankReport, TraceReport

_COLORS = {
    "compute": "#4c72b0",
    "communication": "#dd8452",
    "exposed communication": "#c44e52",
    "copy only": "#8c8c8c",
    "idle": "#e5e5e5",
}


def plot_report(report: TraceReport, out_dir: str | Path, *, step: int | None = None) -> list[Path]:
    """Write one PNG per rank into `out_dir`; return their paths.

    The report must come from `analyze(..., keep_intervals=True)`. `step` picks the step drawn in
    the timeline (default: a median-length one; the whole trace when a rank has no steps).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError("--plot", f"cannot create folder {out} ({exc.strerror or exc})") from None
    written = []
    for rank in report.ranks:
        fig, (ax_time, ax_steps) = plt.subplots(
            2, 1, figsize=(11, 6.5), gridspec_kw={"height_ratios": [1, 1.4]}
        )
        title = rank.file if rank.rank is None else f"rank {rank.rank} — {rank.file}"
        fig.suptitle(f"{title} ({rank.mode} trace)")
        _timeline(ax_time, rank, step)
        _step_bars(ax_steps, rank)
        fig.tight_layout()
        path = out / f"{_stem(rank.file)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    straggler_png = plot_stragglers(report, out)
    if straggler_png is not None:
        written.append(straggler_png)
    return written


def plot_stragglers(report: TraceReport, out_dir: str | Path) -> Path | None:
    """stragglers.png: each rank's arrival lag at every matched collective (top) and the time
    the others waited for each rank (bottom); None without matched collectives."""
    s = report.stragglers
    if s is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, (ax_lag, ax_cost) = plt.subplots(
        2, 1, figsize=(11, 6.5), gridspec_kw={"height_ratios": [1.4, 1]}
    )
    ranks = [r.rank for r in s.ranks]
    for rank in ranks:
        xs, ys = [], []
        for i, c in enumerate(s.collectives):
            if rank in c.ranks:
                xs.append(i)
                ys.append(c.lag_ns[c.ranks.index(rank)] / 1e6)
        ax_lag.plot(xs, ys, marker=".", linewidth=0.8, label=f"rank {rank}")
    ax_lag.set_xlabel(f"matched collective (in time order, matched by {s.match})")
    ax_lag.set_ylabel("arrival lag, ms\n(0 = arrived last)")
    ax_lag.set_title(f"stragglers: rank {s.straggler} makes the others wait most")
    if len(ranks) <= 16:
        ax_lag.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    ax_cost.bar(
        [str(r) for r in ranks],
        [r.caused_ns / 1e6 for r in s.ranks],
        color=[_COLORS["exposed communication"] if r == s.straggler else "#8c8c8c" for r in ranks],
    )
    ax_cost.set_xlabel("rank")
    ax_cost.set_ylabel("others' waiting it caused, ms")
    fig.tight_layout()
    path = out / "stragglers.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _stem(file: str) -> str:
    name = re.sub(r"\.json(\.gz)?$", "", file)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "trace"


def _timeline(ax: Any, rank: RankReport, step: int | None) -> None:
    if rank.intervals is None:
        raise ValueError("plotting needs analyze(..., keep_intervals=True)")
    iv = rank.intervals
    if step is not None:
        chosen = [s for s in rank.steps if s.step == step]
        if not chosen:
            have = ", ".join(str(s.step) for s in rank.steps) or "none"
            raise InputError("--plot-step", f"{rank.file} has no step {step} (its steps: {have})")
        lo, hi, label = chosen[0].start_ns, chosen[0].start_ns + chosen[0].wall_ns, f"step {step}"
    elif rank.steps:
        by_length = sorted(rank.steps, key=lambda s: s.wall_ns)
        s = by_length[(len(by_length) - 1) // 2]
        lo, hi, label = s.start_ns, s.start_ns + s.wall_ns, f"step {s.step} (median length)"
    else:
        lo, hi, label = iv.first_ns, iv.last_ns, "whole trace (no profiler steps)"
    lanes = [
        ("compute", iv.compute),
        ("communication", iv.comm),
        ("exposed communication", iv.exposed_comm),
    ]
    for y, (name, intervals) in enumerate(reversed(lanes)):
        part: IntervalSet = intervals.clip(lo, hi)
        bars = [
            ((s - lo) / 1e6, (e - s) / 1e6)
            for s, e in zip(part.starts.tolist(), part.ends.tolist(), strict=True)
        ]
        ax.broken_barh(bars, (y - 0.4, 0.8), color=_COLORS[name], linewidth=0)
    ax.set_yticks(range(len(lanes)), [name for name, _ in reversed(lanes)])
    ax.set_xlim(0, max(hi - lo, 1) / 1e6)
    ax.set_xlabel(f"ms since the start of {label}")
    ax.set_title("timeline")


def _step_bars(ax: Any, rank: RankReport) -> None:
    parts = rank.steps or []
    labels = [str(s.step) for s in parts] or ["whole trace"]
    rows: list[Breakdown] = list(parts) or [rank.total]
    bottom = [0.0] * len(rows)
    for name, attr in (
        ("compute", "compute_ns"),
        ("exposed communication", "exposed_comm_ns"),
        ("copy only", "copy_only_ns"),
        ("idle", "idle_ns"),
    ):
        heights = [getattr(r, attr) / 1e6 for r in rows]
        ax.bar(labels, heights, bottom=bottom, color=_COLORS[name], label=name)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("ms (stacks add up to the step time)")
    ax.set_xlabel("profiler step")
    ax.set_title("step breakdown")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
