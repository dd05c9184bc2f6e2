"""Which collective a hung job was stuck in, and which ranks never arrived, from NCCL's flight
recorder dumps (no torch here).

With `TORCH_NCCL_TRACE_BUFFER_SIZE` and `TORCH_NCCL_DUMP_ON_TIMEOUT=1` (set by the harness on
GPUs), each rank keeps its last collectives in a ring buffer and, on a collective timeout, writes
it to `TORCH_FR_DUMP_TEMP_FILE<rank>`: a pickle with `entries`, each with the process group
(`process_group`: name, description), its per-group sequence number (`collective_seq_id`), the
operation (`profiling_name`, e.g. `nccl:all_reduce`), sizes and `state` (scheduled, started,
completed). The stuck collective of a group is the lowest sequence number some rank did not
complete; a rank that never issued it did not arrive (PyTorch's own analyser,
`torch.distributed.flight_recorder`, does the full cross-check).
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_RANK = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class Stuck:
    collective: str
    group: str
    seq: int
    sizes: Any
    arrived: list[int]
    missing: list[int]

    def sentence(self) -> str:
        missing = ", ".join(map(str, self.missing)) or "none (all issued it; none completed)"
        return (
            f"stuck in {self.collective} #{self.seq} of process group {self.group} "
            f"(sizes {self.sizes}): rank(s) {missing} did not arrive; arrived: "
            f"{', '.join(map(str, self.arrived))}"
        )


def read_dumps(paths: list[Path]) -> dict[int, list[dict[str, Any]]]:
    """Each rank's entries (the rank is the number the file name ends with); unreadable files
    are skipped."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in paths:
        match = _RANK.search(path.name)
        if not match:
            continue
        try:
            with path.open("rb") as fh:
                dump = pickle.load(fh)  # written by this job's own ranks
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            continue
        entries = dump.get("entries") if isinstance(dump, dict) else None
        if isinstance(entries, list):
            out[int(match.group(1))] = [e for e in entries if isinstance(e, dict)]
    return out


def _group(entry: dict[str, Any]) -> str:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[0])
    return str(entry.get("pg_id", "?"))


def stuck_collective(dumps: dict[int, list[dict[str, Any]]]) -> Stuck | None:
    """The earliest collective (by group and sequence number) that some rank did not complete."""
    candidates: list[tuple[int, str, dict[str, Any]]] = []
    for entries in dumps.values():
        for e in entries:
            seq = e.get("collective_seq_id")
            if e.get("is_p2p") or not isinstance(seq, int) or seq <= 0:
                continue
            if e.get("state") != "completed":
                candidates.append((seq, _group(e), e))
    if not candidates:
        return None
    seq, group, entry = min(candidates, key=lambda c: (c[0], c[1]))
    arrived: list[int] = []
    missing: list[int] = []
    for rank, entries in sorted(dumps.items()):
        issued = any(
            e.get("collective_seq_id") == seq and _group(e) == group and not e.get("is_p2p")
            for e in entries
        )
        (arrived if issued else missing).append(rank)
    return Stuck(
        collective=str(entry.get("profiling_name", "?")),
        group=group,
        seq=seq,
        sizes=entry.get("input_sizes"),
        arrived=arrived,
        missing=missing,
    )


def explain(paths: list[Path]) -> str | None:
    """One sentence for a failed record, or None when the dumps say nothing."""
    stuck = stuck_collective(read_dumps(paths))
    return stuck.sentence() if stuck else None
