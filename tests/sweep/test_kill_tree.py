"""`kill_tree` (psutil): a process, its descendants and the processes marked with its run token
all end, orphans included."""

from __future__ import annotations

import os
import subprocess
import time

import psutil

from scalelab.sweep.executors import kill_tree


def test_kill_tree_ends_descendants_and_marked_orphans() -> None:
    token = f"test-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "SCALELAB_RUN_TOKEN": token}
    # A shell with a child and a grandchild; and an orphan (its parent exited) carrying the token.
    tree = subprocess.Popen(["sh", "-c", "sleep 60 & sh -c 'sleep 60' & wait"], env=env)
    orphan_parent = subprocess.run(
        ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], env=env, capture_output=True, text=True
    )
    orphan = int(orphan_parent.stdout)
    deadline = time.monotonic() + 10
    while (
        len(psutil.Process(tree.pid).children(recursive=True)) < 3 and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    below = [p.pid for p in psutil.Process(tree.pid).children(recursive=True)]
    assert len(below) >= 3
    kill_tree(tree.pid, token)
    tree.wait(timeout=10)
    deadline = time.monotonic() + 10
    alive = [p for p in [*below, orphan] if psutil.pid_exists(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [
            p for p in alive
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]  # fmt: skip
    assert not alive, alive
