"""Find and read PyTorch profiler traces (Chrome-trace / Kineto JSON, optionally gzipped).

Parsing decodes the whole file at once: with msgspec into small typed structs holding only the
fields the analysis reads (the fast path, see `schema`), else with orjson into plain dicts.
Every way a file can be unusable (missing, truncated gzip, invalid JSON, JSON that is not a trace)
becomes an `InputError` that names the file and says what is wrong, never a traceback.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Iterator

from scalelab.errors import InputError

# Neither `typing` nor `re` is imported here at run time: a command imports this module before
# it starts reading its file (`prefetch`), and those imports (~10 ms) then run beside the read.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Literal

try:  # ISA-L's inflate, 2-3x faster than zlib's (optional: the `fast` extra)
    from isal import isal_zlib as _inflate
except ImportError:
    _inflate = zlib  # type: ignore[assignment,misc,unused-ignore]

# The typed fast path (`schema`, msgspec), imported on first use (`_typed`) so that a command
# can start reading its file (`prefetch`) before that import.
_schema: Any = None


def _typed() -> Any:
    """The `schema` module."""
    global _schema
    if _schema is None:
        from scalelab.trace import schema

        _schema = schema
    return _schema


if TYPE_CHECKING:
    Parser = Literal["auto", "general"]


def __getattr__(name: str) -> Any:
    if name == "Parser":  # `from scalelab.trace.load import Parser` at run time
        from typing import Literal

        return Literal["auto", "general"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TRACE_SUFFIXES = (".json", ".json.gz")

# Decompressed bytes above which a command leaves a trace to the full analysis: there the
# numpy analysis, whose import a command runs beside a forked child decoding the file
# (`background`), is faster than these lists (per event, `plain` is slower than numpy).
# Measured on the 2-core build machine under load: v100-ddp (54 MB) 0.71 s that way against
# 0.95 s in `plain`; the ~105,000-event traces (26-35 MB) as fast or faster in `plain`.
PLAIN_MAX_BYTES = 40_000_000
GZIP_MAGIC = b"\x1f\x8b"

# A buffer its reader may change in place (`mutable_buffer`): an anonymous private memory
# map, whose pages are made as they are first written (a bytearray is zero-filled first) and
# are copied on write after a fork, so that each process changes only its own.
if TYPE_CHECKING:
    import mmap
    from pathlib import Path

    Buffer = bytes | bytearray | mmap.mmap


def mutable_buffer(size: int) -> bytearray | mmap.mmap:
    """A large one asks for transparent huge pages where the system offers them on request
    (Linux, `madvise` mode): a 2 MB page is one fault where 4 kB pages are 512 (5 MB filled in
    2.2 ms with small pages, 0.8 with huge ones, on the build machine)."""
    import mmap  # (here: the command's start-up reads no file through it)

    flags = getattr(mmap, "MAP_PRIVATE", None), getattr(mmap, "MAP_ANONYMOUS", None)
    if size <= 0 or flags[0] is None or flags[1] is None:
        return bytearray(size)
    buffer = mmap.mmap(-1, size, flags=flags[0] | flags[1])
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None and size >= HUGE_PAGES_MIN_BYTES:
        try:  # noqa: SIM105 (contextlib is not imported on a command's way to its read)
            buffer.madvise(advice)
        except OSError:  # a kernel without them: small pages, as before
            pass
    return buffer


HUGE_PAGES_MIN_BYTES = 4 << 20


_RANK_IN_NAME = r"rank[-_]?(\d+)"


def _blank(data: Buffer) -> bool:
    """Whether the bytes are empty or only whitespace (what `\\s` matches: space, \\t \\n \\r
    \\v \\f); a trace answers from its first bytes."""
    if data[:64].strip():
        return False
    return not data or bytes(data).isspace()


class RawTrace:
    """One parsed trace file: its events and its top-level metadata (everything but the events).

    `typed`: the events are `schema.Event` structs (the fast path) rather than dicts.

    A plain class, not a dataclass: this module is imported before a command starts reading
    its file, and `dataclasses` imports `inspect` (~10 ms of the command's start-up).
    """

    __slots__ = ("events", "metadata", "path", "typed")

    def __init__(
        self,
        path: str | Path,  # (a command's plain path never imports pathlib: ~5 ms of its start-up)
        events: list[Any],
        metadata: dict[str, Any] | None = None,
        typed: bool = False,
    ) -> None:
        self.path = path
        self.events = events
        self.metadata: dict[str, Any] = {} if metadata is None else metadata
        self.typed = typed

    def __repr__(self) -> str:
        return (
            f"RawTrace(path={self.path!r}, events=<{len(self.events)}>, "
            f"metadata={self.metadata!r}, typed={self.typed!r})"
        )

    @property
    def rank(self) -> int | None:
        """The rank from `distributedInfo`, else from a `rank<N>` in the file name, else None."""
        info = self.metadata.get("distributedInfo")
        if isinstance(info, dict) and isinstance(info.get("rank"), int):
            return int(info["rank"])
        import re

        match = re.search(_RANK_IN_NAME, os.path.basename(self.path), re.IGNORECASE)
        return int(match.group(1)) if match else None

    @property
    def world_size(self) -> int | None:
        info = self.metadata.get("distributedInfo")
        if isinstance(info, dict) and isinstance(info.get("world_size"), int):
            return int(info["world_size"])
        return None


def find_trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders (their `*.json` and `*.json.gz`, not recursive) into trace files."""
    from pathlib import Path

    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = sorted(
                p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
            )
            if not inside:
                raise InputError("PATH", f"folder {path} holds no .json or .json.gz trace")
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        else:
            raise InputError("PATH", f"{path}: no such file or folder")
    if not found:
        raise InputError("PATH", "give at least one trace file or folder")
    return found


def trace_files(paths: Iterable[str | Path]) -> list[str | Path]:
    """`find_trace_files`, except that one existing file is kept as it was given: a command's
    plain path then never imports pathlib (~5 ms of its start-up; in `prefetch`'s thread the
    import would hold the GIL)."""
    given = list(paths)
    if len(given) == 1 and os.path.isfile(given[0]):
        return given
    return list(find_trace_files(given))


# A command's start-up overlap (`prefetch`): the first file's bytes, read and decompressed in a
# background thread while the main thread imports numpy and the analysis; taken by `read_trace`.
_prefetch_thread: Any = None
_prefetched: dict[str, Buffer] = {}

# Where `analyze_file` leaves each parsed trace instead of freeing it, when not None: a command
# that exits right after (os._exit) need not spend time freeing a million objects.
keep_parsed: list[Any] | None = None


def prefetch(paths: Iterable[str | Path]) -> None:
    """Start reading and decompressing the first trace file of `paths` in a background thread.

    Decompression releases the GIL, so it runs beside the imports that follow (numpy's is the
    longest). Only the first file: the overlap is with start-up, which is over after one file,
    and a folder of many ranks would otherwise hold them all in memory. Any failure is left for
    `read_trace` to meet and report as usual.
    """
    import threading

    global _prefetch_thread
    if _prefetch_thread is not None or _prefetched:  # one at a time: the next read takes it
        return

    def work() -> None:
        try:
            first = trace_files(list(paths)[:1])[0]  # (a folder's first file is the first)
            _prefetched[str(first)] = _read_bytes(first)
        except Exception:  # read_trace reads it again and says what is wrong
            pass

    _prefetch_thread = threading.Thread(target=work, name="scalelab-trace-prefetch", daemon=True)
    _prefetch_thread.start()


def remember(path: str | Path, data: Buffer) -> None:
    """Keep a file's bytes for the next `read_trace` of it (which takes them)."""
    _prefetched[str(path)] = data


def forget(path: str | Path) -> None:
    _prefetched.pop(str(path), None)


def read_bytes(path: str | Path) -> Buffer:
    """A trace file's bytes, decompressed (or those prefetched or remembered for it)."""
    data = take_prefetched(path)
    return _read_bytes(path) if data is None else data


def take_prefetched(path: str | Path) -> Buffer | None:
    """The bytes prefetched or remembered for this file (then forgotten), or None."""
    global _prefetch_thread
    if _prefetch_thread is None:
        return _prefetched.pop(str(path), None)
    _prefetch_thread.join()
    _prefetch_thread = None
    data = _prefetched.pop(str(path), None)
    _prefetched.clear()
    return data


def typed_parser_available() -> bool:
    """Whether the msgspec fast path is there (imports it: a command calls this to import the
    decoder while its file is read)."""
    return _typed() is not None


def read_trace(path: str | Path, *, parser: Parser = "auto") -> RawTrace:
    """Read and parse one trace file; gzip is recognised by its magic bytes, not by the name.

    `auto` decodes with the typed fast path (msgspec) where the file fits its
    types, and otherwise with orjson, which reads any trace and says what is wrong with a bad one;
    `general` always uses orjson.
    """
    data = read_bytes(path)
    schema = _typed() if parser == "auto" else None
    if schema is not None:
        try:
            events, metadata = schema.decode(data)
        except schema.DecodeFailed:
            pass  # unusual or broken: the general parser reads it, or says what is wrong
        else:
            return RawTrace(path, events, metadata, typed=True)
    return _parse_general(path, data)


def _read_bytes(path: str | Path) -> Buffer:
    where = str(path)
    try:
        with open(path, "rb") as file:
            data: Buffer = file.read()
    except OSError as exc:
        raise InputError(where, f"cannot read the file ({exc.strerror or exc})") from None
    if data[:2] == GZIP_MAGIC:
        # In one call: a thread (`prefetch`) then releases the GIL once, not once a piece.
        data = inflate(data, where)
    if _blank(data):
        raise InputError(where, "empty file: a trace is a JSON object with a 'traceEvents' list")
    return data


# Decompressing into a buffer made beforehand, this much compressed input at a time: each
# piece's output (~70 kB, small enough for malloc to reuse freed memory; 64 kB of input made
# ~1 MB outputs, each mapped afresh: twice the pages) reuses the memory the previous one freed,
# so the pages touched are the buffer's alone. Decompressing in one call makes the output grow
# in fresh memory instead, ~1.7x its size in new pages; and a part of it cut out for decoding is
# a copy, in more new pages. New pages are dear on this machine (~2-3 us each, more than decompressing them):
# a100-rank0-of-16's second half for the split's child, 41 -> 29 ms (11,200 -> 4,600 pages).
_PIECE = 1 << 12


def gzip_size(data: Buffer) -> int:
    """ISIZE, the gzip trailer's uncompressed size modulo 2**32 (0 if too short)."""
    return int.from_bytes(data[-4:], "little") if len(data) > 18 else 0


def _pieces(decompressor: Any, data: Buffer) -> Iterator[bytes]:
    """The decompressed output of `data`, a piece at a time, to the end of the stream."""
    view = memoryview(data)
    for i in range(0, len(view), _PIECE):
        out = decompressor.decompress(view[i : i + _PIECE])
        if out:
            yield out
        if decompressor.eof:
            return


def inflate_head(data: Buffer, size: int) -> tuple[bytearray | mmap.mmap, int]:
    """A buffer holding at least the first `size` decompressed bytes of a gzip file (fewer if
    it is shorter), and how many it holds (zeros follow); its reader may change it. The CRC is
    not checked (that needs all of it): for a reader that also inflates it whole."""
    out = mutable_buffer(size + (1 << 21))
    pos = 0
    for piece in _pieces(_inflate.decompressobj(31), data):
        n = min(len(piece), len(out) - pos)
        out[pos : pos + n] = piece if n == len(piece) else piece[:n]
        pos += n
        if pos >= size or pos == len(out):
            break
    return out, pos


def inflate_tail(data: Buffer, start: int) -> bytearray | mmap.mmap | None:
    """A gzip file's decompressed bytes from byte `start` on, in a buffer its reader may
    change, the CRC checked; the bytes before `start` are decompressed and dropped a piece at
    a time. None if the file is not one gzip member of the size its trailer says, or is
    corrupt: a reader that inflates it whole says what is wrong."""
    size = gzip_size(data)
    if not 0 <= start < size:
        return None
    out = mutable_buffer(size - start)
    pos = 0  # bytes decompressed so far
    try:
        decompressor = _inflate.decompressobj(31)
        for piece in _pieces(decompressor, data):
            end = pos + len(piece)
            if end > size:
                return None
            if end > start:
                skip = max(start - pos, 0)
                out[pos + skip - start : end - start] = piece[skip:] if skip else piece
            pos = end
        rest = decompressor.unused_data
    except Exception:  # zlib.error or isal's own error type
        return None
    if not decompressor.eof or pos != size or (rest and rest.strip(b"\0")):
        return None
    return out


def inflate(data: Buffer, where: str) -> bytes:
    """A gzip file's bytes decompressed in one call (InputError if corrupt or truncated): with
    ISA-L (the `isal` package, the `fast` extra: 2-3x faster) when installed, else zlib; the gzip
    trailer's CRC is checked by either."""
    try:
        decompressor = _inflate.decompressobj(31)  # 31: a gzip header and trailer
        out = decompressor.decompress(data)
        eof, rest = decompressor.eof, decompressor.unused_data
    except Exception as exc:  # zlib.error or isal's own error type
        raise InputError(where, f"corrupt gzip file ({_one_line(exc)})") from None
    if not eof:
        raise InputError(
            where, "truncated gzip file: the compressed data ends before its end marker"
        )
    if rest and rest.strip(b"\0"):  # several gzip members (concatenated files): the general reader
        import gzip

        try:
            return gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as exc:
            raise InputError(where, f"corrupt gzip file ({_one_line(exc)})") from None
    return out


def _parse_general(path: str | Path, data: Buffer) -> RawTrace:
    import orjson  # only here: the typed fast path reads most traces without it

    where = str(path)
    try:
        document = orjson.loads(data if isinstance(data, (bytes, bytearray)) else memoryview(data))
    except orjson.JSONDecodeError as exc:
        raise InputError(where, f"not valid JSON ({_one_line(exc)})") from None
    if isinstance(document, list):  # the Chrome "JSON array" form: just the events
        return RawTrace(path, document, {})
    if not isinstance(document, dict) or "traceEvents" not in document:
        keys = (
            ", ".join(list(document)[:6]) if isinstance(document, dict) else type(document).__name__
        )
        raise InputError(
            where,
            f"not a PyTorch profiler trace: no 'traceEvents' list (found: {keys or 'an empty object'})",
        )
    events = document.pop("traceEvents")
    if not isinstance(events, list):
        raise InputError(f"{where}: traceEvents", f"must be a list, not {type(events).__name__}")
    return RawTrace(path, events, document)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
