"""Turn a parsed trace into columnar numpy arrays of the activity the analysis needs.

`gather` sorts out device activity, launch calls, profiler steps and collective annotations in one
pass over the events and pulls their fields out as lists, with C-level iteration (CPU traces take a
second pass for host operators); everything after that is numpy.
Timestamps become integer nanoseconds (start = round(ts * 1000), end = start + round(dur * 1000)):
traces write microseconds with up to three decimals (recent PyTorch and ROCm write nanosecond
resolution), so nothing is lost, and integer arithmetic keeps every later sum exact.

Two kinds of trace come out of it:

* **gpu** (the trace has kernels, memcpys or memsets): compute = kernels that are not NCCL/RCCL,
  communication = NCCL/RCCL kernels, copy = memcpy/memset, across all devices and streams.
* **cpu** (no device events, e.g. gloo): communication = the collectives executed on the host
  (`gloo:*` events on gloo's worker threads); compute = host operators (`cpu_op`) on the other
  threads, minus the time those threads spend inside collective calls (`c10d::*`,
  `_c10d_functional::*` enqueues and waits), which are communication, not compute.

A trace whose host launched work on a GPU (CUDA/ROCm launch calls) but that holds no device
event (its device events stripped, or the profiler's GPU activities off) is refused: read as a
CPU trace it would give host time as if it were the GPU's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from scalelab.errors import InputError
from scalelab.trace import classify
from scalelab.trace.intervals import Int64Array, IntervalSet
from scalelab.trace.load import RawTrace

if TYPE_CHECKING:
    from numpy.typing import NDArray

Mode = Literal["gpu", "cpu"]


@dataclass(eq=False)
class Timeline:
    """The classified activity of one trace (one rank), ready for interval arithmetic."""

    mode: Mode
    compute: IntervalSet
    comm: IntervalSet
    copy: IntervalSet
    # Every communication event: its start, end and collective (an index into classify.COLLECTIVES).
    comm_start_ns: Int64Array
    comm_end_ns: Int64Array
    comm_collective: NDArray[np.int16]
    # Every analysed event (gpu: device events; cpu: compute and collective events), for step windows.
    activity_start_ns: Int64Array
    activity_end_ns: Int64Array
    # gpu: host time of the launch call of each device event (NaN where the trace does not link it).
    activity_launch_ts: NDArray[np.float64]
    # Host `ProfilerStep#N` annotations: numbers and [start, end) in integer nanoseconds.
    step_numbers: Int64Array
    step_start_ns: Int64Array
    step_end_ns: Int64Array
    n_events: int
    n_lanes: int  # gpu: device streams with activity; cpu: threads that ran collectives
    notes: tuple[str, ...] = ()
    device: DeviceDetail | None = None  # gpu traces only
    comm_detail: CommDetail | None = None


@dataclass(eq=False)
class DeviceDetail:
    """gpu traces: what each device event is (rows as `activity_*`: kernels, then copies)."""

    kind: NDArray[np.int8]  # classify.COMPUTE / COMM / COPY
    name_id: NDArray[np.int32]  # index into `names`
    names: tuple[str, ...]
    lane: Int64Array  # dense stream index, 0 .. len(lane_labels) - 1
    lane_labels: tuple[str, ...]  # "device/stream" as the trace names them
    launch_start_ns: Int64Array  # the launch call's [start, end); -1 where none is linked
    launch_end_ns: Int64Array
    # Device-side user annotations (`gpu_user_annotation`): spans and their names.
    annotation_start_ns: Int64Array
    annotation_end_ns: Int64Array
    annotation_names: tuple[str, ...]


@dataclass(eq=False)
class CommDetail:
    """Metadata of every communication event (rows as `comm_*`), where the trace carries it:
    record_param_comms / NCCL kernel args (`Process Group Name`, `Seq`, `In/Out msg nelems`,
    `dtype`, `Group size`). Unknown: "" and -1."""

    group: tuple[str, ...]
    seq: Int64Array
    nbytes: Int64Array  # nccl-tests' size: the larger of the input and output message
    group_size: Int64Array
    dtype: tuple[str, ...]

    @classmethod
    def unknown(cls, n: int) -> CommDetail:
        minus = np.full(n, -1, dtype=np.int64)
        return cls(("",) * n, minus, minus.copy(), minus.copy(), ("",) * n)

    @classmethod
    def of(cls, args: list[Any]) -> CommDetail:
        return cls.of_rows([comm_meta(a) for a in args])

    @classmethod
    def of_rows(cls, rows: list[tuple[str, int, int, int, str]]) -> CommDetail:
        return cls(
            tuple(r[0] for r in rows),
            np.asarray([r[1] for r in rows], dtype=np.int64).reshape(-1),
            np.asarray([r[2] for r in rows], dtype=np.int64).reshape(-1),
            np.asarray([r[3] for r in rows], dtype=np.int64).reshape(-1),
            tuple(r[4] for r in rows),
        )


# Sorting the events and reading their fields ------------------------------------------------------------

NAMED_PREFIXES = (
    classify.PROFILER_STEP_PREFIX,
    *classify.HOST_COLLECTIVE_PREFIXES,
    *classify.CPU_COLLECTIVE_PREFIXES,
)

# A numeric column: its values, and whether some event lacked the field (then the values hold
# NaN there, and the column is converted leniently, as always).
Numbers = tuple[list[Any], bool]


@dataclass(eq=False)
class Columns:
    """A GPU trace's fields, as plain lists (rows of `device` are kernels, then copies)."""

    path: str
    typed: bool
    n_events: int
    steps: list[tuple[Any, Any, Any]]  # (name, ts, dur) of host ProfilerStep#N annotations
    host_colls: list[tuple[Any, Any, Any, str]]  # (tid, ts, dur, name) of nccl:* annotations
    n_kernels: int
    kernel_names: list[Any]
    copy_names: list[Any]
    device_ts: Numbers
    device_dur: Numbers
    device_corr: list[Any]
    device_pid: list[Any]
    device_tid: list[Any]
    runtime_ts: Numbers
    runtime_dur: Numbers
    runtime_corr: list[Any]
    runtime_tid: list[Any]
    annotation_ts: Numbers
    annotation_dur: Numbers
    annotation_names: list[Any]
    # Communication kernels (kernel rows whose name is communication, ascending): their
    # `Collective name` arg and their metadata (group, seq, bytes, group size, dtype).
    comm_rows: list[int]
    comm_labels: list[str | None]
    comm_meta: list[tuple[str, int, int, int, str]]
    # A trace of a device type the analyser does not model: the InputError's message.
    refusal: str | None


@dataclass(eq=False)
class CpuTrace:
    """A trace without device events: its events as dicts and its named host events."""

    raw: RawTrace
    n_events: int  # in the file (the typed path's dicts are its 'X' events only)
    steps: list[tuple[Any, Any, Any]]
    cpu_colls: list[tuple[Any, Any, Any, Any, str]]
    step_lanes: set[tuple[Any, Any]]


def gather(raw: RawTrace) -> Columns | CpuTrace:
    """Bucket the events and read their fields (see the module doc); raises what reading a
    malformed event raises (AttributeError, TypeError, ValueError, KeyError), as `extract`
    always did."""
    events = raw.events
    n_events = len(events)
    gpu_annotation = classify.GPU_ANNOTATION_CATEGORY
    get: Callable[..., Callable[[Any], Any]]
    kernels, copies, runtime, annotations, named = buckets(events, raw.typed)
    if not kernels and not copies:
        _refuse_stripped_device_events(raw.path, runtime, raw.typed)
    if raw.typed:
        from scalelab.trace import schema

        if not kernels and not copies:  # a CPU trace: its host events, as dicts
            raw = RawTrace(
                raw.path,
                [schema.as_dict(ev) for ev in events if ev.__class__ is schema.Event],
                raw.metadata,
            )
            events = raw.events
            named = [ev for ev in events if ev.get("name", "").startswith(NAMED_PREFIXES)]
        else:
            named = [schema.host_dict(ev) for ev in named]
        get = attrgetter
    else:
        get = itemgetter

    named = [ev for ev in named if ev.get("ph") == "X"]
    steps = [
        (ev["name"], ev["ts"], ev.get("dur", 0))
        for ev in named
        if ev["name"].startswith(classify.PROFILER_STEP_PREFIX) and ev.get("cat") != gpu_annotation
    ]
    host_colls = [
        (ev.get("tid"), ev["ts"], ev.get("dur", 0), ev["name"])
        for ev in named
        if ev["name"].startswith(classify.HOST_COLLECTIVE_PREFIXES)
        and ev.get("cat") != gpu_annotation
    ]
    cpu_colls = [
        (ev.get("pid"), ev.get("tid"), ev["ts"], ev.get("dur", 0), ev["name"])
        for ev in named
        if ev["name"].startswith(classify.CPU_COLLECTIVE_PREFIXES)
    ]
    if not kernels and not copies:
        step_lanes = {
            (ev.get("pid"), ev.get("tid"))
            for ev in named
            if ev["name"].startswith(classify.PROFILER_STEP_PREFIX)
        }
        return CpuTrace(raw, n_events, steps, cpu_colls, step_lanes)

    device = kernels + copies  # kernels first: row i < len(kernels) is a kernel
    device_ts = numbers(device, "ts", get)
    device_dur = numbers(device, "dur", get)
    kernel_names = column(kernels, "name", "", get)
    copy_names = column(copies, "name", "", get)
    # Communication kernels, classified once per distinct name (as `extract` classifies them).
    comm_of = {
        n: classify.is_comm_kernel(str(n) if n is not None else "")
        for n in dict.fromkeys(kernel_names)
    }
    comm_rows = list(compress(range(len(kernels)), map(comm_of.__getitem__, kernel_names)))
    comm_args = [field(kernels[i], "args") for i in comm_rows]
    return Columns(
        path=str(raw.path),
        typed=raw.typed,
        n_events=n_events,
        steps=steps,
        host_colls=host_colls,
        n_kernels=len(kernels),
        kernel_names=kernel_names,
        copy_names=copy_names,
        device_ts=device_ts,
        device_dur=device_dur,
        device_corr=correlations(device, get),
        device_pid=column(device, "pid", None, get),
        device_tid=column(device, "tid", None, get),
        runtime_ts=numbers(runtime, "ts", get),
        runtime_dur=numbers(runtime, "dur", get),
        runtime_corr=correlations(runtime, get),
        runtime_tid=column(runtime, "tid", None, get),
        annotation_ts=numbers(annotations, "ts", get),
        annotation_dur=numbers(annotations, "dur", get),
        annotation_names=column(annotations, "name", "", get),
        comm_rows=comm_rows,
        comm_labels=[collective_arg(a) for a in comm_args],
        comm_meta=[comm_meta(a) for a in comm_args],
        refusal=None if runtime else unmodelled_device(raw),
    )


def buckets(
    events: list[Any], typed: bool
) -> tuple[list[Any], list[Any], list[Any], list[Any], list[Any]]:
    """Sort events into kernels, copies, launch calls, device annotations and named host events
    (profiler steps, host collectives): one Python pass with a dict lookup per event (measured
    faster than numpy over category codes plus gathers, and than several C-level passes), then
    a C-level name test on the rest.

    Kineto writes device events and launch calls as complete 'X' events only, so the category
    alone decides; named events are those of other categories whose name starts with a prefix.
    """
    found: list[list[Any]] = [[], [], [], [], [], []]
    appends = [b.append for b in found]
    # category -> its bucket's append (one lookup and a call per event, no index)
    append_to = {cat: appends[code] for cat, code in _CATEGORY_CODE.items()}.get
    other = appends[0]
    if typed:
        for ev in events:
            append_to(ev.cat, other)(ev)
    else:
        for ev in events:
            append_to(ev.get("cat"), other)(ev)
    others = found[0]
    if typed:
        names: list[Any] = list(map(attrgetter("name"), others))
    else:
        names = list(map(dict.get, others, repeat("name")))
    try:  # str.startswith at C level: no slices or Python frames per name
        flags = list(map(str.startswith, names, repeat(NAMED_PREFIXES)))
    except TypeError:  # a name that is not a string (None, a number): the slow way
        flags = [n.__class__ is str and n.startswith(NAMED_PREFIXES) for n in names]
    return found[1], found[2], found[3], found[4], list(compress(others, flags))


_CATEGORY_CODE: dict[Any, int] = {
    **dict.fromkeys(classify.KERNEL_CATEGORIES, 1),
    **dict.fromkeys(classify.COPY_CATEGORIES, 2),
    **dict.fromkeys(classify.RUNTIME_CATEGORIES, 3),
    classify.GPU_ANNOTATION_CATEGORY: 4,
    # Flow and instant events, never a profiler step or a collective annotation: skipped (5).
    **dict.fromkeys(("ac2g", "async_cpu_to_gpu", "cpu_instant_event", "fwdbwd", "Trace"), 5),
    "\0skipped": 5,  # schema.SKIPPED_CATEGORY: events of phases the typed decoder skips
}


# Field access works on both kinds of event: dicts (general parser) and typed structs (fast path).
# The column helpers take `get` = itemgetter or attrgetter and run at C level; a dict that lacks a
# key falls back to a per-event `.get`.


def field(ev: Any, key: str) -> Any:
    return ev.get(key) if isinstance(ev, dict) else getattr(ev, key, None)


def column(
    events: list[Any], key: str, default: Any, get: Callable[..., Callable[[Any], Any]]
) -> list[Any]:
    """One field of every event; the C-level fast path unless some event lacks it."""
    try:
        return list(map(get(key), events))
    except KeyError:
        return [ev.get(key, default) for ev in events]


def numbers(events: list[Any], key: str, get: Callable[..., Callable[[Any], Any]]) -> Numbers:
    """A numeric field of every event, and whether some event lacked it (NaN there); a required
    `ts` raises KeyError if absent."""
    try:
        return list(map(get(key), events)), False
    except KeyError:
        if key == "ts":
            raise
        return [ev.get(key, math.nan) for ev in events], True


def correlations(events: list[Any], get: Callable[..., Callable[[Any], Any]]) -> list[Any]:
    """`args.correlation` of every event, None where there is none (not yet checked)."""
    try:
        return list(map(get("correlation"), map(get("args"), events)))
    except (KeyError, TypeError, AttributeError):
        values = []
        for ev in events:
            args = field(ev, "args")
            values.append(field(args, "correlation") if args is not None else None)
        return values


def collective_arg(args: Any) -> str | None:
    """The `Collective name` arg (recent PyTorch writes it on NCCL kernels)."""
    label = (
        args.get("Collective name")
        if isinstance(args, dict)
        else getattr(args, "collective_name", None)
    )
    return label if isinstance(label, str) else None


# Bytes per element of PyTorch's dtype names as record_param_comms writes them.
DTYPE_BYTES: dict[str, int] = {
    "Double": 8,
    "Float": 4,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
}


def int_or(value: Any, default: int = -1) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return default


NO_META = ("", -1, -1, -1, "")


def comm_meta(args: Any) -> tuple[str, int, int, int, str]:
    """(group, seq, bytes, group size, dtype) from one event's args (dict or typed)."""
    if args is None:
        return "", -1, -1, -1, ""
    if isinstance(args, dict):
        values = [
            args.get(k)
            for k in ("Process Group Name", "Seq", "In msg nelems", "Out msg nelems", "Group size")
        ]
        dtype = args.get("dtype")
    else:
        values = [args.pg_name, args.seq, args.in_nelems, args.out_nelems, args.group_size]
        dtype = args.dtype
    group, seq, n_in, n_out, size = values
    if group is None and seq is None and n_in is None and n_out is None and size is None:
        return NO_META
    dtype = dtype if isinstance(dtype, str) else ""
    elements = max(int_or(n_in), int_or(n_out))
    width = DTYPE_BYTES.get(dtype, 0)
    nbytes = elements * width if elements >= 0 and width else -1
    return (str(group) if group is not None else "", int_or(seq), nbytes, int_or(size), dtype)


# Kineto categories of device types the analyser does not model (their kernels, copies and
# launch calls are not CUDA's or ROCm's, so compute and communication cannot be told apart).
_UNMODELLED_DEVICE_CATEGORIES = {
    "mtia_runtime": "MTIA",
    "mtia_ccp_events": "MTIA",
    "mtia_insight": "MTIA",
    "xpu_runtime": "XPU",
    "xpu_driver": "XPU",
    "hpu_op": "HPU",
    "hpu_runtime": "HPU",
    "privateuse1_runtime": "a PrivateUse1 device",
    "privateuse1_driver": "a PrivateUse1 device",
}


def unmodelled_device(raw: RawTrace) -> str | None:
    """What is wrong with a trace of a device type the analyser does not model, which must not
    be read as a CPU trace (asked only of traces without CUDA/ROCm kernels or launch calls)."""
    seen = {field(ev, "cat") for ev in raw.events}
    for cat, device in _UNMODELLED_DEVICE_CATEGORIES.items():
        if cat in seen:
            return (
                f"a trace of {device} devices ('{cat}' events): scalelab trace models CUDA and "
                "ROCm GPU traces and CPU (gloo) traces only"
            )
    return None


def _refuse_stripped_device_events(path: Any, runtime: list[Any], typed: bool) -> None:
    """A trace whose host launched kernels (CUDA/ROCm launch calls) but that holds no kernel,
    copy or set: its device events were stripped or never recorded. Read as a CPU trace it
    would report host operators as the GPU's compute, so it is refused."""
    names = [ev.name if typed else ev.get("name") for ev in runtime]
    launches = sum(1 for n in names if isinstance(n, str) and "launch" in n.lower())
    if launches:
        raise InputError(
            f"{path}: traceEvents",
            f"{launches:,} GPU launch calls (cudaLaunchKernel/hipLaunchKernel...) but no kernel, "
            "memcpy or memset event: a GPU trace without its device events cannot be analysed "
            "(profile with ProfilerActivity.CUDA, and keep the file whole)",
        )


def refuse(path: Any, refusal: str | None) -> None:
    if refusal is not None:
        raise InputError(f"{path}: traceEvents", refusal)


class NeedsGeneralParserError(Exception):
    """The typed fast-path events cannot express this trace (a CPU trace, or fields of unexpected
    types): re-read it with `read_trace(path, parser="general")`."""


def extract(raw: RawTrace) -> Timeline:
    """Classify the events of one parsed trace; an InputError if it has no activity, and
    NeedsGeneralParserError if typed events do not suffice (see there)."""
    try:
        return _extract(raw)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        if isinstance(exc, InputError):
            raise
        if raw.typed:
            raise NeedsGeneralParserError(str(exc)) from None
        raise _locate_bad_event(raw, exc) from None


def _extract(raw: RawTrace) -> Timeline:
    found = gather(raw)
    if isinstance(found, Columns):
        return _gpu_timeline(found)
    step_numbers, step_start, step_end = _steps(found.steps)
    raw = found.raw
    refuse(raw.path, unmodelled_device(raw))
    return _cpu_timeline(
        raw, found.n_events, found.cpu_colls, found.step_lanes, step_numbers, step_start, step_end
    )


def _gpu_timeline(c: Columns) -> Timeline:
    """The numpy half of a GPU trace's extraction, from its columns."""
    step_numbers, step_start, step_end = _steps(c.steps)
    refuse(c.path, c.refusal)
    n_device = len(c.kernel_names) + len(c.copy_names)
    start, end = _ns_times(_floats(c.device_ts, c.typed), _floats(c.device_dur, c.typed))
    names, copy_names = c.kernel_names, c.copy_names
    # Distinct names, kernels' first, in order of appearance (dict.fromkeys: at C level).
    kernel_names = dict.fromkeys(names)
    name_index = {n: i for i, n in enumerate({**kernel_names, **dict.fromkeys(copy_names)})}
    name_id = np.fromiter(map(name_index.__getitem__, names + copy_names), np.int32, n_device)
    distinct = [str(n) if n is not None else "" for n in name_index]
    kind = np.full(n_device, classify.COPY, dtype=np.int8)
    kind[: c.n_kernels] = classify.COMPUTE
    comm_idx = np.asarray(c.comm_rows, dtype=np.int64).reshape(-1)
    kind[comm_idx] = classify.COMM

    rt_ts = _floats(c.runtime_ts, c.typed)
    launch_ts, launch_row = _launch_calls(_ints(c.device_corr), _ints(c.runtime_corr), rt_ts)
    linked = launch_row >= 0
    launch_start = np.full(n_device, -1, dtype=np.int64)
    launch_end = launch_start.copy()
    if linked.any():
        rt_start, rt_end = _ns_times(rt_ts, _floats(c.runtime_dur, c.typed))
        launch_start[linked] = rt_start[launch_row[linked]]
        launch_end[linked] = rt_end[launch_row[linked]]
    lane, lane_labels = _lanes(c.device_pid, c.device_tid)
    ann_start, ann_end = _ns_times(
        _floats(c.annotation_ts, c.typed), _floats(c.annotation_dur, c.typed)
    )
    runtime_tid = c.runtime_tid
    comm_tids = [runtime_tid[r] if r >= 0 else None for r in launch_row[comm_idx].tolist()]
    collectives = np.asarray(
        classify.collective_codes(
            [str(names[i]) for i in c.comm_rows],
            c.comm_labels,
            launch_ts[comm_idx].tolist(),
            comm_tids,
            classify.host_collective_spans(c.host_colls, lambda v: float(v or 0)),
        ),
        dtype=np.int16,
    )
    is_compute = kind == classify.COMPUTE
    is_copy = kind == classify.COPY
    notes: list[str] = []
    if comm_idx.size == 0:
        notes.append("no NCCL/RCCL communication kernels: communication is zero")
    return Timeline(
        mode="gpu",
        compute=IntervalSet.union_of(start[is_compute], end[is_compute]),
        comm=IntervalSet.union_of(start[comm_idx], end[comm_idx]),
        copy=IntervalSet.union_of(start[is_copy], end[is_copy]),
        comm_start_ns=start[comm_idx],
        comm_end_ns=end[comm_idx],
        comm_collective=collectives,
        activity_start_ns=start,
        activity_end_ns=end,
        activity_launch_ts=launch_ts,
        step_numbers=step_numbers,
        step_start_ns=step_start,
        step_end_ns=step_end,
        n_events=c.n_events,
        n_lanes=len(lane_labels),
        notes=tuple(notes),
        device=DeviceDetail(
            kind=kind,
            name_id=name_id,
            names=tuple(distinct),
            lane=lane,
            lane_labels=lane_labels,
            launch_start_ns=launch_start,
            launch_end_ns=launch_end,
            annotation_start_ns=ann_start,
            annotation_end_ns=ann_end,
            annotation_names=tuple(str(n) for n in c.annotation_names),
        ),
        comm_detail=CommDetail.of_rows(c.comm_meta),
    )


def _floats(column: Numbers, typed: bool) -> NDArray[np.float64]:
    """A numeric column as float64 (NaN where absent)."""
    values, lenient = column
    if lenient:  # some event lacks the field: NaN there
        return np.asarray(values, dtype=np.float64)
    if not typed and bool in set(map(type, values)):  # parsed JSON: true would read as 1
        raise ValueError("a number is true or false")
    return np.fromiter(values, np.float64, len(values))


def _ints(values: list[Any]) -> Int64Array:
    """Correlation ids as int64, -1 where absent or not an integer."""
    try:
        return np.fromiter(values, np.int64, len(values))
    except (TypeError, ValueError, OverflowError):
        return np.asarray(
            [v if isinstance(v, int) and not isinstance(v, bool) else -1 for v in values],
            dtype=np.int64,
        )


def _lanes(pids: list[Any], tids: list[Any]) -> tuple[Int64Array, tuple[str, ...]]:
    """Each device event's (device, stream) lane as a dense index, and the lanes' labels: Kineto
    writes a device event's pid = device, tid = stream."""
    try:
        pid = np.fromiter(pids, np.int64, len(pids))
        tid = np.fromiter(tids, np.int64, len(tids))
    except (TypeError, ValueError, OverflowError):
        index: dict[Any, int] = {}
        keys = list(zip(pids, tids, strict=True))
        lane = np.fromiter((index.setdefault(k, len(index)) for k in keys), np.int64, len(keys))
        return lane, tuple(f"{p}/{t}" for p, t in index)
    if pid.size and (pid.min() < 0 or pid.max() >= 2**31 or tid.min() < 0 or tid.max() >= 2**32):
        key = pid * 1_000_003 + tid  # odd ids: still one number per lane for practical values
    else:
        key = (pid << 32) | tid
    _, first, lane = np.unique(key, return_index=True, return_inverse=True)
    labels = tuple(
        f"{p}/{t}" for p, t in zip(pid[first].tolist(), tid[first].tolist(), strict=True)
    )
    return lane.reshape(-1).astype(np.int64), labels


def _cpu_timeline(
    raw: RawTrace,
    n_events: int,
    cpu_colls: list[tuple[Any, Any, Any, Any, str]],
    step_lanes: set[tuple[Any, Any]],
    step_numbers: Int64Array,
    step_start: Int64Array,
    step_end: Int64Array,
) -> Timeline:
    """A trace without device events: collectives and compute are host-side (see module doc)."""
    cpu_op_categories = classify.CPU_OP_CATEGORIES
    ops = [
        (ev.get("pid"), ev.get("tid"), ev["ts"], ev.get("dur", 0), ev.get("name", ""))
        for ev in raw.events
        if ev.get("ph") == "X" and ev.get("cat") in cpu_op_categories
    ]
    if not ops and not cpu_colls and step_numbers.size == 0:
        raise InputError(
            f"{raw.path}: traceEvents",
            "empty trace: no device activity, host operators, collectives or profiler steps",
        )
    # Collectives run on gloo's worker threads, whose own operators (packing, averaging) are part
    # of the collective. A thread that drives training (its pid's main thread, or the one with the
    # profiler steps) is never such a worker, even if a collective shows up on it: there, only the
    # collective's own span is taken out of compute.
    drivers = step_lanes | {(pid, pid) for pid, _, _, _, _ in ops}
    coll_lanes = {(pid, tid) for pid, tid, _, _, _ in cpu_colls} - drivers
    host_ops = [op for op in ops if (op[0], op[1]) not in coll_lanes]
    is_comm_op = np.fromiter(
        (classify.is_cpu_comm_op(op[4]) for op in host_ops), dtype=bool, count=len(host_ops)
    )
    op_start, op_end = _ns_times([op[2] for op in host_ops], [op[3] for op in host_ops])
    coll_start, coll_end = _ns_times([c[2] for c in cpu_colls], [c[3] for c in cpu_colls])
    on_driver = np.fromiter(
        ((c[0], c[1]) not in coll_lanes for c in cpu_colls), dtype=bool, count=len(cpu_colls)
    )
    not_compute = IntervalSet.union_of(
        np.concatenate([op_start[is_comm_op], coll_start[on_driver]]),
        np.concatenate([op_end[is_comm_op], coll_end[on_driver]]),
    )
    compute = IntervalSet.union_of(op_start[~is_comm_op], op_end[~is_comm_op]).difference(
        not_compute
    )
    index = _COLLECTIVE_INDEX
    labels, detail = _cpu_collective_labels(raw, cpu_colls)
    collectives = np.asarray(
        [
            index[classify.collective_from_label(label) or classify.OTHER]
            for label in (labels[i] or c[4] for i, c in enumerate(cpu_colls))
        ],
        dtype=np.int16,
    ).reshape(-1)
    notes = [
        "cpu trace: communication = host collectives (gloo:*) on "
        f"{len(coll_lanes)} worker thread(s); compute = host operators on the other threads "
        "outside collective calls and waits"
    ]
    if not cpu_colls:
        notes.append("no host collectives (gloo:*): communication is zero")
    return Timeline(
        mode="cpu",
        compute=compute,
        comm=IntervalSet.union_of(coll_start, coll_end),
        copy=IntervalSet.empty(),
        comm_start_ns=coll_start,
        comm_end_ns=coll_end,
        comm_collective=collectives,
        activity_start_ns=np.concatenate([op_start, coll_start]),
        activity_end_ns=np.concatenate([op_end, coll_end]),
        activity_launch_ts=np.full(op_start.size + coll_start.size, np.nan),
        step_numbers=step_numbers,
        step_start_ns=step_start,
        step_end_ns=step_end,
        n_events=n_events,
        n_lanes=len(coll_lanes),
        notes=tuple(notes),
        comm_detail=detail,
    )


def _cpu_collective_labels(
    raw: RawTrace, cpu_colls: list[tuple[Any, Any, Any, Any, str]]
) -> tuple[list[str | None], CommDetail]:
    """What each host collective really is, and its metadata.

    gloo runs some collectives as others: FSDP2's reduce-scatter executes as `gloo:all_reduce`. The
    call that enqueued it says what it is: `record_param_comms` (its `Collective name` and message
    metadata) where the trace has them, else the `c10d::` operator (`c10d::_reduce_scatter_base_`).
    The k-th enqueue is matched with the k-th execution when both counts agree (gloo runs a process
    group's collectives in order); else each execution takes the latest enqueue before it.
    """
    n = len(cpu_colls)
    if n == 0:
        return [], CommDetail.unknown(0)
    rpc: list[tuple[float, str, Any]] = []
    c10d: list[tuple[float, str, Any]] = []
    for ev in raw.events:
        name = ev.get("name")
        if ev.get("ph") != "X" or name.__class__ is not str:
            continue
        if name == "record_param_comms":
            args = ev.get("args") or {}
            label = args.get("Collective name") if isinstance(args, dict) else None
            if isinstance(label, str) and classify.collective_from_label(label) is not None:
                rpc.append((float(ev["ts"]), label, args))
        elif name.startswith("c10d::") and classify.collective_from_label(name) is not None:
            c10d.append((float(ev["ts"]), name, None))
    source = sorted(rpc or c10d, key=lambda r: r[0])
    if not source:
        return [None] * n, CommDetail.unknown(n)
    order = sorted(range(n), key=lambda i: float(cpu_colls[i][2]))
    chosen: list[tuple[float, str, Any] | None] = [None] * n
    if len(source) == n:
        for i, src in zip(order, source, strict=True):
            chosen[i] = src
    else:
        starts = [r[0] for r in source]
        for i in order:
            k = int(np.searchsorted(starts, float(cpu_colls[i][2]), side="right")) - 1
            chosen[i] = source[k] if k >= 0 else None
    labels = [c[1] if c is not None else None for c in chosen]
    return labels, CommDetail.of([c[2] if c is not None else None for c in chosen])


_COLLECTIVE_INDEX: dict[str, int] = classify.COLLECTIVE_INDEX


# Timestamps and durations beyond 2^53 µs (the year 2255 since the epoch) are refused: a double no
# longer holds whole microseconds there, and in nanoseconds they near int64's end (2^63).
MAX_TIME_US = float(2**53)


def _ns_times(ts: Any, dur: Any) -> tuple[Int64Array, Int64Array]:
    """start = round(ts * 1000), end = start + round(dur * 1000): microsecond floats to integer
    nanoseconds; bad durations are 0."""
    for values in (ts, dur):
        if not isinstance(values, np.ndarray) and bool in set(map(type, values)):
            raise ValueError("a timestamp or duration is true or false, not a number")
    ts_arr = np.asarray(ts, dtype=np.float64)
    if not np.isfinite(ts_arr).all():
        raise ValueError("a timestamp is not a finite number")
    if ts_arr.size and np.abs(ts_arr).max() > MAX_TIME_US:
        raise ValueError(f"a timestamp is beyond ±{MAX_TIME_US:.0f} µs")
    dur_raw = np.asarray(dur, dtype=np.float64)
    if dur_raw.size and np.nanmax(np.abs(dur_raw), initial=0.0) > MAX_TIME_US:
        raise ValueError(f"a duration is beyond {MAX_TIME_US:.0f} µs")
    dur_arr = np.rint(dur_raw * 1000.0)
    if (dur_arr < 0).any():  # (NaN compares False: a missing duration is an instant)
        raise ValueError("a duration is negative")
    dur_arr[~(dur_arr > 0)] = 0  # missing or NaN durations count as instants
    start = us_to_ns(ts_arr)
    return start, start + dur_arr.astype(np.int64)


def us_to_ns(ts: NDArray[np.float64]) -> Int64Array:
    """Microsecond timestamps to integer nanoseconds, exactly: epoch-based Kineto timestamps
    (~1.7e15 µs) times 1000 exceed a double's 53-bit mantissa, so the whole microseconds and the
    fraction are converted apart."""
    whole = np.floor(ts)
    result: Int64Array = whole.astype(np.int64) * 1000 + np.rint((ts - whole) * 1000.0).astype(
        np.int64
    )
    return result


def _steps(steps: list[tuple[str, Any, Any]]) -> tuple[Int64Array, Int64Array, Int64Array]:
    """Host `ProfilerStep#N` windows, sorted and made disjoint (a step starts after the last ends)."""
    numbered = []
    for name, ts, dur in steps:
        try:
            numbered.append((int(name[len(classify.PROFILER_STEP_PREFIX) :]), ts, dur))
        except ValueError:
            continue
    if not numbered:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    start, end = _ns_times([s[1] for s in numbered], [s[2] for s in numbered])
    numbers = np.asarray([s[0] for s in numbered], dtype=np.int64)
    order = np.argsort(start, kind="stable")
    numbers, start, end = numbers[order], start[order], end[order]
    previous_end = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(end)[:-1]])
    start = np.maximum(start, previous_end)
    end = np.maximum(end, start)
    return numbers, start, end


def _launch_calls(
    dev_corr: Int64Array, rt_corr: Int64Array, rt_ts: NDArray[np.float64]
) -> tuple[NDArray[np.float64], Int64Array]:
    """For each device event, the host time and row of the launch call with the same correlation
    (NaN and -1 where there is none)."""
    n = dev_corr.size
    if rt_corr.size == 0:
        return np.full(n, np.nan), np.full(n, -1, dtype=np.int64)
    order = np.argsort(rt_corr, kind="stable")
    rc_sorted = rt_corr[order]
    pos = np.minimum(np.searchsorted(rc_sorted, dev_corr), rt_corr.size - 1)
    found = (rc_sorted[pos] == dev_corr) & (dev_corr >= 0)
    row = np.where(found, order[pos], -1)
    return np.where(found, rt_ts[np.maximum(row, 0)], np.nan), row


# The fields the analysis reads from an event: type, what to call it, required.
_EVENT_FIELDS: tuple[tuple[str, tuple[type, ...], str, bool], ...] = (
    ("ts", (int, float), f"a finite number of microseconds within ±{2**53}", True),
    ("dur", (int, float), f"a finite number of microseconds within 0..{2**53}", False),
    ("name", (str,), "a string", False),
    ("cat", (str,), "a string", False),
    ("args", (dict,), "a JSON object", False),
)


def _is_device_or_launch(cat: Any) -> bool:
    try:
        return (
            cat
            in classify.KERNEL_CATEGORIES | classify.COPY_CATEGORIES | classify.RUNTIME_CATEGORIES
        )
    except TypeError:  # an unhashable category
        return True


def _locate_bad_event(raw: RawTrace, exc: BaseException) -> InputError:
    """Find the first malformed event to name it; a slow pass, run only after a failure."""
    where = f"{raw.path}: traceEvents"
    for i, ev in enumerate(raw.events):
        if not isinstance(ev, dict):
            return InputError(
                f"{where}[{i}]", f"an event must be a JSON object, not {type(ev).__name__}"
            )
        if ev.get("ph") != "X" and not _is_device_or_launch(ev.get("cat")):
            continue
        for key, types, what, required in _EVENT_FIELDS:
            value = ev.get(key)
            if value is None and not required:
                continue
            bad_number = key in ("ts", "dur") and (
                isinstance(value, bool)
                or (isinstance(value, float) and not math.isfinite(value))
                or (isinstance(value, (int, float)) and abs(value) > MAX_TIME_US)
            )
            if key == "dur" and isinstance(value, (int, float)) and value * 1000.0 < -0.5:
                return InputError(
                    f"{where}[{i}].dur",
                    f"must not be negative, not {value!r:.40} (an impossible duration; "
                    f"event {str(ev.get('name'))[:60]!r})",
                )
            if not isinstance(value, types) or bad_number:
                return InputError(f"{where}[{i}].{key}", f"must be {what}, not {value!r:.40}")
    return InputError(where, f"malformed trace ({' '.join(str(exc).split())})")
