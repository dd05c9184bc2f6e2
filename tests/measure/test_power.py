"""GPU power through the record and calibrate: per GPU on both sides (issue 10, item 1).

A bench record is assembled from known per-rank GPU energies exactly as the harness assembles it
(`measure.record.bench_record`); calibrate must read one GPU's average power from it and compare
it with the predictor's per-GPU power. Before schema 2 the record stored the whole job's power
(energy summed over ranks / window) and calibrate compared it with the per-GPU prediction: off by
the number of GPUs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.calibrate import POWER, fit, points_from_records
from scalelab.config.catalog import load_cluster, load_model
from scalelab.config.layout import Layout
from scalelab.measure.config import BenchOptions
from scalelab.measure.job import BenchJob, RunIdentity
from scalelab.measure.record import RepeatResult, bench_record
from scalelab.perf.predict import predict_layout
from scalelab.results import Record, load_record, write_record

GPUS = 8
STEPS = 10
SHARE = (0.9, 1.1, 1.0, 1.0, 0.95, 1.05, 0.8, 1.2)  # per-rank spread around the mean; sums to 8


def _job() -> BenchJob:
    layout = Layout(gpus=GPUS, global_batch=GPUS, seq_len=4096)
    options = BenchOptions(steps=STEPS, warmup=1, repeats=2)
    return BenchJob(
        model=load_model("llama2-7b"),
        layout=layout,
        options=options,
        cluster="h100-ib",
        nproc_per_node=GPUS,
    )


def _record(job: BenchJob, power_per_gpu: float, step_s: float) -> Record:
    window = step_s * STEPS
    repeats = [
        RepeatResult(
            warmup_step_time_s=[step_s],
            warmup_loss=[5.0],
            step_time_s=[step_s] * STEPS,
            loss=[4.0] * STEPS,
            grad_norm=[1.0] * STEPS,
            window_s=window,
            peak_memory_allocated_bytes=1,
            peak_memory_reserved_bytes=1,
            peak_rss_bytes=1,
            window_energy_j_per_rank=[power_per_gpu * window * f for f in SHARE],
        )
        for _ in range(2)
    ]
    identity = RunIdentity(run_id="p0", created_utc="2026-12-03T00:00:00Z", name="power")
    return bench_record(job, identity, repeats, GPUS, peak_flops=989e12)


def test_per_rank_energy_gives_per_gpu_power_that_calibrate_fits(tmp_path: Path) -> None:
    job = _job()
    cluster = load_cluster("h100-ib")
    predicted = predict_layout(job.model, cluster, job.layout)
    power, step = float(predicted["power_w_per_gpu"]), float(predicted["step_time_s"])
    record = _record(job, power, step)

    # The record: one GPU's average power, the whole job's energy per step, each rank's figures.
    window = step * STEPS
    assert record.summary["power_w_per_gpu"]["mean"] == pytest.approx(power, rel=1e-12)
    assert record.summary["energy_j"]["mean"] == pytest.approx(power * step * GPUS, rel=1e-12)
    assert record.summary["energy_j"]["mean"] == pytest.approx(predicted["energy_j"], rel=1e-12)
    assert record.summary["tokens_per_j"]["mean"] == pytest.approx(
        predicted["tokens_per_j"], rel=1e-12
    )
    per_rank = record.measurements["repeats"][0]["power_w_per_rank"]
    assert per_rank == pytest.approx([power * f for f in SHARE], rel=1e-12)
    tokens = GPUS * 4096 * STEPS
    assert record.summary["tokens_per_j"]["mean"] == pytest.approx(
        tokens / (power * window * GPUS), rel=1e-12
    )

    # Through a file and calibrate: the per-GPU power comes back, and the predictor (whose
    # numbers made the energies) agrees with it exactly before any fitting.
    path = write_record(record, tmp_path)
    _, steps, _ = points_from_records([load_record(path)])
    (point,) = steps
    assert point.power_w_per_gpu == pytest.approx(power, rel=1e-12)
    result = fit(cluster, [], steps, names=list(POWER))
    (row,) = [r for r in result.residuals if r["kind"] == "power_w_per_gpu"]
    assert row["measured"] == pytest.approx(power, rel=1e-12)
    assert row["before"] == pytest.approx(power, rel=1e-9)


def test_schema_1_records_are_read_as_power_per_gpu(tmp_path: Path) -> None:
    """A schema-1 record's `avg_power_w` was the whole job's: reading it divides by the GPUs;
    its `energy_j` was the whole window's: reading it divides by the measured steps."""
    job = _job()
    record = _record(job, 500.0, 0.5)
    data = record.model_dump()
    data["schema_version"] = 1
    summary = data["summary"]
    summary["avg_power_w"] = {k: (v * GPUS if k != "n" and v is not None else v)
                              for k, v in summary.pop("power_w_per_gpu").items()}  # fmt: skip
    summary["energy_j"] = {k: (v * STEPS if k != "n" and v is not None else v)
                           for k, v in summary["energy_j"].items()}  # fmt: skip
    summary["peak_rss_bytes"] = summary.pop("memory_peak_rss_bytes")
    for rep in data["measurements"]["repeats"]:
        rep["avg_power_w"] = rep.pop("power_w_per_gpu") * GPUS
        rep["energy_j"] *= STEPS
    path = write_record(Record(**data), tmp_path)
    loaded = load_record(path)
    assert loaded.schema_version == 2
    assert loaded.summary["power_w_per_gpu"]["mean"] == pytest.approx(500.0)
    assert loaded.measurements["repeats"][1]["power_w_per_gpu"] == pytest.approx(500.0)
    assert loaded.summary["energy_j"]["mean"] == pytest.approx(500.0 * 0.5 * GPUS)
    assert loaded.measurements["repeats"][0]["energy_j"] == pytest.approx(500.0 * 0.5 * GPUS)
    assert "memory_peak_rss_bytes" in loaded.summary and "avg_power_w" not in loaded.summary
    _, steps, _ = points_from_records([loaded])
    assert steps[0].power_w_per_gpu == pytest.approx(500.0)


def test_summary_metrics_are_the_shared_vocabulary() -> None:
    """Every measured metric is named as scalelab.metrics names it (or is one the predictor does
    not model), so records and predictions compare field by field."""
    from scalelab import metrics
    from scalelab.measure.record import MEASURED_ONLY, MOE_SUMMARY_METRICS

    for name in MOE_SUMMARY_METRICS:  # SUMMARY_METRICS and the MoE ones
        assert name in metrics.BY_NAME or name in MEASURED_ONLY, name
    assert not set(MEASURED_ONLY) & set(metrics.BY_NAME)
    record = _record(_job(), 500.0, 0.5)
    shared = [k for k in record.summary if k in metrics.BY_NAME]
    assert {"tokens_per_s", "mfu", "hfu", "power_w_per_gpu", "energy_j", "tokens_per_j"} <= set(
        shared
    )
