"""Weak scaling, strong scaling, model size and the HSDP experiment the study did not run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalelab.config.catalog import load_model
from scalelab.search import Constraints, describe, search
from scalelab.studies.common import (
    DEFAULT,
    WEAK_SCALING_GPUS,
    Assumptions,
    StudyOutput,
    best_layout,
    fsdp_at,
    gpu_axis,
    load,
    markdown_table,
    predict_fitting,
    pyplot,
    save_figure,
    write_csv,
)

METRICS = (
    ("tokens_per_s", "global tokens/s"),
    ("tokens_per_s_per_gpu", "tokens/s per GPU"),
    ("mfu", "MFU"),
    ("exposed_comm_fraction", "exposed communication (share of step)"),
    ("power_w_per_gpu", "GPU power (W, board only)"),
    ("tokens_per_joule", "tokens per joule (GPU energy)"),
)


def _row(series: str, gpus: int, r: dict[str, Any]) -> dict[str, Any]:
    return {
        "series": series,
        "gpus": gpus,
        "layout": describe(r["layout"]),
        **{k: r[k] for k, _ in METRICS},
        "step_time_s": r["step_time_s"],
        "exposed_comm_s": r["exposed_comm_s"],
    }


def weak_scaling_rows(
    a: Assumptions = DEFAULT,
    gpus_list: tuple[int, ...] = WEAK_SCALING_GPUS,
    progress: Callable[[str], None] = lambda s: None,
) -> list[dict[str, Any]]:
    model, cluster = load(a)
    rows = []
    for g in gpus_list:
        progress(f"weak scaling: {g} GPUs")
        rows.append(
            _row(
                "pure FSDP",
                g,
                predict_fitting(model, cluster, fsdp_at(g, a)),
            )
        )
        rows.append(
            _row(
                "HSDP (shard in node)",
                g,
                predict_fitting(model, cluster, fsdp_at(g, a, sharding="hsdp")),
            )
        )
        best = best_layout(
            model,
            cluster,
            g,
            a.sequences_per_gpu * g,
            a.seq_len,
            Constraints(precision=a.precision),
        )
        if best is not None:
            rows.append(_row("best searched layout", g, best))
    return rows


def plot_metrics(
    rows: list[dict[str, Any]], title: str, path: Path, series_order: list[str]
) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    gpus = sorted({r["gpus"] for r in rows})
    for ax, (key, label) in zip(axes.flat, METRICS, strict=True):
        for series in series_order:
            pts = sorted((r for r in rows if r["series"] == series), key=lambda r: r["gpus"])
            scale = 100.0 if key in ("mfu", "exposed_comm_fraction") else 1.0
            ax.plot([p["gpus"] for p in pts], [p[key] * scale for p in pts], "o-", label=series)
        gpu_axis(ax, gpus)
        ax.set_title(label + (" (%)" if key in ("mfu", "exposed_comm_fraction") else ""))
        if key == "tokens_per_s":
            ax.set_yscale("log")
    axes.flat[0].legend(fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def run_weak(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    rows = weak_scaling_rows(a, progress=progress)
    table = write_csv(out / "weak_scaling.csv", rows)
    fig = plot_metrics(
        rows,
        f"Weak scaling of {a.model} on {a.cluster}: {a.sequences_per_gpu} x {a.seq_len} tokens per GPU",
        out / "weak_scaling.png",
        ["pure FSDP", "HSDP (shard in node)", "best searched layout"],
    )
    fsdp = {r["gpus"]: r for r in rows if r["series"] == "pure FSDP"}
    best = {r["gpus"]: r for r in rows if r["series"] == "best searched layout"}
    md = [
        "## Weak scaling",
        f"![weak scaling]({fig.name})",
        markdown_table(
            [
                (
                    g,
                    f"{fsdp[g]['tokens_per_s_per_gpu']:,.0f}",
                    f"{fsdp[g]['mfu'] * 100:.1f}",
                    f"{fsdp[g]['exposed_comm_fraction'] * 100:.0f}",
                    f"{fsdp[g]['power_w_per_gpu']:.0f}",
                    best[g]["layout"] if g in best else "-",
                    f"{best[g]['tokens_per_s_per_gpu']:,.0f}" if g in best else "-",
                )
                for g in sorted(fsdp)
            ],
            [
                "GPUs",
                "FSDP tokens/s/GPU",
                "FSDP MFU %",
                "FSDP exposed comm %",
                "FSDP W/GPU",
                "best layout",
                "best tokens/s/GPU",
            ],
        ),
    ]
    return StudyOutput("weak-scaling", "Weak scaling", [fig], [table], md, {"rows": rows})


def run_strong(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    model, cluster = load(a)
    batch = a.strong_scaling_global_batch
    rows: list[dict[str, Any]] = []
    notes = []
    for g in (16, 32, 64, 128, 256):
        progress(f"strong scaling: {g} GPUs")
        res = search(
            model,
            cluster,
            gpus=g,
            global_batch=batch,
            seq_len=a.seq_len,
            constraints=Constraints(precision=a.precision),
            top_k=1,
        )
        fsdp_res = search(
            model,
            cluster,
            gpus=g,
            global_batch=batch,
            seq_len=a.seq_len,
            constraints=Constraints(
                precision=a.precision, tp=[1], pp=[1], cp=[1], sharding=["fsdp"]
            ),
            top_k=1,
        )
        if res.top:
            rows.append(_row("best searched layout", g, res.top[0]))
        if fsdp_res.top:
            rows.append(_row("pure FSDP", g, fsdp_res.top[0]))
        else:
            reasons = (
                ", ".join(f"{k} ({v})" for k, v in fsdp_res.invalid_by_reason.items())
                or "does not fit"
            )
            notes.append(
                f"{g} GPUs: pure FSDP is infeasible: {reasons}; the data-parallel degree cannot "
                f"exceed {batch} sequences, so model parallelism is required"
            )
    table = write_csv(out / "strong_scaling.csv", rows)
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6))
    for series, style in (("best searched layout", "o-"), ("pure FSDP", "s--")):
        pts = sorted((r for r in rows if r["series"] == series), key=lambda r: r["gpus"])
        ax1.plot([p["gpus"] for p in pts], [p["tokens_per_s"] for p in pts], style, label=series)
        ax2.plot(
            [p["gpus"] for p in pts], [p["tokens_per_s_per_gpu"] for p in pts], style, label=series
        )
        if series == "best searched layout":
            for p in pts:
                ax1.annotate(
                    p["layout"],
                    (p["gpus"], p["tokens_per_s"]),
                    fontsize=7,
                    rotation=20,
                    xytext=(4, 4),
                    textcoords="offset points",
                )
    ideal = sorted(
        (r for r in rows if r["series"] == "best searched layout"), key=lambda r: r["gpus"]
    )
    if ideal:
        base = ideal[0]
        ax1.plot(
            [p["gpus"] for p in ideal],
            [base["tokens_per_s"] * p["gpus"] / base["gpus"] for p in ideal],
            "k:",
            label="linear scaling",
        )
    for ax in (ax1, ax2):
        gpu_axis(ax, (16, 32, 64, 128, 256))
        ax.legend()
    ax1.set_yscale("log")
    ax1.set_title(
        f"Strong scaling: global batch {batch} x {a.seq_len} tokens, global tokens/s (log)"
    )
    ax2.set_title("tokens/s per GPU (pure FSDP stops where dp > batch)")
    fig.tight_layout()
    figure = save_figure(fig, out / "strong_scaling.png")
    md = [
        "## Strong scaling",
        f"![strong scaling]({figure.name})",
        markdown_table(
            [
                (
                    r["gpus"],
                    r["series"],
                    r["layout"],
                    f"{r['tokens_per_s']:,.0f}",
                    f"{r['tokens_per_s_per_gpu']:,.0f}",
                    f"{r['mfu'] * 100:.1f}",
                )
                for r in rows
            ],
            ["GPUs", "series", "layout", "tokens/s", "tokens/s/GPU", "MFU %"],
        ),
    ]
    md += [f"- {n}" for n in notes]
    return StudyOutput(
        "strong-scaling", "Strong scaling", [figure], [table], md, {"rows": rows, "notes": notes}
    )


def run_model_size(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    _, cluster = load(a)
    rows = []
    gpus_list = (8, 32, 128, 512, 2048)
    for name in ("llama2-1b", "llama2-7b", "llama2-13b", "llama2-70b"):
        model = load_model(name)
        for g in gpus_list:
            progress(f"model size: {name} on {g} GPUs")
            r = predict_fitting(model, cluster, fsdp_at(g, a))
            rows.append({**_row(f"{name} pure FSDP", g, r), "model": name, "fits": r["fits"]})
            best = best_layout(
                model,
                cluster,
                g,
                a.sequences_per_gpu * g,
                a.seq_len,
                Constraints(precision=a.precision),
            )
            if best is not None:
                rows.append({**_row(f"{name} best layout", g, best), "model": name, "fits": True})
    table = write_csv(out / "model_size.csv", rows)
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6))
    colors = dict(
        zip(
            ("llama2-1b", "llama2-7b", "llama2-13b", "llama2-70b"),
            ("tab:blue", "tab:orange", "tab:green", "tab:red"),
            strict=True,
        )
    )
    for name, color in colors.items():
        for kind, style in (("pure FSDP", "--"), ("best layout", "-")):
            pts = sorted(
                (r for r in rows if r["series"] == f"{name} {kind}" and r["fits"]),
                key=lambda r: r["gpus"],
            )
            ax1.plot(
                [p["gpus"] for p in pts],
                [p["mfu"] * 100 for p in pts],
                style,
                marker="o",
                color=color,
                label=f"{name} {kind}",
            )
            ax2.plot(
                [p["gpus"] for p in pts],
                [p["exposed_comm_fraction"] * 100 for p in pts],
                style,
                marker="o",
                color=color,
            )
    for ax in (ax1, ax2):
        gpu_axis(ax, gpus_list)
    ax1.set_title("MFU (%) by model size (dashed: pure FSDP, solid: best layout)")
    ax2.set_title("exposed communication (% of step)")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    figure = save_figure(fig, out / "model_size.png")
    md = [
        "## Model size",
        f"![model size]({figure.name})",
        "Larger models do more compute per byte of parameters communicated (per-layer FLOPs grow with "
        "tokens x d_model^2, FSDP traffic with d_model^2), so they keep their MFU to larger scales.",
    ]
    return StudyOutput("model-size", "Model size", [figure], [table], md, {"rows": rows})


def run_hsdp(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    model, cluster = load(a)
    gpus_list = (128, 256, 512, 1024, 2048)
    rows = []
    for g in gpus_list:
        progress(f"hsdp: {g} GPUs")
        batch = a.sequences_per_gpu * g
        rows.append(
            _row(
                "pure FSDP",
                g,
                predict_fitting(model, cluster, fsdp_at(g, a)),
            )
        )
        hsdp = best_layout(
            model,
            cluster,
            g,
            batch,
            a.seq_len,
            Constraints(precision=a.precision, tp=[1], pp=[1], cp=[1], sharding=["hsdp"]),
        )
        if hsdp is not None:
            rows.append(_row("best HSDP (any shard group)", g, hsdp))
        rows.append(
            _row(
                "HSDP, shard inside a node",
                g,
                predict_fitting(model, cluster, fsdp_at(g, a, sharding="hsdp")),
            )
        )
        mp = best_layout(
            model,
            cluster,
            g,
            batch,
            a.seq_len,
            Constraints(precision=a.precision, sharding=["fsdp"], cp=[1]),
        )
        if mp is not None:
            rows.append(_row("best FSDP + TP/PP", g, mp))
    table = write_csv(out / "hsdp.csv", rows)
    series = [
        "pure FSDP",
        "HSDP, shard inside a node",
        "best HSDP (any shard group)",
        "best FSDP + TP/PP",
    ]
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6))
    base = {r["series"]: r for r in rows if r["gpus"] == gpus_list[0]}
    for s in series:
        pts = sorted((r for r in rows if r["series"] == s), key=lambda r: r["gpus"])
        ax1.plot([p["gpus"] for p in pts], [p["tokens_per_s_per_gpu"] for p in pts], "o-", label=s)
        if s in base:
            ax2.plot(
                [p["gpus"] for p in pts],
                [
                    100 * p["tokens_per_s_per_gpu"] / base["pure FSDP"]["tokens_per_s_per_gpu"]
                    for p in pts
                ],
                "o-",
                label=s,
            )
    for ax in (ax1, ax2):
        gpu_axis(ax, gpus_list)
    ax1.set_title("tokens/s per GPU")
    ax2.set_title(f"per-GPU throughput relative to pure FSDP at {gpus_list[0]} GPUs (%)")
    ax1.legend(fontsize=9)
    fig.suptitle(
        f"HSDP against FSDP and model parallelism ({a.model}, {a.cluster}) — not run by the study"
    )
    fig.tight_layout()
    figure = save_figure(fig, out / "hsdp.png")

    def retained(s: str) -> float:
        first = next(r for r in rows if r["series"] == s and r["gpus"] == gpus_list[0])
        last = next(r for r in rows if r["series"] == s and r["gpus"] == gpus_list[-1])
        return 100 * (last["tokens_per_s_per_gpu"] / first["tokens_per_s_per_gpu"] - 1)

    changes = {s: retained(s) for s in series if any(r["series"] == s for r in rows)}
    verdict = (
        f"From {gpus_list[0]} to {gpus_list[-1]} GPUs per-GPU throughput changes by "
        + ", ".join(f"{v:+.1f} % with {s}" for s, v in changes.items())
        + ". HSDP keeps the sharded collectives inside a node (NVLink, a few ranks) and sends only one "
        "gradient AllReduce per layer across nodes, where trees scale with log2 of the nodes, so it "
        f"flattens the diminishing-returns curve by {changes.get('HSDP, shard inside a node', 0) - changes['pure FSDP']:.1f} points."
    )
    md = ["## HSDP: the experiment the study did not run", f"![hsdp]({figure.name})", verdict]
    return StudyOutput("hsdp", "HSDP", [figure], [table], md, {"rows": rows, "change_pct": changes})
