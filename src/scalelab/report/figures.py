"""The report's figures: each metric against GPU count, one line per (model, series).

Measured points carry error bars from the 95 % interval over the pooled repeats (none with a
single repeat); predictions, when asked for, are dashed lines with hollow markers in the same
colour. A last figure puts measured over predicted throughput per configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalelab.plotting import gpu_axis, pyplot, save_figure
from scalelab.report.data import METRICS, Metric, Observation, Row

MAX_CURVES = 16


def _series(rows: Sequence[Row]) -> dict[tuple[str, str], list[Row]]:
    out: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        out.setdefault((r.model, r.series), []).append(r)
    for members in out.values():
        members.sort(key=lambda r: r.gpus)
    return out


def has_data(rows: Sequence[Row], metric: Metric, predicted: bool) -> bool:
    measured = any(r.measured.get(metric.key, {}).get("mean") is not None for r in rows)
    pred = predicted and any(r.predicted.get(metric.key) is not None for r in rows)
    return measured or pred


def metric_figure(rows: Sequence[Row], metric: Metric, path: Path, predicted: bool) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    gpus: set[int] = set()
    for i, ((model, series), members) in enumerate(sorted(_series(rows).items())):
        color = colors[i % len(colors)]
        xs, ys, lo, hi = [], [], [], []
        for r in members:
            st = r.measured.get(metric.key, {})
            if st.get("mean") is None:
                continue
            mean = st["mean"] * metric.scale
            xs.append(r.gpus)
            ys.append(mean)
            low, high = st.get("ci95_low"), st.get("ci95_high")
            lo.append(mean - low * metric.scale if low is not None else 0.0)
            hi.append(high * metric.scale - mean if high is not None else 0.0)
        if xs:
            gpus.update(xs)
            ax.errorbar(
                xs, ys, yerr=[lo, hi], marker="o", capsize=4, color=color,
                label=f"{model} {series} (measured)",
            )  # fmt: skip
        if predicted:
            px = [r.gpus for r in members if r.predicted.get(metric.key) is not None]
            py = [
                (r.predicted[metric.key] or 0.0) * metric.scale
                for r in members
                if r.predicted.get(metric.key) is not None
            ]
            if px:
                gpus.update(px)
                ax.plot(
                    px, py, linestyle="--", marker="o", markerfacecolor="none", color=color,
                    label=f"{model} {series} (predicted)",
                )  # fmt: skip
    if gpus:
        gpu_axis(ax, sorted(gpus))
    ax.set_ylabel(f"{metric.label} ({metric.unit})")
    title = f"{metric.label} vs GPUs"
    ax.set_title(title + ("\n" + metric.note if metric.note else ""), fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def ratio_figure(rows: Sequence[Row], path: Path) -> Path | None:
    """Measured ÷ predicted global throughput, per configuration."""
    plt = pyplot()
    points: list[tuple[str, int, float, Any]] = []
    for r in rows:
        st = r.measured.get("tokens_per_s", {})
        pred = r.predicted.get("tokens_per_s")
        if st.get("mean") is None or not pred:
            continue
        points.append((f"{r.model} {r.series}", r.gpus, st["mean"] / pred, st))
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = sorted({p[0] for p in points})
    for i, label in enumerate(labels):
        mine = sorted((p for p in points if p[0] == label), key=lambda p: p[1])
        xs = [p[1] for p in mine]
        ys = [p[2] for p in mine]
        lo: list[float] = []
        hi: list[float] = []
        for _, _, ratio, st in mine:
            predicted = st["mean"] / ratio  # the prediction the ratio was taken against
            low, high = st.get("ci95_low"), st.get("ci95_high")
            lo.append((st["mean"] - low) / predicted if low is not None else 0.0)
            hi.append((high - st["mean"]) / predicted if high is not None else 0.0)
        ax.errorbar(
            xs, ys, yerr=[lo, hi], marker="o", capsize=4, color=colors[i % len(colors)], label=label
        )
    ax.axhline(1.0, color="grey", linestyle=":")
    gpu_axis(ax, sorted({p[1] for p in points}))
    ax.set_ylabel("measured ÷ predicted tokens/s")
    ax.set_title("measured against predicted throughput (1 = the predictor is exact)", fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def loss_curves(obs: Sequence[Observation]) -> dict[str, list[tuple[list[int], list[float]]]]:
    """Each ok record's training loss, one curve per repeat: (training steps, losses) at every
    step the repeat ran (warm-up and measured; training continues across repeats, so a repeat
    starts where the one before ended), keyed by `model series GPUs`."""
    from scalelab.report.data import repeat_steps

    curves: dict[str, list[tuple[list[int], list[float]]]] = {}
    for o in obs:
        if o.status != "ok":
            continue
        per_repeat = []
        for rep in repeat_steps(o.record):
            points = [(s, v) for s, v in zip(rep.steps, rep.loss, strict=True) if v is not None]
            if points:
                per_repeat.append(([s for s, _ in points], [v for _, v in points]))
        if per_repeat:
            key = f"{o.model} {' / '.join(o.series)} {o.gpus} GPUs"
            if key in curves:
                key = f"{key} ({o.path.stem[-8:]})"
            curves[key] = per_repeat
    return curves


def loss_figure(obs: Sequence[Observation], path: Path) -> Path | None:
    """Loss against training step, one line per repeat of each record (the first MAX_CURVES
    records; a record's repeats share its colour and differ in line style): layouts that train alike lie on one curve,
    and one that does not (wrong gradients) stands out."""
    curves = loss_curves(obs)
    if not curves:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for index, (label, repeats) in enumerate(sorted(curves.items())[:MAX_CURVES]):
        colour = f"C{index % 10}"
        for number, (steps, losses) in enumerate(repeats):
            ax.plot(
                steps,
                losses,
                marker=".",
                color=colour,
                linestyle=("-", "--", ":", "-.")[number % 4],
                label=f"{label}, repeat {number + 1}" if len(repeats) > 1 else label,
            )
    ax.set_xlabel("training step (warm-up and measured; one line per repeat)")
    ax.set_ylabel("loss")
    shown = min(len(curves), MAX_CURVES)
    ax.set_title(f"training loss per record and repeat ({shown} of {len(curves)})", fontsize=10)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


BREAKDOWN_PARTS = (
    ("compute", "compute"),
    ("exposed_comm", "exposed communication"),
    ("idle", "idle (pipeline bubble, waits)"),
)


def step_breakdowns(obs: Sequence[Observation]) -> dict[tuple[str, str, int], dict[str, float]]:
    """Per (model, series, GPUs), the profiled step split into compute, exposed communication,
    idle and the rest (seconds per step, mean over ranks, averaged over the profiled records)."""
    from scalelab.results import trace_metric_s

    sums: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for o in obs:
        report = o.record.measurements.get("exposed_comm") if o.record.measurements else None
        wall = trace_metric_s(report, "wall")
        if o.status != "ok" or not wall:
            continue
        parts = {key: trace_metric_s(report, key) or 0.0 for key, _ in BREAKDOWN_PARTS}
        parts["other"] = max(0.0, wall - sum(parts.values()))
        for series in o.series:
            sums.setdefault((o.model, series, o.gpus), []).append(parts)
    return {
        key: {part: sum(m[part] for m in members) / len(members) for part in members[0]}
        for key, members in sorted(sums.items())
    }


def breakdown_figure(obs: Sequence[Observation], path: Path) -> Path | None:
    """Stacked bars of a profiled step per configuration (only records run with --profile)."""
    data = step_breakdowns(obs)
    if not data:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(data) + 2), 5))
    labels = [f"{series}\n{gpus} GPUs" for (_, series, gpus) in data]
    bottom = [0.0] * len(data)
    for key, label in (*BREAKDOWN_PARTS, ("other", "other (copies, host)")):
        heights = [parts[key] * 1e3 for parts in data.values()]
        ax.bar(labels, heights, bottom=bottom, label=label)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("ms per profiled step (mean over ranks)")
    ax.set_title("where a step's time goes (traces of bench --profile)", fontsize=10)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def all_figures(rows: Sequence[Row], out: Path, predicted: bool) -> dict[str, Path]:
    """Write every figure that has data; returns {metric key (or 'ratio'): path}."""
    figures: dict[str, Path] = {}
    for metric in METRICS:
        if has_data(rows, metric, predicted):
            figures[metric.key] = metric_figure(rows, metric, out / f"{metric.key}.png", predicted)
    if predicted:
        ratio = ratio_figure(rows, out / "measured_vs_predicted.png")
        if ratio is not None:
            figures["ratio"] = ratio
    return figures
