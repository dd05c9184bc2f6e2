"""Progress on stderr for long verbs (issue 36 item 2): shown on a terminal (a pseudo-terminal here),
never on stdout, silent with --json or when stderr is not a terminal unless SCALELAB_PROGRESS asks."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalelab.cli import progress as progress_module
from tests.conftest import run_cli


def _on_terminal(
    *args: str,
    until: bytes | None = None,
    timeout_s: float = 120.0,
    env: dict[str, str] | None = None,
) -> tuple[int | None, bytes, bytes]:
    """Run `scalelab ARGS` with stderr on a pseudo-terminal and stdout on a pipe; return (exit code,
    stdout, what the terminal got). With `until`, stop the process once the terminal shows it."""
    master, slave = pty.openpty()
    full_env = {k: v for k, v in os.environ.items() if k != progress_module.ENV}
    full_env.update({"TERM": "xterm", "COLUMNS": "120", **(env or {})})
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalelab", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        env=full_env,
    )
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal (Linux raises EIO)
                    break
                if not chunk:
                    break
                seen += chunk
                if until is not None and until in seen:
                    proc.terminate()
                    break
            elif proc.poll() is not None:
                break
        stdout = proc.communicate(timeout=timeout_s)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return (None if until is not None else proc.returncode), stdout, seen


def test_study_paper_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    # stopped at its first step: the whole run is the studies' shared fixture's work
    _, stdout, terminal = _on_terminal(
        "study", "paper", "--out", str(tmp_path), until=b"scalelab study paper: "
    )
    assert b"scalelab study paper: " in terminal
    assert b"\r" in terminal  # redrawn in place, not a line per step
    assert stdout == b""


def test_a_short_study_on_a_terminal_keeps_stdout_clean(tmp_path: Path) -> None:
    code, stdout, terminal = _on_terminal("study", "hardware", "--out", str(tmp_path))
    assert code == 0, terminal
    assert b"scalelab study hardware: hardware: V100" in terminal
    assert b"\x1b" not in stdout and b"wrote" in stdout


SEARCH = ("search", "llama2-7b", "--gpus", "64")


def test_json_on_a_terminal_is_silent() -> None:
    code, stdout, terminal = _on_terminal(*SEARCH, "--json")
    assert code == 0, terminal
    assert terminal.strip() == b""
    assert stdout.lstrip().startswith(b"{")


def test_not_a_terminal_is_silent_unless_asked() -> None:
    quiet = run_cli(*SEARCH)
    assert quiet.returncode == 0 and quiet.stderr.strip() == ""
    env = {**os.environ, progress_module.ENV: "1", "PYTHONWARNINGS": "ignore"}
    asked = subprocess.run(
        [sys.executable, "-m", "scalelab", *SEARCH, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert asked.returncode == 0, asked.stderr
    assert asked.stderr == "scalelab search: every layout of llama2-7b on 64 GPUs (0.0 s)\n"
    assert asked.stdout.lstrip().startswith("{")


@pytest.mark.parametrize(
    ("asked", "terminal", "json_out", "expected"),
    [
        ("", True, False, "live"),
        ("", True, True, "off"),
        ("", False, False, "off"),
        ("1", False, True, "lines"),
        ("1", True, True, "live"),
        ("0", True, False, "off"),
    ],
)
def test_the_one_rule(
    monkeypatch: pytest.MonkeyPatch, asked: str, terminal: bool, json_out: bool, expected: str
) -> None:
    monkeypatch.setenv(progress_module.ENV, asked)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    assert progress_module.mode(json_out=json_out) == expected
