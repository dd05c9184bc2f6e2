"""Shared helpers: run the CLI in-process or as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, timeout: float = 120.0) -> CliResult:
    """Run `python -m scalelab ARGS` in a fresh process, as a user would."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "160"}
    proc = subprocess.run(
        [sys.executable, "-m", "scalelab", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def run_cli_all(argvs: Sequence[Sequence[str]], timeout: float = 120.0) -> list[CliResult]:
    """`run_cli` for each argv, two processes at a time: a CLI process's start-up (imports) is one
    core's work, and the suite runs on 2 cores."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda argv: run_cli(*argv, timeout=timeout), argvs))


@pytest.fixture
def cli():
    return run_cli
