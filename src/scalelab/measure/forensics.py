"""Hang forensics on every backend: where each rank is, and one sentence when a collective times out.

As it runs, each rank keeps (cheaply, in memory):

- the step and phase of the training loop it is in (`at(step, phase)`: two attribute writes);
- its last collectives: PyTorch's flight recorder (`TORCH_FR_BUFFER_SIZE`, gloo and NCCL) records
  each one's operation, process group and sequence number.

A `Watcher` thread per rank looks every half second for this run's dump request
(`<flight>/<run>.dump-request`). The rank whose collective timed out writes the request, dumps
itself, and waits a few seconds for the others; each rank answers with
`<flight>/<run>-rank<r>.json` (step, phase, its main thread's Python stack, the flight recorder's
entries) and a `faulthandler` dump of all its threads (`<run>-rank<r>.stack`). From these
`hang_report` writes the sentence a person needs:

    stuck in AllReduce #41 of the data-parallel group (mesh_dp) at step 3, backward: rank 1 never
    arrived (its last was #40, at step 3, forward); rank 1's Python stack: ...

A rank that does not answer is looked up by the pid it wrote at start (`<run>-rank<r>.pid`): a
stopped process (SIGSTOP, a debugger) is named as stopped; nothing is guessed. torchrun's own
clean-up signals, which come after, are not causes.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.io import atomic_write_text
from scalelab.measure.flight import Dumps, read_dumps, stuck_collective

POLL_S = 0.5
FR_BUFFER_ENTRIES = "2000"


@dataclass
class Progress:
    step: int | None = None
    phase: str = "start-up"


PROGRESS = Progress()


def at(step: int | None, phase: str) -> None:
    """Record where this rank is (called by the training loop at each phase)."""
    PROGRESS.step = step
    PROGRESS.phase = phase


def recorder_env() -> dict[str, str]:
    """The flight recorder's ring buffer, for gloo and NCCL (set before the process group)."""
    return {"TORCH_FR_BUFFER_SIZE": FR_BUFFER_ENTRIES}


def run_prefix(name: str | None) -> str:
    """This run's file stem in the flight folder: the record's name, or torchrun's run id."""
    if name:
        return name
    return f"run-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}"


@dataclass(frozen=True)
class Paths:
    folder: Path
    run: str

    def request(self) -> Path:
        return self.folder / f"{self.run}.dump-request"

    def dump(self, rank: int) -> Path:
        return self.folder / f"{self.run}-rank{rank}.json"

    def stack(self, rank: int) -> Path:
        return self.folder / f"{self.run}-rank{rank}.stack"

    def pid(self, rank: int) -> Path:
        return self.folder / f"{self.run}-rank{rank}.pid"

    def nccl_prefix(self) -> Path:
        return self.folder / f"{self.run}-rank"

    def nccl_dump(self, rank: int) -> Path:
        return self.folder / f"{self.run}-rank{rank}"


def _main_stack() -> list[str]:
    """The main thread's Python stack, innermost first, as `func (file:line)`."""
    main = threading.main_thread().ident
    frame = sys._current_frames().get(main) if main is not None else None
    if frame is None:
        return []
    frames = [f for f in traceback.extract_stack(frame) if f.filename != __file__]
    return [f"{f.name} ({_short(f.filename)}:{f.lineno})" for f in reversed(frames)]


def _short(filename: str) -> str:
    parts = Path(filename).parts
    for anchor in ("scalelab", "torch"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)
            return "/".join(parts[i:])
    return Path(filename).name


def write_dump(paths: Paths, rank: int) -> None:
    """This rank's answer: step, phase, main-thread stack, flight recorder, all threads' stacks."""
    fr: Any = None
    with contextlib.suppress(Exception):
        import importlib

        c10d = importlib.import_module("torch._C._distributed_c10d")
        fr = json.loads(c10d._dump_fr_trace_json(True, True))
    with contextlib.suppress(OSError), paths.stack(rank).open("w") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
    document = {
        "rank": rank,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "step": PROGRESS.step,
        "phase": PROGRESS.phase,
        "stack": _main_stack(),
        "fr": fr,
    }
    with contextlib.suppress(OSError):
        atomic_write_text(paths.dump(rank), json.dumps(document) + "\n")


class Watcher:
    """A daemon thread that answers this run's dump request once."""

    def __init__(self, paths: Paths, rank: int) -> None:
        self.paths, self.rank = paths, rank
        self._stop = threading.Event()
        paths.folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            atomic_write_text(paths.pid(rank), f"{os.getpid()} {socket.gethostname()}\n")
        self._thread = threading.Thread(target=self._run, name="scalelab-forensics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        request = self.paths.request()
        while not self._stop.wait(POLL_S):
            if request.exists():
                write_dump(self.paths, self.rank)
                return

    def stop(self) -> None:
        self._stop.set()


def _process_state(pid_file: Path) -> str | None:
    """`stopped (SIGSTOP or a debugger)`, `gone`, or None, for a rank's process on this host."""
    try:
        pid_text, host = pid_file.read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    if host != socket.gethostname():
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return "gone (the process had already exited)"
    state = fields[0] if fields else "?"
    if state in ("T", "t"):
        return f"stopped (process {pid} is in state {state}: SIGSTOP or a debugger)"
    if state == "Z":
        return f"gone (process {pid} exited)"
    return None


def _where(info: dict[str, Any] | None) -> str:
    if not info:
        return ""
    step = info.get("step")
    phase = info.get("phase", "?")
    return f"at step {step}, {phase}" if step is not None else str(phase)


def hang_report(
    paths: Paths, rank: int, world_size: int, wait_s: float
) -> tuple[str | None, dict[str, str]]:
    """Ask every rank for its dump, wait up to `wait_s`, and say where the job is stuck.
    Returns (the sentence or None, notes for the record)."""
    notes: dict[str, str] = {}
    with contextlib.suppress(OSError):
        atomic_write_text(paths.request(), f"rank {rank} timed out\n")
    write_dump(paths, rank)
    deadline = time.monotonic() + wait_s
    wanted = [paths.dump(r) for r in range(world_size)]
    while time.monotonic() < deadline and not all(p.exists() for p in wanted):
        time.sleep(0.1)
    dumps: Dumps = read_dumps([p for p in wanted if p.exists()])
    if dumps.ignored:
        notes["flight_ignored"] = "; ".join(dumps.ignored)
    silent = [r for r in range(world_size) if r not in dumps.info]
    stuck = stuck_collective(dumps.entries, reporter=rank)
    own = dumps.info.get(rank)
    parts: list[str] = []
    if stuck is not None:
        where = _where(own)
        head = f"stuck in {stuck.collective} #{stuck.seq} of {stuck.group}"
        parts.append(f"{head} {where}".strip())
        for r in stuck.missing:
            info = dumps.info.get(r)
            last = stuck.last_seen.get(r, 0)
            tail = f"its last was #{last}" if last else "it issued none in that group"
            if info:
                tail += f", {_where(info)}"
            line = f"rank {r} never arrived ({tail})"
            stack = (info or {}).get("stack") or []
            if stack:
                line += f"; rank {r}'s Python stack: " + " <- ".join(stack[:6])
            parts.append(line)
    else:
        parts.append(f"rank {rank} timed out in a collective {_where(own)}".strip())
    for r in silent:
        state = _process_state(paths.pid(r))
        parts.append(
            f"rank {r} did not answer the dump request"
            + (f": {state}" if state else f" within {wait_s:.0f} s")
        )
    stacks = [str(paths.stack(r)) for r in range(world_size) if paths.stack(r).exists()]
    if stacks:
        notes["hang_stacks"] = " ".join(stacks)
    sentence = ": ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if len(parts) > 2 else "")
    return sentence, notes
