"""Helpers for the harness tests: subprocess environment, torchrun launches, the reference run."""

from __future__ import annotations

import importlib.util
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
# torchao (the `fp8` extra) is installed: the FP8 cases join the 2-rank launch and the references.
HAS_FP8 = importlib.util.find_spec("torchao") is not None
# test_fp8.py's 2-rank cases (fp8 matmuls on CPU are ~6x slower than fp32, so few): both recipes
# on FSDP (tensorwise with the fp8 all-gather and precomputed scales) and on TP (rowwise with SP,
# tensorwise without: gloo cannot carry fp8 activations). Each is compared with one process running
# the same recipe on the same micro-batches (FP8_REFERENCE, made by `references`): the FSDP cases
# run 2 micro-batches of 2 a rank, so that the one-process run, 4 micro-batches of 2, quantises the
# same tensors with the same scales (a rank's rows are a contiguous half of the batch); the TP
# cases (dp 1) one micro-batch of 8.
FP8_WORLD2: list[dict[str, Any]] = [
    {
        "name": "fp8_fsdp_tensorwise_gather",
        "precision": "fp8",
        "fp8_all_gather": True,
        "micro_batch": 2,
    },
    {"name": "fp8_fsdp_rowwise", "precision": "fp8", "fp8_recipe": "rowwise", "micro_batch": 2},
    {
        "name": "fp8_tp_rowwise_sp",
        "precision": "fp8",
        "tp": 2,
        "fp8_recipe": "rowwise",
        "micro_batch": 8,
    },
    {"name": "fp8_tp_tensorwise", "precision": "fp8", "tp": 2, "sp": False, "micro_batch": 8},
]


def fp8_reference_name(case: dict[str, Any]) -> str:
    """The one-process run a 2-rank fp8 case is compared with: its recipe and micro-batch size."""
    return f"fp8_{case.get('fp8_recipe', 'tensorwise')}_mb{case['micro_batch']}_reference"


# Steps of every parity launch and single-process reference (issue 13: 5 steps at 2 and 4 ranks).
PARITY_STEPS = 5


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


def parity_results(
    nproc: int, cases: list[dict[str, Any]], steps: int = PARITY_STEPS
) -> dict[str, Any]:
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
    """The single-process runs (PARITY_STEPS) of llama-tiny and moe-tiny, in one process: the
    whole global batch of 8 in one micro-batch, fp32; with torchao, also llama-tiny in fp8 as each
    2-rank fp8 case runs it (`fp8_reference_name`: its recipe and micro-batch size)."""
    cases: list[dict[str, Any]] = [
        {"name": "reference", "micro_batch": 8},
        {"name": "moe_reference", "model": MOE_TINY, "micro_batch": 8},
    ]
    if HAS_FP8:
        names = {fp8_reference_name(c): c for c in FP8_WORLD2}
        for name, case in names.items():
            recipe = {k: case[k] for k in ("fp8_recipe",) if k in case}
            cases.append(
                {"name": name, "precision": "fp8", "micro_batch": case["micro_batch"], **recipe}
            )
    return parity_results(1, cases)


@pytest.fixture(scope="session")
def world2() -> dict[str, Any]:
    """Every 2-rank case in one launch: test_parity.py's and, with torchao, test_fp8.py's (last,
    so that nothing fp8 does can touch the other cases)."""
    from tests.measure.test_parity import world2_cases

    return parity_results(2, world2_cases() + [dict(c) for c in FP8_WORLD2 if HAS_FP8])


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
