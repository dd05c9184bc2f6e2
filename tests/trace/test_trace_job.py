"""A real job's worth of ranks: 1,024 rank files made from a real trace (rank ids rewritten,
clocks shifted, one rank late), analysed together with stragglers (issue 33, item 2)."""

from __future__ import annotations

from pathlib import Path

from trace_helpers import TRACES

from scalelab.trace import analyze
from scalelab.trace.synthetic import write_job

# The device events, launch calls and step annotations of the real trace (what the analysis
# reads), so that 1,024 files are written in seconds.
KEEP = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "user_annotation"})
N_RANKS = 1024
LATE = 700


def test_1024_ranks_with_their_straggler(tmp_path: Path) -> None:
    source = TRACES / "sampled-rank0-of-128.json.gz"
    files = write_job(
        source, tmp_path, N_RANKS, late_rank=LATE, late_us=2_000, keep_categories=KEEP
    )
    assert len(files) == N_RANKS
    report = analyze(tmp_path, kernels=False)
    assert [r.rank for r in report.ranks] == list(range(N_RANKS))
    assert report.summary.n_ranks == N_RANKS
    found = report.stragglers
    assert found is not None and found.match == "order"
    assert found.straggler == LATE
    assert all(len(c.ranks) == N_RANKS for c in found.collectives)
    assert all(c.straggler == LATE for c in found.collectives)
    late = next(r for r in found.ranks if r.rank == LATE)
    assert late.times_last == len(found.collectives) == 10
    # Every rank holds the same trace: the same breakdown, shifted in time.
    first = report.ranks[0]
    assert all(r.total.to_dict() == first.total.to_dict() for r in report.ranks)
    # Peak memory is a benchmark figure (benchmarks/trace_speed.py --job 1024, docs/benchmarks.md),
    # not asserted here: this process's peak includes every earlier test of the suite.
