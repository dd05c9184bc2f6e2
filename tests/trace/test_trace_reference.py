"""The real traces give the reference numbers (tests/data/traces/README.md), exactly, and the
per-step numbers add up to them."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
from trace_helpers import TRACES, real

from scalelab.trace import Breakdown, analyze
from scalelab.trace.load import Parser, read_trace, typed_parser_available
from scalelab.trace.report import TIME_FIELDS

# file: (comm µs, overlap µs, exposed µs, overlap %), from the reference table.
REFERENCE = {
    "a100-ddp-rank0-of-2.json.gz": (46_864, 7_196, 39_668, 15.36),
    "v100-ddp-rank1-of-2.json.gz": (357_343, 0, 357_343, 0.00),
    "sampled-rank0-of-128.json.gz": (396_199, 59_216, 336_983, 14.95),
    "sampled-rank1-of-128.json.gz": (379_053, 75_530, 303_523, 19.93),
    "a100-rank0-of-16.json.gz": (187_870, 2_553, 185_317, 1.36),
    "rank3-of-8.json.gz": (163_535, 75_614, 87_921, 46.24),
    "rank1-of-2.json.gz": (251_341, 178_043, 73_298, 70.84),
    "single-rank-no-comm.json.gz": (0, 0, 0, None),
    "amd-mi250-rocm.json.gz": (0, 0, 0, None),
}
ALL = sorted(p.name for p in TRACES.glob("*.json.gz"))


def test_the_project_holds_all_ten_traces() -> None:
    assert len(ALL) == 10
    assert (TRACES / "LICENSE-HTA").is_file()


@pytest.mark.parametrize("parser", ["auto", "general"])
@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_whole_trace_numbers_match_the_reference_table(name: str, parser: Parser) -> None:
    """Both parsers: the typed fast path (msgspec, where installed) and the general one (orjson)."""
    comm, overlap, exposed, pct = REFERENCE[name]
    total = real(name, parser).total
    assert (total.comm_us, total.overlap_us, total.exposed_comm_us) == (comm, overlap, exposed)
    if pct is None:
        assert total.overlap_pct is None
    else:
        assert round(total.overlap_pct, 2) == pct  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_per_step_numbers_add_up_to_the_reference(name: str) -> None:
    """All communication of these traces lies in profiler steps: the steps alone give the table."""
    comm, overlap, exposed, _ = REFERENCE[name]
    rank = real(name)
    assert rank.steps, "every reference trace has profiler steps"
    assert sum(s.comm_us for s in rank.steps) == comm
    assert sum(s.overlap_us for s in rank.steps) == overlap
    assert sum(s.exposed_comm_us for s in rank.steps) == exposed


@pytest.mark.parametrize("name", ALL)
def test_steps_and_the_rest_partition_the_trace(name: str) -> None:
    rank = real(name)
    # What lies outside the steps is a real (non-negative) remainder, not a balancing figure.
    assert all(getattr(rank.outside_steps, f) >= 0 for f in TIME_FIELDS)
    assert Breakdown.sum([*rank.steps, rank.outside_steps]) == rank.total
    for part in [*rank.steps, rank.total, rank.outside_steps]:
        # The four disjoint states of a moment add up to the window.
        assert (
            part.compute_us + part.exposed_comm_us + part.copy_only_us + part.idle_us
            == part.wall_us
        )
        assert part.overlap_us + part.exposed_comm_us == part.comm_us
    starts = [s.start_us for s in rank.steps]
    assert starts == sorted(starts)
    if rank.step_source == "device":  # device windows are contiguous
        for a, b in zip(rank.steps, rank.steps[1:], strict=False):
            assert a.start_us + a.wall_us == b.start_us


def _bitmap_breakdown(name: str, lo: int, hi: int) -> tuple[int, int, int]:
    """comm, compute and exposed µs in [lo, hi), by marking every microsecond: an independent,
    naive computation of the same definitions straight from the JSON."""
    with gzip.open(TRACES / name) as fh:
        events = json.load(fh)["traceEvents"]
    comm = np.zeros(hi - lo, dtype=bool)
    compute = np.zeros(hi - lo, dtype=bool)
    for ev in events:
        if ev.get("ph") != "X" or ev.get("cat") != "kernel":
            continue
        s = math.floor(ev["ts"])
        e = s + math.floor(ev.get("dur", 0))
        target = comm if ev["name"].startswith("nccl") or "ncclKernel" in ev["name"] else compute
        target[max(s, lo) - lo : max(min(e, hi), lo) - lo] = True
    return int(comm.sum()), int(compute.sum()), int((comm & ~compute).sum())


@pytest.mark.parametrize("name", ["a100-ddp-rank0-of-2.json.gz", "rank3-of-8.json.gz"])
def test_each_step_matches_a_naive_microsecond_count(name: str) -> None:
    rank = real(name)
    for step in rank.steps:
        comm, compute, exposed = _bitmap_breakdown(
            name, step.start_us, step.start_us + step.wall_us
        )
        assert (step.comm_us, step.compute_us, step.exposed_comm_us) == (comm, compute, exposed)


@pytest.mark.parametrize("name", ALL)
def test_both_parsers_give_the_same_report(name: str) -> None:
    assert real(name, "auto").to_dict() == real(name, "general").to_dict()


@pytest.mark.skipif(not typed_parser_available(), reason="msgspec is not installed")
def test_gpu_traces_take_the_typed_fast_path() -> None:
    assert read_trace(TRACES / "v100-ddp-rank1-of-2.json.gz").typed
    assert not read_trace(TRACES / "v100-ddp-rank1-of-2.json.gz", parser="general").typed


def test_v100_steps_and_allreduce_count() -> None:
    rank = real("v100-ddp-rank1-of-2.json.gz")
    assert [s.step for s in rank.steps] == [2, 3, 4, 5, 6]
    assert rank.step_source == "device"
    assert rank.total.collectives["AllReduce"].count == 2020
    assert sum(s.collectives["AllReduce"].count for s in rank.steps) == 2020


def test_all_to_all_is_named_from_the_host_annotation() -> None:
    """NCCL runs all-to-all as SendRecv kernels; the enclosing nccl:all_to_all names it."""
    totals = real("rank1-of-2.json.gz").total.collectives
    assert totals["AllToAll"].count == 42
    assert totals["AllReduce"].count == 21
    assert sum(c.count for c in totals.values()) == 64  # every NCCL kernel is counted once


def test_traces_without_communication_give_zero_not_nan() -> None:
    for name in ("single-rank-no-comm.json.gz", "amd-mi250-rocm.json.gz"):
        rank = real(name)
        assert rank.total.exposed_comm_us == 0
        assert rank.total.comm_us == 0
        assert rank.total.compute_us > 0
        assert rank.total.overlap_pct is None
        assert rank.total.to_dict()["overlap_pct"] is None
        assert rank.total.collectives == {}


def _gloo_union_us() -> tuple[int, list[tuple[int, int]]]:
    with gzip.open(TRACES / "cpu-gloo-rank34-of-300.json.gz") as fh:
        events = json.load(fh)["traceEvents"]
    spans = sorted(
        (math.floor(e["ts"]), math.floor(e["ts"]) + math.floor(e["dur"]))
        for e in events
        if e.get("ph") == "X" and e["name"].startswith("gloo:")
    )
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return sum(e - s for s, e in merged), [(s, e) for s, e in merged]


def test_cpu_gloo_trace_gives_a_meaningful_answer() -> None:
    rank = real("cpu-gloo-rank34-of-300.json.gz")
    comm_us, merged = _gloo_union_us()
    assert rank.mode == "cpu"
    assert rank.step_source == "host"
    assert rank.n_lanes == 2  # two gloo worker threads
    assert rank.total.comm_us == comm_us > 1_000_000
    assert rank.total.collectives["AllReduce"].count == 10
    # The main thread only allocates (four aten::empty): essentially all communication is exposed.
    assert rank.total.compute_us < 10
    assert rank.total.exposed_comm_us == rank.total.comm_us - rank.total.overlap_us
    assert rank.total.exposed_comm_us > 0.99 * comm_us
    (step,) = rank.steps
    assert step.step == 551
    assert step.wall_us == 210_109
    lo, hi = step.start_us, step.start_us + step.wall_us
    in_step = sum(max(0, min(e, hi) - max(s, lo)) for s, e in merged)
    assert step.comm_us == in_step
    assert rank.outside_steps.comm_us == comm_us - in_step
    assert all(v is not None for v in (rank.total.overlap_pct, rank.total.exposed_comm_pct_of_wall))


def test_analyze_on_the_folder_summarises_across_ranks() -> None:
    report = analyze(TRACES)
    assert len(report.ranks) == 10
    assert report.summary.n_ranks == 10
    assert report.summary.basis == "mean per step"
    walls = [sum(s.wall_us for s in r.steps) / len(r.steps) for r in report.ranks]
    slowest = report.ranks[int(np.argmax(walls))]
    assert report.summary.slowest_file == slowest.file
    exposed = report.summary.metrics["exposed_comm_us"]
    means = [sum(s.exposed_comm_us for s in r.steps) / len(r.steps) for r in report.ranks]
    assert exposed.mean == pytest.approx(sum(means) / len(means))
    assert exposed.max == pytest.approx(max(means))
    text = json.dumps(report.to_dict(), allow_nan=False)  # no NaN anywhere
    assert '"schema": "scalelab.trace/1"' in text
