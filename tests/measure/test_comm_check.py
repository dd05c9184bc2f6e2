"""`scalelab comm` prints nccl-tests' table and checks the collectives' results (#wrong)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.measure.conftest import run

pytest.importorskip("torch")

CORRUPT = Path(__file__).with_name("comm_corrupt.py")


def _comm_under_torchrun(script: list[str], out: Path, *args: str):  # type: ignore[no-untyped-def]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        *script, "comm", "--out", str(out), "-n", "2", "-w", "1", *args,
    ]  # fmt: skip
    # Warnings shown (the suite's children hide them): none of comm's own calls may warn.
    return run(cmd, timeout=240, PYTHONWARNINGS="default")


@pytest.mark.distributed
def test_comm_check_catches_a_corrupted_all_gather(tmp_path) -> None:
    """Rank 1 adds 1 to one element of every all-gather result: `--check` counts it in both
    modes (#wrong 1 out-of-place and in-place, on every size), the footer says FAILED, the record
    is `failed` and the command exits non-zero, as nccl-tests does; all_reduce stays right."""
    r = _comm_under_torchrun(
        [str(CORRUPT)],
        tmp_path,
        "--collectives", "all_reduce,all_gather", "-b", "64", "-e", "1K", "-f", "4",
        "--check", "1",
    )  # fmt: skip
    assert r.returncode != 0, r.stdout
    lines = r.stdout.splitlines()
    body = [ln.split() for ln in lines if ln and not ln.startswith(("#", "record", "error"))]
    gather = [f for f in body if f[3] == "none"]
    reduce = [f for f in body if f[3] == "sum"]
    assert [int(f[0]) for f in gather] == [64, 256, 1024]
    assert all(f[8] == "1" and f[12] == "1" for f in gather), lines
    assert all(f[8] == "0" and f[12] == "0" for f in reduce), lines
    assert "# Out of bounds values : 6 FAILED" in lines
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record["status"] == "failed" and record["summary"]["out_of_bounds_values"] == 6
    assert "FutureWarning" not in r.stderr, r.stderr[-2000:]


@pytest.mark.distributed
def test_comm_prints_nccl_tests_columns(tmp_path) -> None:
    """The real run: nccl-tests' header, size/count per collective (4 ranks' chunking rules on 2
    ranks: all_gather's count is the per-rank chunk), #wrong 0 where checked and N/A where
    nccl-tests does not check (in-place all_to_all), the average bus bandwidth line equal to the
    mean of every line's busbw, and no deprecation warning on stderr."""
    r = _comm_under_torchrun(
        ["-m", "scalelab"],
        tmp_path,
        "--collectives", "all_reduce,all_gather,all_to_all", "--sizes", "4,4K",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert any(ln.split()[1:] == ["size", "count", "type", "redop", "root", "time", "algbw",
               "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"] for ln in lines)  # fmt: skip
    body = [ln.split() for ln in lines if ln and not ln.startswith(("#", "record"))]
    # size, count: all_reduce of 4 B is 1 element; all_gather and all_to_all of 4 B on 2 ranks
    # hold one element per rank (8 B); of 4 KiB, 512 elements per rank.
    assert [(f[0], f[1], f[3]) for f in body] == [
        ("4", "1", "sum"), ("4096", "1024", "sum"),
        ("8", "1", "none"), ("4096", "512", "none"),
        ("8", "1", "none"), ("4096", "512", "none"),
    ]  # fmt: skip
    assert [f[12] for f in body] == ["0", "0", "0", "0", "N/A", "N/A"]
    assert not any(float(f[7]) == 0 for f in body)  # a small message's busbw is not 0.00
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    rows = record["measurements"]["rows"]
    busbw = [x["busbw_GBps"] for x in rows] + [x["in_place"]["busbw_GBps"] for x in rows]
    avg = next(ln for ln in lines if ln.startswith("# Avg bus bandwidth"))
    assert float(avg.split(":")[1]) == pytest.approx(sum(busbw) / len(busbw), rel=1e-5)
    assert "FutureWarning" not in r.stderr and "deprecated" not in r.stderr, r.stderr[-2000:]
