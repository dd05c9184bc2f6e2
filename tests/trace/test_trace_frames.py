"""`TraceReport.to_pandas()`: the report's tables as DataFrames, equal to the report's numbers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from trace_helpers import TRACES

from scalelab.errors import InputError
from scalelab.trace import analyze


def test_every_table_of_one_rank(tmp_path: Path) -> None:
    report = analyze(TRACES / "a100-ddp-rank0-of-2.json.gz")
    tables = report.to_pandas()
    assert set(tables) == {"steps", "collectives", "stragglers", "idle", "kernels", "bandwidth"}
    steps = tables["steps"]
    rank = report.ranks[0]
    assert steps["step"].tolist() == [4, 5, 6]
    assert steps["exposed_comm_ns"].sum() == 39_559_468 == rank.total.exposed_comm_ns
    collectives = tables["collectives"]
    whole = collectives[collectives["step"].isna() & (collectives["collective"] == "AllReduce")]
    assert whole["count"].tolist() == [15]
    assert tables["stragglers"].empty  # one rank
    assert set(tables["idle"]["stream"]) == {s.stream for s in rank.kernels.streams}  # type: ignore[union-attr]
    kernels = tables["kernels"]
    assert set(kernels["class"]) == {c.kernel_class for c in rank.kernels.classes}  # type: ignore[union-attr]
    assert tables["bandwidth"]["lower_bound"].all()
    assert report.to_pandas("steps").equals(steps)


def test_stragglers_of_two_ranks(tmp_path: Path) -> None:
    for name in ("sampled-rank0-of-128.json.gz", "sampled-rank1-of-128.json.gz"):
        shutil.copy(TRACES / name, tmp_path / name)
    report = analyze(tmp_path)
    lags = report.to_pandas("stragglers")
    assert report.stragglers is not None
    assert lags["rank"].tolist() == [0, 1]
    assert lags.loc[lags["straggler"], "rank"].tolist() == [report.stragglers.straggler]
    assert lags["caused_ns"].sum() == lags["waited_ns"].sum()


def test_an_unknown_table_is_one_clear_error() -> None:
    report = analyze(TRACES / "amd-mi250-rocm.json.gz")
    with pytest.raises(InputError, match="steps, collectives"):
        report.to_pandas("step")


def test_the_notebook_example_draws_its_figures(tmp_path: Path) -> None:
    """examples/trace_notebook.py, run whole on a two-rank folder."""
    import runpy
    import sys

    traces = tmp_path / "traces"
    traces.mkdir()
    for name in ("sampled-rank0-of-128.json.gz", "sampled-rank1-of-128.json.gz"):
        shutil.copy(TRACES / name, traces / name)
    script = Path(__file__).resolve().parents[2] / "examples" / "trace_notebook.py"
    argv = sys.argv
    sys.argv = [str(script), str(traces), str(tmp_path / "figures")]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    names = sorted(p.name for p in (tmp_path / "figures").glob("*.png"))
    assert names == [
        "exposed_per_step.png",
        "idle_causes.png",
        "kernel_classes.png",
        "step_breakdown.png",
        "stragglers.png",
    ]


def test_a_script_may_call_analyze_at_top_level(tmp_path: Path) -> None:
    """The pool's workers never run the caller's script again (no `__main__` guard needed)."""
    import os
    import subprocess
    import sys

    for name in ("sampled-rank0-of-128.json.gz", "sampled-rank1-of-128.json.gz"):
        shutil.copy(TRACES / name, tmp_path / name)
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from scalelab.trace import analyze\n"
        f"report = analyze({str(tmp_path)!r}, workers=2)\n"
        "print('straggler', report.stragglers.straggler)\n"
    )
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.count("straggler") == 1
