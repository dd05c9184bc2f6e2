"""One process of a harness job, and what happens when it fails.

`python -m scalelab.measure.worker JOB_FILE` (what `scalelab.measure.launch` has torchrun start
on every rank), or `run_worker(job)` in a process that is already a rank (a torchrun the user
started, or a one-process run). Rank 0 writes the record. A rank that fails writes a `failed` (or
`oom`) record naming itself, the first writer winning (records are hard-linked into place, never
overwritten). A rank that merely lost its peers (closed connection, collective timeout, SIGTERM)
marks its record as secondary; the launcher then names the rank torchrun saw die by a signal. A
failed rank leaves at once (`os._exit`) so that peers stuck in a collective do not keep the job
alive. Nothing is written until the run ends, and writes are atomic (temp file, fsync, rename),
so a killed run leaves no record rather than a partial one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from scalelab.measure.config import under_torchrun
from scalelab.measure.forensics import Paths, Watcher, hang_report, recorder_env, run_prefix
from scalelab.measure.job import BenchJob, CommJob, RunIdentity, read_job
from scalelab.measure.record import SECONDARY_NOTE, base_record
from scalelab.results import Record, write_record


class TerminatedError(Exception):
    """This rank got SIGTERM: torchrun stopping it after another rank failed, or a cancelled job."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise TerminatedError("terminated by SIGTERM (torchrun stops the other ranks when one fails)")


_PEER_LOSS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "timed out",
    "remote process exited",
    "communicator was aborted",
    "ncclremoteerror",
    "terminated by sigterm",  # a TerminatedError that a library wrapped in its own error (DTensor)
)


# How long the rank that timed out waits for the others' dumps (they answer within POLL_S).
HANG_WAIT_S = 5.0


def is_timeout(exc: BaseException) -> bool:
    """A collective that waited out the process group's timeout (gloo or NCCL)."""
    text = str(exc).lower()
    return not isinstance(exc, TerminatedError) and ("timed out" in text or "timeout" in text)


def is_terminated_text(error: str) -> bool:
    """A record's error that only says its rank was stopped by SIGTERM."""
    return "TerminatedError" in error or "terminated by sigterm" in error.lower()


def is_secondary(exc: BaseException) -> bool:
    """An error that reports another rank's failure rather than this rank's own."""
    return isinstance(exc, TerminatedError) or any(s in str(exc).lower() for s in _PEER_LOSS)


def error_text(rank: int, exc: BaseException) -> str:
    text = f"rank {rank}: {type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 2000 else text[:2000] + " ..."


def is_oom(exc: BaseException) -> bool:
    import torch

    return (
        isinstance(exc, (torch.OutOfMemoryError, MemoryError))
        or "out of memory" in str(exc).lower()
    )


def _measure(job: BenchJob | CommJob, info: Any, identity: RunIdentity) -> Record:
    if isinstance(job, CommJob):
        from scalelab.measure.comm_run import measure_comm

        return measure_comm(job, info, identity)
    from scalelab.measure.bench_run import measure_bench

    return measure_bench(job, info, identity)


def run_worker(job: BenchJob | CommJob) -> tuple[int, Path | None]:
    """Run this process's part of the job; returns (exit code, record path on rank 0).

    Under torchrun a failed rank does not return: it writes its record and exits with code 1.
    """
    import torch.distributed as dist

    from scalelab.measure.train import init_distributed

    identity = job.identity
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    paths = Paths(job.out_dir / ".flight", run_prefix(identity.name if identity else None))
    for key, value in recorder_env().items():
        os.environ.setdefault(key, value)
    watcher = Watcher(paths, rank) if world_size > 1 else None
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        info = init_distributed(job.timeout_s, paths.nccl_prefix())
        rank = info.rank
        if identity is None:
            shared: list[Any] = [job.new_identity(info.world_size) if rank == 0 else None]
            dist.broadcast_object_list(shared, src=0)
            identity = shared[0]
        assert identity is not None
        record = _measure(job, info, identity)
        path = write_record(record, job.out_dir) if rank == 0 else None
        dist.barrier()
        dist.destroy_process_group()
        _forget(paths, rank)
        return 0, path
    except KeyboardInterrupt:
        if under_torchrun():
            raise  # the launcher got Ctrl-C too and records the cancelled run
        identity = identity or job.new_identity()
        _write_cancelled(job, identity, "SIGINT")
        if dist.is_initialized():
            dist.destroy_process_group()
        return 130, None
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        if identity is None:
            identity = job.new_identity()
        if isinstance(exc, TerminatedError) and not under_torchrun():
            # One process, no launcher: SIGTERM here is the job being cancelled.
            path = _write_cancelled(job, identity, "SIGTERM")
            if dist.is_initialized():
                dist.destroy_process_group()
            return 1, path
        status = "oom" if is_oom(exc) else "failed"
        record = base_record(job, identity, status, error_text(rank, exc))
        hang = None
        if world_size > 1 and is_timeout(exc):
            # This rank waited out the timeout: ask every rank where it is (forensics.py).
            wait_s = min(HANG_WAIT_S, max(1.0, job.timeout_s))
            hang, hang_notes = hang_report(paths, rank, world_size, wait_s)
            record.notes.update(hang_notes)
        if hang:
            record.notes["timeout_error"] = record.error or ""
            record.error = hang
        elif is_secondary(exc):
            record.notes["error"] = SECONDARY_NOTE
        dumps = [paths.nccl_dump(r) for r in range(world_size) if paths.nccl_dump(r).exists()]
        if dumps:  # NCCL's own flight recorder dumps (GPU runs that timed out)
            from scalelab.measure.flight import explain

            record.notes["nccl_flight_recorder"] = " ".join(str(p) for p in dumps)
            stuck, ignored = explain(dumps)
            if stuck:
                record.notes["hang"] = stuck
            if ignored:
                record.notes["flight_ignored"] = "; ".join(ignored)
        path = None
        try:
            path = write_record(record, job.out_dir, overwrite=False)
            print(f"scalelab {job.kind}: {status} on rank {rank}; record {path}", file=sys.stderr)
        except FileExistsError:
            pass
        if not under_torchrun():
            if dist.is_initialized():
                dist.destroy_process_group()
            return 1, path
        sys.stderr.flush()
        sys.stdout.flush()
        # Other ranks may wait in a collective: leave at once, torchrun stops the rest.
        os._exit(1)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if watcher is not None:
            watcher.stop()


def _write_cancelled(job: BenchJob | CommJob, identity: RunIdentity, how: str) -> Path | None:
    from scalelab.measure.launch import CANCELLED

    record = base_record(job, identity, "cancelled", CANCELLED.format(how=how))
    try:
        return write_record(record, job.out_dir, overwrite=False)
    except FileExistsError:
        return None


def _forget(paths: Paths, rank: int) -> None:
    """After a run that ended well: this rank's pid file goes (and the folder, when empty)."""
    paths.pid(rank).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        paths.folder.rmdir()


def _die_with_torchrun() -> None:
    """SIGKILL this rank when torchrun dies (Linux): torchrun puts ranks in sessions of their own,
    so nothing else ends a rank left waiting in rendezvous by a killed launcher."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent == 1 or os.getppid() != parent:  # torchrun died before the prctl
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m scalelab.measure.worker JOB_FILE", file=sys.stderr)
        return 2
    _die_with_torchrun()
    rc, _ = run_worker(read_job(args[0]))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
