"""The environment a measurement ran in: versions, devices, hosts and the variables that matter."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import scalelab

_ENV_PREFIXES = (
    "NCCL_",
    "TORCH_NCCL_",
    "TORCH_DISTRIBUTED_",
    "GLOO_",
    "TORCHINDUCTOR_",
    "SLURM_JOB_",
)
_ENV_NAMES = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "SLURM_NNODES", "SLURM_NTASKS")


def git_commit() -> dict[str, Any]:
    """The commit of the scalelab checkout this code runs from (null when installed from a wheel)."""
    source = Path(scalelab.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": bool(dirty)}


def relevant_variables() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES
    }


def local_facts(device_name: str) -> dict[str, Any]:
    """What this process sees; gathered from every rank by the harness."""
    return {"hostname": socket.gethostname(), "device": device_name}


def environment(per_rank: list[dict[str, Any]], backend: str, world_size: int) -> dict[str, Any]:
    """The record's `environment` section (call on rank 0 with every rank's `local_facts`)."""
    import torch

    cuda = torch.cuda.is_available()
    nccl: str | None = None
    if cuda:
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            nccl = None
    hosts = sorted({r["hostname"] for r in per_rank})
    return {
        "scalelab_version": scalelab.__version__,
        "git": git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": nccl,
        "backend": backend,
        "world_size": world_size,
        "hostnames": hosts,
        "n_nodes": len(hosts),
        "devices": [r["device"] for r in per_rank],
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "variables": relevant_variables(),
    }
