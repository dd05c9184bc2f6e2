"""The measurement loop of a bench job on one rank: R repeats of warm-up and timed steps, an
optional profiled window, then (on rank 0) the record.

The GPU's dense peak (for MFU and HFU) comes from the job's cluster, or from the catalog cluster
whose GPU matches the CUDA device's name; a CPU run has no peak and says so in `notes`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from scalelab.config.pipeline import layout_stages
from scalelab.measure.job import BenchJob, RunIdentity
from scalelab.measure.record import RepeatResult, add_trace_report, base_record, bench_record
from scalelab.results import Record


def _progress(message: str) -> None:
    print(f"scalelab bench: {message}", file=sys.stderr, flush=True)


def _peak(job: BenchJob, device_name: str, cuda: bool, notes: dict[str, str]) -> float | None:
    from scalelab.measure.config import resolve_cluster

    if not cuda:
        notes["mfu"] = "CPU run: no GPU dense peak to compare with"
        return None
    cluster, _ = resolve_cluster(job.cluster, device_name)
    if cluster is None:
        notes["mfu"] = f"unknown GPU '{device_name}': pass --cluster to set its dense peak"
        return None
    return float(cluster.gpu.peak_flops(job.layout.precision))


def measure_bench(job: BenchJob, info: Any, identity: RunIdentity) -> Record:
    """Train and time the job on this rank; rank 0 returns the full record, others a stub."""
    import torch
    import torch.distributed as dist

    from scalelab.measure.config import resolve_cluster
    from scalelab.measure.energy import EnergyMeter
    from scalelab.measure.env import environment, local_facts
    from scalelab.measure.train import Trainer, profile_window, run_repeat

    layout, options = job.layout, job.options
    device = info.device
    cuda = device.type == "cuda"
    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    facts: list[Any] = [None] * info.world_size
    dist.all_gather_object(facts, local_facts(device_name))
    trainer = Trainer(job.model, layout, options, info)
    meter = EnergyMeter(device.index if cuda else None)
    log = _progress if info.rank == 0 else None

    repeats: list[RepeatResult] = []
    step = 0
    for r in range(options.repeats):
        result = run_repeat(trainer, meter, step)
        step += options.warmup + options.steps
        repeats.append(result)
        if log:
            tps = layout.global_batch * layout.seq_len * options.steps / result.window_s
            log(
                f"repeat {r + 1}/{options.repeats}: {tps:,.0f} tokens/s, loss {result.loss[-1]:.4f}"
            )

    trace_paths: list[str] = []
    if options.profile:
        trace_dir = job.out_dir / "traces" / identity.name
        profile_window(trainer, step, trace_dir)
        dist.barrier()
        trace_paths = [str(trace_dir / f"rank{r}.json.gz") for r in range(info.world_size)]

    if info.rank != 0:
        return base_record(job, identity, "ok")

    notes: dict[str, str] = {}
    peak = _peak(job, device_name, cuda, notes)
    if not cuda:
        notes["memory_peak_allocated_bytes"] = "CPU run: CUDA allocator figures do not apply"
    if not meter.available and meter.reason:
        notes["energy_j"] = meter.reason
        notes["power_w_per_gpu"] = meter.reason
    record = bench_record(job, identity, repeats, info.world_size, peak, notes)
    if cuda and job.cluster is None:
        record.cluster = resolve_cluster(None, device_name)[1]
    record.workload["compute_dtype"] = trainer.compute_dtype
    if trainer.precision_note:
        record.notes["compute_dtype"] = trainer.precision_note
    if trainer.fp8_note:
        record.notes["precision"] = trainer.fp8_note
    record.workload["reshard_after_forward_applied"] = trainer.reshard_after_forward
    if job.layout.pp > 1:  # the layers each stage built (config.pipeline's split)
        record.workload["pipeline_stage_layers"] = [
            stage.n_layers for stage in layout_stages(job.model, job.layout)
        ]
    record.workload["mesh"] = {
        "pp": trainer.dims.pp,
        "dp_replicate": trainer.dims.dp_replicate,
        "dp_shard": trainer.dims.dp_shard,
        "cp": trainer.dims.cp,
        "tp": trainer.dims.tp,
    }
    if job.model.is_moe:
        dims = trainer.dims
        record.workload["mesh"] |= {"ep": dims.ep, "expert_tp": dims.etp}
        if dims.ep > 1:
            record.workload["mesh"]["dp_shard_mod_ep"] = dims.dp_shard_mod_ep
        record.notes["model_flops_per_token"] = (
            "mixture of experts: 6 x active parameters (top-k routed and shared experts, router; "
            "no input embedding) + the attention term, so MFU and HFU count active parameters"
        )
    record.environment = environment(facts, info.backend, info.world_size)
    if meter.driver_version:
        record.environment["nvidia_driver"] = meter.driver_version
    if options.profile:
        add_trace_report(record, _trace_report(trace_paths, record.notes), trace_paths)
    return record


def _trace_report(paths: list[str], notes: dict[str, str]) -> dict[str, Any] | None:
    """The trace analyser's report in its documented, versioned schema (`TraceReport.to_dict`)."""
    try:
        from scalelab.trace import analyze
    except ImportError:
        notes["exposed_comm"] = "trace analyser not installed"
        return None
    try:
        report = analyze([Path(p) for p in paths])
    except Exception as exc:
        notes["exposed_comm"] = f"trace analysis failed: {type(exc).__name__}: {exc}"
        return None
    return report.to_dict()
