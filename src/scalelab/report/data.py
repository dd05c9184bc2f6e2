"""From records to the numbers a report shows: one row per configuration, with 95 % intervals.

A configuration is (model, series, GPUs): the series is the sweep's name for the layout
(`fsdp`, `best-1`, ...) from the record's `workload.tags`, or the layout's own short name for a
record that no sweep wrote. Every repeat of every record of a configuration (several runs of a
point, several points) is pooled, and the mean with its Student-t 95 % interval is taken over
the pooled repeats. Predictions, when asked for, come from the record (`bench --predict`) or
from `predict_layout` on the record's layout and cluster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.errors import InputError
from scalelab.results import Record, load_record, record_paths, stats


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    scale: float = 1.0  # shown value = value × scale
    predicted: str | None = None  # the predictor's field
    note: str = ""


METRICS: tuple[Metric, ...] = (
    Metric(
        "tokens_per_s_per_gpu", "per-GPU throughput", "tokens/s per GPU",
        predicted="tokens_per_s_per_gpu",
    ),
    Metric("tokens_per_s", "global throughput", "tokens/s", predicted="tokens_per_s"),
    Metric("mfu", "MFU", "%", 100.0, predicted="mfu", note="model FLOPs ÷ (GPUs × dense peak)"),
    Metric(
        "exposed_comm_fraction", "exposed communication", "% of step", 100.0,
        predicted="exposed_comm_fraction",
        note="communication with no compute running, from the profiled steps (bench --profile)",
    ),
    Metric(
        "power_w_per_gpu", "GPU power per GPU", "W", predicted="power_w_per_gpu",
        note="GPU board power from NVML energy counters, not the whole node",
    ),
    Metric(
        "tokens_per_j", "tokens per joule", "tokens/J", predicted="tokens_per_joule",
        note="GPU energy only",
    ),
    Metric("step_time_s", "step time", "s", predicted="step_time_s"),
)  # fmt: skip
METRIC_KEYS = tuple(m.key for m in METRICS)


@dataclass
class Observation:
    """What one record contributes: per-repeat values of each metric, and its prediction."""

    path: Path
    record: Record
    model: str
    series: list[str]
    gpus: int
    nodes: int | None
    layout: str
    status: str
    values: dict[str, list[float]] = field(default_factory=dict)
    predicted: dict[str, float | None] = field(default_factory=dict)
    prediction_source: str | None = None


@dataclass
class Row:
    """One configuration: (model, series, GPUs)."""

    model: str
    series: str
    gpus: int
    nodes: int | None
    layouts: list[str]
    records: int
    measured: dict[str, dict[str, Any]]
    predicted: dict[str, float | None]

    def flat(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "model": self.model,
            "series": self.series,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "layouts": " ".join(self.layouts),
            "records": self.records,
        }
        for key in METRIC_KEYS:
            st = self.measured.get(key, {})
            for part in ("mean", "ci95_low", "ci95_high", "n"):
                row[f"{key}.{part}"] = st.get(part)
            if self.predicted:
                row[f"{key}.predicted"] = self.predicted.get(key)
        return row


def _label(layout: dict[str, Any]) -> str:
    sharding = layout.get("sharding", "fsdp")
    if sharding == "hsdp" and layout.get("hsdp_shard_size"):
        sharding = f"hsdp{layout['hsdp_shard_size']}"
    parts = [sharding]
    for key, tag in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("micro_batch", "mb")):
        if (layout.get(key) or 1) > 1:
            parts.append(f"{tag}{layout[key]}")
    if layout.get("recompute", "none") != "none":
        parts.append(f"ac-{layout['recompute']}")
    return "-".join(parts)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _per_repeat(record: Record, gpus: int) -> dict[str, list[float]]:
    """Each metric's value in each repeat (the record's raw measurements, else its summary)."""
    repeats = record.measurements.get("repeats") if record.measurements else None
    values: dict[str, list[float]] = {k: [] for k in METRIC_KEYS}
    if isinstance(repeats, list) and repeats:
        for rep in repeats:
            if not isinstance(rep, dict):
                continue
            window = _finite(rep.get("window_s"))
            steps = record.workload.get("steps")
            per_step = record.workload.get("tokens_per_step")
            tps = None
            if window and steps and per_step:
                tps = float(per_step) * float(steps) / window
            rep_values = {
                "tokens_per_s": tps,
                "tokens_per_s_per_gpu": _finite(rep.get("tokens_per_s_per_gpu")),
                "mfu": _finite(rep.get("mfu")),
                "tokens_per_j": _finite(rep.get("tokens_per_j")),
                "step_time_s": _mean(rep.get("step_time_s")),
                "power_w_per_gpu": _div(_finite(rep.get("avg_power_w")), gpus),
            }
            for key, v in rep_values.items():
                if v is not None:
                    values[key].append(v)
    else:
        for key, src in (
            ("tokens_per_s", "tokens_per_s"),
            ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu"),
            ("mfu", "mfu"),
            ("tokens_per_j", "tokens_per_j"),
            ("step_time_s", "step_time_s"),
        ):
            mean = _finite((record.summary.get(src) or {}).get("mean"))
            if mean is not None:
                values[key].append(mean)
        power = _finite((record.summary.get("avg_power_w") or {}).get("mean"))
        if power is not None:
            values["power_w_per_gpu"].append(power / gpus)
    exposed = _exposed_fraction(record)
    if exposed is not None:
        values["exposed_comm_fraction"].append(exposed)
    return values


def _mean(value: Any) -> float | None:
    if isinstance(value, list):
        xs = [float(v) for v in value if _finite(v) is not None]
        return sum(xs) / len(xs) if xs else None
    return _finite(value)


def _div(value: float | None, by: int) -> float | None:
    return value / by if value is not None and by else None


def _exposed_fraction(record: Record) -> float | None:
    """Exposed communication ÷ wall time of the profiled steps (mean over ranks)."""
    report = record.measurements.get("exposed_comm") if record.measurements else None
    if not isinstance(report, dict):
        return None
    metrics = (report.get("summary") or {}).get("metrics") or {}
    # scalelab.trace/2 writes nanoseconds (*_ns), /1 microseconds (*_us): the ratio is the same.
    exposed = _finite(
        (metrics.get("exposed_comm_ns") or metrics.get("exposed_comm_us") or {}).get("mean")
    )
    wall = _finite((metrics.get("wall_ns") or metrics.get("wall_us") or {}).get("mean"))
    if exposed is None or not wall:
        return None
    return exposed / wall


def load(directory: str | Path) -> list[tuple[Path, Record]]:
    """Every bench record under `directory` (hidden folders, like a sweep's state, skipped)."""
    out = []
    for path in record_paths(directory):
        record = load_record(path)
        if record.kind == "bench":
            out.append((path, record))
    if not out:
        raise InputError("records", f"no bench records under {directory}")
    return out


def observations(records: Sequence[tuple[Path, Record]]) -> list[Observation]:
    obs = []
    for path, record in records:
        layout = record.layout or {}
        tags = record.workload.get("tags") or {}
        gpus = int(layout.get("gpus") or 0)
        label = _label(layout)
        series = tags.get("series") or [label]
        o = Observation(
            path=path,
            record=record,
            model=str(record.workload.get("model") or "?"),
            series=[str(s) for s in series],
            gpus=gpus,
            nodes=tags.get("nodes"),
            layout=label,
            status=record.status,
        )
        if record.status == "ok" and gpus:
            o.values = _per_repeat(record, gpus)
        obs.append(o)
    return obs


def add_predictions(obs: Sequence[Observation], cluster: str | None) -> list[str]:
    """Fill each ok observation's prediction; returns notes on what could not be predicted."""
    from scalelab.config.catalog import load_cluster, load_model
    from scalelab.config.layout import Layout
    from scalelab.config.model import ModelSpec
    from scalelab.perf.predict import predict_layout

    notes: list[str] = []
    clusters: dict[str, Any] = {}
    for o in obs:
        if o.status != "ok":
            continue
        pred = o.record.prediction
        source = "record"
        if not pred or "error" in pred or (cluster and pred.get("cluster") != cluster):
            name = cluster or o.record.cluster or "h100-ib"
            try:
                if name not in clusters:
                    clusters[name] = load_cluster(name)
                spec_data = o.record.workload.get("model_spec")
                spec = (
                    ModelSpec(**spec_data) if isinstance(spec_data, dict) else load_model(o.model)
                )
                pred = predict_layout(spec, clusters[name], Layout(**(o.record.layout or {})))
                source = f"predict_layout on {name}"
            except InputError as exc:
                if name == cluster:
                    raise
                notes.append(f"{o.path.name}: not predicted ({exc})")
                continue
            except Exception as exc:
                notes.append(f"{o.path.name}: not predicted ({type(exc).__name__}: {exc})")
                continue
        o.prediction_source = source
        gpus = o.gpus
        o.predicted = {
            m.key: _finite(pred.get(m.predicted)) if m.predicted else None for m in METRICS
        }
        if o.predicted.get("tokens_per_s_per_gpu") is None and gpus:
            o.predicted["tokens_per_s_per_gpu"] = _div(_finite(pred.get("tokens_per_s")), gpus)
    return notes


def aggregate(obs: Sequence[Observation]) -> list[Row]:
    """One row per (model, series, GPUs) from the ok observations, sorted."""
    groups: dict[tuple[str, str, int], list[Observation]] = {}
    for o in obs:
        if o.status != "ok" or not o.gpus:
            continue
        for s in o.series:
            groups.setdefault((o.model, s, o.gpus), []).append(o)
    rows = []
    for (model, series, gpus), members in sorted(groups.items()):
        measured = {}
        for key in METRIC_KEYS:
            pooled = [v for o in members for v in o.values.get(key, [])]
            measured[key] = stats(pooled)
        predicted: dict[str, float | None] = {}
        with_pred = [o for o in members if o.predicted]
        for key in METRIC_KEYS:
            vals = [o.predicted[key] for o in with_pred if o.predicted.get(key) is not None]
            if with_pred:
                predicted[key] = sum(v for v in vals if v is not None) / len(vals) if vals else None
        nodes = {o.nodes for o in members if o.nodes is not None}
        rows.append(
            Row(
                model=model,
                series=series,
                gpus=gpus,
                nodes=nodes.pop() if len(nodes) == 1 else None,
                layouts=sorted({o.layout for o in members}),
                records=len(members),
                measured=measured,
                predicted=predicted,
            )
        )
    return rows


def unmeasured_reasons(obs: Sequence[Observation]) -> dict[str, str]:
    """Why a metric has no value anywhere (the records' notes), for the page to say."""
    reasons: dict[str, str] = {}
    note_keys = {
        "mfu": "mfu",
        "power_w_per_gpu": "energy_j",
        "tokens_per_j": "energy_j",
        "exposed_comm_fraction": "exposed_comm",
    }
    for key, note in note_keys.items():
        if any(o.values.get(key) for o in obs):
            continue
        for o in obs:
            if note in o.record.notes:
                reasons[key] = o.record.notes[note]
                break
        else:
            if key == "exposed_comm_fraction":
                reasons[key] = "no profiled runs (bench --profile, or profile: true in the sweep)"
            else:
                reasons[key] = "not measured"
    return reasons
