"""Flight-recorder dumps are read as data only, and a hang is explained from them (no torch)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from scalelab.measure.flight import explain, read_dumps, stuck_collective
from scalelab.measure.forensics import Paths, hang_report


class _Planted:
    """What an attacker leaves in a shared runs folder: unpickling it runs a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    planted = tmp_path / "run-rank0"
    planted.write_bytes(pickle.dumps({"entries": [_Planted(marker)]}))
    sentence, ignored = explain([planted])
    assert not marker.exists(), "the planted pickle ran code"
    assert sentence is None
    assert len(ignored) == 1 and "refused to load" in ignored[0] and "system" in ignored[0]


def test_plain_nccl_pickles_are_read(tmp_path: Path) -> None:
    def entry(seq: int, state: str) -> dict[str, Any]:
        return {
            "process_group": ("3", "mesh_dp"), "collective_seq_id": seq, "p2p_seq_id": 0,
            "is_p2p": False, "profiling_name": "nccl:all_reduce", "state": state,
            "input_sizes": [[1024]], "record_id": seq,
        }  # fmt: skip

    (tmp_path / "r-rank0").write_bytes(
        pickle.dumps({"entries": [entry(40, "completed"), entry(41, "started")]})
    )
    (tmp_path / "r-rank1").write_bytes(pickle.dumps({"entries": [entry(40, "completed")]}))
    sentence, ignored = explain([tmp_path / "r-rank0", tmp_path / "r-rank1"])
    assert not ignored
    assert sentence is not None and sentence.startswith(
        "stuck in AllReduce #41 (sizes [[1024]]) of the data-parallel group (mesh_dp): "
        "rank(s) 1 never arrived; arrived: 0"
    ), sentence


def test_another_users_file_is_ignored_with_a_note(tmp_path: Path) -> None:
    if not hasattr(os, "getuid") or os.getuid() != 0:
        pytest.skip("needs root to give a file to another user")
    dump = tmp_path / "run-rank0"
    dump.write_bytes(pickle.dumps({"entries": []}))
    os.chown(dump, 65534, 65534)
    link = tmp_path / "run-rank1"
    link.symlink_to(dump)
    dumps = read_dumps([dump, link])
    assert dumps.entries == {}
    assert "owned by uid 65534" in dumps.ignored[0] and "not a regular file" in dumps.ignored[1]


def test_point_to_point_entries_name_the_stuck_send() -> None:
    def send(seq: int) -> dict[str, Any]:
        return {
            "process_group": ("1", "mesh_pp"), "collective_seq_id": 0, "p2p_seq_id": seq,
            "is_p2p": True, "profiling_name": "nccl:send 0->1", "state": "scheduled",
            "record_id": seq,
        }  # fmt: skip

    stuck = stuck_collective({0: [send(7), send(8)], 1: [send(7)]}, reporter=0)
    assert stuck is not None and stuck.p2p and stuck.seq == 8 and stuck.missing == [1]
    assert stuck.collective == "Send 0->1" and "pipeline-parallel" in stuck.group


def test_hang_report_names_a_stopped_rank_without_inventing_a_cause(tmp_path: Path) -> None:
    """Rank 1 is a SIGSTOPped process that cannot answer: the report says it is stopped and
    guesses nothing else (no signal it did not get, no OOM)."""
    import signal
    import socket
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        paths = Paths(tmp_path, "run")
        paths.pid(1).write_text(f"{child.pid} {socket.gethostname()}\n")
        sentence, notes = hang_report(paths, 0, 2, wait_s=0.3)
    finally:
        child.kill()
        child.wait()
    assert sentence is not None
    assert f"rank 1 did not answer the dump request: stopped (process {child.pid}" in sentence
    assert "SIGKILL" not in sentence and "died" not in sentence
    dump = json.loads(paths.dump(0).read_text())
    assert dump["rank"] == 0 and dump["stack"][0].startswith("test_hang_report_names"), dump
    assert str(paths.stack(0)) in notes["hang_stacks"]
