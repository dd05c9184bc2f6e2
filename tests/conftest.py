"""Shared helpers: run the CLI in-process or as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
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


@pytest.fixture
def cli():
    return run_cli
