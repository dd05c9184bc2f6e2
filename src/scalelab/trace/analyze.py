"""The facade: `analyze(paths) -> TraceReport`, composing load -> extract -> steps -> measure.

One analysis path. A multi-rank run is analysed as Holistic Trace Analysis does it: one process
per rank file, from a pool made for the call and closed at its end (`concurrent.futures` with
`spawn`: fresh interpreters, never a fork of the caller, nothing kept between calls). A worker
parses one file, measures it and sends back only its report (small next to the parsed events), so
memory holds a few files at a time whatever the number of ranks. One file is analysed in the
caller's own process.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import multiprocessing
import os
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec.structs
import numpy as np

from scalelab.errors import InputError
from scalelab.trace.classify import COLLECTIVES
from scalelab.trace.collectives import CommOps, bandwidth_rows
from scalelab.trace.extract import NeedsGeneralParserError, Timeline, extract
from scalelab.trace.intervals import Int64Array, IntervalSet, distinct
from scalelab.trace.kernels import KERNEL_WAIT_NS, kernel_report
from scalelab.trace.load import Parser, find_trace_files, read_trace
from scalelab.trace.report import (
    Breakdown,
    CollectiveStats,
    RankIntervals,
    RankReport,
    TraceReport,
    summarise,
)
from scalelab.trace.steps import StepWindows, step_windows
from scalelab.trace.stragglers import StragglerReport, find_stragglers


def analyze(
    paths: str | Path | Iterable[str | Path],
    *,
    keep_intervals: bool = False,
    parser: Parser = "auto",
    skip_bad: bool = False,
    workers: int | None = None,
    kernels: bool = True,
    unrelated: bool = False,
    kernel_wait_ns: int = KERNEL_WAIT_NS,
) -> TraceReport:
    """Analyse trace files (one per rank) or folders of them.

    Raises `InputError` (one line naming the file and what is wrong) for anything unreadable: by
    default a bad file fails the whole analysis (every file is tried, so the line says how many
    are bad). `skip_bad=True` analyses the good files and lists the bad ones with their reasons
    in `TraceReport.skipped`; it still fails when no file is good.
    The files are taken as the ranks of one run: two files of the same rank, or ranks of
    different runs (another world size, or profiled windows that do not overlap in time) are
    refused, naming the files. `unrelated=True` analyses each file on its own instead (no
    cross-rank matching): a folder of traces from different jobs.
    `keep_intervals=True` keeps each rank's compute/communication interval sets on the report
    (`RankReport.intervals`), which plotting needs; off by default to keep reports small.
    `parser="general"` skips the typed decoder (see `load.read_trace`); results are the same.
    `workers`: processes for a multi-rank run (default: the cores this process may use).
    `kernels=False` leaves out each rank's kernel report (`RankReport.kernels` is None: kernel
    classes, idle causes, launch statistics), for callers that do not show it.
    `kernel_wait_ns`: the idle-cause threshold (`kernels.KERNEL_WAIT_NS`).
    """
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files = find_trace_files(items)
    ranks: list[RankReport] = []
    bad: list[tuple[Path, InputError]] = []
    for f, result in zip(
        files,
        _each_file(files, workers, keep_intervals, parser, kernels, kernel_wait_ns),
        strict=True,
    ):
        if isinstance(result, InputError):
            bad.append((f, result))
        else:
            ranks.append(result)
    if bad and (not skip_bad or not ranks):
        first = bad[0][1]
        more = (
            f" (and {len(bad) - 1} more bad file{'s' if len(bad) > 2 else ''} of {len(files)}: "
            + ", ".join(p.name for p, _ in bad[1:4])
            + (", ..." if len(bad) > 4 else "")
            + ")"
            if len(bad) > 1
            else ""
        )
        hint = f"; --skip-bad analyses the {len(ranks)} good one(s)" if ranks else ""
        raise InputError(first.field, f"{first.message}{more}{hint}")
    ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.path))
    if not unrelated:
        _refuse_mixed_runs(ranks)
    stragglers = None if unrelated else _stragglers(ranks)
    if (
        stragglers is not None
    ):  # waits are now known: bandwidth from the time after the last arrival
        ranks = [
            msgspec.structs.replace(r, bandwidth=bandwidth_rows(r.comm_ops))
            if r.comm_ops is not None
            else r
            for r in ranks
        ]
    return TraceReport(
        ranks=ranks,
        summary=summarise(ranks, straggler=None if stragglers is None else stragglers.straggler),
        stragglers=stragglers,
        skipped=[(str(p), str(exc).removeprefix(f"{p}: ")) for p, exc in bad],
    )


def _each_file(
    files: list[Path],
    workers: int | None,
    keep_intervals: bool,
    parser: Parser,
    kernels: bool,
    kernel_wait_ns: int,
) -> Iterator[RankReport | InputError]:
    """Each file's report (or why it is bad), in order: in this process for one file or one
    worker, else from a process pool made for this call."""
    options: dict[str, Any] = {
        "keep_intervals": keep_intervals,
        "parser": parser,
        "kernels": kernels,
        "kernel_wait_ns": kernel_wait_ns,
    }
    n = min(len(files), workers if workers is not None else _usable_cores())
    if n <= 1:
        yield from (_analyze_or_error(f, **options) for f in files)
        return
    # `spawn`: each worker a fresh interpreter (never a fork of a caller that may hold threads or
    # locks), and nothing left running once the call returns.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n, mp_context=context) as pool:
        with _main_script_not_rerun():  # the workers start with the first submission
            results = pool.map(functools.partial(_from_worker, **options), files, chunksize=1)
        for result in results:
            yield InputError(*result) if isinstance(result, _Bad) else result


@contextlib.contextmanager
def _main_script_not_rerun() -> Iterator[None]:
    """Workers started while this holds do not run the caller's script again.

    A `spawn` or `forkserver` worker imports the parent's `__main__` from its file, which runs a
    script's top-level code (its own call of `analyze` included) unless it is guarded by `if
    __name__ == "__main__"`. The workers run only this module's functions, so they need none of
    it: its file and spec are hidden from the start method for as long as the workers start,
    and a script or notebook cell may call `analyze` at top level as it would call any function."""
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if hasattr(main, k)}
    try:
        if "__file__" in saved:
            del main.__file__  # type: ignore[union-attr]
        if "__spec__" in saved:
            main.__spec__ = None  # type: ignore[union-attr]
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _analyze_or_error(
    path: Path, *, keep_intervals: bool, parser: Parser, kernels: bool, kernel_wait_ns: int
) -> RankReport | InputError:
    """The file's report, or the InputError that says why it is bad (returned, not raised, so
    that one bad file does not stop the others; `_Bad` carries it out of a worker)."""
    try:
        return analyze_file(
            path,
            keep_intervals=keep_intervals,
            parser=parser,
            kernels=kernels,
            kernel_wait_ns=kernel_wait_ns,
        )
    except InputError as exc:
        return exc


class _Bad(tuple):  # type: ignore[type-arg]
    """An InputError's (field, message), as a worker sends it back: an exception whose
    constructor takes other arguments than its `args` does not survive pickling."""


def _from_worker(path: Path, **options: Any) -> RankReport | _Bad:
    result = _analyze_or_error(path, **options)
    return _Bad((result.field, result.message)) if isinstance(result, InputError) else result


def _refuse_mixed_runs(ranks: list[RankReport]) -> None:
    """One line naming the files where the traces cannot be the ranks of one run."""
    if len(ranks) < 2:
        return
    by_rank: dict[int, RankReport] = {}
    for r in ranks:
        if r.rank is None:
            continue
        if r.rank in by_rank:
            raise InputError(
                "PATH",
                f"{by_rank[r.rank].path} and {r.path} are both rank {r.rank}: give one trace per "
                "rank of one run (or --unrelated to analyse traces of different jobs apart)",
            )
        by_rank[r.rank] = r
    sizes = {r.world_size: r for r in ranks if r.world_size is not None}
    if len(sizes) > 1:
        (a, ra), (b, rb) = list(sizes.items())[:2]
        raise InputError(
            "PATH",
            f"{ra.path} (world size {a}) and {rb.path} (world size {b}) come from different "
            "runs: give the ranks of one run (or --unrelated to analyse them apart)",
        )
    spans = [(r.first_ns, r.last_ns, r) for r in ranks if r.last_ns > r.first_ns]
    if len(spans) > 1:
        late = max(spans, key=lambda s: s[0])
        early = min(spans, key=lambda s: s[1])
        if early[1] < late[0]:
            gap_s = (late[0] - early[1]) / 1e9
            raise InputError(
                "PATH",
                f"{early[2].path} ends {_duration(gap_s)} before {late[2].path} starts: their "
                "profiled windows do not overlap, so they are not ranks of one run profiled "
                "together (or --unrelated to analyse them apart)",
            )


def _duration(seconds: float) -> str:
    if seconds >= 86_400:
        return f"{seconds / 86_400:,.1f} days"
    if seconds >= 1:
        return f"{seconds:,.1f} s"
    return f"{seconds * 1e3:,.3f} ms"


def _stragglers(ranks: list[RankReport]) -> StragglerReport | None:
    """Cross-rank matching, for ranks that say who they are (one trace per rank)."""
    known = [r for r in ranks if r.rank is not None and r.comm_ops is not None]
    ids = [r.rank for r in known]
    if len(known) < 2 or len(set(ids)) != len(ids):
        return None
    ops = {int(r.rank): r.comm_ops for r in known if r.rank is not None and r.comm_ops}
    steps = {
        int(r.rank): (
            np.asarray([s.step for s in r.steps], dtype=np.int64),
            np.asarray([s.start_ns for s in r.steps], dtype=np.int64),
        )
        for r in known
        if r.rank is not None
    }
    return find_stragglers(ops, steps)


def analyze_file(
    path: str | Path,
    *,
    keep_intervals: bool = False,
    parser: Parser = "auto",
    kernels: bool = True,
    kernel_wait_ns: int = KERNEL_WAIT_NS,
) -> RankReport:
    """Analyse one trace file (`kernels`, `kernel_wait_ns`: see `analyze`)."""
    # A parsed trace is millions of small objects made in one go; the cyclic garbage collector
    # would rescan them again and again while they are made (3-4x slower), and they hold no
    # cycles, so it is paused while the file is parsed and its events are extracted.
    paused = gc.isenabled()
    gc.disable()
    try:
        timeline, rank, world_size = _read(Path(path), parser)
    finally:
        if paused:
            gc.enable()
    windows = step_windows(timeline)
    sets = _Sets.of(timeline)

    starts = [timeline.activity_start_ns, windows.start_ns]
    ends = [timeline.activity_end_ns, windows.end_ns]
    first = min(int(a.min()) for a in starts if a.size)
    last = max(int(a.max()) for a in ends if a.size)
    # Every window measured at once: the whole trace, before and after the steps, each step.
    lo, hi = [first], [last]
    if windows.numbers.size:
        first_step, last_step = int(windows.start_ns[0]), int(windows.end_ns[-1])
        lo += [first, max(last_step, first)]
        hi += [min(first_step, last), last]
    head = len(lo)
    measured = _measure(
        sets,
        np.concatenate([np.asarray(lo, dtype=np.int64), windows.start_ns]),
        np.concatenate([np.asarray(hi, dtype=np.int64), windows.end_ns]),
        count_all_first=True,
    )
    total = measured[0]
    before, after = measured[1:3] if head == 3 else (Breakdown.sum([]), Breakdown.sum([]))
    steps = [
        b.as_step(int(n), int(s))
        for n, s, b in zip(windows.numbers, windows.start_ns, measured[head:], strict=True)
    ]
    comm_ops = CommOps.of(timeline)
    return RankReport(
        path=str(path),
        rank=rank,
        world_size=world_size,
        mode=timeline.mode,
        step_source=windows.source,
        n_events=timeline.n_events,
        n_lanes=timeline.n_lanes,
        first_ns=first,
        last_ns=last,
        total=total,
        steps=steps,
        outside_steps=total.minus(Breakdown.sum(list(steps))),
        before_steps=before,
        after_steps=after,
        launched_before_profiling=_launched_before_profiling(timeline, windows),
        kernels=kernel_report(
            timeline,
            sets.compute,
            sets.comm,
            windows.numbers,
            windows.start_ns,
            windows.end_ns,
            [(name, exposed) for name, _, exposed, _ in sets.collectives],
            exposed=sets.exposed,
            kernel_wait_ns=kernel_wait_ns,
        )
        if kernels
        else None,
        bandwidth=bandwidth_rows(comm_ops),
        comm_ops=comm_ops,
        notes=list(timeline.notes),
        intervals=(
            RankIntervals(
                compute=sets.compute,
                comm=sets.comm,
                exposed_comm=sets.exposed,
                first_ns=first,
                last_ns=last,
            )
            if keep_intervals
            else None
        ),
    )


def _read(path: Path, parser: Parser) -> tuple[Timeline, int | None, int | None]:
    """Parse and extract one file: its timeline, rank and world size."""
    raw = read_trace(path, parser=parser)
    try:
        timeline = extract(raw)
    except NeedsGeneralParserError:
        raw = read_trace(path, parser="general")
        timeline = extract(raw)
    return timeline, raw.rank, raw.world_size


def _launched_before_profiling(timeline: Timeline, windows: StepWindows) -> int:
    """Device events whose launch call is not in the trace (the host launched them before the
    profiler started) and that start before the first step: work of earlier steps."""
    device = timeline.device
    if device is None or windows.numbers.size == 0:
        return 0
    unlinked = device.launch_start_ns < 0
    if unlinked.all():  # a trace without launch links at all says nothing about this
        return 0
    return int((unlinked & (timeline.activity_start_ns < windows.start_ns[0])).sum())


@dataclass(eq=False)
class _Sets:
    """The interval sets every window is measured against: unions only. Within any window,
    |A and B| = |A| + |B| - |A or B| and |A - B| = |A or B| - |B|, exactly (integers), so overlap,
    exposed communication and copy-only time need no intersection or difference of their own
    (no intersection or difference per window)."""

    compute: IntervalSet
    comm: IntervalSet
    compute_or_comm: IntervalSet
    busy: IntervalSet  # compute, communication or a copy
    # Per collective present: name, its union, its exposed part, its events' sorted start times.
    collectives: list[tuple[str, IntervalSet, IntervalSet, Int64Array]]

    @classmethod
    def of(cls, t: Timeline) -> _Sets:
        collectives = []
        for code in distinct(t.comm_collective).tolist():
            mine = t.comm_collective == code
            union = IntervalSet.union_of(t.comm_start_ns[mine], t.comm_end_ns[mine])
            collectives.append(
                (
                    COLLECTIVES[code],
                    union,
                    union.difference(t.compute),
                    np.sort(t.comm_start_ns[mine]),
                )
            )
        compute_or_comm = t.compute.union(t.comm)
        return cls(
            compute=t.compute,
            comm=t.comm,
            compute_or_comm=compute_or_comm,
            busy=compute_or_comm.union(t.copy),
            collectives=collectives,
        )

    @functools.cached_property
    def exposed(self) -> IntervalSet:
        """Communication with no compute running, as a set (the kernel report, plots)."""
        return self.comm.difference(self.compute)


def _measure(
    sets: _Sets, lo: Int64Array, hi: Int64Array, *, count_all_first: bool = False
) -> list[Breakdown]:
    """Breakdowns of many windows [lo, hi) at once (counts: events starting in the window;
    `count_all_first`: every event in the first, the whole trace)."""
    wall = hi - lo
    compute = sets.compute.covered_in(lo, hi)
    comm = sets.comm.covered_in(lo, hi)
    compute_or_comm = sets.compute_or_comm.covered_in(lo, hi)
    busy = sets.busy.covered_in(lo, hi)
    overlap = compute + comm - compute_or_comm
    copy_only = busy - compute_or_comm
    per_collective = []
    for name, union, exposed, starts in sets.collectives:
        count = np.searchsorted(starts, hi, side="left") - np.searchsorted(starts, lo, side="left")
        if count_all_first and count.size:
            count[0] = starts.size
        per_collective.append((name, count, union.covered_in(lo, hi), exposed.covered_in(lo, hi)))
    out = []
    for i in range(lo.size):
        collectives = {
            name: CollectiveStats(int(count[i]), int(total[i]), int(exposed[i]))
            for name, count, total, exposed in per_collective
            if count[i] or total[i]
        }
        out.append(
            Breakdown(
                wall_ns=int(wall[i]),
                compute_ns=int(compute[i]),
                comm_ns=int(comm[i]),
                overlap_ns=int(overlap[i]),
                exposed_comm_ns=int(comm[i] - overlap[i]),
                copy_only_ns=int(copy_only[i]),
                idle_ns=int(wall[i] - busy[i]),
                collectives=collectives,
            )
        )
    return out
