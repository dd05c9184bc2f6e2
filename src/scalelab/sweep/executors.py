"""Where a sweep's points run: `local` (torchrun on this machine) or `slurm` (one job per point).

Both run a point's `BenchJob` (`point.job_for(out, ...)`: the point's record name and tags as the
run's identity), so the record lands at `<out>/<point.name>.json`, written atomically by the
harness. An executor only starts points and says when each has ended; `run.py` reads the records.

`local` writes each point's job to `<out>/.sweep/jobs/<point.name>.job` and starts it as a
subprocess (`python -m scalelab.measure.launch JOB`, which starts torchrun when the point has
several processes), with the harness's child environment, in its own process group and marked with `SCALELAB_RUN_TOKEN` in its environment, so that an
interrupted sweep can end the whole point — torchrun and its workers, which run in sessions of
their own — with SIGKILL (`kill_tree`), leaving no record rather than a failed one. If the sweep
itself is killed, each process of the chain dies with its parent (PR_SET_PDEATHSIG, down to the
workers). `slurm` submits each point through
submitit as a job of `nodes` nodes, one task per node; each task starts torchrun with a c10d
rendezvous on the first host of the job (`--nnodes $SLURM_NNODES --node-rank $SLURM_NODEID
--rdzv-endpoint HOST:PORT`). The cluster's SLURM does the scheduling: points are submitted as job
arrays, one per node count, with `--max-parallel` as the array's throttle.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from scalelab.errors import InputError
from scalelab.io import atomic_write_text
from scalelab.measure.launch import child_env
from scalelab.results import utc_now
from scalelab.sweep.plan import Point
from scalelab.sweep.schema import SlurmOptions, check_slurm_value
from scalelab.sweep.slurm_state import (
    ENDED,
    accounting_error,
    squeue_watcher,
    stopped_state_from_log,
)

STATE_DIR = ".sweep"  # hidden: record loaders skip it


@dataclass
class Ended:
    """How a point's job ended, as the executor saw it."""

    point: Point
    returncode: int | None
    detail: str
    interrupted: bool = False  # stopped from outside (scheduler, signal): not the point's failure
    log: Path | None = None


Started = Callable[[Point, str], None]
Finished = Callable[[Ended], None]


class Executor(Protocol):
    name: str

    def check(self, points: Sequence[Point], out: Path) -> None: ...

    def run(
        self, points: Sequence[Point], out: Path, started: Started, ended: Finished
    ) -> None: ...


def _die_with_parent() -> None:
    """In a child: a new process group, and SIGKILL when the sweep dies (Linux)."""
    os.setpgrp()
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _process_table() -> dict[int, list[int]]:
    """parent pid -> child pids of every process (psutil: Linux, macOS, ...)."""
    import psutil

    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            children.setdefault(int(ppid), []).append(proc.pid)
    return children


def _marked(token: str) -> list[int]:
    """Processes whose environment carries `SCALELAB_RUN_TOKEN=token` (reparented orphans too);
    a process whose environment cannot be read (another user's) is not ours."""
    import psutil

    found = []
    for proc in psutil.process_iter(["environ"]):
        environ = proc.info.get("environ")
        if environ and environ.get("SCALELAB_RUN_TOKEN") == token:
            found.append(proc.pid)
    return found


def kill_tree(pid: int, token: str | None = None) -> None:
    """SIGKILL `pid`, every process below it and every process marked with `token`.

    torchrun starts its workers in their own sessions, so killing torchrun's process group is not
    enough: the workers would stay alive (in rendezvous) as orphans. The tree is frozen with
    SIGSTOP while it is walked (no new children escape), then killed, process groups included.
    """
    victims: list[int] = []
    seen: set[int] = set()
    for _ in range(3):  # a process that forked between the walk and its SIGSTOP is found next time
        table = _process_table()
        todo = [pid, *(_marked(token) if token else [])]
        new = False
        while todo:
            p = todo.pop()
            if p in seen or p == os.getpid():
                continue
            seen.add(p)
            new = True
            victims.append(p)
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGSTOP)
            todo.extend(table.get(p, ()))
        if not new:
            break
    for p in victims:
        with contextlib.suppress(OSError):
            if os.getpgid(p) == p:
                os.killpg(p, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


class LocalExecutor:
    """Each point as `scalelab bench` (torchrun) on this machine, `max_parallel` at a time."""

    name = "local"

    def __init__(self, max_parallel: int = 1, poll_s: float = 0.2) -> None:
        if max_parallel < 1:
            raise InputError("max-parallel", f"must be a positive integer, not {max_parallel}")
        self.max_parallel = max_parallel
        self.poll_s = poll_s

    def check(self, points: Sequence[Point], out: Path) -> None:
        for p in points:
            if p.nodes != 1:
                raise InputError(
                    "nodes",
                    f"the local executor runs on this one machine: {p.nodes} nodes is for "
                    "--executor slurm (or set nodes: [1])",
                )

    def command(self, point: Point, out: Path) -> list[str]:
        """Write the point's job file; the command that runs it."""
        from scalelab.measure.job import JOB_SUFFIX, write_job

        job_file = out / STATE_DIR / "jobs" / f"{point.name}{JOB_SUFFIX}"
        write_job(point.job_for(out, utc_now()), job_file)
        return [sys.executable, "-m", "scalelab.measure.launch", str(job_file)]

    def run(self, points: Sequence[Point], out: Path, started: Started, ended: Finished) -> None:
        logs = out / STATE_DIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        queue = deque(points)
        running: dict[int, tuple[subprocess.Popen[bytes], Point, Path, IO[bytes]]] = {}
        tokens: dict[int, str] = {}
        try:
            while queue or running:
                while queue and len(running) < self.max_parallel:
                    point = queue.popleft()
                    env = child_env(point.env)
                    env["SCALELAB_RUN_TOKEN"] = f"{os.getpid()}-{point.name}-{time.time_ns()}"
                    log = logs / f"{point.name}.log"
                    fh: IO[bytes] = open(log, "ab")  # noqa: SIM115 (closed when the point ends)
                    proc = subprocess.Popen(
                        self.command(point, out),
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        preexec_fn=_die_with_parent,
                    )
                    running[proc.pid] = (proc, point, log, fh)
                    tokens[proc.pid] = env["SCALELAB_RUN_TOKEN"]
                    started(point, f"pid {proc.pid}")
                for pid, entry in list(running.items()):
                    rc = entry[0].poll()
                    if rc is None:
                        continue
                    del running[pid]
                    entry[3].close()
                    ended(Ended(entry[1], rc, _exit_detail(rc), log=entry[2]))
                if running:
                    time.sleep(self.poll_s)
        finally:
            for pid, entry in running.items():
                kill_tree(pid, tokens.get(pid))
                entry[0].wait()
                entry[3].close()


def _exit_detail(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


# SLURM ---------------------------------------------------------------------------------------

# Job states in which the job was stopped from outside rather than failing by itself.
_STOPPED_STATES = ("CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE")
_ACTIVE_STATES = (
    "PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED",
    "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED",
)  # fmt: skip


def rendezvous(
    nnodes: int, node: int, hostnames: list[str], job_id: str, port: int | None
) -> list[str]:
    """torchrun's rendezvous flags for one node of a job: c10d on the job's first host.

    The first host is what `scontrol show hostnames $SLURM_JOB_NODELIST | head -1` gives (submitit
    parses the node list the same way); the port is fixed by the sweep or derived from the job id,
    so that jobs sharing a node do not collide. A one-node job meets on the loopback address.
    """
    master = hostnames[0] if nnodes > 1 and hostnames else "127.0.0.1"
    digits = "".join(c for c in job_id if c.isdigit()) or "0"
    rdzv_port = port or 29500 + int(digits[-6:]) % 2000
    return [
        "--nnodes", str(nnodes), "--node-rank", str(node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master}:{rdzv_port}",
        "--rdzv-id", f"scalelab-{job_id}",
    ]  # fmt: skip


def run_point_on_node(point_json: str, out: str, port: int | None) -> dict[str, Any]:
    """The job function: runs on every node of a point's job (one SLURM task per node).

    Starts torchrun with a c10d rendezvous on the job's first host; the first node writes a
    failed record if the job ends badly without one (the harness names the rank that died).
    """
    import tempfile

    import submitit

    from scalelab.measure.job import JOB_SUFFIX
    from scalelab.measure.launch import launch
    from scalelab.measure.record import base_record

    point = Point.model_validate_json(point_json)
    env = submitit.JobEnvironment()
    nnodes, node = int(env.num_nodes), int(env.node)
    torchrun_args = rendezvous(nnodes, node, list(env.hostnames), str(env.job_id), port)
    os.environ.update(point.env)
    job = point.job_for(out, utc_now())
    assert job.identity is not None
    # The first node speaks for the job when it ends without a record of its own.
    failed = base_record(job, job.identity, "failed") if node == 0 else None
    with tempfile.TemporaryDirectory(prefix="scalelab-job-") as folder:
        job_file = Path(folder) / f"{point.name}{JOB_SUFFIX}"
        rc, path = launch(job, job_file, failed, torchrun_args)
    return {"node": node, "returncode": rc, "record": str(path) if path else None}


class SlurmExecutor:
    """Each point as a SLURM job through submitit (nodes × GPUs per node, one task per node).

    `backend` is submitit's cluster: "slurm" on a cluster; "local" or "debug" run the same job
    function on this machine (tests, trying a sweep out).
    """

    name = "slurm"

    def __init__(
        self,
        options: SlurmOptions,
        max_parallel: int | None = None,
        backend: str = "slurm",
        poll_s: float | None = None,
    ) -> None:
        if max_parallel is not None and max_parallel < 1:
            raise InputError("max-parallel", f"must be a positive integer, not {max_parallel}")
        for key, value in options.model_dump().items():
            if isinstance(value, str):
                check_slurm_value(f"slurm.{key}", value)
        for key, value in options.additional.items():  # keys and values reach #SBATCH lines
            check_slurm_value(f"slurm.additional.{key}", f"{key}={value}")
        self.options = options
        self.max_parallel = max_parallel
        self.backend = backend
        self.poll_s = options.poll_s if poll_s is None else poll_s
        self._watcher: Any = None

    def check(self, points: Sequence[Point], out: Path) -> None:
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise InputError(
                "executor", "--executor slurm needs submitit: pip install 'scalelab[slurm]'"
            ) from None
        if "%" in str(out.resolve()):
            raise InputError(
                "out", "SLURM reads % in log paths as a pattern: choose a folder without %"
            )
        check_slurm_value("out", str(out.resolve()))

    def folder(self, out: Path) -> Path:
        return (out / STATE_DIR / "slurm").resolve()

    def parameters(self, point: Point, sweep_name: str) -> dict[str, Any]:
        """submitit's (AutoExecutor) parameters for a point's job."""
        o = self.options
        params: dict[str, Any] = {
            "name": f"scalelab-{sweep_name}",
            "nodes": point.nodes,
            "tasks_per_node": 1,
            "timeout_min": o.time_min,
        }
        additional = dict(o.additional)
        request = self.gpu_request(point)
        if request == "gpus-per-node":
            params["gpus_per_node"] = point.gpus_per_node
        elif request == "gres":
            kind = f"gpu:{o.gres_type}" if o.gres_type else "gpu"
            additional.setdefault("gres", f"{kind}:{point.gpus_per_node}")
        if o.cpus_per_task is not None:
            params["cpus_per_task"] = o.cpus_per_task
        if o.mem_gb is not None:
            params["mem_gb"] = o.mem_gb
        slurm: dict[str, Any] = {
            "partition": o.partition,
            "account": o.account,
            "qos": o.qos,
            "constraint": o.constraint,
            "exclusive": True if o.exclusive else None,
            "setup": list(o.setup) or None,
            "additional_parameters": additional or None,
            "array_parallelism": self.max_parallel,
        }
        params.update({f"slurm_{k}": v for k, v in slurm.items() if v is not None})
        return params

    def gpu_request(self, point: Point) -> str:
        """How the point's job asks for GPUs: "gpus-per-node", "gres" or "none".

        `auto` asks only where the sweep's cluster has GPUs: a cluster without GPU gres rejects a
        job that asks for them, and a sweep that names no cluster does not say it has any.
        """
        choice = self.options.gpus
        if choice != "auto":
            return choice
        if point.cluster is None:
            return "none"
        from scalelab.config.catalog import load_cluster

        return "gpus-per-node" if load_cluster(point.cluster).gpu.is_gpu else "none"

    def _executor(self, out: Path, point: Point, sweep_name: str) -> Any:
        import submitit

        kwargs: dict[str, Any] = {}
        if self.options.python and self.backend == "slurm":
            kwargs["slurm_python"] = shlex.quote(self.options.python)
        try:
            ex = submitit.AutoExecutor(folder=self.folder(out), cluster=self.backend, **kwargs)
        except RuntimeError as exc:
            raise InputError("executor", f"no SLURM here ({exc}): use --executor local") from None
        ex.update_parameters(**self.parameters(point, sweep_name))
        return ex

    def submit(self, points: Sequence[Point], out: Path) -> list[tuple[Point, Any]]:
        """Submit points, one job array per node count; returns (point, submitit job) pairs."""
        groups: dict[tuple[int, int], list[Point]] = {}
        for p in points:
            groups.setdefault((p.nodes, p.gpus_per_node), []).append(p)
        from submitit.core.utils import FailedJobError

        submitted: list[tuple[Point, Any]] = []
        for group in groups.values():
            ex = self._executor(out, group[0], group[0].sweep)
            try:
                with ex.batch():
                    jobs = [
                        ex.submit(
                            run_point_on_node,
                            p.model_dump_json(),
                            str(out.resolve()),
                            self.options.port,
                        )
                        for p in group
                    ]
            except FailedJobError as exc:
                self._remember(out, submitted)
                lines = [line for line in str(exc).strip().splitlines() if line.strip()]
                reason = lines[-1].removeprefix("sbatch: error: ") if lines else "no reason given"
                raise InputError("slurm", f"sbatch refused the job: {reason}") from None
            submitted.extend(zip(group, jobs, strict=True))
        self._remember(out, submitted)
        return submitted

    def _jobs_file(self, out: Path) -> Path:
        return out / STATE_DIR / "jobs.json"

    def _remember(self, out: Path, submitted: list[tuple[Point, Any]]) -> None:
        path = self._jobs_file(out)
        known = self.known_jobs(out)
        known.update({p.id: str(job.job_id) for p, job in submitted})
        atomic_write_text(path, json.dumps(known, indent=1, sort_keys=True) + "\n")

    def known_jobs(self, out: Path) -> dict[str, str]:
        path = self._jobs_file(out)
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text())
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _reattach(self, points: Sequence[Point], out: Path) -> list[tuple[Point, Any]]:
        """Jobs of an earlier `scalelab sweep` that SLURM still has queued or running."""
        if self.backend != "slurm":
            return []
        from submitit.slurm.slurm import SlurmJob

        known = self.known_jobs(out)
        attached: list[tuple[Point, Any]] = []
        for p in points:
            if p.id in known:
                job: Any = SlurmJob(folder=self.folder(out), job_id=known[p.id])
                if self._watcher is not None:
                    job.watcher = self._watcher
                    self._watcher.register_job(str(job.job_id))
                with contextlib.suppress(Exception):
                    if job.state.split()[0] in _ACTIVE_STATES:
                        attached.append((p, job))
        return attached

    def run(self, points: Sequence[Point], out: Path, started: Started, ended: Finished) -> None:
        self._use_squeue_without_accounting()
        attached = self._reattach(points, out)
        ids = {p.id for p, _ in attached}
        jobs = attached + self.submit([p for p in points if p.id not in ids], out)
        if self._watcher is not None:
            for _, job in jobs:
                job.watcher = self._watcher
                self._watcher.register_job(str(job.job_id))
        for p, job in jobs:
            started(p, f"job {job.job_id}" + (" (still queued from before)" if p.id in ids else ""))
        waiting = list(jobs)
        while waiting:
            still = []
            for p, job in waiting:
                if not job.done():
                    still.append((p, job))
                    continue
                ended(self._ended(p, job))
            waiting = still
            if waiting:
                time.sleep(self.poll_s)

    def _use_squeue_without_accounting(self) -> None:
        """Where `sacct` fails (no accounting database), read job states from `squeue`."""
        if self.backend != "slurm" or self._watcher is not None:
            return
        reason = accounting_error()
        if reason is None:
            return
        self._watcher = squeue_watcher(delay_s=max(int(self.poll_s), 1))
        print(
            f"slurm: no job accounting here (sacct: {reason}); job states come from squeue",
            file=sys.stderr,
        )

    def _ended(self, point: Point, job: Any) -> Ended:
        state = str(job.state)
        log = None
        with contextlib.suppress(Exception):
            log = Path(job.paths.stderr)
        if state == ENDED:
            state = stopped_state_from_log(log) or "ENDED (no accounting: state unknown)"
        stopped = any(state.startswith(s) for s in _STOPPED_STATES)
        if not stopped and self._watcher is not None:
            from_log = stopped_state_from_log(log)
            if from_log is not None:
                state, stopped = from_log, True
        try:
            results = job.results()
        except Exception as exc:
            text = str(exc).strip().splitlines()
            detail = f"job {job.job_id} {state}: {text[-1] if text else type(exc).__name__}"
            return Ended(point, None, detail, interrupted=stopped, log=log)
        codes = [r.get("returncode") for r in results if isinstance(r, dict)]
        rc = next((c for c in codes if c), 0)
        # torchrun ended by SIGTERM: SLURM stopped the job (scancel, time limit, pre-emption).
        stopped = stopped or rc == -signal.SIGTERM
        detail = f"job {job.job_id} {state}, torchrun exit code {rc}"
        return Ended(point, rc, detail, interrupted=stopped, log=log)

    def job_script(self, point: Point, out: Path) -> str:
        """The sbatch script submitit writes for a point's job (for --dry-run and tests)."""
        if self.backend != "slurm":
            raise InputError("executor", "job scripts exist for the slurm backend only")
        inner = self._executor(out, point, point.sweep)._executor
        return str(inner._make_submission_file_text(inner._submitit_command_str, "preview"))
