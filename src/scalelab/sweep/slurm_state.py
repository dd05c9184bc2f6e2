"""Job states on a SLURM without accounting: `squeue` in place of `sacct`.

submitit asks `sacct` for job states. A cluster without an accounting database (a one-node test
SLURM, some small clusters) answers every call with an error, and submitit then never learns that
a job which left no result (cancelled, out of time) has ended: the sweep would wait for ever.
There, a job is active while `squeue` lists it and ended once it does not; why it ended is read
from the line slurmstepd writes into the job's log ("*** JOB 12 ON node CANCELLED AT ...").
"""

from __future__ import annotations

import getpass
import re
import subprocess
import time
from pathlib import Path
from typing import Any

ENDED = "ENDED"
_STEPD_REASON = re.compile(
    r"\*\*\* (?:JOB|STEP) \S+ ON \S+ (CANCELLED|DUE TO TIME LIMIT|DUE TO PREEMPTION|DUE TO NODE FAILURE)"
)
_REASON_STATE = {
    "CANCELLED": "CANCELLED",
    "DUE TO TIME LIMIT": "TIMEOUT",
    "DUE TO PREEMPTION": "PREEMPTED",
    "DUE TO NODE FAILURE": "NODE_FAIL",
}


def accounting_error() -> str | None:
    """None when `sacct` answers; otherwise what it said (one line)."""
    try:
        proc = subprocess.run(
            ["sacct", "-n", "-X", "-j", "1", "-o", "JobID"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode == 0:
        return None
    lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"sacct exit code {proc.returncode}"


def stopped_state_from_log(log: Path | None) -> str | None:
    """CANCELLED, TIMEOUT, PREEMPTED or NODE_FAIL when slurmstepd said so in the job's log."""
    if log is None:
        return None
    try:
        text = log.read_text(errors="replace")[-20000:]
    except OSError:
        return None
    found = _STEPD_REASON.findall(text)
    return _REASON_STATE[found[-1]] if found else None


def squeue_watcher(delay_s: int = 5) -> Any:
    """A submitit watcher that reads states from `squeue` (needs submitit)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class SqueueWatcher(SlurmInfoWatcher):  # type: ignore[misc]
        def update(self) -> None:
            waiting = self._registered - self._finished
            if not waiting:
                return
            self._num_calls += 1
            try:
                proc = subprocess.run(
                    ["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T|%N"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            except (OSError, subprocess.TimeoutExpired):
                self._last_status_check = time.time()
                return
            if proc.returncode == 0:
                listed: dict[str, dict[str, str]] = {}
                for line in proc.stdout.splitlines():
                    parts = line.strip().split("|")
                    if len(parts) == 3:
                        listed[parts[0]] = {
                            "JobID": parts[0],
                            "State": parts[1],
                            "NodeList": parts[2],
                        }
                for job_id in waiting:
                    self._info_dict[job_id] = listed.get(
                        job_id, {"JobID": job_id, "State": ENDED, "NodeList": ""}
                    )
            self._last_status_check = time.time()
            for job_id in waiting:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)

    return SqueueWatcher(delay_s=delay_s)
