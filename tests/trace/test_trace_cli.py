"""`scalelab trace` from the command line: output for people and tools, and one clear line with
exit code 2 for every kind of bad input."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trace_helpers import TRACES, write_trace, x

from scalelab.cli import main

SRC = Path(__file__).resolve().parents[2] / "src"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(["trace", *args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("scalelab: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


def test_json_output_has_the_reference_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli([str(TRACES / "a100-ddp-rank0-of-2.json.gz"), "--json"], capsys)
    assert code == 0 and err == ""
    document = json.loads(out)
    (rank,) = document["ranks"]
    total = rank["total"]
    assert (total["comm_ns"], total["overlap_ns"], total["exposed_comm_ns"]) == (
        46_876_493,
        7_317_025,
        39_559_468,
    )
    assert total["overlap_pct"] == 15.61
    assert [s["step"] for s in rank["steps"]] == [4, 5, 6]
    assert sum(s["exposed_comm_ns"] for s in rank["steps"]) == 39_559_468
    assert total["collectives"]["AllReduce"]["count"] == 15
    assert document["summary"]["n_ranks"] == 1


def test_table_output_with_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        [
            str(TRACES / "rank3-of-8.json.gz"),
            str(TRACES / "cpu-gloo-rank34-of-300.json.gz"),
            "--per-step",
            "--unrelated",  # two different jobs
        ],
        capsys,
    )
    assert code == 0
    assert "exposed communication per rank" in out
    assert "87.921" in out  # rank 3's exposed ms
    assert "1014" in out  # a step number
    assert "AllToAll" in out
    assert "longest steps" in out
    assert "gloo" in out  # the CPU trace says how it was read


def test_plot_writes_one_png_per_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        [
            str(TRACES / "sampled-rank0-of-128.json.gz"),
            str(TRACES / "sampled-rank1-of-128.json.gz"),
            "--plot",
            str(tmp_path / "plots"),
        ],
        capsys,
    )
    assert code == 0
    pngs = sorted((tmp_path / "plots").glob("*.png"))
    assert [p.name for p in pngs] == [
        "sampled-rank0-of-128.png",
        "sampled-rank1-of-128.png",
        "stragglers.png",  # two ranks: their collectives matched
    ]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert "wrote" in out


def test_plot_step_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        [str(TRACES / "sampled-rank0-of-128.json.gz"), "--plot", str(tmp_path), "--plot-step", "9"],
        capsys,
    )
    assert_one_line_error(code, out, err, "--plot-step", "551, 552")


def _truncated_gzip(tmp_path: Path) -> Path:
    data = (TRACES / "a100-ddp-rank0-of-2.json.gz").read_bytes()
    path = tmp_path / "truncated.json.gz"
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1', ("not valid JSON", "bad.json")),
        (b"", ("empty file",)),
        (b" \t\r\n\x0b\x0c" * 50, ("empty file",)),
        (b'{"hello": "world"}', ("not a PyTorch profiler trace", "traceEvents")),
        (b"[1, 2]", ("traceEvents[0]", "object")),
        (b'{"traceEvents": []}', ("empty trace",)),
        (b'{"traceEvents": {"ph": "X"}}', ("traceEvents", "must be a list")),
        (
            json.dumps(
                {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1}]}
            ).encode(),
            ("traceEvents[0].ts", "must be a finite number"),
        ),
        (
            json.dumps(
                {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 1}]}
            ).encode(),
            ("traceEvents[0].ts",),
        ),
        (
            json.dumps({"traceEvents": [{"cat": "kernel", "name": "k", "dur": 1}]}).encode(),
            ("traceEvents[0].ts",),  # a device event is read even without 'ph'
        ),
        (gzip.compress(b"this is not json"), ("not valid JSON",)),
        (
            json.dumps(
                {
                    "traceEvents": [
                        {"ph": "X", "cat": "mtia_runtime", "name": "launch", "ts": 1, "dur": 2},
                        {"ph": "X", "cat": "mtia_ccp_events", "name": "k", "ts": 5, "dur": 9},
                    ]
                }
            ).encode(),
            ("MTIA", "mtia_runtime", "models CUDA and ROCm"),
        ),
        (b"\x1f\x8b\x08\x00garbage-after-a-gzip-magic", ("gzip",)),
    ],
)
def test_bad_files_get_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, fragments: tuple[str, ...]
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    code, out, err = run_cli([str(path)], capsys)
    assert_one_line_error(code, out, err, *fragments)


def test_truncated_gzip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _truncated_gzip(tmp_path)
    code, out, err = run_cli([str(path)], capsys)
    assert_one_line_error(code, out, err, "truncated gzip", "truncated.json.gz")


def test_kineto_shell_without_activity_is_an_empty_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a profiler writes when it recorded nothing: only metadata and its own span."""
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "python"}},
        x("PyTorch Profiler (0)", 0, 100, cat="Trace", pid="Spans", tid="PyTorch Profiler"),
        {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 100},
    ]
    code, out, err = run_cli([str(write_trace(tmp_path / "shell.json", events))], capsys)
    assert_one_line_error(code, out, err, "empty trace")


def test_missing_paths_and_empty_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli([str(tmp_path / "nope.json")], capsys)
    assert_one_line_error(code, out, err, "PATH", "no such file")
    code, out, err = run_cli([str(tmp_path)], capsys)
    assert_one_line_error(code, out, err, "PATH", "no .json or .json.gz")


def test_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    """End to end, as a user runs it: the exit code and stderr of `python -m scalelab trace`."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-m", "scalelab", "trace", str(_truncated_gzip(tmp_path))],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "truncated gzip" in done.stderr and "Traceback" not in done.stderr


def test_trace_help_is_typers_like_every_verb(capsys: pytest.CaptureFixture[str]) -> None:
    from typer.testing import CliRunner

    from scalelab.cli import app

    result = CliRunner().invoke(app, ["trace", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in ("--json", "--per-step", "--plot-step", "--kernel-wait-ns", "--unrelated"):
        assert flag in result.output
    assert "╭" in result.output  # rich's panels, as `scalelab predict --help` shows


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--plot-step", "3"], ("plot-step", "applies only with --plot")),
        (["--plot", "PLOTS", "--plot-step", "-1"], ("--plot-step", "0 or more", "-1")),
        (["--kernel-wait-ns", "-5"], ("--kernel-wait-ns", "0 or more")),
        (["--workers", "0"], ("--workers", "1 or more")),
    ],
)
def test_option_mistakes_get_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragments: tuple[str, ...]
) -> None:
    extra = [str(tmp_path / e) if e == "PLOTS" else e for e in extra]
    code, out, err = run_cli([str(TRACES / "amd-mi250-rocm.json.gz"), *extra], capsys)
    assert_one_line_error(code, out, err, *fragments)
    assert not (tmp_path / "PLOTS").exists()


def test_help_lists_trace_and_typer_forwards_to_it(capsys: pytest.CaptureFixture[str]) -> None:
    from typer.testing import CliRunner

    from scalelab.cli import app

    result = CliRunner().invoke(app, ["trace", str(TRACES / "amd-mi250-rocm.json.gz"), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output)["schema"] == "scalelab.trace/2"
    assert "trace" in CliRunner().invoke(app, ["--help"]).output


def test_bandwidth_beside_the_cluster_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        [str(TRACES / "a100-ddp-rank0-of-2.json.gz"), "--cluster", "a100-ib", "--json"], capsys
    )
    assert code == 0, err
    (rank,) = json.loads(out)["ranks"]
    rows = [r for r in rank["bandwidth"] if r["collective"] == "AllReduce"]
    assert rows and all(r["group_size"] == 2 for r in rows)
    assert all(r["predicted_busbw_gbps"] > 0 for r in rows)
    # DDP's initial broadcasts: busbw factor 1; the predictor does not model broadcast
    broadcast = [r for r in rank["bandwidth"] if r["collective"] == "Broadcast"]
    assert broadcast and all(r["predicted_busbw_gbps"] is None for r in broadcast)
    # nccl-tests: all-reduce busbw = algbw x 2(n-1)/n = algbw on 2 ranks
    assert all(r["busbw_gbps"] == r["algbw_gbps"] for r in rows)
    code, out, _ = run_cli(
        [str(TRACES / "a100-ddp-rank0-of-2.json.gz"), "--bandwidth", "--cluster", "a100-ib"], capsys
    )
    assert code == 0 and "predicted busbw" in out and "AllReduce" in out


def test_ranks_of_two_runs_get_one_line_naming_both(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        [str(TRACES / "rank3-of-8.json.gz"), str(TRACES / "cpu-gloo-rank34-of-300.json.gz")],
        capsys,
    )
    assert_one_line_error(code, out, err, "rank3-of-8", "cpu-gloo-rank34-of-300", "--unrelated")


def test_one_ranks_bandwidth_table_says_lower_bound(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli([str(TRACES / "a100-ddp-rank0-of-2.json.gz"), "--bandwidth"], capsys)
    assert code == 0
    assert "LOWER BOUNDS" in out and "waits included" in out


def test_kernel_names_reach_the_terminal_with_control_characters_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 34 class 4: a kernel name holding ESC sequences (from a trace file) is shown escaped."""
    name = "gemm\x1b]0;pwned\x07\x1b[2J_kernel"
    events = [
        x("ProfilerStep#1", 0, 100, cat="user_annotation"),
        x(name, 10, 50, cat="kernel", pid=0, tid=7),
    ]
    trace = write_trace(tmp_path / "rank0.json", events)
    code, out, err = run_cli([str(trace), "--kernels"], capsys)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b" in out  # shown, escaped
