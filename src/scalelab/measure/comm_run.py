"""Run a collective sweep as one process of a torchrun job (or alone) and write its record."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

from scalelab.results import Record, new_run_id, record_name, utc_now, write_record


def comm_identity(collectives: list[str], world: int) -> tuple[str, str, str]:
    run_id, created = new_run_id(), utc_now()
    label = f"{'-'.join(c.replace('_', '') for c in collectives)}-n{world}"
    return run_id, created, record_name("comm", label, created, run_id)


def comm_record(
    run_id: str,
    created: str,
    name: str,
    status: str,
    workload: dict[str, Any],
    error: str | None = None,
) -> Record:
    return Record(
        kind="comm",
        run_id=run_id,
        name=name,
        created_utc=created,
        status=status,  # type: ignore[arg-type]
        error=error,
        workload=workload,
    )


def run_comm_worker(
    collectives: list[str],
    sizes: list[int],
    iters: int,
    warmup: int,
    timeout_s: float,
    out_dir: Path,
    cluster: str | None,
) -> tuple[int, Path | None]:
    import torch.distributed as dist

    from scalelab.measure.comm_bench import sweep
    from scalelab.measure.env import environment, local_facts
    from scalelab.measure.launch import RunIdentity
    from scalelab.measure.train import init_distributed

    identity = RunIdentity.from_env()
    info = init_distributed(timeout_s)
    workload: dict[str, Any] = {
        "collectives": collectives,
        "sizes_bytes": sizes,
        "iters": iters,
        "warmup": warmup,
        "world_size": info.world_size,
        "nproc_per_node": info.local_world_size,
        "backend": info.backend,
        "dtype": "float32",
        "definitions": "nccl-tests (out-of-place, median over iterations of the slowest rank)",
    }
    if identity is None:
        run_id, created, name = comm_identity(collectives, info.world_size)
    else:
        run_id, created, name = identity.run_id, identity.created_utc, identity.name
    try:
        rows = sweep(collectives, sizes, iters, warmup, info.device)
        import torch

        device_name = (
            torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else "cpu"
        )
        facts: list[Any] = [None] * info.world_size
        dist.all_gather_object(facts, local_facts(device_name))
        record = comm_record(run_id, created, name, "ok", workload)
        record.cluster = cluster
        record.environment = environment(facts, info.backend, info.world_size)
        record.measurements = {"rows": rows}
        record.summary = {}
        for c in collectives:
            mine = [r for r in rows if r["collective"] == c]
            if mine:
                record.summary[c] = {
                    "max_busbw_GBps": max(r["busbw_GBps"] for r in mine),
                    "largest_bytes": mine[-1]["bytes"],
                    "busbw_at_largest_GBps": mine[-1]["busbw_GBps"],
                }
        path = write_record(record, out_dir) if info.rank == 0 else None
        dist.barrier()
        dist.destroy_process_group()
        return 0, path
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        record = comm_record(
            run_id,
            created,
            name,
            "failed",
            workload,
            f"rank {info.rank}: {type(exc).__name__}: {exc}",
        )
        try:
            path = write_record(record, out_dir, overwrite=False)
        except FileExistsError:
            path = None
        if os.environ.get("LOCAL_WORLD_SIZE"):
            os._exit(1)
        return 1, path
