"""`scalelab trace`: exposed communication, stragglers, idle causes, kernels and collective
bandwidth from PyTorch profiler traces; `scalelab trace diff A B`: what grew between two runs.

A typer verb like every other: it parses the flags, calls `scalelab.trace.analyze` and renders
rich tables (or one JSON document with --json). matplotlib (--plot) and the cluster catalog
(--cluster) are imported only when asked for.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from scalelab.cli.safe import SafeConsole, only_with, safe_print
from scalelab.errors import InputError
from scalelab.trace.kernels import KERNEL_WAIT_NS
from scalelab.trace.report import Breakdown, RankReport, TraceReport

# (not `cli.common`'s: it imports the layout flags' models, which this verb does not need); kernel
# and file names come from traces, so the console shows their control characters escaped.
console = SafeConsole(width=None if sys.stdout.isatty() else 160)
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document and nothing else")]


def print_json(document: Any) -> None:
    """One JSON document on stdout (the report holds no NaN or infinity: refused if it did)."""
    import json

    sys.stdout.write(json.dumps(document, indent=2, allow_nan=False) + "\n")


HELP = "\n\n".join(
    (
        "Compute, communication, overlap and exposed communication per rank and per profiler "
        "step; the straggler of every collective across ranks; idle time by cause; kernels by "
        "class; collective bandwidth from the trace's own metadata.",
        "GPU traces: NCCL/RCCL, symmetric-memory, NVSHMEM and custom all-reduce kernels are "
        "communication, other kernels compute, memcpy/memset neither. CPU (gloo) traces: gloo "
        "collectives are communication, host operators compute. Exposed communication is "
        "communication with no compute running. Tables in ms; --json in integer nanoseconds.",
        "The files of a folder are the ranks of one run, analysed one process per file. "
        "`scalelab trace diff A B` compares two runs (files or folders): per step, what grew.",
    )
)


def register(app: typer.Typer) -> None:
    app.command("trace", help=HELP)(trace)


def trace(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="trace files (.json or .json.gz, one per rank) or folders of them; "
            "`diff A B` compares two runs",
            show_default=False,
            metavar="PATH",
        ),
    ],
    json_out: JsonOpt = False,
    per_step: Annotated[
        bool, typer.Option("--per-step", help="also show every step of every rank")
    ] = False,
    stragglers: Annotated[
        bool,
        typer.Option("--stragglers", help="per rank arrival lag and the straggler of each step"),
    ] = False,
    kernels: Annotated[
        bool,
        typer.Option(
            "--kernels",
            help="kernels by class and annotation, idle time by cause, launch statistics",
        ),
    ] = False,
    bandwidth: Annotated[
        bool,
        typer.Option(
            "--bandwidth",
            help="algorithm and bus bandwidth of each collective (nccl-tests' definitions)",
        ),
    ] = False,
    show_all: Annotated[bool, typer.Option("--all", help="all of the above tables")] = False,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            metavar="NAME",
            help="catalog cluster or YAML: its predicted bus bandwidth beside the measured one",
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="DIR",
            help="write one PNG per rank to DIR (a timeline of one step and the step "
            "breakdown), and stragglers.png across ranks",
        ),
    ] = None,
    plot_step: Annotated[
        int | None,
        typer.Option(
            "--plot-step",
            metavar="N",
            help="with --plot: the step drawn in the timeline (default: a median-length step)",
        ),
    ] = None,
    kernel_wait_ns: Annotated[
        int,
        typer.Option(
            "--kernel-wait-ns",
            help="idle gaps on a stream shorter than this, not waiting for the host, are "
            "'kernel wait' (back-to-back launch overhead); the default is the 30 µs that "
            "Holistic Trace Analysis 0.5 applies to its microsecond data",
        ),
    ] = KERNEL_WAIT_NS,
    skip_bad: Annotated[
        bool,
        typer.Option(
            "--skip-bad",
            help="analyse the readable traces and list the bad ones with their reasons "
            "(default: a bad file fails the whole analysis, exit 2)",
        ),
    ] = False,
    unrelated: Annotated[
        bool,
        typer.Option(
            "--unrelated",
            help="the files are traces of different jobs: analyse each apart, no cross-rank "
            "matching (default: the ranks of one run; files of different runs are refused)",
        ),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", help="processes for a multi-rank run (default: the usable cores)"
        ),
    ] = None,
    parser: Annotated[
        str,
        typer.Option(
            "--parser",
            hidden=True,
            help="auto (the typed decoder where a file fits it) or general (every file read as "
            "plain JSON); for checking one against the other",
        ),
    ] = "auto",
) -> None:
    """Where each rank's time goes, who makes the others wait, and why the GPU sits idle."""
    if paths and str(paths[0]) == "diff" and not os.path.exists("diff"):
        _run_diff(paths[1:], json_out)
        return
    only_with("--plot-step", plot_step is not None, "--plot", plot is not None)
    if plot_step is not None and plot_step < 0:
        raise InputError("--plot-step", f"must be a step number (0 or more), not {plot_step}")
    if kernel_wait_ns < 0:
        raise InputError("--kernel-wait-ns", f"must be 0 or more, not {kernel_wait_ns}")
    if workers is not None and workers < 1:
        raise InputError("--workers", f"must be 1 or more, not {workers}")
    if parser not in ("auto", "general"):
        raise InputError("--parser", f"must be auto or general, not {parser!r}")
    from scalelab.trace import analyze

    report = analyze(
        paths,
        keep_intervals=plot is not None,
        parser="general" if parser == "general" else "auto",
        skip_bad=skip_bad,
        kernels=json_out or kernels or show_all,  # else not shown
        unrelated=unrelated,
        workers=workers,
        kernel_wait_ns=kernel_wait_ns,
    )
    for bad, reason in report.skipped:
        safe_print(f"scalelab trace: skipped {bad}: {reason}", stderr=True)
    if cluster:
        _add_predictions(report, cluster)
    written: list[Path] = []
    if plot is not None:
        from scalelab.trace.plot import plot_report

        written = plot_report(report, plot, step=plot_step)
    if json_out:
        print_json(report.to_dict())
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        return
    every = show_all
    _render(
        report,
        per_step=per_step or every,
        stragglers=stragglers or every,
        kernels=kernels or every,
        bandwidth=bandwidth or every or bool(cluster),
        kernel_wait_ns=kernel_wait_ns,
    )
    for path in written:
        _line(f"wrote {path}")


def _run_diff(paths: list[Path], json_out: bool) -> None:
    if len(paths) != 2:
        raise InputError("diff", f"takes two runs, A and B (files or folders), not {len(paths)}")
    from scalelab.trace import analyze
    from scalelab.trace.diff import diff

    a, b = paths
    result = diff(analyze(a), analyze(b), str(a), str(b))
    if json_out:
        print_json(result.to_dict())
        return
    _line(
        f"A: {result.a_label} ({result.a_steps} rank-steps), mean step {_ms(result.a_step_ns)} ms"
    )
    _line(
        f"B: {result.b_label} ({result.b_steps} rank-steps), mean step {_ms(result.b_step_ns)} ms"
    )
    _line(f"step time B - A: {_signed_ms(result.delta_ns)} ms")
    rows = []
    for r in result.rows:
        share = "—" if not result.delta_ns else f"{100.0 * r.delta_ns / result.delta_ns:+.1f}"
        total = "" if r.total_a_ns is None else f"{_ms(r.total_a_ns)} -> {_ms(r.total_b_ns or 0.0)}"
        rows.append([r.part, _ms(r.a_ns), _ms(r.b_ns), _signed_ms(r.delta_ns), share, total])
    _table(
        "what changed per step, largest first (rows add up to the step-time difference)",
        ["part", "A ms", "B ms", "B - A ms", "% of change", "comm total ms (A -> B)"],
        rows,
        left={0, 5},
    )


# Rendering ----------------------------------------------------------------------------------


def _line(text: str = "") -> None:
    """One line of text as written (no rich markup or highlighting: names hold brackets)."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _table(
    title: str, header: list[str], rows: list[list[str]], left: set[int] | None = None
) -> None:
    left = left if left is not None else {0}
    table = Table(title=title, title_justify="left", highlight=False)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i in left else "right", overflow="fold")
    for row in rows:
        table.add_row(*(_plain(c) for c in row))
    console.print(table)


def _plain(text: str) -> Any:
    from rich.text import Text

    return Text(text)


def _ms(ns: int | float) -> str:
    return f"{ns / 1e6:,.3f}"


def _signed_ms(ns: int | float) -> str:
    return f"{ns / 1e6:+,.3f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _rank(r: RankReport) -> str:
    return "?" if r.rank is None else str(r.rank)


_COLUMNS = ["wall ms", "compute ms", "comm ms", "overlap ms", "exposed ms", "overlap %", "idle ms"]


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


def _render(
    report: TraceReport,
    *,
    per_step: bool,
    stragglers: bool,
    kernels: bool,
    bandwidth: bool,
    kernel_wait_ns: int = KERNEL_WAIT_NS,
) -> None:
    _table(
        "exposed communication per rank (whole trace)",
        ["rank", "file", "kind", "steps", *_COLUMNS],
        [[_rank(r), r.file, r.mode, str(len(r.steps)), *_cells(r.total)] for r in report.ranks],
        left={1, 2},
    )
    coll = [
        [_rank(r), name, f"{c.count:,}", _ms(c.total_ns), _ms(c.exposed_ns)]
        for r in report.ranks
        for name, c in r.total.collectives.items()
    ]
    if coll:
        _table(
            "communication by collective (whole trace)",
            ["rank", "collective", "count", "total ms", "exposed ms"],
            coll,
            left={1},
        )
    if per_step:
        rows = []
        for r in report.ranks:
            for s in r.steps:
                rows.append([_rank(r), str(s.step), *_cells(s)])
            if r.steps and r.before_steps.wall_ns:
                rows.append([_rank(r), "before", *_cells(r.before_steps)])
            if r.steps and r.after_steps.wall_ns:
                rows.append([_rank(r), "after", *_cells(r.after_steps)])
        _table(
            "per step (windows on the device timeline for GPU traces; before/after: outside "
            "every step)",
            ["rank", "step", *_COLUMNS],
            rows,
            left=set(),
        )
    summ = report.summary
    _table(
        f"across {summ.n_ranks} rank(s): {summ.basis}",
        ["metric", "mean ms", "max ms", "max on rank", "file"],
        [
            [
                name.removesuffix("_ns"),
                _ms(m.mean),
                _ms(m.max),
                "?" if m.max_rank is None else str(m.max_rank),
                m.max_file,
            ]
            for name, m in summ.metrics.items()
        ],
        left={0, 4},
    )
    if stragglers:
        _render_stragglers(report)
    if kernels:
        _render_kernels(report, kernel_wait_ns)
    if bandwidth:
        _render_bandwidth(report)
    found = report.stragglers
    if found is not None:
        lag = next(r for r in found.ranks if r.rank == found.straggler)
        _line(
            f"straggler: rank {found.straggler} (starts last at {lag.times_last} of "
            f"{len(found.collectives)} matched collectives; the others waited "
            f"{_ms(lag.caused_ns)} ms for it; matched by {found.match})"
        )
    slowest = "?" if summ.slowest_rank is None else str(summ.slowest_rank)
    _line(
        f"longest steps: rank {slowest} ({summ.slowest_file})"
        + (" — a rank that waits has long steps too; see the straggler" if found else "")
    )
    for r in report.ranks:
        if r.launched_before_profiling:
            _line(
                f"rank {_rank(r)} ({r.file}): {r.launched_before_profiling} device events were "
                f"launched before profiling started ({_ms(r.before_steps.wall_ns)} ms before "
                "the first step, reported apart from the steps)"
            )
        for note in r.notes:
            _line(f"rank {_rank(r)} ({r.file}): {note}")


def _render_stragglers(report: TraceReport) -> None:
    s = report.stragglers
    if s is None:
        _line("stragglers: need two or more ranks' traces with collectives to match")
        _line()
        return
    _table(
        f"arrival lag per rank ({len(s.collectives)} collectives matched by {s.match})",
        ["rank", "collectives", "last at", "mean lag ms", "max lag ms", "waited ms", "caused ms"],
        [
            [
                str(r.rank),
                str(r.collectives),
                str(r.times_last),
                _ms(r.mean_lag_ns),
                _ms(r.max_lag_ns),
                _ms(r.waited_ns),
                _ms(r.caused_ns),
            ]
            for r in s.ranks
        ],
        left=set(),
    )
    if s.steps:
        _table(
            "straggler per step (the rank that made the others wait longest)",
            ["step", "straggler", "caused ms", "all waiting ms", "collectives"],
            [
                [
                    str(p.step),
                    str(p.straggler),
                    _ms(p.caused_ns),
                    _ms(p.wait_ns),
                    str(p.collectives),
                ]
                for p in s.steps
            ],
            left=set(),
        )


def _render_kernels(report: TraceReport, kernel_wait_ns: int) -> None:
    for r in report.ranks:
        k = r.kernels
        if k is None:
            continue
        rows = []
        for c in k.classes:
            for i, top in enumerate(c.top):
                rows.append(
                    [
                        c.kernel_class if i == 0 else "",
                        f"{c.share_pct:.1f}" if i == 0 else "",
                        _ms(c.total_ns) if i == 0 else "",
                        f"{top.count:,}",
                        _ms(top.total_ns),
                        top.name[:70],
                    ]
                )
        _table(
            f"rank {_rank(r)}: kernel time by class (summed durations) and top kernels",
            ["class", "% of device", "class ms", "count", "kernel ms", "kernel"],
            rows,
            left={0, 5},
        )
        if k.annotations:
            _table(
                f"rank {_rank(r)}: by user annotation (device side)",
                [
                    "annotation",
                    "count",
                    "wall ms",
                    "compute ms",
                    "comm ms",
                    "exposed ms",
                    "exposed by",
                ],
                [
                    [
                        a.name[:60],
                        str(a.count),
                        _ms(a.wall_ns),
                        _ms(a.compute_ns),
                        _ms(a.comm_ns),
                        _ms(a.exposed_comm_ns),
                        ", ".join(
                            f"{name} {_ms(v)}" for name, v in a.exposed_by_collective.items()
                        ),
                    ]
                    for a in k.annotations
                ],
                left={0, 6},
            )
        _table(
            f"rank {_rank(r)}: idle time per stream by cause (HTA's definitions; kernel wait: "
            f"gaps under {kernel_wait_ns / 1e3:g} µs not waiting for the host, --kernel-wait-ns)",
            ["stream", "busy ms", "idle ms", "host wait ms", "kernel wait ms", "other ms"],
            [
                [
                    s.stream,
                    _ms(s.busy_ns),
                    _ms(s.idle_ns),
                    _ms(s.host_wait_ns),
                    _ms(s.kernel_wait_ns),
                    _ms(s.other_ns),
                ]
                for s in k.streams
            ],
        )
        la = k.launches
        _line(
            f"rank {_rank(r)}: launches: {la.linked:,} kernels linked to their launch call; "
            f"launch delay median {la.delay_median_ns / 1e3:,.1f} µs, p95 "
            f"{la.delay_p95_ns / 1e3:,.1f} µs, max {la.delay_max_ns / 1e3:,.1f} µs; "
            f"{la.short_kernels:,} kernels shorter than their launch call "
            f"({_ms(la.short_kernel_ns)} ms)"
        )
        _line()


def _render_bandwidth(report: TraceReport) -> None:
    rows = []
    for r in report.ranks:
        for b in r.bandwidth:
            rows.append(
                [
                    _rank(r),
                    b.collective,
                    f"{b.nbytes / 1e6:,.3f}",
                    str(b.group_size),
                    str(b.count),
                    f"{b.time_median_ns / 1e3:,.1f}",
                    f"{b.algbw_gbps:,.2f}",
                    f"{b.busbw_gbps:,.2f}",
                    f"{b.busbw_best_gbps:,.2f}",
                    "—" if b.predicted_busbw_gbps is None else f"{b.predicted_busbw_gbps:,.2f}",
                    "≥ (waits included)" if b.lower_bound else "after last arrival",
                ]
            )
    if not rows:
        _line("bandwidth: no collective carries message size and group size metadata")
        _line()
        return
    _table(
        "collective bandwidth from trace metadata (nccl-tests' algbw and busbw, GB/s = 1e9 B/s)"
        + (
            "; LOWER BOUNDS: a collective's time on one rank includes waiting for its peers"
            if any(b.lower_bound for r in report.ranks for b in r.bandwidth)
            else ""
        ),
        [
            "rank",
            "collective",
            "MB",
            "ranks",
            "count",
            "median µs",
            "algbw",
            "busbw",
            "best busbw",
            "predicted busbw",
            "bound",
        ],
        rows,
        left={1},
    )


def _add_predictions(report: TraceReport, cluster_name: str) -> None:
    """Fill each bandwidth row's `predicted_busbw_gbps` from a cluster profile (groups of
    consecutive ranks assumed: stride 1)."""
    import dataclasses

    import msgspec.structs
    import numpy as np

    from scalelab.config.catalog import load_cluster
    from scalelab.perf import comm
    from scalelab.trace.collectives import MODELLED_NAME

    cluster = load_cluster(cluster_name)
    for i, r in enumerate(report.ranks):
        rows = []
        for b in r.bandwidth:
            name = MODELLED_NAME.get(b.collective)
            if name is None:
                rows.append(b)
                continue
            group = comm.group_shape(np.array([b.group_size]), np.array([1]), cluster)
            busbw = comm.bus_bandwidth_achieved(name, np.array([float(b.nbytes)]), group, cluster)
            rows.append(dataclasses.replace(b, predicted_busbw_gbps=float(busbw[0]) / 1e9))
        report.ranks[i] = msgspec.structs.replace(r, bandwidth=rows)
