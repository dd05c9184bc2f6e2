"""`scalelab calibrate --trace`: collectives observed in a profiler trace fit the cluster profile
as `comm` records' rows do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trace_helpers import TRACES

from scalelab.cli import main
from scalelab.trace import analyze
from scalelab.trace.collectives import calibration_observations


def test_observations_from_the_trace_metadata() -> None:
    """a100-ddp carries `In msg nelems`, `dtype` and `Group size` on its NCCL kernels."""
    observations = calibration_observations(analyze(TRACES / "a100-ddp-rank0-of-2.json.gz"))
    assert observations
    assert {o.collective for o in observations} == {"all_reduce"}
    assert all(o.ranks == 2 and o.nbytes % 4 == 0 and o.time_s > 0 for o in observations)
    assert sum(o.count for o in observations) == 15  # the 15 all-reduces with a size


def test_calibrate_takes_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fitted.yaml"
    trace = str(TRACES / "a100-ddp-rank0-of-2.json.gz")
    main(["calibrate", "--trace", trace, "--base", "a100-ib", "--out", str(out), "--json"])
    document = json.loads(capsys.readouterr().out)
    n = len(calibration_observations(analyze(trace)))
    comm_rows = [r for r in document["residuals"] if r["kind"] == "comm"]
    assert len(comm_rows) == n
    assert document["error_after"] < document["error_before"]
    assert out.is_file()


def test_calibrate_trace_without_metadata_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = str(TRACES / "v100-ddp-rank1-of-2.json.gz")  # NCCL kernels without sizes
    with pytest.raises(SystemExit) as done:
        main(["calibrate", "--trace", trace, "--out", str(tmp_path / "x.yaml")])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace" in err[0] and "metadata" in err[0]
