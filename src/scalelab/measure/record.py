"""From a job and what its ranks measured to the one result record (no torch here).

Metric names are the shared output vocabulary (step_time_s, tokens_per_s, tokens_per_s_per_gpu,
mfu, hfu, exposed_comm_s, power_w_per_gpu, energy_j, energy_per_token_j, tokens_per_j,
memory_*_bytes), so a measured record and a prediction compare field by field.

Energy and power: each rank reads its own GPU's NVML energy counter around the measured window.
The window's GPU energy of the whole job is the sum over ranks. `energy_j` is that per optimizer
step (window energy / measured steps: GPU energy of one step, all GPUs); `power_w_per_gpu` is the
average power of one GPU (window energy / window / GPUs); the predictor's `energy_j` and
`power_w_per_gpu` are the same quantities. Each rank's own figures are in the raw repeats
(`window_energy_j_per_rank`, `power_w_per_rank`). GPU power only, not the node's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scalelab.config.model import ModelSpec, flops_utilisation, model_tflops_per_gpu
from scalelab.measure.job import BenchJob, CommJob, RunIdentity
from scalelab.results import Record, stats, summarise, trace_metric_s

SECONDARY_NOTE = (
    "reported by a rank that lost its peers or was stopped; another rank may have failed first"
)

# What the harness measures that the predictor does not model (not in scalelab.metrics).
MEASURED_ONLY = (
    "memory_peak_allocated_bytes",  # CUDA allocator peak over the window, per GPU (max over ranks)
    "memory_peak_reserved_bytes",  # CUDA allocator reserved peak, per GPU (max over ranks)
    "memory_peak_rss_bytes",  # host process peak resident memory (max over ranks)
    "final_loss",  # training loss at the last measured step of a repeat
    # MoE models: per step, max over experts / mean over experts of the (token, choice) slots
    # routed to each expert in the global batch, averaged over the MoE layers, then over steps.
    "expert_load_imbalance",
    # MoE models: per step, the busiest EP rank's (token, choice) rows over the mean of its EP
    # group's, averaged over the MoE layers and EP groups, then over steps (1.0 without EP; the
    # predictor's load-imbalance factor is this quantity, perf/moe.py).
    "ep_load_imbalance",
)
# Per-repeat metrics of a bench record's summary (mean, std, 95 % CI over repeats): names from
# scalelab.metrics, where the predictor's result has the same keys, or MEASURED_ONLY.
SUMMARY_METRICS = (
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "hfu",
    "model_tflops_per_gpu",
    "memory_peak_allocated_bytes",
    "memory_peak_reserved_bytes",
    "memory_peak_rss_bytes",
    "energy_j",
    "power_w_per_gpu",
    "tokens_per_j",
    "energy_per_token_j",
    "final_loss",
)
MOE_SUMMARY_METRICS = (*SUMMARY_METRICS, "expert_load_imbalance", "ep_load_imbalance")
# Metrics a repeat's raw measurements hold per measured step, not as the repeat's one value.
PER_STEP = ("step_time_s", "tokens_per_s", "expert_load_imbalance", "ep_load_imbalance")


@dataclass
class RepeatResult:
    """Raw figures of one repeat, already reduced over ranks (times: the slowest rank's)."""

    warmup_step_time_s: list[float]
    warmup_loss: list[float]
    step_time_s: list[float]
    loss: list[float]
    grad_norm: list[float]
    window_s: float
    peak_memory_allocated_bytes: int | None
    peak_memory_reserved_bytes: int | None
    peak_rss_bytes: int
    # Each rank's GPU energy over the window; None unless every rank read its counter.
    window_energy_j_per_rank: list[float] | None = None
    # Per measured step, the largest over ranks: CUDA peak allocated bytes during the step on
    # GPU, the process's resident set after the step on CPU.
    memory_bytes: list[int | None] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def window_energy_j(self) -> float | None:
        """The whole job's GPU energy over the window (sum over ranks)."""
        per_rank = self.window_energy_j_per_rank
        return None if per_rank is None else float(sum(per_rank))


def workload(job: BenchJob) -> dict[str, Any]:
    spec, layout, options = job.model, job.layout, job.options
    moe = {"active_params": spec.active_params} if spec.is_moe else {}
    return {
        "model": spec.name,
        "model_spec": spec.model_dump(),
        "n_params": spec.n_params,
        **moe,
        "seq_len": layout.seq_len,
        "global_batch": layout.global_batch,
        "tokens_per_step": layout.global_batch * layout.seq_len,
        "model_flops_per_token": spec.model_flops_per_token(layout.seq_len),
        "hardware_flops_per_token": spec.hardware_flops_per_token(layout.recompute, layout.seq_len),
        "steps": options.steps,
        "warmup": options.warmup,
        "repeats": options.repeats,
        "seed": options.seed,
        "lr": options.lr,
        "grad_clip": options.grad_clip,
        "compile": options.compile,
        "compute_dtype": options.compute_dtype,
        # When gradients were reduced: once per step, or on every micro-batch (flat layouts only).
        "grad_sync": "step" if job.layout.pp > 1 else options.grad_sync,
        "data": options.data or "synthetic",
        "profile": options.profile,
    } | (
        {"fp8_recipe": options.fp8_recipe, "fp8_all_gather": options.fp8_all_gather}
        if layout.precision == "fp8"
        else {}
    )


def comm_workload(job: CommJob, world_size: int | None = None, **facts: Any) -> dict[str, Any]:
    return {
        "collectives": list(job.collectives),
        "sizes_bytes": list(job.sizes_bytes),
        "iters": job.iters,
        "warmup": job.warmup,
        "world_size": world_size or job.nproc_per_node,
        "nproc_per_node": job.nproc_per_node,
    } | facts


def base_record(
    job: BenchJob | CommJob, identity: RunIdentity, status: str, error: str | None = None
) -> Record:
    """The record of a job with no measurements yet: what every outcome (ok or not) starts from."""
    if isinstance(job, CommJob):
        return Record(
            kind="comm",
            run_id=identity.run_id,
            name=identity.name,
            created_utc=identity.created_utc,
            status=status,  # type: ignore[arg-type]
            error=error,
            workload=comm_workload(job),
            cluster=job.cluster,
        )
    work = workload(job)
    if identity.tags:
        work["tags"] = identity.tags
    return Record(
        kind="bench",
        run_id=identity.run_id,
        name=identity.name,
        created_utc=identity.created_utc,
        status=status,  # type: ignore[arg-type]
        error=error,
        workload=work,
        layout=job.layout.model_dump(),
        cluster=job.cluster,
    )


def repeat_figures(
    spec: ModelSpec,
    seq_len: int,
    recompute: str,
    tokens_per_step: int,
    steps: int,
    world_size: int,
    peak_flops: float | None,
    res: RepeatResult,
) -> dict[str, Any]:
    """One repeat's value of every summary metric."""
    tokens = tokens_per_step * steps
    tps = tokens / res.window_s
    energy = res.window_energy_j
    model_flops = spec.model_flops_per_token(seq_len)
    hw_flops = spec.hardware_flops_per_token(recompute, seq_len)
    return {
        "step_time_s": sum(res.step_time_s) / len(res.step_time_s),
        "tokens_per_s": tps,
        "tokens_per_s_per_gpu": tps / world_size,
        "mfu": flops_utilisation(model_flops, tps, world_size, peak_flops) if peak_flops else None,
        "hfu": flops_utilisation(hw_flops, tps, world_size, peak_flops) if peak_flops else None,
        "model_tflops_per_gpu": model_tflops_per_gpu(model_flops, tps, world_size),
        "memory_peak_allocated_bytes": res.peak_memory_allocated_bytes,
        "memory_peak_reserved_bytes": res.peak_memory_reserved_bytes,
        "memory_peak_rss_bytes": res.peak_rss_bytes,
        "energy_j": energy / steps if energy is not None else None,
        "power_w_per_gpu": energy / res.window_s / world_size if energy is not None else None,
        "tokens_per_j": tokens / energy if energy else None,
        "energy_per_token_j": energy / tokens if energy is not None else None,
        "final_loss": res.loss[-1] if res.loss else None,
        **_moe_figures(spec, res),
    }


def _moe_figures(spec: ModelSpec, res: RepeatResult) -> dict[str, Any]:
    if not spec.is_moe:
        return {}
    figures: dict[str, Any] = {}
    for name in ("expert_load_imbalance", "ep_load_imbalance"):
        per_step = res.extra.get(name) or []
        figures[name] = sum(per_step) / len(per_step) if per_step else None
    return figures


def bench_record(
    job: BenchJob,
    identity: RunIdentity,
    repeats: list[RepeatResult],
    world_size: int,
    peak_flops: float | None,
    notes: dict[str, str] | None = None,
) -> Record:
    """An ok bench record: raw per-repeat measurements and statistics over repeats."""
    layout, options = job.layout, job.options
    metrics = MOE_SUMMARY_METRICS if job.model.is_moe else SUMMARY_METRICS
    record = base_record(job, identity, "ok")
    tokens_per_step = layout.global_batch * layout.seq_len
    per_repeat = []
    raw = []
    for i, res in enumerate(repeats):
        figures = repeat_figures(
            job.model,
            layout.seq_len,
            layout.recompute,
            tokens_per_step,
            options.steps,
            world_size,
            peak_flops,
            res,
        )
        per_repeat.append(figures)
        per_rank = res.window_energy_j_per_rank
        raw.append(
            {
                "repeat": i,
                "window_s": res.window_s,
                "step_time_s": res.step_time_s,
                "tokens_per_s": [tokens_per_step / t for t in res.step_time_s],
                "loss": res.loss,
                "grad_norm": res.grad_norm,
                "warmup_step_time_s": res.warmup_step_time_s,
                "warmup_loss": res.warmup_loss,
                "memory_bytes": res.memory_bytes,
                "memory_bytes_kind": (
                    "rss" if res.peak_memory_allocated_bytes is None else "cuda_peak_allocated"
                ),
                "window_energy_j_per_rank": per_rank,
                "power_w_per_rank": (
                    [e / res.window_s for e in per_rank] if per_rank is not None else None
                ),
                # Per-step series where the repeat has them (MoE: expert_load_imbalance).
                **{k: figures[k] for k in metrics if k not in PER_STEP},
                **{k: v for k, v in res.extra.items() if k in PER_STEP},
            }
        )
    record.measurements = {"repeats": raw}
    record.summary = summarise(per_repeat, metrics)
    record.notes = dict(notes or {})
    return record


def add_trace_report(record: Record, report: dict[str, Any] | None, paths: list[str]) -> None:
    """The profiled steps' trace report (its versioned `to_dict` schema) and exposed_comm_s.

    exposed_comm_s is the mean over ranks of the exposed communication per profiled step.
    """
    record.measurements["trace_paths"] = paths
    record.measurements["exposed_comm"] = report
    record.summary["exposed_comm_s"] = stats([trace_metric_s(report, "exposed_comm")])


def comm_summary(rows: list[dict[str, Any]], collectives: list[str]) -> dict[str, Any]:
    """Per collective: its best and largest-size bus bandwidth (out-of-place); and nccl-tests'
    footer: `out_of_bounds_values` (wrong elements over all checked rows and modes) and
    `avg_busbw_GBps` (the mean bus bandwidth of every out-of-place and in-place line)."""
    summary: dict[str, Any] = {}
    busbw = [r["busbw_GBps"] for r in rows] + [
        r["in_place"]["busbw_GBps"] for r in rows if isinstance(r.get("in_place"), dict)
    ]
    wrong = [r.get("wrong") for r in rows] + [
        r["in_place"].get("wrong") for r in rows if isinstance(r.get("in_place"), dict)
    ]
    summary["out_of_bounds_values"] = sum(int(w) for w in wrong if w)
    summary["avg_busbw_GBps"] = sum(busbw) / len(busbw) if busbw else None
    for c in collectives:
        mine = [r for r in rows if r["collective"] == c]
        if mine:
            summary[c] = {
                "max_busbw_GBps": max(r["busbw_GBps"] for r in mine),
                "largest_bytes": mine[-1]["bytes"],
                "busbw_at_largest_GBps": mine[-1]["busbw_GBps"],
            }
    return summary
