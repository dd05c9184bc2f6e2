"""Stragglers on a synthetic 4-rank trace where rank 2 is late, and bandwidth from metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
from trace_helpers import write_trace, x

from scalelab.trace import analyze

HOST, DEVICE = 100, 0
US = 1000
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _rank_trace(tmp_path: Path, rank: int, *, with_seq: bool) -> Path:
    """Two steps of 200 µs: a gemm, then an all-reduce of 1,000,000 floats over 4 ranks.
    Rank 2's gemm takes 150 µs (the others' 100), so it reaches the all-reduce last; everyone's
    all-reduce ends at 190 µs: the others wait 50 µs each. In step 2 rank 2 is late by 30 µs.
    Rank 1 runs one more small kernel at the end, so it has the longest wall time."""
    events: list[dict] = []
    corr = 0
    for step, base in ((1, 0), (2, 200)):
        late = {1: 50, 2: 30}[step] if rank == 2 else 0
        events.append(x(f"ProfilerStep#{step}", base, 200, cat="user_annotation", pid=HOST, tid=1))
        for name, ts, dur, stream, meta in (
            ("sm90_xmma_gemm", base, 100 + late, 7, {}),
            (
                ALLREDUCE,
                base + 100 + late,
                90 - late,
                20,
                {
                    "Collective name": "allreduce",
                    "In msg nelems": 1_000_000,
                    "Out msg nelems": 1_000_000,
                    "dtype": "Float",
                    "Group size": 4,
                    "Process Group Name": "0",
                    **({"Seq": step} if with_seq else {}),
                },
            ),
        ):
            corr += 1
            events.append(
                x(
                    "cudaLaunchKernel",
                    base + corr,
                    1,
                    cat="cuda_runtime",
                    pid=HOST,
                    tid=1,
                    correlation=corr,
                )
            )
            events.append(
                x(name, ts, dur, cat="kernel", pid=DEVICE, tid=stream, correlation=corr, **meta)
            )
    if rank == 1:
        corr += 1
        events.append(
            x("cudaLaunchKernel", 390, 1, cat="cuda_runtime", pid=HOST, tid=1, correlation=corr)
        )
        events.append(x("tail_kernel", 395, 20, cat="kernel", pid=DEVICE, tid=7, correlation=corr))
    return write_trace(
        tmp_path / f"rank{rank}.json", events, distributedInfo={"rank": rank, "world_size": 4}
    )


@pytest.mark.parametrize("with_seq", [True, False])
def test_the_late_rank_is_the_straggler_not_the_longest(tmp_path: Path, with_seq: bool) -> None:
    for rank in range(4):
        _rank_trace(tmp_path, rank, with_seq=with_seq)
    report = analyze(tmp_path)
    s = report.stragglers
    assert s is not None
    assert s.match == ("sequence number" if with_seq else "order")
    assert s.straggler == 2
    assert report.summary.straggler_rank == 2
    assert report.summary.slowest_rank == 1  # the longest wall: not the cause
    assert len(s.collectives) == 2
    first, second = s.collectives
    assert first.straggler == second.straggler == 2
    assert first.step == 1 and second.step == 2
    assert first.lag_ns == [50 * US, 50 * US, 0, 50 * US]
    assert first.wait_ns == 150 * US and second.wait_ns == 90 * US
    by_rank = {r.rank: r for r in s.ranks}
    assert by_rank[2].times_last == 2 and by_rank[2].caused_ns == 240 * US
    assert by_rank[2].waited_ns == 0
    assert by_rank[0].waited_ns == 80 * US and by_rank[0].mean_lag_ns == 40 * US
    assert [(p.step, p.straggler, p.caused_ns) for p in s.steps] == [
        (1, 2, 150 * US),
        (2, 2, 90 * US),
    ]
    document = report.to_dict()
    assert document["stragglers"]["straggler"] == 2
    assert document["summary"]["straggler_rank"] == 2


def test_bandwidth_from_metadata_after_the_last_arrival(tmp_path: Path) -> None:
    """4,000,000 bytes all-reduced over 4 ranks in the 40 µs after the last rank arrived (step 1)
    and 60 µs (step 2): algbw = bytes / median time, busbw = algbw x 2(n-1)/n (nccl-tests)."""
    for rank in range(4):
        _rank_trace(tmp_path, rank, with_seq=True)
    report = analyze(tmp_path)
    for r in report.ranks:
        (row,) = r.bandwidth
        assert (row.collective, row.nbytes, row.group_size, row.count) == ("AllReduce", 4e6, 4, 2)
        assert row.time_median_ns == 50 * US  # median of 40 and 60 µs
        assert row.algbw_gbps == pytest.approx(4e6 / 50e-6 / 1e9)
        assert row.busbw_gbps == pytest.approx(80 * 1.5)
        assert row.busbw_best_gbps == pytest.approx(4e6 / 40e-6 / 1e9 * 1.5)
    # One rank alone cannot know it waited: its kernels' own durations.
    alone = analyze(tmp_path / "rank0.json").ranks[0]
    (row,) = alone.bandwidth
    assert row.time_median_ns == 90 * US
    assert row.busbw_gbps == pytest.approx(4e6 / 90e-6 / 1e9 * 1.5)


def test_straggler_command_json_and_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from scalelab.cli import main

    for rank in range(4):
        _rank_trace(tmp_path, rank, with_seq=False)
    main(["trace", str(tmp_path), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert document["stragglers"]["straggler"] == 2
    assert [s["straggler"] for s in document["stragglers"]["steps"]] == [2, 2]
    main(["trace", str(tmp_path), "--stragglers", "--plot", str(tmp_path / "png")])
    out = capsys.readouterr().out
    assert "straggler: rank 2" in out and "arrival lag per rank" in out
    png = tmp_path / "png" / "stragglers.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
