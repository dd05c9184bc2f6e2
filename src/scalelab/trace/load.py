"""Find and read PyTorch profiler traces (Chrome-trace / Kineto JSON, optionally gzipped).

One JSON decoder, msgspec: the typed decoder (`schema`) reads only the fields the analysis needs
into small structs (the whole analysis of a million-event trace 1.47x faster than with a generic
decode: 6.7 s against 9.8 s, `benchmarks/trace_speed.py`, 2026-12-05 on the loaded 2-core build
machine); a trace that does not fit those types is decoded generically, into
dicts, by the same library, which also says what is wrong with a bad file.
Every way a file can be unusable (missing, truncated gzip, invalid JSON, JSON that is not a trace)
becomes an `InputError` that names the file and says what is wrong, never a traceback.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import msgspec

from scalelab.errors import InputError
from scalelab.trace import schema

try:  # ISA-L's inflate, 2-3x faster than zlib's (optional: the `fast` extra)
    from isal import isal_zlib as _inflate
except ImportError:
    _inflate = zlib  # type: ignore[assignment,misc,unused-ignore]

Parser = Literal["auto", "general"]

TRACE_SUFFIXES = (".json", ".json.gz")
GZIP_MAGIC = b"\x1f\x8b"
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


class RawTrace:
    """One parsed trace file: its events and its top-level metadata (everything but the events).

    `typed`: the events are `schema.Event` structs (the fast path) rather than dicts.
    """

    __slots__ = ("events", "metadata", "path", "typed")

    def __init__(
        self,
        path: str | Path,
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
        if isinstance(info, dict) and _is_int(info.get("rank")):
            return int(info["rank"])
        match = _RANK_IN_NAME.search(os.path.basename(self.path))
        return int(match.group(1)) if match else None

    @property
    def world_size(self) -> int | None:
        info = self.metadata.get("distributedInfo")
        if isinstance(info, dict) and _is_int(info.get("world_size")):
            return int(info["world_size"])
        return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def find_trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders (their `*.json` and `*.json.gz`, not recursive) into trace files;
    the same file given twice (directly, through a folder or a link) is refused."""
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
    seen: dict[Path, Path] = {}
    for path in found:
        real = path.resolve()
        if real in seen:
            raise InputError(
                "PATH", f"{seen[real]} and {path} are the same file: give each rank's trace once"
            )
        seen[real] = path
    return found


def read_trace(path: str | Path, *, parser: Parser = "auto") -> RawTrace:
    """Read and parse one trace file; gzip is recognised by its magic bytes, not by the name.

    `auto` decodes with the typed decoder (`schema`) where the file fits its types, and
    otherwise generically; `general` always decodes generically (the same results, slower).
    """
    data = read_bytes(path)
    if parser == "auto":
        try:
            events, metadata = schema.decode(data)
        except schema.DecodeFailed:
            pass  # unusual or broken: the generic decode reads it, or says what is wrong
        else:
            return RawTrace(path, events, metadata, typed=True)
    return _parse_general(path, data)


def read_bytes(path: str | Path) -> bytes:
    """A trace file's bytes, decompressed: a regular file only (a link to /dev/zero, a FIFO or a
    folder is refused), read and inflated up to `scalelab.io`'s bound on one input file
    (`SCALELAB_MAX_INPUT_MIB`), so that neither an endless file nor a gzip bomb is read to its end."""
    from scalelab.io import max_input_bytes, read_user_bytes

    where = str(path)
    limit = max_input_bytes()
    data = read_user_bytes(where, path, limit=limit)
    if data[:2] == GZIP_MAGIC:
        data = inflate(data, where, limit)
    if not data.strip():
        raise InputError(where, "empty file: a trace is a JSON object with a 'traceEvents' list")
    return data


def inflate(data: bytes, where: str, limit: int) -> bytes:
    """A gzip file's bytes decompressed to at most `limit` bytes (InputError if corrupt, truncated
    or larger): with ISA-L (the `isal` package, the `fast` extra: 2-3x faster) when installed, else
    zlib; the gzip trailer's CRC is checked by either."""
    from scalelab.io import gunzip_bounded

    try:
        decompressor = _inflate.decompressobj(31)  # 31: a gzip header and trailer
        out = decompressor.decompress(data, limit + 1)
        eof, rest = decompressor.eof, decompressor.unused_data
    except Exception as exc:  # zlib.error or isal's own error type
        raise InputError(where, f"corrupt gzip file ({_one_line(exc)})") from None
    if len(out) > limit:
        raise InputError(
            where,
            f"inflates to more than the {limit / 2**20:g} MiB scalelab reads from one input file "
            "(set SCALELAB_MAX_INPUT_MIB to raise the bound)",
        )
    if not eof:
        raise InputError(
            where, "truncated gzip file: the compressed data ends before its end marker"
        )
    if rest and rest.strip(b"\0"):  # several gzip members (concatenated files)
        return gunzip_bounded(where, Path(where), data, limit)
    return bytes(out)


def _parse_general(path: str | Path, data: bytes) -> RawTrace:
    where = str(path)
    try:
        document = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise InputError(where, f"not valid JSON ({_one_line(exc)})") from None
    except RecursionError:
        raise InputError(where, "not a trace: JSON nested too deeply to read") from None
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
