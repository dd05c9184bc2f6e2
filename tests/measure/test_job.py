"""The typed harness job: one description of a run, written to a file that the worker reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from scalelab.config.catalog import load_model
from scalelab.config.layout import Layout
from scalelab.measure.config import BenchOptions
from scalelab.measure.job import JOB_SUFFIX, BenchJob, CommJob, RunIdentity, read_job, write_job
from scalelab.measure.launch import child_env
from scalelab.results import load_record, record_paths

ROOT = Path(__file__).resolve().parents[2]


def _job(out: Path, **layout: object) -> BenchJob:
    return BenchJob(
        model=load_model("llama-tiny"),
        layout=Layout(gpus=1, global_batch=2, seq_len=32, **layout),  # type: ignore[arg-type]
        options=BenchOptions(steps=1, warmup=0, repeats=1, lr=3e-3, out_dir=str(out)),
        identity=RunIdentity(
            run_id="abc123", created_utc="2026-12-03T10:00:00Z", name="tiny-job", tags={"x": 1}
        ),
    )


def test_jobs_round_trip_through_a_file(tmp_path: Path) -> None:
    job = _job(tmp_path, recompute="selective")
    path = write_job(job, tmp_path / f"a{JOB_SUFFIX}")
    assert read_job(path) == job
    comm = CommJob(collectives=["all_reduce"], sizes_bytes=[1024, 2048], nproc_per_node=2)
    assert read_job(write_job(comm, tmp_path / f"b{JOB_SUFFIX}")) == comm
    assert not list(tmp_path.glob("*.json")), "a job file must not look like a record"


def test_a_bad_job_file_is_refused_with_the_field(tmp_path: Path) -> None:
    path = write_job(_job(tmp_path), tmp_path / f"a{JOB_SUFFIX}")
    path.write_text(path.read_text().replace('"fsdp"', '"zero9"'))
    with pytest.raises(ValidationError, match="sharding"):
        read_job(path)


def test_child_env_defaults_and_keeps_what_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    env = child_env({"EXTRA": "1"})
    assert env["OMP_NUM_THREADS"] == "1" and env["EXTRA"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == "eth7"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT / "src")


def _worker(job_file: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = child_env({"PYTHONWARNINGS": "ignore"})
    env.pop("SCALELAB_FAULT", None)
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "scalelab.measure.worker", str(job_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def test_the_worker_runs_a_job_file(tmp_path: Path) -> None:
    job = _job(tmp_path / "out", recompute="selective")
    done = _worker(write_job(job, tmp_path / f"job{JOB_SUFFIX}"))
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = record_paths(tmp_path / "out")
    record = load_record(path)
    assert path.name == "tiny-job.json" and record.run_id == "abc123"
    assert record.status == "ok" and record.workload["tags"] == {"x": 1}
    assert record.layout == job.layout.model_dump()
    assert record.summary["tokens_per_s"]["mean"] > 0


def test_a_failing_worker_leaves_one_failed_record(tmp_path: Path) -> None:
    job = _job(tmp_path / "out")
    done = _worker(write_job(job, tmp_path / f"job{JOB_SUFFIX}"), SCALELAB_FAULT="0:0")
    assert done.returncode == 1
    (path,) = record_paths(tmp_path / "out")
    record = load_record(path)
    assert record.status == "failed" and record.name == "tiny-job"
    assert (record.error or "").startswith("rank 0: RuntimeError: injected failure")
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]
