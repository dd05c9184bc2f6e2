"""Helpers for the trace analyser's tests: the project's copies of the real traces (never
../shared), and small handmade traces."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from scalelab.trace import RankReport, analyze_file
from scalelab.trace.load import Parser

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


@functools.cache
def real(name: str, parser: Parser = "auto") -> RankReport:
    """The analysis of one real trace, computed once per test session and parser."""
    return analyze_file(TRACES / name, parser=parser)


def write_trace(path: Path, events: list[dict[str, Any]], **metadata: Any) -> Path:
    """A Kineto-style JSON file with these events."""
    path.write_text(json.dumps({"schemaVersion": 1, **metadata, "traceEvents": events}))
    return path


def x(
    name: str, ts: float, dur: float, *, cat: str, pid: Any = 1, tid: Any = 1, **args: Any
) -> dict[str, Any]:
    """One complete ('X') event."""
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }
