"""The command's speed machinery gives the same answers as the plain library call: columns
gathered in another process (`background`), the prefetch thread, numpy-free start-up, and the
numpy helpers that avoid importing `numpy.ma`."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from trace_helpers import TRACES, real

from scalelab.cli import main
from scalelab.errors import InputError
from scalelab.trace import analyze, background, load
from scalelab.trace.columns import Columns, CpuTrace, gather
from scalelab.trace.extract import extract
from scalelab.trace.intervals import distinct, percentile

SRC = Path(__file__).resolve().parents[2] / "src"
GPU = TRACES / "a100-ddp-rank0-of-2.json.gz"


def _command(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m scalelab trace ...` as a user runs it (the console entry: fork, os._exit)."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "scalelab", "trace", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "name", ["a100-ddp-rank0-of-2", "amd-mi250-rocm", "cpu-gloo-rank34-of-300"]
)
def test_the_command_in_its_own_process_answers_as_the_library(name: str) -> None:
    path = TRACES / f"{name}.json.gz"
    done = _command(str(path), "--json")
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stderr == ""
    assert json.loads(done.stdout) == json.loads(json.dumps(analyze(path).to_dict()))


def test_the_command_prints_its_tables_whole_before_it_exits() -> None:
    done = _command(str(GPU), "--all")
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.startswith("exposed communication per rank")
    assert done.stdout.endswith("\n") and "longest steps: rank 0" in done.stdout


def test_a_bad_file_from_the_command_is_still_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "soon"}]}')
    done = _command(str(bad))
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_columns_survive_marshal_and_give_the_same_timeline() -> None:
    raw = load.read_trace(GPU)
    found = gather(raw)
    assert isinstance(found, Columns)
    carried = Columns.from_tuple(marshal.loads(marshal.dumps(found.to_tuple())))
    direct, via = extract(raw), extract(carried)
    for name in ("activity_start_ns", "activity_end_ns", "comm_start_ns", "comm_collective"):
        assert np.array_equal(getattr(direct, name), getattr(via, name)), name
    assert direct.compute.total_ns() == via.compute.total_ns()
    assert direct.comm.total_ns() == via.comm.total_ns()


def test_a_cpu_trace_is_not_gathered_into_columns() -> None:
    assert isinstance(gather(load.read_trace(TRACES / "cpu-gloo-rank34-of-300.json.gz")), CpuTrace)


@pytest.mark.skipif(not background.available(), reason="no os.fork here")
def test_a_forked_child_hands_over_the_columns() -> None:
    assert background.start([GPU])
    taken = background.take(GPU)
    assert taken is not None
    values, metadata = taken
    assert isinstance(values, Columns) and metadata["distributedInfo"]["rank"] == 0
    assert background.take(GPU) is None  # handed over once


@pytest.mark.skipif(not background.available(), reason="no os.fork here")
def test_the_library_uses_what_a_child_gathered_and_answers_the_same() -> None:
    assert background.start([GPU])
    report = analyze(GPU)
    assert background._pending == {}
    assert report.ranks[0].to_dict() == real("a100-ddp-rank0-of-2.json.gz").to_dict()


def test_prefetched_bytes_are_used_once(capsys: pytest.CaptureFixture[str]) -> None:
    load.prefetch([GPU])
    main(["trace", str(GPU), "--json"])
    assert load._prefetch_thread is None and load._prefetched == {}
    assert json.loads(capsys.readouterr().out)["ranks"][0]["rank"] == 0


def test_a_trace_after_whitespace_is_read_and_its_rank_found_in_its_name(tmp_path: Path) -> None:
    """Only an empty or all-whitespace file is refused: one whose JSON starts after more
    whitespace than the first look (64 bytes) reads as the same trace."""
    path = tmp_path / "spaced_RANK-5.json"
    path.write_bytes(b" \r\n\t" * 40 + load.read_bytes(GPU))
    raw, same = load.read_trace(path), load.read_trace(GPU)
    assert len(raw.events) == len(same.events) and raw.typed
    assert raw.metadata == same.metadata
    assert load.RawTrace(path, []).rank == 5 and load.RawTrace("trace.json", []).rank is None


def test_importing_the_reader_does_not_import_numpy() -> None:
    code = (
        "import sys; import scalelab.trace.load, scalelab.trace.columns, "
        "scalelab.trace.background; print('numpy' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "False"


def test_the_package_keeps_its_function_when_the_submodule_is_imported_first() -> None:
    code = (
        "import scalelab.trace.analyze, scalelab.trace as t; "
        "from scalelab.trace import analyze; print(callable(t.analyze), callable(analyze), "
        "type(analyze).__name__)"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.split() == ["True", "True", "function"]


def test_distinct_and_percentile_are_numpys() -> None:
    rng = np.random.default_rng(14)
    for _ in range(300):
        n = int(rng.integers(1, 200))
        values = rng.integers(0, int(rng.choice([5, 1000, 10**12])), n).astype(np.int64)
        assert np.array_equal(distinct(values), np.unique(values))
        for q in (0, 1, 5, 50, 95, 99, 100):
            assert percentile(values, q) == float(np.percentile(values, q))
    assert distinct(np.zeros(0, np.int64)).size == 0


@pytest.mark.skipif(not background.available(), reason="no os.fork here")
@pytest.mark.parametrize("name", ["a100-ddp-rank0-of-2", "single-rank-no-comm"])
def test_two_processes_gather_the_same_columns_as_one(name: str) -> None:
    path = TRACES / f"{name}.json.gz"
    whole = gather(load.read_trace(path))
    assert isinstance(whole, Columns)
    taken = background.gather_in_two(path)
    assert taken is not None
    merged, metadata = taken
    assert merged.to_tuple() == whole.to_tuple()
    assert metadata == load.read_trace(path).metadata
    assert load._prefetched == {}


@pytest.mark.skipif(not background.available(), reason="no os.fork here")
def test_two_processes_from_bytes_already_read(tmp_path: Path) -> None:
    """Bytes a command prefetched are cut as they are (not inflated again); an uncompressed
    file is cut at its middle; both gather what one process does."""
    whole = gather(load.read_trace(GPU))
    assert isinstance(whole, Columns)
    load.remember(GPU, load.read_bytes(GPU))
    taken = background.gather_in_two(GPU)
    assert taken is not None and taken[0].to_tuple() == whole.to_tuple()
    assert load._prefetched == {}
    plain_json = tmp_path / "a100-ddp-rank0-of-2.json"
    plain_json.write_bytes(load.read_bytes(GPU))
    taken = background.gather_in_two(plain_json)
    assert taken is not None and taken[0].to_tuple()[1:] == whole.to_tuple()[1:]


@pytest.mark.skipif(not background.available(), reason="no os.fork here")
def test_a_corrupt_gzip_split_in_two_is_reported_as_one_process_does(tmp_path: Path) -> None:
    """The caller inflates only its part (no CRC); the child inflates all and checks it: a
    corrupt file gives no columns, and the caller's own read says what is wrong."""
    packed = bytearray(GPU.read_bytes())
    packed[-8] ^= 0xFF  # the gzip trailer's CRC-32
    bad = tmp_path / "bad-rank0.json.gz"
    bad.write_bytes(bytes(packed))
    assert background.gather_in_two(bad) is None
    with pytest.raises(InputError, match="corrupt gzip"):
        analyze(bad, workers=2)


@pytest.mark.skipif(not background.available(), reason="no os.fork here")
def test_a_split_started_ahead_gives_the_same_report() -> None:
    """The command forks the child for a file's second part before importing the plain
    analysis (`split_start`, a smaller first part); the report is the one-process report."""
    from scalelab.trace import plain

    one = plain.report([GPU], split=False)
    data = load.read_bytes(GPU)
    load.remember(GPU, data)
    assert background.split_start(GPU, 0.4)
    assert str(GPU) in background._splits
    two = plain.report([GPU], split=True)
    assert background._splits == {} and load._prefetched == {}
    assert two.to_dict() == one.to_dict()


@pytest.mark.skipif(not background.available(), reason="no os.fork here")
def test_a_part_without_device_events_is_still_a_typed_part() -> None:
    """rank3-of-8 writes its host events first: a first part cut before 47 % of the file holds
    no kernel. It is still a part of a GPU trace (typed columns, not a CPU trace's dicts), so
    the merged columns are one process's and the command's plain path takes them."""
    from scalelab.trace import plain

    path = TRACES / "rank3-of-8.json.gz"
    raw = load.read_trace(path)
    whole = gather(raw)
    assert isinstance(whole, Columns)
    load.remember(path, load.read_bytes(path))
    assert background.split_start(path, 0.2)
    taken = background.gather_in_two(path)
    assert taken is not None
    assert taken[0].typed and taken[0].to_tuple() == whole.to_tuple()
    assert plain.rank_report(*taken).to_dict() == plain.rank_report(whole, raw.metadata).to_dict()


def test_the_cut_lies_between_two_events() -> None:
    data = load.read_bytes(GPU)
    cut = background.split_point(data)
    assert cut is not None
    end_a, start_b = cut
    assert data[end_a - 1 : end_a] == b"}" and data[start_b : start_b + 1] == b"{"
    assert data[end_a:start_b].strip() == b","
    # A compact file (no Kineto indentation) is not cut: it is read in one process.
    assert background.split_point(load.read_bytes(TRACES / "sampled-rank0-of-128.json.gz")) is None


def test_small_files_and_threaded_callers_are_read_in_one_process() -> None:
    import threading

    small = TRACES / "amd-mi250-rocm.json.gz"
    assert background.gather_in_two(small) is None
    assert load.read_bytes(small) is not None  # what it read is kept for the reader
    assert load._prefetched == {}
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert background.gather_in_two(GPU) is None
    finally:
        stop.set()
        other.join()
    assert analyze(GPU, workers=1).to_dict() == analyze(GPU, workers=2).to_dict()
