"""Which collective a hung job was stuck in, which ranks never arrived, and where they were, from
the flight recorder's dumps (no torch here).

PyTorch's flight recorder (`TORCH_FR_BUFFER_SIZE`, for gloo and NCCL) keeps each rank's last
collectives in a ring buffer: the process group (`process_group`: name, description), its
per-group sequence number (`collective_seq_id`, or `p2p_seq_id` for send/recv), the operation
(`profiling_name`, e.g. `gloo:all_reduce`), sizes and `state`. Two kinds of dump are read:

- the JSON dumps the harness's own ranks write when a rank times out (`measure/forensics.py`):
  `{"rank", "pid", "host", "step", "phase", "stack", "fr": <torch's _dump_fr_trace_json>}`;
- NCCL's own pickles, written on a collective timeout to `TORCH_FR_DUMP_TEMP_FILE<rank>`.

Only this run's files are read (the caller passes their exact names), only regular files the
caller's user owns, and pickles only through an unpickler that builds plain data (dicts, lists,
strings, numbers) and refuses every class or function: a pickle left in a shared runs folder can
never run code. PyTorch's own analyser (`torch.distributed.flight_recorder`) uses plain
`pickle.load`, so it is not used here.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_RANK = re.compile(r"(\d+)(?:\.json)?$")
MAX_DUMP_BYTES = 64 * 2**20


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds only what pickle encodes natively; any global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: only plain data is read")


def load_plain_pickle(data: bytes) -> Any:
    return _PlainDataUnpickler(io.BytesIO(data)).load()


def own_file_problem(path: Path) -> str | None:
    """Why `path` may not be read (not a regular file, another user's, too large), or None."""
    try:
        st = path.lstat()
    except OSError as exc:
        return f"cannot stat: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not this user"
    if st.st_size > MAX_DUMP_BYTES:
        return f"larger than {MAX_DUMP_BYTES} bytes"
    return None


@dataclass
class Dumps:
    """Each rank's flight-recorder entries and what else its dump says; files left unread."""

    entries: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    info: dict[int, dict[str, Any]] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)


def read_dumps(paths: list[Path]) -> Dumps:
    """The dumps in `paths` (the rank is the number the name ends with, before `.json`). A file
    another user owns, a link, or one that does not hold plain data is skipped with a note."""
    out = Dumps()
    for path in paths:
        match = _RANK.search(path.name)
        if not match:
            continue
        problem = own_file_problem(path)
        if problem:
            out.ignored.append(f"{path}: {problem}")
            continue
        rank = int(match.group(1))
        try:
            data = path.read_bytes()
            if path.suffix == ".json":
                dump = json.loads(data)
                fr = dump.get("fr") if isinstance(dump, dict) else None
                info = (
                    {k: v for k, v in dump.items() if k != "fr"} if isinstance(dump, dict) else {}
                )
            else:
                fr = load_plain_pickle(data)
                info = {}
        except (OSError, ValueError, pickle.UnpicklingError, EOFError, RecursionError) as exc:
            out.ignored.append(f"{path}: {type(exc).__name__}: {exc}")
            continue
        entries = fr.get("entries") if isinstance(fr, dict) else None
        if isinstance(entries, list):
            out.entries.setdefault(rank, []).extend(e for e in entries if isinstance(e, dict))
        elif info:
            out.entries.setdefault(rank, [])
        if info:
            out.info[rank] = info
    return out


_GROUP_NAMES = {
    "pp": "pipeline-parallel",
    "tp": "tensor-parallel",
    "cp": "context-parallel",
    "ep": "expert-parallel",
    "dp": "data-parallel",
}


def group_label(entry: dict[str, Any]) -> str:
    """`the data-parallel group (mesh_dp_shard_cp)`, `the default group`, from an entry."""
    pg = entry.get("process_group")
    name, desc = (
        (str(pg[0]), str(pg[1]) if len(pg) > 1 else "")
        if isinstance(pg, (list, tuple)) and pg
        else (str(entry.get("pg_id", "?")), "")
    )
    if desc == "default_pg":
        return "the default group (all ranks)"
    if desc.startswith("mesh_"):
        dims = desc[len("mesh_") :]
        first = dims.split("_", 1)[0]
        kind = _GROUP_NAMES.get(first, dims)
        return f"the {kind} group ({desc})"
    return f"process group {name}" + (f" ({desc})" if desc and desc != "undefined" else "")


def _group(entry: dict[str, Any]) -> str:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[0])
    return str(entry.get("pg_id", "?"))


def _seq(entry: dict[str, Any]) -> int | None:
    seq = entry.get("p2p_seq_id" if entry.get("is_p2p") else "collective_seq_id")
    return seq if isinstance(seq, int) and seq > 0 else None


def op_name(entry: dict[str, Any]) -> str:
    """`gloo:all_reduce` -> `AllReduce`; `nccl:send 0->1` -> `Send 0->1`."""
    raw = str(entry.get("profiling_name", "?"))
    raw = raw.split(":", 1)[1] if ":" in raw else raw
    head, _, tail = raw.partition(" ")
    name = "".join(part.capitalize() for part in head.split("_"))
    name = name.replace("Allreduce", "AllReduce").replace("Allgather", "AllGather")
    return f"{name} {tail}".strip()


@dataclass(frozen=True)
class Stuck:
    collective: str
    group: str
    seq: int
    p2p: bool
    sizes: Any
    arrived: list[int]
    missing: list[int]
    last_seen: dict[int, int]

    def sentence(self) -> str:
        missing = ", ".join(map(str, self.missing)) or "none (all issued it; none completed)"
        kind = "point-to-point " if self.p2p else ""
        return (
            f"stuck in {self.collective} #{self.seq} ({kind}sizes {self.sizes}) of {self.group}: "
            f"rank(s) {missing} never arrived; arrived: {', '.join(map(str, self.arrived))}"
        )


def stuck_collective(
    dumps: dict[int, list[dict[str, Any]]], reporter: int | None = None
) -> Stuck | None:
    """The collective a job is stuck in, point-to-point entries included. With `reporter` (the
    rank that timed out) it is that rank's latest entry (gloo's recorder does not mark entries
    completed); without, the earliest (group, sequence number) some rank did not complete
    (NCCL's states). Ranks whose last entry in that group is older never arrived."""
    candidates: list[tuple[int, int, dict[str, Any]]] = []
    own = dumps.get(reporter, []) if reporter is not None else []
    if own:
        latest = max(
            (e for e in own if _seq(e) is not None),
            key=lambda e: (e.get("record_id", 0), e.get("time_created_ns", 0)),
            default=None,
        )
        if latest is not None:
            candidates.append((0, 0, latest))
    else:
        for entries in dumps.values():
            for e in entries:
                seq = _seq(e)
                if seq is not None and e.get("state") != "completed":
                    candidates.append((seq, 0, e))
    if not candidates:
        return None
    _, _, entry = min(candidates, key=lambda c: (c[0], _group(c[2])))
    seq, group, p2p = _seq(entry) or 0, _group(entry), bool(entry.get("is_p2p"))
    arrived: list[int] = []
    missing: list[int] = []
    last_seen: dict[int, int] = {}
    for rank, entries in sorted(dumps.items()):
        same = [
            s
            for e in entries
            if _group(e) == group and bool(e.get("is_p2p")) == p2p and (s := _seq(e)) is not None
        ]
        if p2p and not same:
            continue  # not a party to this send/recv
        last_seen[rank] = max(same, default=0)
        (arrived if last_seen[rank] >= seq else missing).append(rank)
    return Stuck(
        collective=op_name(entry),
        group=group_label(entry),
        seq=seq,
        p2p=p2p,
        sizes=entry.get("input_sizes"),
        arrived=arrived,
        missing=missing,
        last_seen=last_seen,
    )


def explain(paths: list[Path]) -> tuple[str | None, list[str]]:
    """One sentence for a failed record (or None when the dumps say nothing), and the files
    that were not read, each with why."""
    dumps = read_dumps(paths)
    stuck = stuck_collective(dumps.entries)
    return (stuck.sentence() if stuck else None), dumps.ignored
