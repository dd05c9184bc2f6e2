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

The library call's second process is kept for the next file (`_Helper`, up to `HELPER_IDLE_S`
after its last one) instead of being forked for each: right after a fork, every page of freed
memory that either process fills again is copied on write (~2,100 faults, 5-7 ms on each side of
a100-ddp's halves); a kept helper fills its own.
"""

from __future__ import annotations

import _thread
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
    path: str | Path,
    *,
    min_bytes: int = SPLIT_MIN_BYTES,
    arrays: bool = False,
    keep_helper: bool = False,
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
    `min_bytes` are left to one process.

    `keep_helper`: a gzipped file's second part goes to the kept helper (`_Helper`; started
    now if there is none), which stays for the next file, rather than to a child of its own."""
    split = _splits.pop(str(path), None)
    if split is None:
        split = _fork(path, min_bytes, None, arrays=arrays, keep_helper=keep_helper)
    if split is None:
        return None
    return _finish(path, split)


# path -> a split started ahead (`split_start`): see `_Split`
_splits: dict[str, _Split] = {}


class _Split:
    """A forked child decoding a file's second part, from byte `at` on. (A plain class: this
    module is imported before the fork, `dataclasses` would import `inspect`, ~10 ms.)"""

    __slots__ = ("arrays", "at", "data", "helper", "packed", "pid", "read_end")

    def __init__(
        self,
        pid: int,
        read_end: int,
        at: int,
        data: load.Buffer | None,  # the whole file's bytes, or None: the caller inflates its part
        packed: bytes | None,
        arrays: bool = False,  # numeric columns as numpy arrays (`gather_in_two`)
        helper: _Helper | None = None,  # the kept helper decodes it (its lock is held)
    ) -> None:
        self.pid = pid
        self.read_end = read_end
        self.at = at
        self.data = data
        self.packed = packed
        self.arrays = arrays
        self.helper = helper


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
    path: str | Path,
    min_bytes: int,
    share: float | None,
    *,
    arrays: bool = False,
    keep_helper: bool = False,
) -> _Split | None:
    from scalelab.trace import load

    if not available() or not (keep_helper or _single_threaded()):
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
    if keep_helper and packed is not None:
        helper = _ask_helper(str(path), at, packed)
        if helper is not None:
            return _Split(helper.pid, helper.replies, at, None, packed, arrays, helper)
    if not _single_threaded():
        return None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        load.keep_parsed = []  # this process leaves with os._exit: its events are never freed
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
    """This process's part of a split, the other process's columns, merged. However this ends
    (an interrupt included), the other process is answered for: its reply read, or it is
    stopped (`_abandon`)."""
    theirs: Any = _ABANDONED
    try:
        mine = _first_part(path, split)
        theirs = (
            _helper_reply(split.helper) if split.helper else _receive(split.pid, split.read_end)
        )
    finally:
        if theirs is _ABANDONED:
            _abandon(split)
        if split.helper is not None:
            _helper_lock.release()
    if mine is None or theirs is None:
        return None
    from scalelab.trace import load
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


_ABANDONED = object()


def _abandon(split: _Split) -> None:
    """The other process of a split whose reply will not be read: a kept helper is dropped
    (stopped, so that its late reply can never answer another file), a child stopped."""
    if split.helper is not None:
        _drop_helper(split.helper)
        return
    with contextlib.suppress(OSError):
        os.close(split.read_end)
    with contextlib.suppress(OSError):
        os.kill(split.pid, 9)
    _reap(split.pid)


def _first_part(path: str | Path, split: _Split) -> tuple[Any, dict[str, Any]] | None:
    """This process's part of a split (None if it cannot be read this way)."""
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
    return mine


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
        with os.fdopen(write_end, "wb") as out:
            out.write(_encode(payload))
    finally:
        os._exit(0)


def _encode(payload: Any) -> bytes:
    """A part's columns and metadata as `marshal` bytes (see `_send`)."""
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
    return marshal.dumps(payload)


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


# The kept helper (`gather_in_two(..., keep_helper=True)`, the library call's split).


class _Helper:
    """A process forked once and kept, that decodes the second part of each large gzipped file
    this process reads in two, until it has had no file for `HELPER_IDLE_S` or this process
    has gone. It holds only its two pipes (every other inherited file descriptor is closed:
    a pipe of this process's must not stay open through it), ignores SIGINT (an interrupt is
    this process's to handle: it drops the helper) and runs none of this process's signal
    handlers (a SIGTERM handler that cleans up files must not run in it)."""

    __slots__ = ("owner", "pid", "replies", "requests")

    def __init__(self, pid: int, requests: int, replies: int) -> None:
        self.pid = pid
        self.requests = requests  # write end: (path, at, the gzipped bytes) per file
        self.replies = replies  # read end: the part's columns, as `_encode` writes them
        self.owner = os.getpid()


# A helper that has had no file for this long exits (its memory is then the system's again); a
# file asked of it meanwhile is read in one process (`_helper_reply`: its reply is missing).
HELPER_IDLE_S = 2.0
_helper: _Helper | None = None
_helper_lock = _thread.allocate_lock()  # one file at a time (held from request to reply)
_hooks_registered = False


def _ask_helper(path: str, at: int, packed: bytes) -> _Helper | None:
    """Send a file's second part to the kept helper (started if there is none, or if the one
    kept has exited); its lock is then held until `_finish` takes the reply. None if no helper
    can take it now (another thread is using it, or none can be forked), or if this process
    would die of SIGPIPE writing to a helper that has just left (Python ignores SIGPIPE; a
    program may have restored its default)."""
    import signal

    if signal.getsignal(signal.SIGPIPE) != signal.SIG_IGN:
        return None
    if not _helper_lock.acquire(blocking=False):
        return None
    try:
        for _attempt in range(2):
            helper = _helper if _helper is not None and _helper.owner == os.getpid() else None
            if helper is None or _exited(helper.pid):
                if helper is not None:
                    _drop_helper(helper)
                helper = _start_helper()
                if helper is None:
                    break
            try:
                _write_message(helper.requests, marshal.dumps((path, at, packed)))
            except OSError:  # it exited just now (idle): start another, once
                _drop_helper(helper)
                continue
            return helper
    except BaseException:
        _helper_lock.release()
        raise
    _helper_lock.release()
    return None


def _exited(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # collected by someone else: gone
        return True
    return done != 0


def _start_helper() -> _Helper | None:
    global _helper, _hooks_registered
    if not _single_threaded():
        return None
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    pipes = (requests_read, requests_write, replies_read, replies_write)
    if min(pipes) < 3:  # this process has closed its standard input, output or error
        for fd in pipes:
            os.close(fd)
        return None
    for fd in (requests_write, replies_write):
        _widen(fd)
    pid = os.fork()
    if pid == 0:  # the helper: never returns
        os.close(requests_write)
        os.close(replies_read)
        _serve(requests_read, replies_write)
    os.close(requests_read)
    os.close(replies_write)
    _helper = _Helper(pid, requests_write, replies_read)
    if not _hooks_registered:
        import atexit

        os.register_at_fork(after_in_child=_forget_inherited_helper)
        atexit.register(_stop_helper)
        _hooks_registered = True
    return _helper


def _widen(fd: int) -> None:
    """A pipe that holds a whole request or reply (up to 1 MB, Linux's limit for a user), so
    that its writer need not wait for its reader."""
    import fcntl

    size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if size is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, size, 1 << 20)


def _serve(requests: int, replies: int) -> None:
    """The helper's life: each request's part decoded and sent back, its events freed after
    the reply (while the caller measures); it ends when the caller has gone, closed its end,
    or sent nothing for `HELPER_IDLE_S`."""
    try:
        import select
        import signal

        for number in signal.valid_signals():  # the caller's handlers are not for this process
            with contextlib.suppress(OSError, ValueError):
                if callable(signal.getsignal(number)):
                    signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        low, high = sorted((requests, replies))
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, 1 << 20)
        from scalelab.trace import load

        parent = os.getppid()
        while True:
            ready, _, _ = select.select([requests], [], [], HELPER_IDLE_S)
            if not ready or os.getppid() != parent:
                break
            message = _read_message(requests)
            if message is None:
                break
            load.keep_parsed = []
            try:
                path, at, packed = marshal.loads(message)
                reply = _encode(_gather_second(path, None, packed, at))
            except Exception:  # this part cannot be read so: the caller reads the file whole
                reply = marshal.dumps(None)
            del message
            _write_message(replies, reply)
            del reply
            load.keep_parsed = None  # this file's events freed, after the reply
    finally:
        os._exit(0)


def _helper_reply(helper: _Helper) -> Any:
    """The helper's columns for the file asked of it; None if it could not read its part or has
    exited (then it is dropped: the caller reads the file in one process)."""
    message = None
    with contextlib.suppress(OSError):
        message = _read_message(helper.replies)
    if message is None:
        _drop_helper(helper)
        return None
    try:
        return marshal.loads(message)
    except (EOFError, ValueError, TypeError):
        _drop_helper(helper)
        return None


def _drop_helper(helper: _Helper) -> None:
    """Stop a kept helper now (it may be busy) and forget it."""
    global _helper
    if _helper is helper:
        _helper = None
    _close_pipes(helper)
    if helper.owner == os.getpid():
        with contextlib.suppress(OSError):
            os.kill(helper.pid, 9)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(helper.pid, 0)


def _close_pipes(helper: _Helper) -> None:
    """This process's ends of a helper's pipes, closed (the helper sees its requests end)."""
    for fd in (helper.requests, helper.replies):
        with contextlib.suppress(OSError):
            os.close(fd)


def _forget_inherited_helper() -> None:
    """In a process forked from one with a helper: that helper is not this process's; its
    pipes are closed here (the owner's stay open) and a helper of its own is started if needed."""
    global _helper
    helper = _helper
    if helper is not None and helper.owner != os.getpid():
        _helper = None
        _close_pipes(helper)


def _stop_helper() -> None:
    """At exit: the helper sees its requests end and leaves; it is collected (stopped if it
    has not left within a second)."""
    global _helper
    helper = _helper
    if helper is None or helper.owner != os.getpid():
        return
    _helper = None
    _close_pipes(helper)
    import time

    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        if _exited(helper.pid):
            return
        time.sleep(0.005)
    with contextlib.suppress(OSError):
        os.kill(helper.pid, 9)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(helper.pid, 0)


def _write_message(fd: int, body: bytes) -> None:
    """A message: its length (8 bytes, little-endian), then its bytes; all written."""
    view = memoryview(len(body).to_bytes(8, "little") + body)
    while view:
        view = view[os.write(fd, view) :]


def _read_message(fd: int) -> bytearray | None:
    """The next message on `fd` (see `_write_message`); None at the end of the stream."""
    header = _read_exactly(fd, 8)
    if header is None:
        return None
    size = int.from_bytes(header, "little")
    return _read_exactly(fd, size) if size else bytearray()


def _read_exactly(fd: int, size: int) -> bytearray | None:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            return None
        got += n
    return buffer
