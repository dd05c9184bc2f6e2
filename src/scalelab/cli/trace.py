"""`scalelab trace`: exposed communication, stragglers, idle causes, kernels and collective
bandwidth from PyTorch profiler traces; `scalelab trace diff A B`: what grew between two runs.

Parsed with argparse and printed as plain text tables, and dispatched by `scalelab.cli.main`
before typer, pydantic or any other verb is imported (see `_OWN_PARSER` there): the command's
start-up is Python, numpy and the trace package only. matplotlib (--plot) and the cluster
catalog (--cluster) are imported only when asked for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import SimpleNamespace

# `typing` is imported by the decoder (msgspec), after the command has started reading its file:
# not here, before that.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from pathlib import Path
    from typing import Any, NoReturn

    import typer

    from scalelab.trace.report import Breakdown, RankReport, TraceReport

DESCRIPTION = """\
Compute, communication, overlap and exposed communication per rank and per profiler step;
the straggler of every collective across ranks; idle time by cause; kernels by class;
collective bandwidth from the trace's own metadata.

GPU traces: NCCL/RCCL, symmetric-memory, NVSHMEM and custom all-reduce kernels are
communication, other kernels compute, memcpy/memset neither. CPU (gloo) traces: gloo
collectives are communication, host operators compute. Exposed communication is communication
with no compute running. Tables in ms; --json in integer nanoseconds.

`scalelab trace diff A B` compares two runs (files or folders): per step, what grew."""


def _parser_class() -> type[argparse.ArgumentParser]:
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:  # one line, exit 2, like every other verb
            print(f"scalelab: error: {message}", file=sys.stderr)
            raise SystemExit(2)

    return _Parser


def _parser() -> argparse.ArgumentParser:
    import argparse
    from pathlib import Path

    p = _parser_class()(
        prog="scalelab trace",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        type=Path,
        help="trace files (.json or .json.gz, one per rank) or folders of them",
    )
    p.add_argument(
        "--json",
        dest="json_out",
        action="store_true",
        help="print one JSON document and nothing else",
    )
    p.add_argument("--per-step", action="store_true", help="also show every step of every rank")
    p.add_argument(
        "--stragglers",
        action="store_true",
        help="per rank arrival lag and the straggler of each step",
    )
    p.add_argument(
        "--kernels",
        action="store_true",
        help="kernels by class and annotation, idle time by cause, launch statistics",
    )
    p.add_argument(
        "--bandwidth",
        action="store_true",
        help="algorithm and bus bandwidth of each collective (nccl-tests' definitions)",
    )
    p.add_argument("--all", dest="show_all", action="store_true", help="all of the above tables")
    p.add_argument(
        "--cluster",
        metavar="NAME",
        help="catalog cluster or YAML: show its predicted bus bandwidth beside",
    )
    p.add_argument(
        "--plot",
        metavar="DIR",
        type=Path,
        help="write one PNG per rank to DIR (a timeline of one step and the step "
        "breakdown), and stragglers.png across ranks",
    )
    p.add_argument(
        "--plot-step",
        type=int,
        metavar="N",
        help="the step drawn in the timeline (default: a median-length step)",
    )
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="analyse the readable traces and list the bad ones with their reasons (default: "
        "a bad file fails the whole analysis, exit 2)",
    )
    p.add_argument("--parser", choices=("auto", "general"), default="auto", help=argparse.SUPPRESS)
    return p


def _diff_parser() -> argparse.ArgumentParser:
    from pathlib import Path

    p = _parser_class()(
        prog="scalelab trace diff",
        description="What grew between two runs (e.g. 8 and 64 GPUs), per step: compute by "
        "kernel class, each collective's exposed time, copies, idle; ranked by contribution to "
        "the step-time difference, adding up to it.",
    )
    p.add_argument("a", type=Path, metavar="A", help="the first run: a trace file or a folder")
    p.add_argument("b", type=Path, metavar="B", help="the second run: a trace file or a folder")
    p.add_argument(
        "--json",
        dest="json_out",
        action="store_true",
        help="print one JSON document and nothing else",
    )
    return p


def run(args: Sequence[str], *, exits: bool = False) -> int:
    """`scalelab trace ...` (argv after the verb); returns the exit code.

    `exits`: the process ends right after (the console entry point): the parsed traces are not
    freed (`load.keep_parsed`), the process's exit does it at once.
    """
    args = list(args)
    if args and args[0] == "diff" and not os.path.exists("diff"):
        return _run_diff(_diff_parser().parse_args(args[1:]))
    opts = _plain_args(args) or _parser().parse_args(args)
    if _plain_report_only(opts):
        code = _run_plain(opts, exits)
        if code is not None:
            return code
    from scalelab.trace import load

    # A head start on the first file beside the imports of numpy and the analysis: a command
    # (a process of its own, `exits`) reads, decodes and gathers it in a forked child
    # (`background`); otherwise a thread reads and decompresses it (which releases the GIL).
    if exits:
        load.keep_parsed = []
        # numpy's OpenBLAS starts a thread per core when imported, which spin for ~0.1 s of
        # CPU beside the child decoding the file; the analysis does no linear algebra.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if not (exits and opts.parser == "auto" and _start_background(opts.paths)):
        load.prefetch(opts.paths)
    from scalelab.trace import analyze

    report = analyze(
        opts.paths,
        keep_intervals=opts.plot is not None,
        parser=opts.parser,
        skip_bad=opts.skip_bad,
        kernels=opts.json_out or opts.kernels or opts.show_all,  # else not shown
    )
    for bad, reason in report.skipped:
        print(f"scalelab trace: skipped {bad}: {reason}", file=sys.stderr)
    if opts.cluster:
        _add_predictions(report, opts.cluster)
    written: list[Path] = []
    if opts.plot is not None:
        from scalelab.trace.plot import plot_report

        written = plot_report(report, opts.plot, step=opts.plot_step)
    if opts.json_out:
        _print_json(report.to_dict())
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        return 0
    every = opts.show_all
    out = _Out()
    _render(
        out,
        report,
        per_step=opts.per_step or every,
        stragglers=opts.stragglers or every,
        kernels=opts.kernels or every,
        bandwidth=opts.bandwidth or every or bool(opts.cluster),
    )
    for path in written:
        out.line(f"wrote {path}")
    out.flush()
    return 0


def _plain_args(args: list[str]) -> Any:
    """The options of the commonest command, `scalelab trace FILE [--per-step]`, without
    argparse (whose parser costs more to build than reading a small trace); None for anything
    else (argparse parses it, answers --help and reports mistakes)."""
    paths = [a for a in args if a != "--per-step"]  # (str: pathlib is not imported yet)
    if not paths or any(a.startswith("-") or not a for a in args if a != "--per-step"):
        return None
    return SimpleNamespace(
        paths=paths,
        json_out=False,
        per_step="--per-step" in args,
        stragglers=False,
        kernels=False,
        bandwidth=False,
        show_all=False,
        cluster=None,
        plot=None,
        plot_step=None,
        skip_bad=False,
        parser="auto",
    )


def _run_plain(opts: Any, exits: bool) -> int | None:
    """The default table of one GPU trace without numpy (`trace.plain`), for a file small
    enough that this is the faster way; None where it does not apply (the full analysis runs,
    and reports any error as it always does).

    The file is read and decompressed in a thread while the decoder (msgspec) is imported. A
    larger file is left to the full analysis with its bytes: a forked child decodes it while
    the command imports numpy (`background`), which then takes less time than these lists,
    even on a busy machine (two processes get twice the share of its cores)."""
    from scalelab.errors import InputError
    from scalelab.trace import load

    try:
        files = load.trace_files(opts.paths)
    except InputError:
        return None
    if len(files) != 1:
        return None  # several ranks: matched for stragglers by the full analysis
    (path,) = files
    load.prefetch(files)
    if exits:
        _import_msgspec_lean()
    load.typed_parser_available()  # imports the decoder meanwhile
    try:
        data = load.read_bytes(path)
    except InputError:
        return None
    load.remember(path, data)
    if len(data) > load.PLAIN_MAX_BYTES:
        return None  # the numpy analysis, its import beside a child's decoding
    from scalelab.trace import background

    if exits:
        load.keep_parsed = []
    # Where a core is spare, a child decodes the file's second half from now on, while this
    # process imports the plain analysis (~5 ms) and then decodes the first half: as long as the
    # child takes to send its columns. Measured (interleaved runs, 2-core build machine): halves
    # 3-6 % faster than a first part of 40 % (a100-ddp) or 45 % (a100-rank0-of-16), 55 % slower.
    split = (
        background.spare_core()
        and len(data) >= background.SPLIT_MIN_BYTES
        and background.split_start(path, 0.5)
    )
    from scalelab.trace import plain

    try:
        found = plain.report(files, split=split or None)
    except Exception:  # UnsupportedError, or a bad file: the full analysis reports it
        return None
    out = _Out()
    _render(out, found, per_step=opts.per_step, stragglers=False, kernels=False, bandwidth=False)
    out.flush()
    return 0


def _import_msgspec_lean() -> None:
    """Import msgspec without `typing_extensions`, in a command's own process only.

    msgspec reads type hints with typing_extensions where it is installed (for its TypedDict
    and Required on old Pythons), and typing_extensions imports `inspect`: ~9 ms of a ~110 ms
    command on the build machine (a100-ddp's timeline; 17 ms by `-X importtime`). The command
    decodes with its own schema only, which uses none of that, and `typing` answers the same
    for it (the reference tests run every trace through the command). Never in a library call:
    the caller's own msgspec types may need typing_extensions. Where msgspec does need it after
    all, it is imported as usual."""
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import msgspec  # noqa: F401
    except ImportError:  # it needs typing_extensions (or is absent): the usual import decides
        for name in [n for n in sys.modules if n == "msgspec" or n.startswith("msgspec.")]:
            del sys.modules[name]
    finally:
        if sys.modules.get("typing_extensions", 0) is None:
            del sys.modules["typing_extensions"]


def _plain_report_only(opts: argparse.Namespace) -> bool:
    """Whether the command asks for the default table only (`--per-step` included)."""
    return (
        opts.parser == "auto"
        and not opts.json_out
        and not (opts.stragglers or opts.kernels or opts.bandwidth or opts.show_all)
        and opts.cluster is None
        and opts.plot is None
    )


def _start_background(paths: list[Path]) -> bool:
    from scalelab.trace import background

    return background.start(paths)


def _run_diff(opts: argparse.Namespace) -> int:
    from scalelab.trace import analyze
    from scalelab.trace.diff import diff

    result = diff(analyze(opts.a), analyze(opts.b), str(opts.a), str(opts.b))
    if opts.json_out:
        _print_json(result.to_dict())
        return 0
    out = _Out()
    out.line(
        f"A: {result.a_label} ({result.a_steps} rank-steps), mean step {_ms(result.a_step_ns)} ms"
    )
    out.line(
        f"B: {result.b_label} ({result.b_steps} rank-steps), mean step {_ms(result.b_step_ns)} ms"
    )
    out.line(f"step time B - A: {_signed_ms(result.delta_ns)} ms")
    rows = []
    for r in result.rows:
        share = "—" if not result.delta_ns else f"{100.0 * r.delta_ns / result.delta_ns:+.1f}"
        total = "" if r.total_a_ns is None else f"{_ms(r.total_a_ns)} -> {_ms(r.total_b_ns or 0.0)}"
        rows.append([r.part, _ms(r.a_ns), _ms(r.b_ns), _signed_ms(r.delta_ns), share, total])
    out.table(
        "what changed per step, largest first (rows add up to the step-time difference)",
        ["part", "A ms", "B ms", "B - A ms", "% of change", "comm total ms (A -> B)"],
        rows,
        left={0, 5},
    )
    out.flush()
    return 0


def register(app: typer.Typer) -> None:
    """List `trace` in `scalelab --help`; `scalelab.cli.main` runs it before typer is imported,
    this forwards when typer is driven directly (e.g. `scalelab.cli.app` in a test)."""
    import typer

    def trace(ctx: typer.Context) -> None:
        try:
            code = run(ctx.args)
        except SystemExit as exc:
            code = int(exc.code or 0)
        if code:
            raise typer.Exit(code)

    # typer reads the annotations; this module imports typer only here (see the module doc)
    trace.__annotations__ = {"ctx": typer.Context, "return": None}
    app.command(
        "trace",
        help=DESCRIPTION.split("\n\n")[0].replace("\n", " ") + " See `scalelab trace --help`.",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )(trace)


# Rendering ----------------------------------------------------------------------------------


class _Out:
    """Plain text tables, collected and written at once."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def line(self, text: str = "") -> None:
        self.parts.append(text)

    def table(
        self, title: str, header: list[str], rows: list[list[str]], left: set[int] | None = None
    ) -> None:
        left = left if left is not None else {0}
        widths = [len(h) for h in header]
        for row in rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))

        def fmt(cells: list[str]) -> str:
            return "  ".join(
                c.ljust(widths[i]) if i in left else c.rjust(widths[i]) for i, c in enumerate(cells)
            ).rstrip()

        self.parts += [title, fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows), ""]

    def flush(self) -> None:
        sys.stdout.write("\n".join(self.parts) + "\n")
        sys.stdout.flush()


def _print_json(document: dict[str, Any]) -> None:
    import json

    sys.stdout.write(json.dumps(document, indent=2, allow_nan=False) + "\n")


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
    out: _Out,
    report: TraceReport,
    *,
    per_step: bool,
    stragglers: bool,
    kernels: bool,
    bandwidth: bool,
) -> None:
    out.table(
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
        out.table(
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
        out.table(
            "per step (windows on the device timeline for GPU traces; before/after: outside "
            "every step)",
            ["rank", "step", *_COLUMNS],
            rows,
            left=set(),
        )
    summ = report.summary
    out.table(
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
        _render_stragglers(out, report)
    if kernels:
        _render_kernels(out, report)
    if bandwidth:
        _render_bandwidth(out, report)
    found = report.stragglers
    if found is not None:
        lag = next(r for r in found.ranks if r.rank == found.straggler)
        out.line(
            f"straggler: rank {found.straggler} (starts last at {lag.times_last} of "
            f"{len(found.collectives)} matched collectives; the others waited "
            f"{_ms(lag.caused_ns)} ms for it; matched by {found.match})"
        )
    slowest = "?" if summ.slowest_rank is None else str(summ.slowest_rank)
    out.line(
        f"longest steps: rank {slowest} ({summ.slowest_file})"
        + (" — a rank that waits has long steps too; see the straggler" if found else "")
    )
    for r in report.ranks:
        if r.launched_before_profiling:
            out.line(
                f"rank {_rank(r)} ({r.file}): {r.launched_before_profiling} device events were "
                f"launched before profiling started ({_ms(r.before_steps.wall_ns)} ms before "
                "the first step, reported apart from the steps)"
            )
        for note in r.notes:
            out.line(f"rank {_rank(r)} ({r.file}): {note}")


def _render_stragglers(out: _Out, report: TraceReport) -> None:
    s = report.stragglers
    if s is None:
        out.line("stragglers: need two or more ranks' traces with collectives to match")
        out.line()
        return
    out.table(
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
        out.table(
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


def _render_kernels(out: _Out, report: TraceReport) -> None:
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
        out.table(
            f"rank {_rank(r)}: kernel time by class (summed durations) and top kernels",
            ["class", "% of device", "class ms", "count", "kernel ms", "kernel"],
            rows,
            left={0, 5},
        )
        if k.annotations:
            out.table(
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
        out.table(
            f"rank {_rank(r)}: idle time per stream by cause (HTA's definitions)",
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
        out.line(
            f"rank {_rank(r)}: launches: {la.linked:,} kernels linked to their launch call; "
            f"launch delay median {la.delay_median_ns / 1e3:,.1f} µs, p95 "
            f"{la.delay_p95_ns / 1e3:,.1f} µs, max {la.delay_max_ns / 1e3:,.1f} µs; "
            f"{la.short_kernels:,} kernels shorter than their launch call "
            f"({_ms(la.short_kernel_ns)} ms)"
        )
        out.line()


def _render_bandwidth(out: _Out, report: TraceReport) -> None:
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
                ]
            )
    if not rows:
        out.line("bandwidth: no collective carries message size and group size metadata")
        out.line()
        return
    out.table(
        "collective bandwidth from trace metadata (nccl-tests' algbw and busbw, GB/s = 1e9 B/s)",
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
