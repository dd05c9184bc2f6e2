"""The sweep's SLURM path against a real SLURM: Debian's slurmctld and slurmd on this machine.

`.ci/run` starts a one-node cluster (`.ci/slurm-up.sh`: no GPUs, no accounting database) and
these tests submit through the real `sbatch`. Elsewhere the fixture starts it when it can (root,
the Debian packages installed) and otherwise skips with the reason; under CI it never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scalelab.results import load_record
from tests.sweep.conftest import ROOT, child_env, scalelab, write_sweep

pytest.importorskip("submitit")
pytestmark = [pytest.mark.distributed, pytest.mark.slurm]

SWEEP = """\
name: {name}
cluster: cpu-gloo
models: [llama-tiny]
nodes: [1]
gpus_per_node: {gpus}
global_batch_per_gpu: 2
layouts:
  - {{sharding: fsdp}}
bench: {{steps: {steps}, warmup: 1, repeats: 1}}
slurm:
  time_min: 10
  poll_s: 1
  python: {python}
{extra}"""


def _answers() -> bool:
    if shutil.which("srun") is None:
        return False
    try:
        done = subprocess.run(
            ["srun", "-N1", "-n1", "--immediate=10", "true"], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def real_slurm() -> Iterator[None]:
    started = False
    if not _answers():
        reason = "no SLURM answers here and it could not be started"
        if os.geteuid() == 0 and shutil.which("slurmctld"):
            up = subprocess.run(
                [str(ROOT / ".ci" / "slurm-up.sh")], capture_output=True, text=True, timeout=120
            )
            started = up.returncode == 0 and _answers()
            reason = f"{reason}: {(up.stderr or up.stdout).strip()[-300:]}"
        elif os.geteuid() != 0:
            reason += " (starting it needs root)"
        else:
            reason += " (apt-get install slurmctld slurmd slurm-client munge)"
        if not started:
            if os.environ.get("CI"):
                raise AssertionError(reason)
            pytest.skip(reason)
    yield
    if started:
        subprocess.run([str(ROOT / ".ci" / "slurm-down.sh")], capture_output=True, timeout=60)


def _sweep(tmp_path: Path, name: str, gpus: str = "[2]", steps: int = 2, extra: str = "") -> Path:
    text = SWEEP.format(
        name=name, gpus=gpus, steps=steps, python=json.dumps(sys.executable), extra=extra
    )
    return write_sweep(tmp_path, text, f"{name}.yaml")


def _points(done: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert done.stdout.strip(), done.stderr[-3000:]
    return list(json.loads(done.stdout)["points"])


@pytest.fixture(scope="module")
def swept(real_slurm: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One sweep of two CPU points (1 and 2 processes) through sbatch -> srun -> torchrun, run four
    times: with a fault injected (both points fail), again (the failures are kept), with
    --retry-failed (both run and succeed), and again (nothing runs). Its SLURM account and comment
    carry shell (test_hostile_values_reach_sbatch_quoted). One sweep for the three tests, so two
    rounds of jobs instead of four."""
    tmp_path = tmp_path_factory.mktemp("slurm")
    marker = tmp_path / "pwned"
    hostile = (
        f"  account: 'lab $(touch {marker}) x'\n"
        f"  additional: {{comment: 'a;touch {marker} `touch {marker}`'}}\n"
    )
    sweep = _sweep(tmp_path, "real", gpus="[1, 2]", extra=hostile)
    out = tmp_path / "out"
    args = ("sweep", str(sweep), "--executor", "slurm", "--out", str(out), "--json")
    runs = {"failed": scalelab(*args, SCALELAB_FAULT="0:1"), "kept": scalelab(*args)}
    runs["retried"] = scalelab(*args, "--retry-failed")
    runs["again"] = scalelab(*args)
    return {"out": out, "marker": marker, **runs}


def test_cpu_sweep_runs_through_sbatch_and_resumes(swept: dict[str, Any]) -> None:
    """Two CPU points through sbatch -> srun -> torchrun; no GPU request on a GPU-less cluster."""
    done, out = swept["retried"], swept["out"]
    assert done.returncode == 0, done.stderr[-3000:]
    points = _points(done)
    assert [p["state"] for p in points] == ["ok", "ok"]
    records = list(out.glob("*.json"))
    assert len(records) == 2 and all(load_record(p).status == "ok" for p in records)
    assert done.stderr.count("sacct") <= 1, (
        "one line about the missing accounting, not one per poll"
    )
    scripts = list((out / ".sweep" / "slurm").glob("**/*submission.sh"))
    assert scripts and not any("gpus-per-node" in s.read_text() for s in scripts)
    again = swept["again"]
    assert again.returncode == 0 and all(p["action"] == "skipped" for p in _points(again))


def test_scancel_of_a_running_job_then_resume(real_slurm: None, tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, "cancel", steps=60)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "scalelab", "sweep", str(sweep), "--executor", "slurm"]
    proc = subprocess.Popen(
        [*argv, "--out", str(out), "--json"],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        job_id = ""
        for _ in range(120):
            listed = subprocess.run(
                ["squeue", "-h", "-n", "scalelab-cancel", "-t", "RUNNING", "-o", "%i"],
                capture_output=True,
                text=True,
            ).stdout.split()
            if listed:
                job_id = listed[0]
                break
            time.sleep(0.5)
        assert job_id, "the job never ran"
        time.sleep(3)
        subprocess.run(["scancel", job_id], check=True)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert stdout.strip(), stderr[-3000:]
    (point,) = json.loads(stdout)["points"]
    assert point["state"] == "interrupted", (point["detail"], stderr[-2000:])
    assert not list(out.glob("*.json")), "a cancelled point leaves no record"
    resumed = scalelab(
        "sweep", str(sweep), "--executor", "slurm", "--out", str(out), "--json", timeout=400
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _points(resumed)[0]["state"] == "ok"


def test_failed_point_is_kept_then_retried(swept: dict[str, Any]) -> None:
    failed = swept["failed"]
    assert failed.returncode == 1, failed.stderr[-3000:]
    points = _points(failed)
    assert len(points) == 2
    for point in points:
        assert point["state"] == "failed" and "injected failure" in str(point["detail"])
    kept = swept["kept"]
    assert kept.returncode == 1 and all(p["action"] == "skipped" for p in _points(kept))
    retried = swept["retried"]
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert [(p["state"], p["action"]) for p in _points(retried)] == [("ok", "retried")] * 2


def test_rejected_submission_is_one_line(real_slurm: None, tmp_path: Path) -> None:
    """Asking this GPU-less cluster for GPUs: sbatch's reason in one line, exit 2."""
    sweep = _sweep(tmp_path, "gres", extra="  gpus: gpus-per-node\n")
    done = scalelab("sweep", str(sweep), "--executor", "slurm", "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr
    assert "sbatch refused the job" in lines[-1] and "gres" in lines[-1].lower()


def test_hostile_values_reach_sbatch_quoted(swept: dict[str, Any]) -> None:
    """Shell in a value is data for sbatch, never run; the jobs run with the value as given."""
    assert swept["retried"].returncode == 0, swept["retried"].stderr[-3000:]
    assert not swept["marker"].exists()
