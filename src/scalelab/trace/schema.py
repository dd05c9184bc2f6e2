"""The typed fast path: decode only the fields the analysis reads, with msgspec.

A generic JSON parser builds a dict for every event and its `args`, with every key and value, and
then frees it all again; most of that is never looked at (operator shapes, kernel launch
parameters). Decoding into small typed structs that name only the needed fields skips the rest
while parsing. Anything that does not fit
the types (a malformed or unusual trace) raises, and the caller falls back to msgspec's generic
decode into dicts, which reads any trace and explains what is wrong with a bad one.

msgspec is the project's one JSON decoder: it earns its place here (a million-event trace's
analysis is 1.47x faster with the typed decode than with a generic one, `benchmarks/trace_speed.py`),
and the report's types are msgspec Structs too.
"""

from __future__ import annotations

from typing import Any, ClassVar, Union

import msgspec


class Args(msgspec.Struct, gc=False):  # type: ignore[call-arg]  # (mypy without msgspec)
    """The `args` of an event, reduced to what the analysis reads."""

    correlation: int = -1
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    # Communication metadata (recent PyTorch, on NCCL kernels and record_param_comms): Any, so
    # that an odd type in a field the overlap does not need never forces the slow path.
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    seq: Any = msgspec.field(default=None, name="Seq")


class Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):  # type: ignore[call-arg]
    """One complete ('X') trace event, reduced to what the analysis reads (gc=False: it holds no
    cycles). Kineto writes every device event, launch call and annotation as an 'X' event."""

    ph: ClassVar[str] = "X"
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float = 0.0
    args: Args | None = None


SKIPPED_CATEGORY = "\0skipped"  # what a skipped event answers for its category


class Skipped(msgspec.Struct, gc=False, tag_field="ph"):  # type: ignore[call-arg]
    """An event of a phase the analysis never reads: flow starts and ends ('s', 'f', 't': ~40 %
    of a Kineto trace's events), instants ('i', 'I'), metadata ('M'), counters ('C'). Decoded
    to an empty struct, its fields skipped unread; its `cat` is SKIPPED_CATEGORY. A phase not listed here (or none) is not skipped: the whole
    trace then goes through the general parser."""

    ph: ClassVar[str] = ""
    cat: ClassVar[str] = SKIPPED_CATEGORY
    name: ClassVar[str] = ""


def _skipped(phase: str) -> type[Skipped]:
    return type(f"Skipped_{phase}", (Skipped,), {"ph": phase}, tag=phase)  # type: ignore[call-arg]


_SKIPPED_PHASES = ("s", "f", "t", "i", "I", "M", "C", "b", "e", "n", "O", "N", "D", "P")
AnyEvent = Union[(Event, *(_skipped(p) for p in _SKIPPED_PHASES))]  # type: ignore[valid-type]


class Document(msgspec.Struct, gc=False):  # type: ignore[call-arg]  # (mypy without msgspec)
    traceEvents: list[AnyEvent]  # type: ignore[valid-type]  # noqa: N815 (the trace format's key)
    distributedInfo: Any = None  # noqa: N815


_DECODER = msgspec.json.Decoder(Document)
DecodeFailed = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def decode(data: bytes | bytearray | memoryview) -> tuple[list[Event], dict[str, Any]]:
    """Events and metadata (only `distributedInfo`); raises one of `DecodeFailed` if the data
    is not a trace document of the expected types."""
    document = _DECODER.decode(data)
    metadata = (
        {} if document.distributedInfo is None else {"distributedInfo": document.distributedInfo}
    )
    return document.traceEvents, metadata


_ARG_NAMES = {
    "correlation": "correlation",
    "collective_name": "Collective name",
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
    "dtype": "dtype",
    "pg_name": "Process Group Name",
    "seq": "Seq",
}


def args_dict(args: Args | None) -> dict[str, Any]:
    """Typed args as the general path's dict (the trace's own key names)."""
    if args is None:
        return {}
    out = {key: getattr(args, f) for f, key in _ARG_NAMES.items()}
    return {k: v for k, v in out.items() if v is not None and not (k == "correlation" and v < 0)}


def host_dict(event: Event) -> dict[str, Any]:
    """A host annotation (profiler step, host collective) as a dict: the fields read of it."""
    return {
        "ph": event.ph,
        "cat": event.cat,
        "name": event.name,
        "pid": event.pid,
        "tid": event.tid,
        "ts": event.ts,
        "dur": event.dur,
    }


def as_dict(event: Event) -> dict[str, Any]:
    """An event as the general path's dict (for the few events read field by field)."""
    out = {f: getattr(event, f) for f in event.__struct_fields__ if f != "args"}
    result = {k: v for k, v in out.items() if v is not None}
    result["ph"] = event.ph
    if event.args is not None:
        result["args"] = args_dict(event.args)
    return result
