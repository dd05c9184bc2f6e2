"""`trace diff`: what grew between two runs, ranked, adding up to the step-time difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trace_helpers import write_trace, x

from scalelab.cli import main
from scalelab.trace import analyze
from scalelab.trace.diff import diff

HOST, DEVICE = 100, 0
US = 1000


def _run(path: Path, gemm: float, allgather: float, hidden: float) -> Path:
    """Two steps: a gemm [0, gemm) on stream 7, an all-gather on stream 20 that starts `hidden`
    µs before the gemm ends (hidden under it), then a 10 µs element-wise kernel after both."""
    events: list[dict] = []
    corr = 0
    step_len = gemm - hidden + allgather + 10
    for step in (1, 2):
        base = (step - 1) * step_len
        events.append(
            x(f"ProfilerStep#{step}", base, step_len, cat="user_annotation", pid=HOST, tid=1)
        )
        for name, ts, dur, stream in (
            ("sm90_xmma_gemm", base, gemm, 7),
            ("ncclDevKernel_AllGather_RING_LL(x)", base + gemm - hidden, allgather, 20),
            ("vectorized_elementwise_kernel", base + gemm - hidden + allgather, 10, 7),
        ):
            corr += 1
            events.append(
                x(
                    "cudaLaunchKernel",
                    base + corr * 0.01,
                    0.005,
                    cat="cuda_runtime",
                    pid=HOST,
                    tid=1,
                    correlation=corr,
                )
            )
            events.append(x(name, ts, dur, cat="kernel", pid=DEVICE, tid=stream, correlation=corr))
    return write_trace(path, events)


def test_diff_ranks_what_grew_and_adds_up(tmp_path: Path) -> None:
    """A: gemm 100, all-gather 40 of which 20 hidden; B (more GPUs): gemm 60 (smaller shard),
    all-gather 90 of which 20 hidden. Step 130 -> 140 µs: exposed AllGather +50, GEMM -40."""
    a = analyze(_run(tmp_path / "a.json", 100, 40, 20))
    b = analyze(_run(tmp_path / "b.json", 60, 90, 20))
    d = diff(a, b, "8 GPUs", "64 GPUs")
    assert d.a_step_ns == 130 * US and d.b_step_ns == 140 * US
    assert [r.part for r in d.rows][:2] == ["exposed comm: AllGather", "compute: GEMM"]
    gather, gemm = d.rows[0], d.rows[1]
    assert gather.delta_ns == pytest.approx(50 * US)
    assert (gather.total_a_ns, gather.total_b_ns) == (40 * US, 90 * US)
    assert gemm.delta_ns == pytest.approx(-40 * US)
    assert sum(r.delta_ns for r in d.rows) == pytest.approx(d.delta_ns)
    document = d.to_dict()
    assert document["rows"][0]["share_of_step_delta_pct"] == 500.0


def test_diff_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _run(tmp_path / "a.json", 100, 40, 20)
    b = _run(tmp_path / "b.json", 60, 90, 20)
    main(["trace", "diff", str(a), str(b), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert document["rows"][0]["part"] == "exposed comm: AllGather"
    main(["trace", "diff", str(a), str(b)])
    out = capsys.readouterr().out
    assert "exposed comm: AllGather" in out and "+0.050" in out
