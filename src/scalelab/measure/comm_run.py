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

    rows = sweep(
        job.collectives, job.sizes_bytes, job.iters, job.warmup, info.device, job.check_iters
    )
    device_name = torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else "cpu"
    facts: list[Any] = [None] * info.world_size
    dist.all_gather_object(facts, local_facts(device_name))
    summary = comm_summary(rows, job.collectives)
    wrong = summary["out_of_bounds_values"]
    # nccl-tests exits non-zero when a check found wrong elements: so does the record.
    record = base_record(
        job,
        identity,
        "failed" if wrong else "ok",
        f"result check: {wrong} wrong elements (see the rows' wrong)" if wrong else None,
    )
    record.workload = comm_workload(
        job,
        info.world_size,
        nproc_per_node=info.local_world_size,
        backend=info.backend,
        dtype="float32",
        check_iters=job.check_iters,
        definitions="nccl-tests (out-of-place at the row's top level, in-place under in_place; "
        "median over iterations of the slowest rank)",
    )
    record.environment = environment(facts, info.backend, info.world_size)
    record.measurements = {"rows": rows}
    record.summary = summary
    return record
