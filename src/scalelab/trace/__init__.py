"""Analyse PyTorch profiler (Kineto / Chrome-trace JSON) traces: compute, communication, overlap
and exposed communication per rank and per profiler step; stragglers across ranks (`stragglers`);
idle causes, launch statistics and kernel classes (`kernels`); collective bandwidth from the
trace's metadata (`collectives`); what grew between two runs (`diff`). Never imports torch.

    from scalelab.trace import analyze
    report = analyze(["traces/"])          # files or folders, one trace per rank
    report.ranks[0].total.exposed_comm_ns  # integer nanoseconds
    report.stragglers                      # None for one rank
    report.to_pandas()["steps"]            # every table as a pandas DataFrame
    report.to_dict()                       # JSON-ready (schema scalelab.trace/2)
"""

from __future__ import annotations

from scalelab.trace.analyze import analyze, analyze_file
from scalelab.trace.report import (
    Breakdown,
    CollectiveStats,
    RankReport,
    StepBreakdown,
    Summary,
    TraceReport,
)

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
