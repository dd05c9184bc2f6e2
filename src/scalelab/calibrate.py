"""Fit a cluster profile's free parameters to measured `comm` and `bench` records.

Each observation is predicted with the cluster's parameters and compared on a log scale:
collective times from `comm` sweeps, step times (and GPU power per GPU, where measured) from
`bench` runs. A bench record's `power_w_per_gpu` (its GPU energy / window / GPUs) is fitted
against the predictor's `power_w_per_gpu`: the same quantity. Bounded least squares (scipy) moves only the parameters the observations can inform
(NVLink-tier collective parameters need collectives inside a node, network ones need several
nodes, compute ones need bench runs, power ones need energy); a parameter whose fitted value the
data leaves free (its column of the Jacobian is flat) is reported as undetermined and keeps the
base value. The result is written as a cluster YAML that `predict`, `search` and `study` accept.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import yaml
from pydantic import ValidationError

from scalelab.config.hardware import ClusterParams, ClusterSpec
from scalelab.config.layout import Layout, LayoutTable
from scalelab.config.model import ModelSpec
from scalelab.config.stack import StackSpec
from scalelab.errors import InputError
from scalelab.io import atomic_write_text
from scalelab.perf import comm
from scalelab.perf.predict import predict
from scalelab.predicted import record_layout, record_model

T = TypeVar("T")

COMM_INTRA = (
    "nvlink_bus_efficiency",
    "nvlink_step_latency_us",
    "base_latency_us",
    "bandwidth_ramp_mib",
)
COMM_INTER = (
    "net_bus_efficiency",
    "net_step_latency_us",
    "net_base_latency_us",
    "tree_level_latency_us",
    "net_scale_degradation",
)
COMPUTE = (
    "gemm_efficiency",
    "gemm_half_gflop",
    "attention_efficiency",
    "hbm_efficiency",
    "layer_overhead_us",
    "step_overhead_ms",
    "overlap_slowdown",
)
POWER = ("compute_power_fraction",)
# CPU ranks (a cluster whose "GPU" is a CPU core): every op runs on the host, so a step's time is
# mostly per-op host cost: per layer, per TP layer (DTensor dispatch), per collective call, per
# micro-batch and per step, beside the GEMMs' achieved rate.
CPU_HOST = ("microbatch_overhead_us", "tp_layer_overhead_us", "collective_overhead_us")
# What CPU step times cannot determine, and why: kept at the base's values. The peak and the
# bandwidth they multiply are measured instead (benchmarks/calibrate_cpu.py: a matmul's FLOP/s
# and a copy's bytes/s), so gemm_efficiency is the achieved fraction of that matmul rate.
CPU_UNDETERMINED: dict[str, str] = {
    "gemm_half_gflop": "a model's GEMMs span too few sizes: collinear with gemm_efficiency and "
    "the per-layer overhead (set it from a small matmul's rate)",
    "hbm_efficiency": "element-wise and optimizer traffic is a few per cent of a small model's "
    "CPU step: measure the bandwidth and keep 1",
    "attention_efficiency": "attention is a few per cent of a small model's CPU step: collinear "
    "with the per-layer overhead",
    "overlap_slowdown": "nothing overlaps on CPU (FSDP2 unshards synchronously): 1",
}
BOUNDS: dict[str, tuple[float, float]] = {
    "nvlink_bus_efficiency": (0.01, 1.2),
    "nvlink_step_latency_us": (0.0, 20_000.0),
    "base_latency_us": (0.0, 100_000.0),
    "bandwidth_ramp_mib": (0.0, 1_000.0),
    "net_bus_efficiency": (0.01, 1.2),
    "net_step_latency_us": (0.0, 20_000.0),
    "net_base_latency_us": (0.0, 100_000.0),
    "tree_level_latency_us": (0.0, 100_000.0),
    "net_scale_degradation": (0.0, 2.0),
    "gemm_efficiency": (0.001, 1.0),
    "gemm_half_gflop": (0.0, 1_000.0),
    "attention_efficiency": (0.001, 1.0),
    "fp8_efficiency_ratio": (0.05, 1.0),
    "hbm_efficiency": (0.01, 1.0),
    "layer_overhead_us": (0.0, 1_000_000.0),
    "microbatch_overhead_us": (0.0, 1_000_000.0),
    "tp_layer_overhead_us": (0.0, 1_000_000.0),
    "collective_overhead_us": (0.0, 1_000_000.0),
    "step_overhead_ms": (0.0, 100_000.0),
    "overlap_slowdown": (0.0, 1.0),
    "compute_power_fraction": (0.0, 1.0),
}


@dataclass(frozen=True)
class CommPoint:
    """One measured collective: `nbytes` as nccl-tests sizes it, on `ranks` ranks."""

    collective: str
    nbytes: float
    ranks: int
    ranks_per_node: int
    time_s: float
    source: str = ""


@dataclass(frozen=True)
class StepPoint:
    """One measured training step (mean over the measured steps and repeats)."""

    model: ModelSpec
    layout: Layout
    step_time_s: float
    power_w_per_gpu: float | None = None  # one GPU's average power (W)
    source: str = ""
    weight: float = 1.0
    hardware: ClusterSpec | None = (
        None  # this run's own node type; the fitted parameters apply to it
    )
    # The software stack the run states (None: `generic`): its behaviour (overlaps, norm kernel,
    # gradient sync) is part of the prediction the fitted parameters must explain.
    stack: StackSpec | None = None


@dataclass
class FitResult:
    base: str
    fitted: dict[str, float]
    before: dict[str, float]
    free: list[str]
    undetermined: list[str]
    residuals: list[dict[str, Any]] = field(default_factory=list)
    error_before: float = 0.0
    error_after: float = 0.0
    # Groups of fitted parameters the data moves only together (nearly collinear columns of the
    # Jacobian at the start): each group's members are not separately determined.
    collinear: list[list[str]] = field(default_factory=list)
    # Parameters left out of the fit on purpose, with the reason (CPU_UNDETERMINED on CPU).
    reasons: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _with(cluster: ClusterSpec, values: dict[str, float]) -> ClusterSpec:
    return cluster.model_copy(update={"params": cluster.params.model_copy(update=values)})


def _predict_all(
    cluster: ClusterSpec, comm_points: list[CommPoint], step_points: list[StepPoint]
) -> tuple[np.ndarray, np.ndarray]:
    """Predicted collective times, then step times and powers (nan where no power measured)."""
    comm_pred = np.zeros(len(comm_points))
    groups: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(comm_points):
        groups[p.collective].append(i)
    for collective, idx in groups.items():
        pts = [comm_points[i] for i in idx]
        shape = comm.GroupShape(
            ranks=np.array([p.ranks for p in pts]),
            ranks_per_domain=np.array([min(p.ranks_per_node, p.ranks) for p in pts]),
        )
        comm_pred[idx] = comm.collective_time(
            collective, np.array([p.nbytes for p in pts]), shape, cluster
        )
    step_pred = np.zeros(2 * len(step_points))
    by_model: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, point in enumerate(step_points):
        hw = point.hardware.model_dump_json() if point.hardware is not None else ""
        st = point.stack.model_dump_json() if point.stack is not None else ""
        by_model[(point.model.model_dump_json(), hw, st)].append(i)
    for idx in by_model.values():
        table = LayoutTable.from_layouts([step_points[i].layout for i in idx])
        first = step_points[idx[0]]
        own = first.hardware
        target = cluster if own is None else own.model_copy(update={"params": cluster.params})
        pred = predict(first.model, target, table, first.stack)
        step_pred[idx] = pred["step_time_s"]
        step_pred[[len(step_points) + i for i in idx]] = pred["power_w_per_gpu"]
    return comm_pred, step_pred


def is_cpu(cluster: ClusterSpec) -> bool:
    return cluster.gpu.device == "cpu"


def free_parameters(
    comm_points: list[CommPoint], step_points: list[StepPoint], cpu: bool = False
) -> list[str]:
    """What the observations can inform; on CPU ranks (`cpu`) the host overheads, without the
    efficiencies that CPU step times cannot separate (`CPU_UNDETERMINED`)."""
    names: list[str] = []
    if any(p.ranks_per_node > 1 for p in comm_points):
        names += COMM_INTRA
    if any(p.ranks > p.ranks_per_node for p in comm_points):
        names += COMM_INTER
    if step_points and cpu:
        names += [n for n in COMPUTE if n not in CPU_UNDETERMINED] + list(CPU_HOST)
    elif step_points:
        names += COMPUTE
    if any(p.power_w_per_gpu is not None for p in step_points):
        names += POWER
    return names


def fit(
    cluster: ClusterSpec,
    comm_points: list[CommPoint],
    step_points: list[StepPoint],
    names: list[str] | None = None,
    max_nfev: int = 1000,
) -> FitResult:
    """Fit `names` (default: what the data can inform) by bounded least squares on log errors.

    `max_nfev` caps the solver's residual evaluations (validate's cross-validation uses a few)."""
    from scipy.optimize import least_squares

    if not comm_points and not step_points:
        raise InputError(
            "records", "no usable measurement in the records (need ok comm or bench records)"
        )
    cpu = is_cpu(cluster)
    reasons = {} if names or not cpu or not step_points else dict(CPU_UNDETERMINED)
    names = names or free_parameters(comm_points, step_points, cpu)
    base = cluster.params.model_dump()
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    x0 = np.clip(np.array([float(base[n]) for n in names]), lo + 1e-9, hi - 1e-9)
    comm_measured = np.array([p.time_s for p in comm_points])
    step_measured = np.array([p.step_time_s for p in step_points])
    power_measured = np.array(
        [np.nan if p.power_w_per_gpu is None else p.power_w_per_gpu for p in step_points]
    )
    has_power = ~np.isnan(power_measured)
    # Each kind of observation carries equal weight, however many points it has.
    w_comm = 1.0 / np.sqrt(max(len(comm_points), 1))
    w_step = np.array([p.weight for p in step_points]) / np.sqrt(max(len(step_points), 1))
    w_power = 1.0 / np.sqrt(max(int(has_power.sum()), 1))

    def residuals(x: np.ndarray) -> np.ndarray:
        c = _with(cluster, dict(zip(names, x.tolist(), strict=True)))
        cp, sp = _predict_all(c, comm_points, step_points)
        n = len(step_points)
        parts = [
            w_comm * np.log(np.maximum(cp, 1e-12) / comm_measured),
            w_step * np.log(np.maximum(sp[:n], 1e-12) / step_measured),
        ]
        if has_power.any():
            parts.append(w_power * np.log(sp[n:][has_power] / power_measured[has_power]))
        return np.concatenate(parts)

    # Parameters the data cannot move (a flat Jacobian column at the start) are left out.
    r0 = residuals(x0)
    sensitivity = np.zeros(len(names))
    columns = np.zeros((len(r0), len(names)))
    for j in range(len(names)):
        step = np.zeros(len(names))
        step[j] = max(abs(x0[j]) * 0.05, 1e-3)
        probe = (
            np.clip(x0 + step, lo, hi) if x0[j] + step[j] <= hi[j] else np.clip(x0 - step, lo, hi)
        )
        columns[:, j] = residuals(probe) - r0
        sensitivity[j] = float(np.linalg.norm(columns[:, j]))
    undetermined = [
        n
        for n, v in zip(names, sensitivity, strict=True)
        if v < 1e-4 * max(sensitivity.max(), 1e-12)
    ]
    keep = [j for j, n in enumerate(names) if n not in undetermined]
    collinear = collinear_groups([names[j] for j in keep], columns[:, keep])
    fitted: dict[str, float] = {}
    if keep:
        kept = [names[j] for j in keep]

        def kept_residuals(x: np.ndarray) -> np.ndarray:
            full = x0.copy()
            full[keep] = x
            return residuals(full)

        solution = least_squares(
            kept_residuals,
            x0[keep],
            bounds=(lo[keep], hi[keep]),
            x_scale="jac",
            diff_step=1e-3,
            max_nfev=max_nfev,
        )
        fitted = {n: float(v) for n, v in zip(kept, solution.x, strict=True)}
    final = _with(cluster, fitted)
    before_c, before_s = _predict_all(cluster, comm_points, step_points)
    after_c, after_s = _predict_all(final, comm_points, step_points)
    rows: list[dict[str, Any]] = []
    for i, cpt in enumerate(comm_points):
        rows.append(
            {
                "kind": "comm",
                "what": f"{cpt.collective} {cpt.nbytes:.0f} B on {cpt.ranks} ranks",
                "measured": cpt.time_s,
                "before": float(before_c[i]),
                "after": float(after_c[i]),
            }
        )
    n = len(step_points)
    for i, spt in enumerate(step_points):
        rows.append(
            {
                "kind": "step_time_s",
                "what": f"{spt.model.name} {spt.layout.gpus} ranks {spt.source}",
                "measured": spt.step_time_s,
                "before": float(before_s[i]),
                "after": float(after_s[i]),
            }
        )
        if spt.power_w_per_gpu is not None:
            rows.append(
                {
                    "kind": "power_w_per_gpu",
                    "what": spt.source,
                    "measured": spt.power_w_per_gpu,
                    "before": float(before_s[n + i]),
                    "after": float(after_s[n + i]),
                }
            )
    for r in rows:
        r["error_before"] = r["before"] / r["measured"] - 1.0
        r["error_after"] = r["after"] / r["measured"] - 1.0
    return FitResult(
        base=cluster.name,
        fitted=fitted,
        before={n: float(base[n]) for n in names},
        free=names,
        undetermined=undetermined,
        residuals=rows,
        error_before=float(np.mean([abs(r["error_before"]) for r in rows])),
        error_after=float(np.mean([abs(r["error_after"]) for r in rows])),
        collinear=collinear,
        reasons=reasons,
    )


def fit_stack(
    step_points: list[StepPoint], names: list[str], max_nfev: int = 100
) -> dict[str, float]:
    """Fit the stack parameters `names` (`StackParams` fields) to training runs, each point
    keeping its own hardware and cluster parameters: what the framework costs beyond what the
    cluster's (separately fitted) parameters explain. Bounded least squares on log step-time
    errors, each point weighted by its `weight`. Every point needs `hardware` and `stack`."""
    from scipy.optimize import least_squares

    if not step_points or any(p.hardware is None or p.stack is None for p in step_points):
        raise InputError("records", "stack fits need runs with their hardware and stack")
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    # Start inside the bounds, away from a zero that a relative finite difference cannot move.
    x0 = np.clip(_stack_start(names), lo + 1e-9, hi - 1e-9)
    measured = np.array([p.step_time_s for p in step_points])
    weights = np.array([p.weight for p in step_points]) / np.sqrt(len(step_points))
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, p in enumerate(step_points):
        assert p.hardware is not None and p.stack is not None
        key = (p.model.model_dump_json(), p.hardware.model_dump_json(), p.stack.model_dump_json())
        groups[key].append(i)

    def residuals(x: np.ndarray) -> np.ndarray:
        values = dict(zip(names, x.tolist(), strict=True))
        pred = np.zeros(len(step_points))
        for idx in groups.values():
            first = step_points[idx[0]]
            assert first.hardware is not None and first.stack is not None
            stack = first.stack.model_copy(
                update={"params": first.stack.params.model_copy(update=values)}
            )
            table = LayoutTable.from_layouts([step_points[i].layout for i in idx])
            pred[idx] = predict(first.model, first.hardware, table, stack)["step_time_s"]
        return weights * np.log(np.maximum(pred, 1e-12) / measured)

    solution = least_squares(
        residuals, x0, bounds=(lo, hi), x_scale="jac", diff_step=1e-3, max_nfev=max_nfev
    )
    return {n: float(v) for n, v in zip(names, solution.x, strict=True)}


def _stack_start(names: list[str]) -> np.ndarray:
    """A starting point for stack fits: host costs at 100 µs / 100 ms, ratios at 0.75."""
    start = {"step_overhead_ms": 100.0, "fp8_efficiency_ratio": 0.75, "attention_efficiency": 0.3}
    return np.array([start.get(n, 100.0) for n in names])


def collinear_groups(
    names: list[str], columns: np.ndarray, threshold: float = 0.02
) -> list[list[str]]:
    """Parameters whose (unit-scaled) Jacobian columns are nearly linearly dependent: for each
    singular value below `threshold` x the largest, the parameters that carry most of its right
    singular vector move the residuals only together (the data fixes a combination of them)."""
    if len(names) < 2 or not np.isfinite(columns).all():
        return []
    norms = np.linalg.norm(columns, axis=0)
    if (norms <= 0).any():
        return []
    _, sv, vt = np.linalg.svd(columns / norms, full_matrices=False)
    groups: list[list[str]] = []
    for value, vector in zip(sv, vt, strict=True):
        if value < threshold * sv[0]:
            weight = np.abs(vector)
            members = [n for n, w in zip(names, weight, strict=True) if w >= 0.3 * weight.max()]
            if len(members) > 1:
                groups.append(members)
    return groups


def calibrated_cluster(cluster: ClusterSpec, result: FitResult, name: str) -> ClusterSpec:
    return _with(cluster, result.fitted).model_copy(update={"name": name})


def fit_and_write_stack(
    cluster: ClusterSpec,
    result: FitResult,
    run_stack: StackSpec,
    step_points: list[StepPoint],
    names: list[str],
    out: Path,
    n_records: int,
) -> dict[str, Any]:
    """Fit `names` of the stack on the step points with the fitted cluster held fixed, and write
    the stack (its behaviour and the fitted numbers) as a YAML `load_stack` reads."""
    from dataclasses import replace

    fitted_cluster = calibrated_cluster(cluster, result, cluster.name)
    # Each point on its own node type with the fitted cluster parameters, as `fit` predicts it.
    points = [
        replace(
            p,
            hardware=fitted_cluster
            if p.hardware is None
            else p.hardware.model_copy(update={"params": fitted_cluster.params}),
        )
        for p in step_points
    ]
    values = fit_stack(points, names)
    params = run_stack.params.model_copy(update=values)
    data = run_stack.model_copy(update={"params": params}).model_dump(mode="json", exclude={"name"})
    data["source"] = (
        f"{run_stack.source} FITTED by scalelab calibrate on {n_records} records: "
        + ", ".join(f"{k} = {v:.4g}" for k, v in values.items())
    ).strip()
    atomic_write_text(out, yaml.safe_dump(data, sort_keys=False))
    return {"stack_fitted": values, "stack_file": str(out)}


def write_cluster_yaml(cluster: ClusterSpec, result: FitResult, path: Path, note: str = "") -> Path:
    """A cluster file with the fitted parameters and where they came from."""
    out = calibrated_cluster(cluster, result, path.stem)
    params = out.params.model_dump()
    params["source"] = (
        f"scalelab calibrate from base '{result.base}': fitted {', '.join(sorted(result.fitted)) or 'nothing'}"
        + (
            f"; undetermined (kept from base): {', '.join(result.undetermined)}"
            if result.undetermined
            else ""
        )
        + f"; mean |error| {result.error_before * 100:.1f} % -> {result.error_after * 100:.1f} %"
        + (f"; {note}" if note else "")
    )
    document = {
        "gpu": out.gpu.model_dump(exclude={"name"}) | {"name": out.gpu.name},
        "gpus_per_node": out.gpus_per_node,
        "nvlink_domain": out.nvlink_domain,
        "nics_per_node": out.nics_per_node,
        "nic_gbps": out.nic_gbps,
        "max_gpus": out.max_gpus,
        "source": f"calibrated from measured records on top of {result.base}",
        "params": params,
    }
    return atomic_write_text(path, yaml.safe_dump(document, sort_keys=False))


def _record_part(rec: Any, part: str, read: Callable[[Any], T]) -> T:
    """One part of a bench record, read by `read`; missing or invalid: an InputError naming the
    record, the part and (for a value pydantic refuses, like a layout of 0 GPUs) the field."""
    where = f"records: {rec.name}: {part}"
    try:
        return read(rec)
    except (KeyError, TypeError):
        raise InputError(where, "the bench record lacks it") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        message = str(err["msg"]).removeprefix("Value error, ")
        raise InputError(f"{where}.{loc}" if loc else where, message) from None
    except InputError as exc:
        raise InputError(where, f"{exc.field}: {exc.message}") from None


def points_from_records(
    records: list[Any],
) -> tuple[list[CommPoint], list[StepPoint], dict[str, int]]:
    """Observations from `comm` and `bench` records (scalelab.results.Record); skipped ones counted."""
    comm_points: list[CommPoint] = []
    step_points: list[StepPoint] = []
    skipped: dict[str, int] = defaultdict(int)
    for rec in records:
        if rec.status != "ok":
            skipped[f"status {rec.status}"] += 1
            continue
        if rec.kind == "comm":
            w = rec.workload
            rows = rec.measurements.get("rows", [])
            if not isinstance(rows, list):
                raise InputError(
                    f"records: {rec.name}: measurements.rows", "must be a list of rows"
                )
            for i, row in enumerate(rows):
                try:
                    point = CommPoint(
                        collective=str(row["collective"]),
                        nbytes=float(row["bytes"]),
                        ranks=int(w["world_size"]),
                        ranks_per_node=int(w.get("nproc_per_node", w["world_size"])),
                        time_s=float(row["time_s"]),
                        source=rec.name,
                    )
                    good = all(
                        math.isfinite(v) and v > 0
                        for v in (point.nbytes, point.time_s, point.ranks, point.ranks_per_node)
                    )
                except (KeyError, TypeError, ValueError, OverflowError) as exc:
                    raise InputError(
                        f"records: {rec.name}: measurements.rows[{i}]",
                        "needs collective, bytes and time_s (positive numbers) and the workload's "
                        f"world_size ({type(exc).__name__}: {' '.join(str(exc).split())[:80]})",
                    ) from None
                if not good:
                    raise InputError(
                        f"records: {rec.name}: measurements.rows[{i}]",
                        "bytes, time_s, world_size and nproc_per_node must be positive finite "
                        f"numbers, not {point.nbytes}, {point.time_s}, {point.ranks}, "
                        f"{point.ranks_per_node}",
                    )
                comm_points.append(point)
        elif rec.kind == "bench":
            if not isinstance(rec.workload.get("model_spec"), dict):
                raise InputError(
                    f"records: {rec.name}: workload.model_spec", "the bench record lacks it"
                )
            model = _record_part(rec, "workload.model_spec", record_model)
            layout = _record_part(rec, "layout", record_layout)
            step = _record_part(
                rec, "summary.step_time_s.mean", lambda r: r.summary["step_time_s"]["mean"]
            )
            if (
                isinstance(step, bool)
                or not isinstance(step, (int, float))
                or not (math.isfinite(step) and step > 0)
            ):
                raise InputError(
                    f"records: {rec.name}: summary.step_time_s.mean",
                    f"must be a positive number of seconds, not {step!r:.40}",
                )
            # Records of schema 1 are upgraded on load (avg_power_w / GPUs).
            power = (rec.summary.get("power_w_per_gpu") or {}).get("mean")
            step_points.append(
                StepPoint(
                    model, layout, float(step), None if power is None else float(power), rec.name
                )
            )
        else:
            raise InputError(
                "records",
                f"{rec.name}: kind '{rec.kind}' cannot be calibrated against (comm or bench)",
            )
    return comm_points, step_points, dict(skipped)


__all__ = [
    "ClusterParams",
    "CommPoint",
    "FitResult",
    "StepPoint",
    "fit",
    "points_from_records",
    "write_cluster_yaml",
]
