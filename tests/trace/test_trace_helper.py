"""The library call's kept helper (`background._Helper`): the second process of a split kept for
the next file. It must answer as one process does, never answer the wrong file, never outlive
its caller or hold the caller's files open, and never be used by another process."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trace_helpers import TRACES

from scalelab.trace import analyze, background, load
from scalelab.trace.columns import Columns, gather

pytestmark = pytest.mark.skipif(not background.available(), reason="no os.fork here")

SRC = Path(__file__).resolve().parents[2] / "src"
GPU = TRACES / "a100-ddp-rank0-of-2.json.gz"  # 9.8 MB inflated: split in two


def _whole() -> tuple[object, ...]:
    columns = gather(load.read_trace(GPU))
    assert isinstance(columns, Columns)
    return columns.to_tuple()


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


@pytest.fixture(autouse=True)
def _no_helper_between_tests() -> object:
    background._stop_helper()
    yield
    background._stop_helper()


def test_the_helper_is_kept_and_answers_each_file_as_one_process() -> None:
    whole = _whole()
    first = background.gather_in_two(GPU, keep_helper=True)
    helper = background._helper
    assert first is not None and helper is not None and _alive(helper.pid)
    second = background.gather_in_two(GPU, keep_helper=True)
    assert second is not None and background._helper is helper
    assert first[0].to_tuple() == whole and second[0].to_tuple() == whole
    other = TRACES / "single-rank-no-comm.json.gz"
    third = background.gather_in_two(other, keep_helper=True)
    one = gather(load.read_trace(other))
    assert third is not None and isinstance(one, Columns) and background._helper is helper
    assert third[0].to_tuple() == one.to_tuple()
    assert not background._helper_lock.locked()


def test_analyze_gives_the_one_process_report_with_the_helper() -> None:
    one = analyze(GPU, workers=1).to_dict()
    assert analyze(GPU, workers=2).to_dict() == one
    assert background._helper is not None
    assert analyze(GPU, workers=2).to_dict() == one


def test_an_idle_helper_leaves_and_the_next_file_starts_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(background, "HELPER_IDLE_S", 0.2)
    assert background.gather_in_two(GPU, keep_helper=True) is not None
    first = background._helper
    assert first is not None
    deadline = time.monotonic() + 10
    while _alive(first.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(first.pid)
    taken = background.gather_in_two(GPU, keep_helper=True)
    assert taken is not None and taken[0].to_tuple() == _whole()
    assert background._helper is not None and background._helper.pid != first.pid


def test_a_helper_killed_mid_file_leaves_the_file_to_one_process() -> None:
    assert background.gather_in_two(GPU, keep_helper=True) is not None
    helper = background._helper
    assert helper is not None
    split = background._fork(GPU, background.SPLIT_MIN_BYTES, None, keep_helper=True)
    assert split is not None and split.helper is helper
    os.kill(helper.pid, 9)
    assert background._finish(GPU, split) is None  # its reply never comes: no columns
    assert background._helper is None and not background._helper_lock.locked()
    assert analyze(GPU, workers=2).to_dict() == analyze(GPU, workers=1).to_dict()


def test_an_interrupt_between_request_and_reply_drops_the_helper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its reply would otherwise be waiting in the pipe for the next file."""
    assert background.gather_in_two(GPU, keep_helper=True) is not None
    helper = background._helper
    assert helper is not None

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(background, "_first_part", interrupted)
    with pytest.raises(KeyboardInterrupt):
        background.gather_in_two(GPU, keep_helper=True)
    assert background._helper is None and not _alive(helper.pid)
    assert not background._helper_lock.locked()
    monkeypatch.undo()
    taken = background.gather_in_two(GPU, keep_helper=True)
    assert taken is not None and taken[0].to_tuple() == _whole()


def test_a_busy_helper_is_not_waited_for() -> None:
    """Another thread's file holds it: this one is split by a child of its own."""
    assert background.gather_in_two(GPU, keep_helper=True) is not None
    helper = background._helper
    assert background._helper_lock.acquire(blocking=False)
    try:
        split = background._fork(GPU, background.SPLIT_MIN_BYTES, None, keep_helper=True)
        assert split is not None and split.helper is None
        taken = background._finish(GPU, split)
    finally:
        background._helper_lock.release()
    assert taken is not None and taken[0].to_tuple() == _whole()
    assert background._helper is helper


def test_an_interrupt_for_the_caller_does_not_stop_the_helper() -> None:
    """Ctrl-C reaches the whole process group: it is the caller's to handle."""
    assert background.gather_in_two(GPU, keep_helper=True) is not None
    helper = background._helper
    assert helper is not None
    os.kill(helper.pid, signal.SIGINT)
    time.sleep(0.2)
    assert _alive(helper.pid)
    taken = background.gather_in_two(GPU, keep_helper=True)
    assert taken is not None and background._helper is helper


def test_the_helper_runs_none_of_the_callers_signal_handlers(tmp_path: Path) -> None:
    """A caller's SIGTERM handler (one that cleans up its files, say) is not run by the
    helper: a SIGTERM ends the helper as it ends any process without a handler."""
    marker = tmp_path / "handled"
    previous = signal.signal(signal.SIGTERM, lambda *_: marker.write_text("ran"))
    try:
        assert background.gather_in_two(GPU, keep_helper=True) is not None
        helper = background._helper
        assert helper is not None
        os.kill(helper.pid, signal.SIGTERM)
        _, status = os.waitpid(helper.pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        assert not marker.exists()
    finally:
        signal.signal(signal.SIGTERM, previous)
        background._helper = None


def test_no_helper_where_sigpipe_would_kill_the_caller() -> None:
    """A program that restored SIGPIPE's default would die writing to a helper that left a
    moment before: its large files are split by a child of their own instead."""
    previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        taken = background.gather_in_two(GPU, keep_helper=True)
    finally:
        signal.signal(signal.SIGPIPE, previous)
    assert taken is not None and taken[0].to_tuple() == _whole()
    assert background._helper is None


def test_no_helper_in_a_process_without_standard_input() -> None:
    """Its pipes would take descriptor 0, which the helper points at /dev/null: the file is
    split by a child of its own instead, to the same columns."""
    code = (
        "import sys\n"
        "from scalelab.trace import background, load\n"
        "from scalelab.trace.columns import gather\n"
        "taken = background.gather_in_two(sys.argv[1], keep_helper=True)\n"
        "whole = gather(load.read_trace(sys.argv[1]))\n"
        "print(taken is not None and taken[0].to_tuple() == whole.to_tuple(), "
        "background._helper is None)\n"
    )
    done = subprocess.run(
        ["sh", "-c", 'exec 0<&- "$0" -c "$1" "$2"', sys.executable, code, str(GPU)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=120,
        check=False,
    )
    assert done.stdout.split() == ["True", "True"], done.stderr[-500:]


def test_the_helper_holds_none_of_the_callers_pipes_open() -> None:
    """A pipe the caller closes must reach its end for its reader, helper or not."""
    read_end, write_end = os.pipe()
    try:
        assert background.gather_in_two(GPU, keep_helper=True) is not None
        assert background._helper is not None
        os.close(write_end)
        ready, _, _ = select.select([read_end], [], [], 5.0)  # not while the helper holds it
        assert ready and os.read(read_end, 1) == b""
        fds = Path(f"/proc/{background._helper.pid}/fd")
        if fds.exists():  # Linux: standard input, output and error, and its two pipes
            assert len(list(fds.iterdir())) == 5
    finally:
        os.close(read_end)


def test_a_forked_process_does_not_use_its_parents_helper() -> None:
    assert background.gather_in_two(GPU, keep_helper=True) is not None
    helper = background._helper
    assert helper is not None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked process: its own helper, the same columns
        code = 1
        try:
            inherited = background._helper
            taken = background.gather_in_two(GPU, keep_helper=True)
            mine = background._helper
            ok = (
                inherited is None
                and taken is not None
                and taken[0].to_tuple() == _whole()
                and mine is not None
                and mine.pid != helper.pid
            )
            background._stop_helper()
            code = 0 if ok else 1
        finally:
            os.write(write_end, bytes([code]))
            os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 1)
    os.close(read_end)
    os.waitpid(pid, 0)
    assert answer == b"\0"
    assert background._helper is helper and _alive(helper.pid)
    taken = background.gather_in_two(GPU, keep_helper=True)
    assert taken is not None and taken[0].to_tuple() == _whole()


def test_the_helper_leaves_with_its_caller() -> None:
    """A caller that exits (normally, or at once with os._exit) leaves no helper behind."""
    for ending in ("", "os._exit(0)"):
        code = (
            "import os, sys\n"
            "from scalelab.trace import analyze, background\n"
            "analyze(sys.argv[1], workers=2)\n"
            "print(background._helper.pid, flush=True)\n" + ending
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(GPU)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(SRC)},
            timeout=120,
            check=True,
        )
        pid = int(done.stdout)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            status = (
                Path(f"/proc/{pid}/status").read_text() if Path(f"/proc/{pid}").exists() else ""
            )
            if "zombie" in status or not status:
                break
            time.sleep(0.05)
        status = Path(f"/proc/{pid}/status").read_text() if Path(f"/proc/{pid}").exists() else ""
        assert not status or "zombie" in status, status
