"""Helpers for the harness tests: subprocess environment, torchrun launches, the reference run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
WORKER = Path(__file__).with_name("parity_worker.py")
# The tiny mixture-of-experts model of the MoE tests (and of the README's bench example).
MOE_TINY = str(ROOT / "examples" / "moe-tiny.yaml")


def child_env(**extra: str) -> dict[str, str]:
    """The environment every child process gets: this checkout first, 1 thread, loopback gloo."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env.update(
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        PYTHONWARNINGS="ignore",
        TORCHINDUCTOR_COMPILE_THREADS="1",
    )
    env.update(extra)
    return env


def run(cmd: list[str], timeout: float = 300, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=ROOT, env=child_env(**extra), capture_output=True, text=True, timeout=timeout
    )


def parity_results(nproc: int, cases: list[dict[str, Any]], steps: int = 3) -> dict[str, Any]:
    """Run `cases` in one process group of `nproc` ranks; retried once (rare gloo teardown abort)."""
    if nproc == 1:
        cmd = [sys.executable, str(WORKER), json.dumps(cases), str(steps)]
    else:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(WORKER), json.dumps(cases), str(steps),
        ]  # fmt: skip
    last = None
    for _ in range(2):
        last = run(cmd, timeout=300)
        for line in last.stdout.splitlines():
            if line.startswith("PARITY "):
                result: dict[str, Any] = json.loads(line[len("PARITY ") :])
                return result
    assert last is not None
    raise AssertionError(f"no PARITY line (rc {last.returncode}):\n{last.stderr[-4000:]}")


@pytest.fixture(scope="session")
def parity() -> Callable[..., dict[str, Any]]:
    """`parity(nproc, cases)`: each case's losses, local sequence length and local parameters."""
    return parity_results


@pytest.fixture(scope="session")
def references() -> dict[str, Any]:
    """The single-process runs (5 steps) of llama-tiny and moe-tiny, in one process: the whole
    global batch of 8 in one micro-batch, fp32."""
    cases = [
        {"name": "reference", "micro_batch": 8},
        {"name": "moe_reference", "model": MOE_TINY, "micro_batch": 8},
    ]
    return parity_results(1, cases, 5)


@pytest.fixture(scope="session")
def reference(references: dict[str, Any]) -> dict[str, Any]:
    """llama-tiny's single-process run (`references`)."""
    result: dict[str, Any] = references["reference"]
    return result


@pytest.fixture(scope="session")
def moe_reference(references: dict[str, Any]) -> dict[str, Any]:
    """moe-tiny's single-process run (`references`)."""
    result: dict[str, Any] = references["moe_reference"]
    return result
