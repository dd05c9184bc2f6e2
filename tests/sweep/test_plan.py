"""A sweep expands into jobs: typed `BenchJob`s with the point's identity, run from job files."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.config.layout import Layout
from scalelab.measure.job import read_job
from scalelab.sweep.executors import STATE_DIR, LocalExecutor
from scalelab.sweep.plan import expand
from scalelab.sweep.run import failed_record
from scalelab.sweep.schema import LayoutTemplate, load_sweep
from tests.sweep.conftest import TINY_SWEEP, write_sweep


def _points(tmp_path: Path, text: str = TINY_SWEEP) -> list:
    sweep, base = load_sweep(write_sweep(tmp_path, text))
    return expand(sweep, base)


def test_points_are_bench_jobs(tmp_path: Path) -> None:
    points = _points(tmp_path)
    p = points[3]
    assert isinstance(p.job.layout, Layout) and p.layout is p.job.layout
    assert (p.layout.gpus, p.layout.global_batch, p.layout.sharding) == (2, 4, "fsdp")
    # The model is resolved once, into the job: the nodes need no model file.
    assert p.job.model.name == "llama-tiny2" and p.job.nproc_per_node == 2
    assert (p.job.options.steps, p.job.options.warmup, p.job.options.repeats) == (2, 1, 2)
    assert p.job.identity is None
    run = p.job_for(tmp_path / "out", "2026-12-03T10:00:00Z")
    assert run.identity is not None
    assert (run.identity.run_id, run.identity.name) == (p.id, p.name)
    assert run.identity.tags == p.tags() and run.options.out_dir == str(tmp_path / "out")
    assert run.model_copy(update={"identity": None, "options": p.job.options}) == p.job


def test_local_executor_runs_a_job_file(tmp_path: Path) -> None:
    point = _points(tmp_path)[1]
    out = tmp_path / "out"
    cmd = LocalExecutor().command(point, out)
    assert cmd[1:3] == ["-m", "scalelab.measure.launch"]
    job_file = Path(cmd[3])
    assert job_file.parent == out / STATE_DIR / "jobs"
    job = read_job(job_file)
    assert job.identity is not None and job.identity.name == point.name
    assert job.model_copy(update={"identity": None, "options": point.job.options}) == point.job


def test_failed_record_of_a_point(tmp_path: Path) -> None:
    point = _points(tmp_path)[0]
    record = failed_record(point, tmp_path, "the run ended (exit code 9) without writing a record")
    assert record.status == "failed" and record.name == point.name and record.run_id == point.id
    assert record.layout == point.layout.model_dump()
    assert record.workload["tags"] == point.tags() and record.workload["steps"] == 2


def test_layout_template_is_made_from_layout() -> None:
    """Every Layout field but what the sweep sets, with Layout's own types (not `str`)."""
    fields = LayoutTemplate.model_fields
    assert set(fields) == (set(Layout.model_fields) - {"gpus", "seq_len"}) | {"name"}
    for name in ("sharding", "pp_schedule", "recompute", "precision", "attention"):
        assert fields[name].annotation == Layout.model_fields[name].annotation
        assert fields[name].annotation is not str
    with pytest.raises(ValueError, match="recompute"):
        LayoutTemplate(recompute="sometimes")


def test_predict_true_puts_the_prediction_beside_an_ok_record(tmp_path: Path) -> None:
    from scalelab.measure.record import base_record
    from scalelab.results import load_record, write_record
    from scalelab.sweep.run import add_prediction

    text = TINY_SWEEP.replace("repeats: 2}", "repeats: 2, predict: true}")
    point = _points(tmp_path, text)[1]
    assert point.bench.predict
    job = point.job_for(tmp_path / "out", "2026-12-03T10:00:00Z")
    assert job.identity is not None
    path = write_record(base_record(job, job.identity, "ok"), tmp_path / "out")
    assert add_prediction(path, point) is None
    prediction = load_record(path).prediction
    assert prediction is not None and prediction["cluster"] == "h100-ib"
    assert prediction["tokens_per_s"] > 0 and "power_w_per_gpu" in prediction


def test_a_layout_the_bench_options_rule_out_is_refused(tmp_path: Path) -> None:
    from scalelab.errors import InputError

    text = TINY_SWEEP.replace("gpus_per_node: [1, 2]", "gpus_per_node: [2]")
    text = text.replace("{sharding: fsdp}", "{pp: 2, pp_schedule: zbv, virtual_stages: 2}")
    text = text.replace(
        "bench: {steps: 2, warmup: 1, repeats: 2}", "bench: {steps: 2, compile: true}"
    )
    with pytest.raises(InputError) as info:
        _points(tmp_path, text)
    assert "compile" in str(info.value)
