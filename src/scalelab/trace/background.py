"""The `scalelab trace` command's head start: the first trace file is read, decompressed, decoded
and gathered into columns (`columns.gather`, plain Python) in a forked process while the command
itself imports numpy and the analysis, the longest part of its start-up.

The child sends the columns back through a pipe with `marshal` (plain values only) and exits; the
command's `analyze` takes them (`take`) instead of reading the file. Anything unusual (a CPU
trace, a trace the typed decoder cannot read, a bad file, a child that died) sends nothing, and
the file is read in the command's own process as usual, which reports any error as it always
does. Used by the console command only (a process that ends after one analysis), where `os.fork`
exists and before any thread is started; the library never forks.
"""

from __future__ import annotations

import marshal
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scalelab.errors import InputError

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
        try:
            with os.fdopen(write_end, "wb") as out:
                out.write(marshal.dumps(payload))
        finally:
            os._exit(0)
    os.close(write_end)
    _pending[str(first)] = (pid, read_end)
    return True


def _gather(path: Path) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    import gc

    from scalelab.trace.columns import Columns, gather
    from scalelab.trace.load import read_trace

    gc.disable()
    raw = read_trace(path)
    if not raw.typed:
        return None
    found = gather(raw)
    if not isinstance(found, Columns):
        return None
    return found.to_tuple(), raw.metadata


def take(path: str | Path) -> tuple[Any, dict[str, Any]] | None:
    """The columns and metadata a child gathered for this file (then forgotten), or None."""
    entry = _pending.pop(str(path), None)
    if entry is None:
        return None
    pid, read_end = entry
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    try:
        payload = marshal.loads(data) if data else None
    except (EOFError, ValueError, TypeError):
        return None
    if payload is None:
        return None
    from scalelab.trace.columns import Columns

    values, metadata = payload
    return Columns.from_tuple(values), metadata
