"""The gradient-sync option is recorded, and a prediction says when the run differs from it."""

from __future__ import annotations

import pytest

from scalelab.config.catalog import load_cluster, load_model
from scalelab.config.layout import Layout
from scalelab.measure.config import BenchOptions
from scalelab.measure.job import BenchJob, RunIdentity
from scalelab.measure.record import base_record
from scalelab.predicted import GRAD_SYNC_NOTE, attach_prediction


@pytest.mark.parametrize(("grad_sync", "pp", "recorded"), [
    ("step", 1, "step"), ("microbatch", 1, "microbatch"), ("step", 2, "step"),
])  # fmt: skip
def test_grad_sync_is_recorded_and_predictions_note_a_mismatch(
    grad_sync: str, pp: int, recorded: str
) -> None:
    job = BenchJob(
        model=load_model("llama-tiny"),
        layout=Layout(gpus=2, pp=pp, global_batch=8, seq_len=32),
        options=BenchOptions(grad_sync=grad_sync),  # type: ignore[arg-type]
        identity=RunIdentity(run_id="r", created_utc="2026-12-03T10:00:00Z", name="n"),
    )
    record = base_record(job, job.identity, "ok")  # type: ignore[arg-type]
    assert record.workload["grad_sync"] == recorded
    prediction = attach_prediction(record, load_cluster("h100-ib")).prediction
    assert prediction is not None
    assert (prediction.get("note") == GRAD_SYNC_NOTE) == (recorded == "microbatch")
