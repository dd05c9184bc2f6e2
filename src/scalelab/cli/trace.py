"""`scalelab trace`: exposed communication and the step breakdown from PyTorch profiler traces."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from scalelab.cli.common import JsonOpt, console, err_console, print_json
from scalelab.trace import analyze
from scalelab.trace.report import Breakdown, RankReport, TraceReport

PathsArg = Annotated[
    list[Path],
    typer.Argument(
        help="trace files (.json or .json.gz, one per rank) or folders of them",
        show_default=False,
        metavar="PATH",
    ),
]
PerStepOpt = Annotated[bool, typer.Option("--per-step", help="also show every step of every rank")]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        metavar="DIR",
        help="write one PNG per rank to DIR: a timeline of one step and the step breakdown",
    ),
]
PlotStepOpt = Annotated[
    int | None,
    typer.Option(
        "--plot-step", help="the step drawn in the timeline (default: a median-length step)"
    ),
]


def register(app: typer.Typer) -> None:
    app.command("trace")(trace)


def trace(
    paths: PathsArg,
    json_out: JsonOpt = False,
    per_step: PerStepOpt = False,
    plot: PlotOpt = None,
    plot_step: PlotStepOpt = None,
) -> None:
    """Compute, communication, overlap and exposed communication per rank and per profiler step.

    GPU traces: NCCL/RCCL kernels are communication, other kernels compute, memcpy/memset neither.
    CPU (gloo) traces: gloo collectives are communication, host operators compute.

    Exposed communication is communication with no compute running. Tables in ms; --json in integer ns.
    """
    report = analyze(paths, keep_intervals=plot is not None)
    written: list[Path] = []
    if plot is not None:
        from scalelab.trace.plot import plot_report

        written = plot_report(report, plot, step=plot_step)
    if json_out:
        print_json(report.to_dict())
        for path in written:
            err_console.print(f"wrote {path}")
        return
    _render(report, per_step=per_step)
    for path in written:
        console.print(f"wrote {path}")


def _ms(ns: int | float) -> str:
    return f"{ns / 1e6:,.3f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _rank(r: RankReport) -> str:
    return "?" if r.rank is None else str(r.rank)


_COLUMNS = ("wall ms", "compute ms", "comm ms", "overlap ms", "exposed ms", "overlap %", "idle ms")


def _cells(b: Breakdown) -> list[str]:
    return [
        _ms(b.wall_ns),
        _ms(b.compute_ns),
        _ms(b.comm_ns),
        _ms(b.overlap_ns),
        _ms(b.exposed_comm_ns),
        _pct(b.overlap_pct),
        _ms(b.idle_ns),
    ]


def _render(report: TraceReport, *, per_step: bool) -> None:
    table = Table(title="exposed communication per rank (whole trace)")
    for col in ("rank", "file", "kind", "steps", *_COLUMNS):
        table.add_column(col, justify="left" if col in ("file", "kind") else "right")
    for r in report.ranks:
        table.add_row(_rank(r), r.file, r.mode, str(len(r.steps)), *_cells(r.total))
    console.print(table)

    coll = Table(title="communication by collective (whole trace)")
    for col in ("rank", "collective", "count", "total ms", "exposed ms"):
        coll.add_column(col, justify="left" if col == "collective" else "right")
    for r in report.ranks:
        for name, c in r.total.collectives.items():
            coll.add_row(_rank(r), name, f"{c.count:,}", _ms(c.total_ns), _ms(c.exposed_ns))
    if coll.row_count:
        console.print(coll)

    if per_step:
        steps = Table(title="per step (windows on the device timeline for GPU traces)")
        for col in ("rank", "step", *_COLUMNS):
            steps.add_column(col, justify="right")
        for r in report.ranks:
            for s in r.steps:
                steps.add_row(_rank(r), str(s.step), *_cells(s))
            if r.steps and r.outside_steps.wall_ns:
                steps.add_row(_rank(r), "outside", *_cells(r.outside_steps))
        console.print(steps)

    summ = report.summary
    summary = Table(title=f"across {summ.n_ranks} rank(s): {summ.basis}")
    for col in ("metric", "mean ms", "max ms", "max on rank", "file"):
        summary.add_column(col, justify="left" if col in ("metric", "file") else "right")
    for name, m in summ.metrics.items():
        summary.add_row(
            name.removesuffix("_us"),
            _ms(m.mean),
            _ms(m.max),
            "?" if m.max_rank is None else str(m.max_rank),
            m.max_file,
        )
    console.print(summary)
    slowest = "?" if summ.slowest_rank is None else str(summ.slowest_rank)
    console.print(f"slowest rank: {slowest} ({summ.slowest_file})")
    for r in report.ranks:
        for note in r.notes:
            console.print(f"[dim]rank {_rank(r)} ({r.file}): {note}[/dim]")
