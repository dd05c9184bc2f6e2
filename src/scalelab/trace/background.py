"""Decoding in other processes, for speed; the answers are the same lists either way.

* The `scalelab trace` command's head start (`start`, `take`): the first trace file is read,
  decompressed, decoded and gathered into columns (`columns.gather`, plain Python) in a forked
  child while the command itself imports numpy and the analysis, the longest part of its
  start-up. Used by the console command only (a process that ends after one analysis, before any
  thread is started).
* Two processes on one large file (`gather_in_two`): each decodes half of its events, for the
  library call (`analyze(..., workers=2)`, the default on two cores or more) and the command.

A child sends its columns back through a pipe with `marshal` (plain values only) and exits with
`os._exit`. Anything unusual (a CPU trace, a trace the typed decoder cannot read, a bad file, a
child that died) sends nothing, and the file is read in the calling process as usual, which
reports any error as it always does.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from scalelab.errors import InputError

if TYPE_CHECKING:
    from pathlib import Path

    from scalelab.trace import load

# path -> (child pid, read end of its pipe)
_pending: dict[str, tuple[int, int]] = {}


def available() -> bool:
    return hasattr(os, "fork")


def start(paths: Iterable[str | Path]) -> bool:
    """Fork a child that gathers the first trace file's columns; False if none was started."""
    from scalelab.trace.load import find_trace_files

    if not available():
        return False
    try:
        first = find_trace_files(paths)[0]
    except InputError:
        return False  # `analyze` finds the same and reports it
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        try:
            payload = _gather(first)
        except BaseException:  # the command's own read reports what is wrong
            payload = None
        _send(write_end, payload)
    os.close(write_end)
    _pending[str(first)] = (pid, read_end)
    return True


# The command's child splits only a file this large with a grandchild: beside the command's own
# imports, three processes share the cores, which pays off only when decoding outlasts them.
COMMAND_SPLIT_MIN_BYTES = 24_000_000


def _gather(path: str | Path) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    import gc

    from scalelab.trace.columns import Columns, gather
    from scalelab.trace.load import read_trace

    gc.disable()
    two = gather_in_two(path, min_bytes=COMMAND_SPLIT_MIN_BYTES) if spare_core() else None
    if two is not None:
        return two[0].to_tuple(), two[1]
    raw = read_trace(path)
    if not raw.typed:
        return None
    found = gather(raw)
    if not isinstance(found, Columns):
        return None
    return found.to_tuple(), raw.metadata


# Files smaller than this are read in one process: a fork and a pipe cost more than they save.
SPLIT_MIN_BYTES = 8_000_000
# Between two events of a Kineto trace (indented JSON, one event per object at depth two): the
# only place where a newline, two spaces and a brace end an object and another begins.
_SEAM = b"\n  },\n  {"


def split_point(data: load.Buffer, at: int | None = None) -> tuple[int, int] | None:
    """Where to cut the decompressed JSON of a trace in two: the end of the first part's last
    event and the start of the second part's first event, at the first seam between two events
    from byte `at` on (default: the middle); None if the file is not laid out as Kineto writes
    it. A wrong cut cannot go unnoticed: each part is decoded as a whole document, which fails
    unless the cut lies between two events of traceEvents. The same for any `data` that holds
    the file's first bytes up to the seam (a prefix gives the same cut as the whole file)."""
    key = data.find(b'"traceEvents"')
    if key < 0:
        return None
    seam = data.find(_SEAM, max(len(data) // 2 if at is None else at, key))
    if seam < 0:
        return None
    return seam + 4, seam + len(_SEAM) - 1


# The caller's share of a gzipped file split in two (`gather_in_two`). The child also inflates
# the caller's part (gzip is read from its start) and sends its columns through the pipe; the
# caller frees its part's events (the child leaves with os._exit) and pays copy-on-write for
# the pages it writes while the child lives. By CPU time alone (load ~4) 0.52 balanced them; live
# (load ~0.7: a100-ddp, a100-rank0-of-16) at 0.52 the child finished decoding 7-8 ms before the
# caller, at 0.48 with it, and the columns arrived 5-13 ms later either way: half it is.
CALLER_SHARE = 0.5
# How far past its share the caller inflates to find the seam after it (an event is < 64 kB).
_SEAM_SLACK = 1 << 20
_SEAM_NEAR = 1 << 16  # tried first (1 MB more to inflate is ~1.5 ms)


def gather_in_two(
    path: str | Path, *, min_bytes: int = SPLIT_MIN_BYTES, arrays: bool = False
) -> tuple[Any, dict[str, Any]] | None:
    """A large trace's columns gathered by two processes at once: this one decodes and gathers
    the first part of its events while a forked child does the rest; the parts' columns are
    merged in file order (`columns.merge`), the same lists as one process would gather.

    A gzipped file is forked before it is inflated: the child inflates all of it (checking its
    CRC) and decodes the second part, while this process inflates only its own part (its share,
    `CALLER_SHARE`, up to the next seam) and decodes it. A file whose bytes were read already
    (prefetched) is cut as it is, at its middle; a child started earlier for it (`split_start`)
    is the one waited for.

    None (the caller reads the file as usual) where that does not apply: no `os.fork`, other
    threads running (forking them is unsafe), a small file, an unusual layout, a part the typed
    decoder cannot read, a CPU trace or a trace without launch calls. Decompressed files under
    `min_bytes` are left to one process."""
    split = _splits.pop(str(path), None)
    if split is None:
        split = _fork(path, min_bytes, None, arrays=arrays)
    if split is None:
        return None
    return _finish(path, split)


# path -> a split started ahead (`split_start`): see `_Split`
_splits: dict[str, _Split] = {}


class _Split:
    """A forked child decoding a file's second part, from byte `at` on. (A plain class: this
    module is imported before the fork, `dataclasses` would import `inspect`, ~10 ms.)"""

    __slots__ = ("arrays", "at", "data", "packed", "pid", "read_end")

    def __init__(
        self,
        pid: int,
        read_end: int,
        at: int,
        data: load.Buffer | None,  # the whole file's bytes, or None: the caller inflates its part
        packed: bytes | None,
        arrays: bool = False,  # numeric columns as numpy arrays (`gather_in_two`)
    ) -> None:
        self.pid = pid
        self.read_end = read_end
        self.at = at
        self.data = data
        self.packed = packed
        self.arrays = arrays


def split_start(path: str | Path, share: float, *, min_bytes: int = SPLIT_MIN_BYTES) -> bool:
    """Fork the child that decodes the part of a file after its first `share` now (the file's
    bytes read and remembered, `load.remember`), so that it decodes while this process does
    something else first (a command's imports); `gather_in_two` later decodes this process's
    part and merges. False if no child was started (see `gather_in_two`)."""
    split = _fork(path, min_bytes, share)
    if split is None:
        return False
    _splits[str(path)] = split
    return True


def _fork(
    path: str | Path, min_bytes: int, share: float | None, *, arrays: bool = False
) -> _Split | None:
    from scalelab.trace import load

    if not available() or not _single_threaded():
        return None
    data = load.take_prefetched(path)
    packed = None
    if data is None:
        try:
            with open(path, "rb") as file:
                packed = file.read()
        except OSError:
            return None  # the caller's read says what is wrong
        if packed[:2] == load.GZIP_MAGIC and len(packed) > 18:
            # ISIZE, the gzip trailer's uncompressed size modulo 2**32 (so a file over 4 GiB
            # may look small and be read in one process: slower, not wrong).
            size = int.from_bytes(packed[-4:], "little")
        else:
            data, packed = load.read_bytes(path), None
            size = len(data)
    else:
        size = len(data)
    if size < min_bytes:
        if data is None:
            data = load.read_bytes(path)
        load.remember(path, data)  # for the caller, who reads it in one process
        return None
    if share is None:
        share = CALLER_SHARE if packed is not None else 0.5
    at = int(size * share)
    if data is not None:
        load.remember(path, data)  # for the caller, if it must read the file after all
        if split_point(data, at) is None:
            return None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        try:
            payload = _gather_second(path, data, packed, at)
        except BaseException:
            payload = None
        _send(write_end, payload)
    os.close(write_end)
    return _Split(pid, read_end, at, data, packed, arrays)


# What makes a part after the cut a whole document (the first part gets "]}" after its last
# event): both are written over the bytes around the cut in place where the buffer allows it
# (each process has its own copy of the pages it writes), instead of copying the part.
_OPEN = b'{"traceEvents":['


def _gather_second(
    path: str | Path, data: load.Buffer | None, packed: bytes | None, at: int
) -> tuple[Any, dict[str, Any]] | None:
    """The child's part: the events after the first seam from byte `at` on. A gzipped file not
    read yet is inflated here (checking its CRC), only the bytes from `at` kept; none if the
    first part cannot be cut where the caller cuts it."""
    from scalelab.trace import load

    load.keep_parsed = []  # this process leaves with os._exit: its events are never freed
    if data is None:
        tail = load.inflate_tail(packed or b"", at - len(_OPEN))
        if tail is None:
            return None
        seam = tail.find(_SEAM, len(_OPEN))  # from byte `at` of the file, as split_point
        if seam < 0:
            return None
        whole: load.Buffer = tail
        start = seam + len(_SEAM) - 1
    else:
        found = split_point(data, at)
        if found is None:
            return None
        whole, start = data, found[1]
    if isinstance(whole, bytes):
        return _gather_part(path, b"".join((_OPEN, memoryview(whole)[start:])))
    whole[start - len(_OPEN) : start] = _OPEN  # over the first part's end: this process's copy
    return _gather_part(path, memoryview(whole)[start - len(_OPEN) :])


def _finish(path: str | Path, split: _Split) -> tuple[Any, dict[str, Any]] | None:
    """This process's part of a split, the child's columns, merged."""
    from scalelab.trace import load

    data, at = split.data, split.at
    mine = None
    try:
        if data is not None:
            head: load.Buffer = data
            cut = split_point(head, at)
        else:
            # Events are short: the next seam is nearly always within a few kB of `at`
            for slack in (_SEAM_NEAR, _SEAM_SLACK):
                head, _ = load.inflate_head(split.packed or b"", at + slack)
                cut = split_point(head, at)
                if cut is not None:
                    break
        # The child cuts at the first seam from `at` on, as split_point does where the
        # traceEvents key lies before `at` (every real trace; else no split).
        if cut is not None and head.find(b'"traceEvents"') < at:
            mine = _gather_first(path, head, cut[0])
            if mine is not None and split.arrays:  # now, while the child may still decode
                _as_arrays(mine[0], _fromiter, _np().float64, _np().int64)
    except Exception:
        mine = None
    theirs = _receive(split.pid, split.read_end)
    if mine is None or theirs is None:
        return None
    from scalelab.trace.columns import Columns, merge

    columns = Columns.from_tuple(theirs[0])
    if split.arrays:
        _as_arrays(columns, _frombuffer, _np().float64, _np().int64)
    else:
        _as_arrays(columns, _tolist, "d", "q")
    merged = merge(mine[0], columns)
    if not (merged.n_kernels or merged.copy_names) or len(merged.runtime_corr) == 0:
        return None  # a CPU trace, or one without launch calls: the whole path decides
    load.forget(path)
    return merged, {**theirs[1], **mine[1]}


def _gather_first(
    path: str | Path, head: load.Buffer, end: int
) -> tuple[Any, dict[str, Any]] | None:
    """The first part, the events before byte `end`: "]}" is written after them in place and
    the two bytes it covers are put back after decoding (the buffer may be the whole file's,
    kept for a read in one process)."""
    if isinstance(head, bytes):
        return _gather_part(path, b"".join((memoryview(head)[:end], b"]}")))
    saved = head[end : end + 2]
    head[end : end + 2] = b"]}"
    try:
        return _gather_part(path, memoryview(head)[: end + 2])
    finally:
        head[end : end + 2] = saved


def spare_core() -> bool:
    """Whether a second process would find a core of its own now: more than one core, and a
    1-minute load average (this process included) at least half a core below their number. On
    a machine whose cores are all busy, two processes take longer than one."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on this system: trust the core count
        return cores > 1
    return cores > 1 and load < cores - 0.5


def _single_threaded() -> bool:
    threading = sys.modules.get("threading")  # never imported: no thread was ever started
    return threading is None or threading.active_count() == 1


def _gather_part(path: str | Path, blob: bytes | memoryview) -> tuple[Any, dict[str, Any]] | None:
    from scalelab.trace import load, schema
    from scalelab.trace.columns import Columns, gather
    from scalelab.trace.load import RawTrace

    events, metadata = schema.decode(blob)
    found = gather(RawTrace(path, events, metadata, typed=True), part=True)
    assert isinstance(found, Columns)
    if load.keep_parsed is not None:  # a process about to exit: not worth freeing (~3 ms)
        load.keep_parsed.append(events)
    return found, metadata


# Children that had sent their columns but had not exited yet when their pipe closed.
_unreaped: list[int] = []


def _reap(pid: int) -> None:
    """Collect a child that has sent its columns, without waiting for its exit: the kernel
    frees a large child's memory before it is reaped (3-6 ms on a100-ddp and a100-rank0-of-16
    on the build machine), which the caller need not wait for. One not yet gone is collected
    when the next split ends or at this process's exit."""
    _reap_finished()
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # already collected (a SIGCHLD handler of the caller's own)
        return
    if done == 0:
        if not _unreaped:
            import atexit

            atexit.register(_reap_all)
        _unreaped.append(pid)


def _reap_finished() -> None:
    for pid in list(_unreaped):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _unreaped.remove(pid)


def _reap_all() -> None:
    while _unreaped:
        pid = _unreaped.pop()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _send(write_end: int, payload: Any) -> None:
    """The child's last act: the payload (plain values) into the pipe, then exit. Columns go
    with their large numeric columns as the bytes of C arrays where every value fits
    (`_as_arrays`), which the caller takes as numpy arrays without making a Python number of each, or turns
    back into the same lists (`_tolist`): marshal writes and reads a list a number at a time
    (a100-ddp's child part: 5.5 ms to write, 2.4 to read; as arrays ~2 and ~1)."""
    try:
        if payload is not None and not isinstance(payload[0], tuple):
            columns = payload[0]
            # One object per distinct name: marshal then writes each name once and refers to
            # it after (kernel names are ~2/3 of the bytes: a100-rank0-of-16's columns 3.5 ->
            # 1.3 MB, loaded in 6.9 instead of 8.6 ms), and the caller makes no copies of them.
            for f in ("kernel_names", "copy_names", "annotation_names"):
                seen: dict[Any, Any] = {}
                setattr(columns, f, list(map(seen.setdefault, *(getattr(columns, f),) * 2)))
            from array import array

            _as_arrays(columns, lambda values, code: array(code, values).tobytes(), "d", "q")
            payload = (columns.to_tuple(), payload[1])
        with os.fdopen(write_end, "wb") as out:
            out.write(marshal.dumps(payload))
    finally:
        os._exit(0)


# Numeric columns carried as arrays (`_send`): float64 and int64 ones. A column
# some value of which does not fit (a missing field, a None, a huge id) stays a list.
_FLOAT_COLUMNS = ("device_ts", "device_dur", "runtime_ts", "runtime_dur")
_INT_COLUMNS = ("device_corr", "runtime_corr")


def _np() -> Any:
    import numpy

    return numpy


def _as_arrays(columns: Any, convert: Any, float_type: Any, int_type: Any) -> None:
    """Each array column of `columns` replaced by `convert(values, type)` where that succeeds
    (`float_type` for the float columns, `int_type` for the int ones)."""
    for f in _FLOAT_COLUMNS:
        values, lenient = getattr(columns, f)
        if not lenient:  # (NaN where a field is missing: converted by extract, leniently)
            with contextlib.suppress(TypeError, ValueError, OverflowError):
                setattr(columns, f, (convert(values, float_type), False))
    for f in _INT_COLUMNS:
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            setattr(columns, f, convert(getattr(columns, f), int_type))


def _fromiter(values: Any, dtype: Any) -> Any:
    return _np().fromiter(values, dtype, len(values))


def _tolist(values: Any, code: str) -> list[Any]:
    from array import array

    if not isinstance(values, bytes):
        raise TypeError("a list: left as it is")
    return array(code, values).tolist()


def _frombuffer(values: Any, dtype: Any) -> Any:
    if not isinstance(values, bytes):
        raise TypeError("a list: left as it is")
    return _np().frombuffer(values, dtype)


def _receive(pid: int, read_end: int) -> Any:
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _reap(pid)
    try:
        return marshal.loads(data) if data else None
    except (EOFError, ValueError, TypeError):
        return None


def take(path: str | Path) -> tuple[Any, dict[str, Any]] | None:
    """The columns and metadata a child gathered for this file (then forgotten), or None."""
    entry = _pending.pop(str(path), None)
    if entry is None:
        return None
    payload = _receive(*entry)
    if payload is None:
        return None
    from scalelab.trace.columns import Columns

    values, metadata = payload
    return Columns.from_tuple(values), metadata
