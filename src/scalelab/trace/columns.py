"""The first half of `extract`, in plain Python (no numpy): sort a parsed trace's events into
buckets and pull out, as lists, the fields the analysis reads.

`gather(raw)` gives a `Columns` for a GPU trace (its values plain Python: lists of numbers and
strings, which `marshal` carries between processes) or a `CpuTrace` (the host events as dicts,
for `extract`'s CPU path). `extract` turns either into numpy arrays and interval sets.

It is apart from `extract` so that it imports no numpy: the `scalelab trace` command runs it in a
forked process while the main one imports numpy and the analysis (see `background`).
Every value is read as `extract` always read it; checks that `extract` makes on the numbers
(booleans, non-finite values, types numpy refuses) stay there, on these lists.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import compress, repeat
from operator import attrgetter, itemgetter
from typing import Any

from msgspec import Struct

from scalelab.errors import InputError
from scalelab.trace import classify
from scalelab.trace.load import RawTrace

NAMED_PREFIXES = (
    classify.PROFILER_STEP_PREFIX,
    *classify.HOST_COLLECTIVE_PREFIXES,
    *classify.CPU_COLLECTIVE_PREFIXES,
)

# A numeric column: its values, and whether some event lacked the field (then the values hold
# NaN there, and the column is converted leniently, as always).
Numbers = tuple[list[Any], bool]


class Columns(Struct, eq=False):
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

    def to_tuple(self) -> tuple[Any, ...]:
        """Plain values only, for `marshal`."""
        return tuple(getattr(self, f) for f in _FIELDS)

    @classmethod
    def from_tuple(cls, values: tuple[Any, ...]) -> Columns:
        return cls(*values)


class CpuTrace(Struct, eq=False):
    """A trace without device events: its events as dicts and its named host events."""

    raw: RawTrace
    n_events: int  # in the file (the typed path's dicts are its 'X' events only)
    steps: list[tuple[Any, Any, Any]]
    cpu_colls: list[tuple[Any, Any, Any, Any, str]]
    step_lanes: set[tuple[Any, Any]]


def gather(raw: RawTrace, *, part: bool = False) -> Columns | CpuTrace:
    """Bucket the events and read their fields (see the module doc); raises what reading a
    malformed event raises (AttributeError, TypeError, ValueError, KeyError), as `extract`
    always did. `part`: the events are a part of a trace's (see `merge`): always Columns."""
    events = raw.events
    n_events = len(events)
    gpu_annotation = classify.GPU_ANNOTATION_CATEGORY
    get: Callable[..., Callable[[Any], Any]]
    kernels, copies, runtime, annotations, named = buckets(events, raw.typed)
    if raw.typed:
        from scalelab.trace import schema

        if not kernels and not copies and not part:  # a CPU trace: its host events, as dicts
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
    if not kernels and not copies and not part:
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
        refusal=None if runtime or part else unmodelled_device(raw),
    )


def merge(a: Columns, b: Columns) -> Columns:
    """The columns of a trace from those of its two parts (`a`'s events before `b`'s in the
    file): the same lists, in the same order, as gathering the whole trace at once gives."""
    ka, kb = a.n_kernels, b.n_kernels

    def device(x: Any, y: Any) -> Any:  # kernels first, then copies
        return _joined(x[:ka], y[:kb], x[ka:], y[kb:])

    def numbers_of(x: Numbers, y: Numbers, on_device: bool = False) -> Numbers:
        values = device(x[0], y[0]) if on_device else _joined(x[0], y[0])
        return values, x[1] or y[1]

    return Columns(
        path=a.path,
        typed=a.typed and b.typed,
        n_events=a.n_events + b.n_events,
        steps=a.steps + b.steps,
        host_colls=a.host_colls + b.host_colls,
        n_kernels=ka + kb,
        kernel_names=a.kernel_names + b.kernel_names,
        copy_names=a.copy_names + b.copy_names,
        device_ts=numbers_of(a.device_ts, b.device_ts, on_device=True),
        device_dur=numbers_of(a.device_dur, b.device_dur, on_device=True),
        device_corr=device(a.device_corr, b.device_corr),
        device_pid=device(a.device_pid, b.device_pid),
        device_tid=device(a.device_tid, b.device_tid),
        runtime_ts=numbers_of(a.runtime_ts, b.runtime_ts),
        runtime_dur=numbers_of(a.runtime_dur, b.runtime_dur),
        runtime_corr=_joined(a.runtime_corr, b.runtime_corr),
        runtime_tid=a.runtime_tid + b.runtime_tid,
        annotation_ts=numbers_of(a.annotation_ts, b.annotation_ts),
        annotation_dur=numbers_of(a.annotation_dur, b.annotation_dur),
        annotation_names=a.annotation_names + b.annotation_names,
        comm_rows=a.comm_rows + [r + ka for r in b.comm_rows],
        comm_labels=a.comm_labels + b.comm_labels,
        comm_meta=a.comm_meta + b.comm_meta,
        refusal=None,
    )


_FIELDS = Columns.__struct_fields__


def _joined(*parts: Any) -> Any:
    """Lists concatenated; numpy arrays (columns carried as arrays, `background`) likewise,
    into one array, or into a list where a part is a list."""
    lists = [isinstance(p, list) for p in parts]
    if not any(lists):
        import numpy as np  # (only columns carried as arrays are arrays: numpy is loaded)

        return np.concatenate(parts)
    out: list[Any] = []
    for part, is_list in zip(parts, lists, strict=True):
        out += part if is_list else part.tolist()
    return out


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


def refuse(path: Any, refusal: str | None) -> None:
    if refusal is not None:
        raise InputError(f"{path}: traceEvents", refusal)
