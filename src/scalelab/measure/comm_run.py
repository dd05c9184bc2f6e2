"""The collective sweep of a comm job on one rank (rank 0 returns the record)."""

from __future__ import annotations

from typing import Any

from scalelab.measure.job import CommJob, RunIdentity
from scalelab.measure.record import base_record, comm_summary, comm_workload
from scalelab.results import Record


def measure_comm(job: CommJob, info: Any, identity: RunIdentity) -> Record:
    import torch
    import torch.distributed as dist

    from scalelab.measure.comm_bench import sweep
    from scalelab.measure.env import environment, local_facts

    rows = sweep(job.collectives, job.sizes_bytes, job.iters, job.warmup, info.device)
    device_name = torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else "cpu"
    facts: list[Any] = [None] * info.world_size
    dist.all_gather_object(facts, local_facts(device_name))
    record = base_record(job, identity, "ok")
    record.workload = comm_workload(
        job,
        info.world_size,
        nproc_per_node=info.local_world_size,
        backend=info.backend,
        dtype="float32",
        definitions="nccl-tests (out-of-place, median over iterations of the slowest rank)",
    )
    record.environment = environment(facts, info.backend, info.world_size)
    record.measurements = {"rows": rows}
    record.summary = comm_summary(rows, job.collectives)
    return record
