"""Run a sweep: skip what is done, run the rest through an executor, record every outcome.

A point's record is `<out>/<point.name>.json`. Before running, each point is:

- **done** when its record has status `ok`: skipped, so a sweep resumes after any interruption;
- **failed** when its record has status `failed` or `oom`: kept and skipped, unless
  `retry_failed`, which moves the record to `<out>/.sweep/attempts/` and runs the point again;
- **pending** otherwise. A record that only says its ranks were stopped by SIGTERM (a cancelled
  job, an interrupted sweep) is not the point's failure: it is moved aside and the point pending.

A point whose run ends without any record (a process killed by the OOM killer, a job function
that raised) gets a `failed` record written here, so every point that ran is recorded. A point
stopped from outside (SIGKILL of the sweep, a cancelled or timed-out SLURM job) is left with no
record and runs again next time. Records are written atomically by the harness, so there is
never a half record. One sweep at a time may use a folder (a lock file says so).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scalelab.errors import InputError
from scalelab.io import atomic_write_text
from scalelab.measure.record import SECONDARY_NOTE, base_record
from scalelab.results import RECORD_SUFFIX, Record, load_record, utc_now, write_record
from scalelab.sweep.executors import STATE_DIR, Ended, Executor
from scalelab.sweep.plan import Point

State = Literal["ok", "failed", "oom", "pending", "running", "interrupted"]
_TERMINATED = "TerminatedError"


@dataclass
class PointStatus:
    point: Point
    state: State
    action: str = "pending"  # skipped | ran | retried
    record: Path | None = None
    detail: str = ""
    seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        p = self.point
        return {
            "id": p.id,
            "name": p.name,
            "model": p.model_name,
            "nodes": p.nodes,
            "gpus_per_node": p.gpus_per_node,
            "gpus": p.gpus,
            "series": list(p.series),
            "run": p.run,
            "state": self.state,
            "action": self.action,
            "record": str(self.record) if self.record else None,
            "detail": self.detail,
            "seconds": self.seconds,
        }


@dataclass
class SweepResult:
    out: Path
    executor: str
    statuses: list[PointStatus]
    interrupted: bool = False
    seconds: float = 0.0

    def count(self) -> dict[str, int]:
        """Points by state (ok, failed, oom, pending, interrupted), and `points` in all."""
        counts: dict[str, int] = {"points": len(self.statuses)}
        for s in self.statuses:
            counts[s.state] = counts.get(s.state, 0) + 1
        return counts

    def actions(self) -> dict[str, int]:
        """Points by what this sweep did with them (skipped, ran, retried, pending)."""
        counts: dict[str, int] = {}
        for s in self.statuses:
            counts[s.action] = counts.get(s.action, 0) + 1
        return counts

    @property
    def complete(self) -> bool:
        return all(s.state == "ok" for s in self.statuses)

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "executor": self.executor,
            "complete": self.complete,
            "interrupted": self.interrupted,
            "seconds": round(self.seconds, 3),
            "counts": self.count(),
            "actions": self.actions(),
            "points": [s.to_dict() for s in self.statuses],
        }


class Progress:
    """What a sweep reports as it goes; the CLI draws it (done, running, failed, remaining)."""

    def begin(self, statuses: Sequence[PointStatus]) -> None:
        pass

    def update(self, status: PointStatus, statuses: Sequence[PointStatus]) -> None:
        pass

    def end(self, statuses: Sequence[PointStatus]) -> None:
        pass


def record_path(out: Path, point: Point) -> Path:
    return out / f"{point.name}{RECORD_SUFFIX}"


def stopped_from_outside(record: Record) -> bool:
    """A cancelled record, or a failed one whose only error is that its ranks were terminated
    (SIGTERM)."""
    return record.status == "cancelled" or (
        record.status == "failed"
        and record.notes.get("error") == SECONDARY_NOTE
        and _TERMINATED in (record.error or "")
    )


def _set_aside(out: Path, path: Path, why: str) -> Path:
    """Move a record out of the way (kept for the curious, never loaded by reports)."""
    attempts = out / STATE_DIR / "attempts"
    attempts.mkdir(parents=True, exist_ok=True)
    target = attempts / f"{path.stem}.{why}.{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json"
    os.replace(path, target)
    return target


def classify(out: Path, point: Point, retry_failed: bool) -> PointStatus:
    """The state of a point from its record (and what resuming does with it)."""
    path = record_path(out, point)
    if not path.exists():
        return PointStatus(point, "pending")
    record = load_record(path)
    if record.status == "ok":
        return PointStatus(point, "ok", "skipped", path, "done before")
    if stopped_from_outside(record):
        _set_aside(out, path, "stopped")
        return PointStatus(point, "pending", detail="was stopped before; runs again")
    assert record.status != "cancelled"  # stopped from outside, set aside above
    if retry_failed:
        _set_aside(out, path, record.status)
        return PointStatus(point, "pending", "retried", detail=f"was {record.status}; retried")
    return PointStatus(
        point, record.status, "skipped", path, f"{record.error or record.status} (kept)"
    )


@contextlib.contextmanager
def sweep_lock(out: Path) -> Iterator[None]:
    """One sweep at a time in a folder (an advisory lock, released when the process ends)."""
    import fcntl

    state = out / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    fh = open(state / "lock", "a+")  # noqa: SIM115
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise InputError("out", f"another scalelab sweep is running in {out}") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        yield
    finally:
        fh.close()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a `kill`, a job's end) stops the sweep the way Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def write_plan(out: Path, sweep_name: str, points: Sequence[Point]) -> Path:
    """`<out>/.sweep/plan.json`: every point of the sweep (what `report` could compare against)."""
    doc = {
        "sweep": sweep_name,
        "written_utc": utc_now(),
        "points": [p.model_dump() for p in points],
    }
    return atomic_write_text(out / STATE_DIR / "plan.json", json.dumps(doc, indent=1) + "\n")


def failed_record(point: Point, out: Path, error: str) -> Record:
    """The record of a point whose run ended without writing one itself."""
    job = point.job_for(out, utc_now())
    assert job.identity is not None
    return base_record(job, job.identity, "failed", error)


def add_prediction(path: Path, point: Point) -> str | None:
    """`predict: true`: the predictor's numbers beside an ok record (on the record's cluster,
    else h100-ib, as `bench --predict`); returns why not, if it could not."""
    from scalelab.config.catalog import load_cluster
    from scalelab.predicted import attach_prediction, predictor_available

    if not predictor_available():
        return "the predictor is not available in this install"
    record = load_record(path)
    try:
        cluster = load_cluster(record.cluster or point.cluster or "h100-ib")
    except InputError as exc:
        return f"no prediction: {exc}"
    write_record(attach_prediction(record, cluster), path.parent)
    return None


def run_sweep(
    points: Sequence[Point],
    out: Path,
    executor: Executor,
    *,
    retry_failed: bool = False,
    progress: Progress | None = None,
    sweep_name: str = "sweep",
) -> SweepResult:
    """Run every point that is not done; returns each point's state."""
    progress = progress or Progress()
    out = Path(out)
    start = time.monotonic()
    executor.check(points, out)
    out.mkdir(parents=True, exist_ok=True)
    with sweep_lock(out):
        write_plan(out, sweep_name, points)
        statuses = [classify(out, p, retry_failed) for p in points]
        by_id = {s.point.id: s for s in statuses}
        todo = [s.point for s in statuses if s.state == "pending"]
        begun: dict[str, float] = {}
        progress.begin(statuses)

        def started(point: Point, detail: str) -> None:
            s = by_id[point.id]
            s.state, s.detail = "running", detail
            s.action = "retried" if s.action == "retried" else "ran"
            begun[point.id] = time.monotonic()
            progress.update(s, statuses)

        def ended(e: Ended) -> None:
            s = by_id[e.point.id]
            s.seconds = time.monotonic() - begun.get(e.point.id, time.monotonic())
            _settle(out, s, e)
            progress.update(s, statuses)

        interrupted = False
        try:
            with _sigterm_as_interrupt():
                if todo:
                    executor.run(todo, out, started, ended)
        except KeyboardInterrupt:
            interrupted = True
            for s in statuses:
                if s.state == "running":
                    s.state, s.detail = "interrupted", "the sweep was interrupted; runs again"
                    path = record_path(out, s.point)
                    with contextlib.suppress(OSError, InputError):
                        if path.exists() and load_record(path).status != "ok":
                            _set_aside(out, path, "interrupted")
        progress.end(statuses)
    return SweepResult(
        out=out,
        executor=executor.name,
        statuses=statuses,
        interrupted=interrupted,
        seconds=time.monotonic() - start,
    )


def _settle(out: Path, s: PointStatus, e: Ended) -> None:
    """Read the record a finished point left; write a failed one if it left none."""
    path = record_path(out, s.point)
    if path.exists():
        record = load_record(path)
        if stopped_from_outside(record):
            _set_aside(out, path, "stopped")
            s.state, s.record = "interrupted", None
            s.detail = f"stopped from outside ({e.detail}); runs again"
            return
        assert record.status != "cancelled"  # stopped from outside, set aside above
        s.state, s.record = record.status, path
        s.detail = "" if record.status == "ok" else (record.error or e.detail)
        if record.status == "ok" and s.point.bench.predict and record.prediction is None:
            s.detail = add_prediction(path, s.point) or ""
        return
    if e.interrupted:
        s.state, s.detail = "interrupted", f"{e.detail}; runs again"
        return
    log = f"; log: {e.log}" if e.log else ""
    error = f"the run ended ({e.detail}) without writing a record{log}"
    with contextlib.suppress(FileExistsError):
        write_record(failed_record(s.point, out, error), out, overwrite=False)
    s.state, s.record, s.detail = "failed", path, error
