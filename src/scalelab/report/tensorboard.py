"""TensorBoard event files from bench records (`scalelab report RUNS --tensorboard DIR`).

One TensorBoard run per record and repeat, `DIR/<record name>/repeat-<n>`, with the scalars
torchtitan logs per step (torchtitan/components/metrics.py: loss, grad norm, throughput, MFU,
memory), named with their units; and, where the record has a prediction (`bench --predict`, or
`report --predict`), a run `DIR/<record name>/predicted` holding the predicted step time,
throughput and MFU as flat lines over the measured steps, so that TensorBoard overlays them on the
measured curves. The x axis is the training step counted from the record's first (warm-up
included; training continues across repeats).

The events are what torch's `SummaryWriter` (torchtitan's logger) writes: `simple_value` scalar
summaries through TensorBoard's own `EventFileWriter` (torch/utils/tensorboard/writer.py uses the
same class), so no torch and no TensorFlow are needed. Each run is written into a hidden folder
and renamed into place: a crash leaves no half-written run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalelab.errors import InputError
from scalelab.report.data import Observation, RepeatSteps, repeat_steps

GIB = 2**30
# Predicted metrics drawn as flat lines (record or `report --predict` vocabulary -> tag).
PREDICTED_TAGS: tuple[tuple[str, str, float], ...] = (
    ("step_time_s", "step_time_s", 1.0),
    ("tokens_per_s", "tokens_per_s", 1.0),
    ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu", 1.0),
    ("mfu", "mfu_percent", 100.0),
)


def _writer_class() -> Any:
    """TensorBoard's event-file writer (an InputError naming the extra when it is missing)."""
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise InputError(
            "tensorboard",
            "writing TensorBoard files needs tensorboard: pip install 'scalelab[report]'",
        ) from None
    return EventFileWriter


def _scalar_event(tag: str, value: float, step: int, wall_time: float) -> Any:
    """One scalar as torch's SummaryWriter.add_scalar writes it (a `simple_value` summary)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def _measured_values(rep: RepeatSteps, gpus: int) -> dict[str, list[float | None]]:
    per_gpu = [t / gpus if t is not None and gpus else None for t in rep.tokens_per_s]
    return {
        "grad_norm": rep.grad_norm,
        "step_time_s": rep.step_time_s,
        "tokens_per_s": rep.tokens_per_s,
        "tokens_per_s_per_gpu": per_gpu,
        "mfu_percent": [m * 100.0 if m is not None else None for m in rep.mfu],
        "memory_peak_GiB": [b / GIB if b is not None else None for b in rep.memory_bytes],
    }


def _prediction(o: Observation) -> dict[str, float]:
    """The record's predicted metrics: `report --predict`'s, else the record's own."""
    source: dict[str, Any] = dict(o.predicted) if o.predicted else {}
    own = o.record.prediction
    if not source and isinstance(own, dict) and "error" not in own:
        source = own
    out = {}
    for key, tag, scale in PREDICTED_TAGS:
        value = source.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            out[tag] = float(value) * scale
    return out


def _write_run(root: Path, name: str, points: dict[str, list[tuple[int, float]]]) -> Path:
    """One TensorBoard run `root/name` with these (step, value) points per tag, written in a
    hidden folder first and renamed into place (an older run of that name is replaced)."""
    writer_class = _writer_class()
    final = root / name
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        writer = writer_class(str(staging), flush_secs=3600)
        now = time.time()
        try:
            for tag, series in points.items():
                for step, value in series:
                    writer.add_event(_scalar_event(tag, value, step, now))
        finally:
            writer.close()
        for path in staging.iterdir():
            os.chmod(path, 0o644)
        os.chmod(staging, 0o755)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def write_tensorboard(obs: Sequence[Observation], out: str | Path) -> list[Path]:
    """Event files for every ok bench record with per-step data; returns the runs written."""
    _writer_class()  # a missing writer is one clear line before any folder is made
    root = Path(out)
    runs: list[Path] = []
    for o in obs:
        if o.status != "ok":
            continue
        repeats = repeat_steps(o.record)
        if not repeats:
            continue
        name = o.path.stem
        last_measured: list[int] = []
        for rep in repeats:
            points: dict[str, list[tuple[int, float]]] = {
                "loss": [(s, v) for s, v in zip(rep.steps, rep.loss, strict=True) if v is not None]
            }
            for tag, values in _measured_values(rep, o.gpus).items():
                points[tag] = [
                    (s, v) for s, v in zip(rep.measured_steps, values, strict=True) if v is not None
                ]
            points = {tag: series for tag, series in points.items() if series}
            if points:
                runs.append(_write_run(root, f"{name}/repeat-{rep.repeat + 1}", points))
            last_measured += rep.measured_steps
        predicted = _prediction(o)
        if predicted and last_measured:
            flat = {
                tag: [(s, value) for s in (last_measured[0], last_measured[-1])]
                for tag, value in predicted.items()
            }
            runs.append(_write_run(root, f"{name}/predicted", flat))
    return runs
