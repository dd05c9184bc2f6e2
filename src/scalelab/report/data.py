"""From records to the numbers a report shows: one row per configuration, with 95 % intervals.

A configuration is (model, series, GPUs): the series is the sweep's name for the layout
(`fsdp`, `best-1`, ...) from the record's `workload.tags`, or the layout's full label (`_label`:
schedule, SP, recompute, reshard, compile included) for a record that no sweep wrote; a sweep
series holding several layouts at one GPU count splits by layout label, so different layouts
never pool. Every repeat of every record of a configuration is pooled, and the mean with its
Student-t 95 % interval (clipped at 0: every metric is non-negative) is taken over the pooled
repeats. A prediction is made for `--cluster`, else the record's cluster; a record with neither
(a CPU run) is not predicted, and the page names the cluster of every prediction. Predictions, when asked for, come from the record (`bench --predict`) or
from `predict_layout` on the record's layout and cluster (`scalelab.predicted.prediction_of`).
Measured and predicted values are read under the same metric names (the shared vocabulary:
`tokens_per_s_per_gpu`, `power_w_per_gpu`, `tokens_per_j`, ...); records of schema 1 are
upgraded when they are loaded (`scalelab.results`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.errors import InputError
from scalelab.results import Record, load_record, record_paths, stats, trace_metric_s


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    scale: float = 1.0  # shown value = value × scale
    note: str = ""


METRICS: tuple[Metric, ...] = (
    Metric("tokens_per_s_per_gpu", "per-GPU throughput", "tokens/s per GPU"),
    Metric("tokens_per_s", "global throughput", "tokens/s"),
    Metric("mfu", "MFU", "%", 100.0, note="model FLOPs ÷ (GPUs × dense peak)"),
    Metric(
        "model_tflops_per_gpu", "model TFLOP/s per GPU", "TFLOP/s",
        note="model FLOPs per token (6N + attention, as MFU) × tokens/s per GPU",
    ),
    Metric(
        "exposed_comm_fraction", "exposed communication", "% of step", 100.0,
        note="communication with no compute running, from the profiled steps (bench --profile)",
    ),
    Metric(
        "power_w_per_gpu", "GPU power per GPU", "W",
        note="GPU board power from NVML energy counters, not the whole node",
    ),
    Metric("tokens_per_j", "tokens per joule", "tokens/J", note="GPU energy only"),
    Metric("step_time_s", "step time", "s"),
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
    prediction_cluster: str | None = None


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


def _label(layout: dict[str, Any], workload: dict[str, Any] | None = None) -> str:
    """The full name of what ran: `Layout.label` (degrees, pipeline schedule and virtual stages,
    SP, micro-batch, recompute, noreshard, precision, attention) plus the bench options that
    change the step (`compile`, `grad-sync-microbatch`). A layout without data or context
    parallelism has no sharding word (a pure pipeline is `pp2-1f1b`, not `fsdp pp2-1f1b`; one
    process is `single`)."""
    from pydantic import ValidationError

    from scalelab.config.layout import Layout

    workload = workload or {}
    try:
        built = Layout(**layout)
    except (TypeError, ValidationError):
        return str(layout.get("sharding", "?"))
    parts = built.label_parts()
    if built.dp * built.cp == 1:
        parts = parts[1:]
    if workload.get("compile"):
        parts.append("compile")
    if workload.get("grad_sync") == "microbatch":
        parts.append("grad-sync-microbatch")
    return " ".join(parts) or "single"


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _per_repeat(record: Record) -> dict[str, list[float]]:
    """Each metric's value in each repeat (the record's raw measurements, else its summary)."""
    repeats = record.measurements.get("repeats") if record.measurements else None
    values: dict[str, list[float]] = {k: [] for k in METRIC_KEYS}
    if isinstance(repeats, list) and repeats:
        steps = record.workload.get("steps")
        per_step = record.workload.get("tokens_per_step")
        for rep in repeats:
            if not isinstance(rep, dict):
                continue
            rep_values = {key: _mean(rep.get(key)) for key in METRIC_KEYS}
            # A repeat's raw `tokens_per_s` is per step; its figure is tokens over the window.
            window = _finite(rep.get("window_s"))
            rep_values["tokens_per_s"] = (
                float(per_step) * float(steps) / window if window and steps and per_step else None
            )
            for key, v in rep_values.items():
                if v is not None:
                    values[key].append(v)
    else:
        for key in METRIC_KEYS:
            mean = _finite((record.summary.get(key) or {}).get("mean"))
            if mean is not None:
                values[key].append(mean)
    exposed = _exposed_fraction(record)
    values["exposed_comm_fraction"] = [] if exposed is None else [exposed]
    return values


def _mean(value: Any) -> float | None:
    if isinstance(value, list):
        xs = [float(v) for v in value if _finite(v) is not None]
        return sum(xs) / len(xs) if xs else None
    return _finite(value)


def _exposed_fraction(record: Record) -> float | None:
    """Exposed communication ÷ wall time of the profiled steps (mean over ranks)."""
    report = record.measurements.get("exposed_comm") if record.measurements else None
    exposed = trace_metric_s(report, "exposed_comm")
    wall = trace_metric_s(report, "wall")
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


def _gpus(path: Path, value: Any) -> int:
    """A record's GPU count (0 when absent); an InputError naming the record when it is no count."""
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**31:
        return value
    raise InputError(f"{path}: layout.gpus", f"must be a whole number of GPUs, not {value!r:.40}")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) < 2**63


def _check_numbers(path: Path, record: Record) -> None:
    """An InputError naming the record and field for a measurement that is there but no number
    (a missing one or a NaN is a measurement not made: it is left out, not refused)."""
    for key in ("steps", "tokens_per_step"):
        value = record.workload.get(key)
        if value is not None and not (_is_number(value) and value > 0):
            raise InputError(
                f"{path}: workload.{key}", f"must be a positive number, not {value!r:.40}"
            )
    repeats = record.measurements.get("repeats") if record.measurements else None
    if repeats is None:
        return
    if not isinstance(repeats, list):
        raise InputError(f"{path}: measurements.repeats", "must be a list of repeats")
    for i, rep in enumerate(repeats):
        if not isinstance(rep, dict):
            raise InputError(f"{path}: measurements.repeats[{i}]", "must be a mapping of metrics")
        for key in (*METRIC_KEYS, "window_s"):
            value = rep.get(key)
            for x in value if isinstance(value, list) else [value]:
                if x is not None and not _is_number(x):
                    raise InputError(
                        f"{path}: measurements.repeats[{i}].{key}",
                        f"must be a number, not {x!r:.40}",
                    )


def observations(records: Sequence[tuple[Path, Record]]) -> list[Observation]:
    obs = []
    for path, record in records:
        layout = record.layout or {}
        tags = record.workload.get("tags") or {}
        if not isinstance(tags, dict):
            raise InputError(f"{path}: workload.tags", "must be a mapping of tag to value")
        gpus = _gpus(path, layout.get("gpus"))
        label = _label(layout, record.workload)
        series = tags.get("series") or [label]
        if isinstance(series, (str, int, float)):  # one tag, not a list of one (nor of characters)
            series = [series]
        elif not isinstance(series, list):
            raise InputError(f"{path}: workload.tags.series", "must be a string or a list of them")
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
            _check_numbers(path, record)
            o.values = _per_repeat(record)
        obs.append(o)
    return obs


def add_predictions(obs: Sequence[Observation], cluster: str | None) -> list[str]:
    """Fill each ok observation's prediction; returns notes on what could not be predicted."""
    from scalelab.predicted import prediction_of

    notes: list[str] = []
    clusters: dict[str, Any] = {}
    for o in obs:
        if o.status != "ok":
            continue
        own = o.record.prediction or {}
        if cluster is None and o.record.cluster is None and (not own or "error" in own):
            notes.append(
                f"{o.path.name}: not predicted (the record names no cluster: a CPU run? "
                "pass --cluster to predict it for one)"
            )
            continue
        try:
            pred, source = prediction_of(o.record, cluster, clusters)
        except InputError as exc:
            if cluster and cluster not in clusters:  # the cluster asked for does not load
                raise
            notes.append(f"{o.path.name}: not predicted ({exc})")
            continue
        except Exception as exc:
            notes.append(f"{o.path.name}: not predicted ({type(exc).__name__}: {exc})")
            continue
        o.prediction_source = source
        o.prediction_cluster = str(pred.get("cluster") or cluster or o.record.cluster or "?")
        o.predicted = {m.key: _finite(pred.get(m.key)) for m in METRICS}
    return notes


def prediction_clusters(obs: Sequence[Observation]) -> dict[str, list[str]]:
    """The clusters predicted for, each with the devices its records were measured on."""
    out: dict[str, set[str]] = {}
    for o in obs:
        if o.prediction_cluster is None:
            continue
        env = o.record.environment if isinstance(o.record.environment, dict) else {}
        devices = env.get("devices")
        devices = devices if isinstance(devices, list) and devices else ["?"]
        out.setdefault(o.prediction_cluster, set()).update(str(d) for d in devices)
    return {k: sorted(v) for k, v in sorted(out.items())}


def aggregate(obs: Sequence[Observation]) -> list[Row]:
    """One row per (model, series, GPUs) from the ok observations, sorted."""
    by_series: dict[tuple[str, str, int], list[Observation]] = {}
    for o in obs:
        if o.status != "ok" or not o.gpus:
            continue
        for s in o.series:
            by_series.setdefault((o.model, s, o.gpus), []).append(o)
    # Different layouts are never pooled: a series with several layouts at one GPU count (four
    # pipeline schedules under one sweep name) splits into `series · layout label`.
    groups: dict[tuple[str, str, int], list[Observation]] = {}
    for (model, series, gpus), members in by_series.items():
        labels = {o.layout for o in members}
        for o in members:
            name = series if len(labels) == 1 else f"{series} · {o.layout}"
            groups.setdefault((model, name, gpus), []).append(o)
    rows = []
    for (model, series, gpus), members in sorted(groups.items()):
        measured = {}
        for key in METRIC_KEYS:
            pooled = [v for o in members for v in o.values.get(key, [])]
            measured[key] = _clip_at_zero(stats(pooled))
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


def _clip_at_zero(st: dict[str, Any]) -> dict[str, Any]:
    """Every metric here is non-negative: a Student-t interval's lower end below 0 (2 repeats:
    t = 12.7) is clipped to 0 and the clip is flagged (`ci95_clipped`)."""
    low = st.get("ci95_low")
    if low is not None and low < 0:
        return {**st, "ci95_low": 0.0, "ci95_clipped": True}
    return st


def unmeasured_reasons(obs: Sequence[Observation]) -> dict[str, str]:
    """Why a metric has no value anywhere (the records' notes), for the page to say."""
    reasons: dict[str, str] = {}
    note_keys = {
        "mfu": "mfu",
        "power_w_per_gpu": "power_w_per_gpu",
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


@dataclass
class RepeatSteps:
    """One repeat of one record, step by step: `steps` are training steps counted from the
    record's first (warm-up included; training continues across repeats, so repeat 2 starts
    where repeat 1 ended). Loss covers warm-up and measured steps; the other series the
    measured steps only (`measured_steps`). A value not recorded is None."""

    repeat: int
    steps: list[int]
    loss: list[float | None]
    measured_steps: list[int]
    grad_norm: list[float | None]
    step_time_s: list[float | None]
    tokens_per_s: list[float | None]
    mfu: list[float | None]
    memory_bytes: list[float | None]
    memory_kind: str | None


def _series(value: Any, n: int) -> list[float | None]:
    """A per-step list of `n` numbers (a missing or short list padded with None)."""
    xs = value if isinstance(value, list) else []
    out = [_finite(x) for x in xs[:n]]
    return out + [None] * (n - len(out))


def repeat_steps(record: Record) -> list[RepeatSteps]:
    """Each repeat of a bench record, step by step (empty for a record without repeats).

    MFU per step is the repeat's MFU (over its measured window) scaled by the step's throughput
    over the window's: the model FLOPs per token and the peak are the same at every step."""
    repeats = record.measurements.get("repeats") if record.measurements else None
    if not isinstance(repeats, list):
        return []
    steps_per_repeat = record.workload.get("steps")
    tokens_per_step = _finite(record.workload.get("tokens_per_step"))
    out: list[RepeatSteps] = []
    first = 1
    for i, rep in enumerate(repeats):
        if not isinstance(rep, dict):
            continue
        warm = max(len(rep.get(k) or []) for k in ("warmup_loss", "warmup_step_time_s"))
        measured = max(
            [len(rep.get(k) or []) for k in ("loss", "step_time_s", "grad_norm")]
            + [int(_finite(steps_per_repeat) or 0) if _is_number(steps_per_repeat) else 0]
        )
        measured_steps = list(range(first + warm, first + warm + measured))
        step_time = _series(rep.get("step_time_s"), measured)
        tokens = _series(rep.get("tokens_per_s"), measured)
        if tokens_per_step:
            tokens = [
                tokens_per_step / t if tok is None and t else tok
                for tok, t in zip(tokens, step_time, strict=True)
            ]
        window = _finite(rep.get("window_s"))
        rep_mfu = _finite(rep.get("mfu"))
        window_tokens = (
            tokens_per_step * measured / window if tokens_per_step and window and measured else None
        )
        mfu = [
            rep_mfu * tok / window_tokens if rep_mfu is not None and tok and window_tokens else None
            for tok in tokens
        ]
        kind = rep.get("memory_bytes_kind")
        out.append(
            RepeatSteps(
                repeat=int(rep["repeat"]) if _is_number(rep.get("repeat")) else i,
                steps=list(range(first, first + warm + measured)),
                loss=_series(rep.get("warmup_loss"), warm) + _series(rep.get("loss"), measured),
                measured_steps=measured_steps,
                grad_norm=_series(rep.get("grad_norm"), measured),
                step_time_s=step_time,
                tokens_per_s=tokens,
                mfu=mfu,
                memory_bytes=_series(rep.get("memory_bytes"), measured),
                memory_kind=str(kind) if isinstance(kind, str) else None,
            )
        )
        first += warm + measured
    return out
