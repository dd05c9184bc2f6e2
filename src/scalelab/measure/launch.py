"""Start a harness job under torchrun and say how it ended.

`launch(job, job_file, failed_record)` writes the job to `job_file`, starts `torchrun` with
`python -m scalelab.measure.worker JOB_FILE` as the program (`--standalone` on one machine, or
the rendezvous flags of one node of a multi-node job), passes torchrun's stderr through and keeps
its tail. When the job dies without a record of its own (a rank killed by a signal), the launcher
names the rank torchrun saw die and writes `failed_record`; when a surviving rank wrote a
secondary record (it only lost its peers), the launcher names the rank that died first.

`child_env` is the environment of every child process the harness or a sweep starts (one thread
per process, gloo on loopback, this scalelab first on PYTHONPATH). `python -m
scalelab.measure.launch JOB_FILE` runs a job file as `scalelab bench`/`comm` would (torchrun
when the job has more than one process per node), for callers such as `scalelab sweep`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO

from scalelab.measure.job import BenchJob, CommJob, read_job, write_job
from scalelab.measure.record import SECONDARY_NOTE, base_record
from scalelab.results import Record, load_record, write_record


def scalelab_src() -> str:
    """The folder this scalelab is imported from, for the PYTHONPATH of every child process."""
    return str(Path(__file__).resolve().parents[2])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a harness child process: this one's, plus `extra`, plus defaults.

    OMP_NUM_THREADS=1 (one thread per rank; torchrun sets it too, a plain subprocess does not),
    GLOO_SOCKET_IFNAME=lo on Linux (gloo stays on loopback on one machine unless the user chose
    an interface), KINETO_LOG_LEVEL=6 (the profiler's own lines off), and this scalelab first on
    PYTHONPATH. Variables already set are kept.
    """
    env = dict(os.environ)
    env.update(extra or {})
    env.setdefault("OMP_NUM_THREADS", "1")
    # Kineto's own log lines off (set before torch loads; see train.KINETO_QUIET_LEVEL).
    env.setdefault("KINETO_LOG_LEVEL", "6")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    src = scalelab_src()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launcher dies (Linux), so no orphan job keeps running."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_RANK_FIELD = re.compile(r"rank\s*:\s*(\d+)")
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")


def launch(
    job: BenchJob | CommJob,
    job_file: Path,
    failed_record: Record | None,
    torchrun_args: Sequence[str] = ("--standalone",),
) -> tuple[int, Path | None]:
    """Run `job` (which must carry its identity) under torchrun; returns (rc, record path).

    `torchrun_args` set up the rendezvous: `--standalone` on one machine, or `--nnodes`,
    `--node-rank`, `--rdzv-backend c10d`, `--rdzv-endpoint HOST:PORT` on each node of a multi-node
    job. torchrun's stderr is passed through and its tail kept to name the failed rank if the job
    dies without writing a record itself; then `failed_record` is written (pass None on every node
    but the first, so that one node speaks for the job). A run stopped from outside (SIGTERM to
    the launcher or to torchrun: scancel, a time limit; SIGINT: Ctrl-C) ends in a `cancelled`
    record, which reports keep apart from failures; a real failure recorded before it is kept.
    While it runs, the launcher holds a lock on `job_file`, so that a later launch can tell a job
    file left by a killed launcher (`remove_stale_jobs`).
    """
    identity = job.identity
    if identity is None:
        raise ValueError("launch needs a job with its identity (the record's name)")
    out_dir = job.out_dir
    remove_stale_jobs(job_file.parent)
    write_job(job, job_file)
    lock = _hold(job_file)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", *torchrun_args,
        f"--nproc-per-node={job.nproc_per_node}", "-m", "scalelab.measure.worker", str(job_file),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        env=child_env(),
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        preexec_fn=_die_with_parent,
    )
    tail: deque[str] = deque(maxlen=400)

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()

    stopped_by: str | None = None

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopped_by
        stopped_by = stopped_by or _signal_name(signum)
        proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # Ctrl-C (torchrun got it too); wait for it to stop
                stopped_by = stopped_by or "SIGINT"
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
        reader.join(timeout=5)
        lock.close()
    final = out_dir / f"{identity.name}.json"
    # SIGTERM from outside (scancel, a time limit, pre-emption) may reach torchrun before us.
    if stopped_by is None and rc == -signal.SIGTERM:
        stopped_by = "SIGTERM to torchrun"
    if stopped_by is not None:
        return rc, _cancelled(final, failed_record, stopped_by)
    if rc == 0:
        return rc, final if final.exists() else None
    culprit = _culprit("".join(tail))
    who = f"rank {culprit[0]}" if culprit else "an unknown rank"
    how = ""
    if culprit and culprit[1] is not None:
        code = culprit[1]
        how = f" by signal {_signal_name(-code)}" if code < 0 else f" with exit code {code}"
    if final.exists():
        record = load_record(final)
        reporter = (record.error or "").split(":", 1)[0]
        if culprit and record.notes.get("error") == SECONDARY_NOTE and reporter != who:
            record.error = f"{who} died{how}; then {record.error}"
            record.notes.pop("error")
            write_record(record, out_dir)
        return rc, final
    if failed_record is None:
        return rc, None
    failed_record.error = (
        f"{who} died{how} without reporting an error; torchrun exited with code {rc}"
    )
    try:
        return rc, write_record(failed_record, out_dir, overwrite=False)
    except FileExistsError:
        return rc, final


CANCELLED = "cancelled by {how} (scancel, a time limit or Ctrl-C): stopped, not failed"
# A job file older than this whose lock nobody holds was left by a launcher that was killed.
STALE_JOB_S = 60.0


def _cancelled(final: Path, failed_record: Record | None, how: str) -> Path | None:
    """The record of a run stopped from outside: `cancelled`, unless a rank had already failed
    on its own (a primary failed or oom record is kept as it is)."""
    from scalelab.measure.worker import is_terminated_text

    error = CANCELLED.format(how=how)
    if final.exists():
        record = load_record(final)
        stopped = record.status == "failed" and (
            record.notes.get("error") == SECONDARY_NOTE or is_terminated_text(record.error or "")
        )
        if stopped:
            record.status = "cancelled"
            record.notes.pop("error", None)
            record.notes["stopped_rank_error"] = record.error or ""
            record.error = error
            write_record(record, final.parent)
        return final
    if failed_record is None:
        return None
    record = failed_record.model_copy(update={"status": "cancelled", "error": error})
    try:
        return write_record(record, final.parent, overwrite=False)
    except FileExistsError:
        return final


def _hold(job_file: Path) -> IO[bytes]:
    """An open handle holding an exclusive lock on `job_file` for as long as the run lasts (the
    kernel drops it when this process dies, however it dies)."""
    handle = job_file.open("rb")
    with contextlib.suppress(OSError):
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


def remove_stale_jobs(folder: Path) -> list[Path]:
    """Remove job files left by launchers that were killed (SIGKILL leaves them): older than
    STALE_JOB_S and locked by nobody. Returns the files removed."""
    from scalelab.measure.job import JOB_SUFFIX

    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    now = time.time()
    for path in folder.glob(f"*{JOB_SUFFIX}"):
        try:
            if now - path.stat().st_mtime < STALE_JOB_S:
                continue
            with path.open("rb") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises when a run holds it
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed


def launch_job(job: BenchJob | CommJob, out_dir: Path) -> tuple[int, Path | None]:
    """Launch `job` under torchrun from a job file in `out_dir/.jobs`; returns (rc, record).

    The job gets a new run identity; its failed record (written if the job dies without one) is
    prepared here, and the job file goes when the run ends (its folder too, when empty).
    """
    from scalelab.measure.job import JOB_SUFFIX

    job = job.model_copy(update={"identity": job.new_identity()})
    assert job.identity is not None
    job_file = out_dir / ".jobs" / f"{job.identity.name}{JOB_SUFFIX}"
    try:
        return launch(job, job_file, base_record(job, job.identity, "failed"))
    finally:
        job_file.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            job_file.parent.rmdir()  # only when no other run's job is there


def _culprit(report: str) -> tuple[int, int | None] | None:
    """The rank that failed first, from torchrun's failure report.

    A rank killed by a signal other than SIGTERM (SIGKILL from the OOM killer, SIGSEGV, SIGABRT)
    died on its own, while ranks that exit 1 or get SIGTERM are usually its consequences; failing
    that, torchrun's root cause (its earliest observed failure, which ties can misorder).
    """
    entries: list[tuple[int, int | None]] = []
    for block in report.split("\n[")[1:]:
        rank_match, code_match = _RANK_FIELD.search(block), _EXITCODE.search(block)
        if rank_match:
            entries.append(
                (int(rank_match.group(1)), int(code_match.group(1)) if code_match else None)
            )
    for rank, code in entries:
        if code is not None and code < 0 and code != -signal.SIGTERM:
            return rank, code
    root = report[report.rfind("Root Cause") :] if "Root Cause" in report else ""
    rank_match, code_match = _RANK_FIELD.search(root), _EXITCODE.search(root)
    if rank_match:
        return int(rank_match.group(1)), (int(code_match.group(1)) if code_match else None)
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def run_job_file(path: str | Path) -> int:
    """Run a job file here: in this process for one process per node, else under torchrun."""
    job = read_job(path)
    if job.nproc_per_node == 1:
        from scalelab.measure.worker import run_worker

        rc, _ = run_worker(job)
        return rc
    if job.identity is None:
        job = job.model_copy(update={"identity": job.new_identity()})
    assert job.identity is not None
    rc, _ = launch(job, Path(path), base_record(job, job.identity, "failed"))
    return rc


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m scalelab.measure.launch JOB_FILE", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(1 if run_job_file(sys.argv[1]) else 0)
