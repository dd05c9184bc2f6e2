"""Analyse PyTorch profiler (Kineto / Chrome-trace JSON) traces: compute, communication, overlap
and exposed communication per rank and per profiler step; stragglers across ranks (`stragglers`);
idle causes, launch statistics and kernel classes (`kernels`); collective bandwidth from the
trace's metadata (`collectives`); what grew between two runs (`diff`). Never imports torch.

    from scalelab.trace import analyze
    report = analyze(["traces/"])          # files or folders, one trace per rank
    report.ranks[0].total.exposed_comm_ns  # integer nanoseconds
    report.stragglers                      # None for one rank
    report.ranks[0].kernels, report.ranks[0].bandwidth
    report.to_dict()                       # JSON-ready (schema scalelab.trace/2)
"""

from __future__ import annotations

import sys
import types
from importlib import import_module

TYPE_CHECKING = False  # (no `typing` import: see `load`)
if TYPE_CHECKING:
    from typing import Any

    from scalelab.trace.analyze import analyze, analyze_file
    from scalelab.trace.report import (
        Breakdown,
        CollectiveStats,
        RankReport,
        StepBreakdown,
        Summary,
        TraceReport,
    )

# Resolved on first use, so that importing a submodule (`scalelab.trace.load`, `columns`) does
# not import numpy and the whole analysis: the `scalelab trace` command starts reading its first
# file before that import (see `background`).
_LAZY = {
    "analyze": "scalelab.trace.analyze",
    "analyze_file": "scalelab.trace.analyze",
    "Breakdown": "scalelab.trace.report",
    "CollectiveStats": "scalelab.trace.report",
    "RankReport": "scalelab.trace.report",
    "StepBreakdown": "scalelab.trace.report",
    "Summary": "scalelab.trace.report",
    "TraceReport": "scalelab.trace.report",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """Importing the submodule `scalelab.trace.analyze` binds it on the package under its own
    name, over the function of that name: the package keeps the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "analyze" and isinstance(value, types.ModuleType):
            value = value.analyze
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "Breakdown",
    "CollectiveStats",
    "RankReport",
    "StepBreakdown",
    "Summary",
    "TraceReport",
    "analyze",
    "analyze_file",
]
