"""The TP x PP grid at fixed scale and the hardware generations at equal scale."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.config.catalog import load_cluster
from scalelab.plotting import STUDY_MARKER, markdown_table, pyplot, save_figure, write_csv
from scalelab.search import Constraints
from scalelab.studies.common import (
    DEFAULT,
    STUDY_SCHEDULES,
    STUDY_SCHEDULES_NOTE,
    TOKENS_PER_J,
    Assumptions,
    StudyOutput,
    best_layout,
    describe,
    fsdp_at,
    is_assumed,
    load,
    predict_fitting,
)
from scalelab.studies.findings import paper_range, paper_values

DEGREES = (1, 2, 4, 8, 16)
HARDWARE = (
    ("v100-ib", "V100"),
    ("a100-ib", "A100"),
    ("h100-ib", "H100"),
    ("h200-ib", "H200"),
    ("b200-ib", "B200"),
)


def run_mp_grid(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    model, cluster = load(a)
    g, batch = a.mp_grid_gpus, a.mp_grid_global_batch
    grid = np.full((len(DEGREES), len(DEGREES)), np.nan)
    rows: list[dict[str, Any]] = []
    for i, tp in enumerate(DEGREES):
        for j, pp in enumerate(DEGREES):
            progress(f"mp-grid: tp {tp} x pp {pp}")
            best = best_layout(
                model,
                cluster,
                g,
                batch,
                a.seq_len,
                Constraints(
                    precision=a.precision,
                    tp=[tp],
                    pp=[pp],
                    cp=[1],
                    sharding=["fsdp"],
                    pp_schedule=STUDY_SCHEDULES,
                ),
            )
            if best is None:
                rows.append({"tp": tp, "pp": pp, "feasible": False})
                continue
            grid[i, j] = best["tokens_per_s_per_gpu"]
            rows.append(
                {
                    "tp": tp,
                    "pp": pp,
                    "feasible": True,
                    "layout": describe(best["layout"]),
                    "tokens_per_s_per_gpu": best["tokens_per_s_per_gpu"],
                    "mfu": best["mfu"],
                    "exposed_comm_fraction": best["exposed_comm_fraction"],
                    "pp_bubble_s": best["pp_bubble_s"],
                }
            )
    table = write_csv(out / "mp_grid.csv", rows)
    f7_lo, f7_hi = paper_range(paper_values()["F7"]["value"])
    preferred = [
        (i, j)
        for i, tp in enumerate(DEGREES)
        for j, pp in enumerate(DEGREES)
        if (tp == 1) != (pp == 1) and f7_lo <= max(tp, pp) <= f7_hi
    ]
    figure = _plot_grid(grid, preferred, a, out / "mp_grid.png", (f7_lo, f7_hi))
    best_cell = np.unravel_index(np.nanargmax(grid), grid.shape)
    md = [
        "## TP x PP grid",
        f"![mp grid]({figure.name})",
        f"{a.model}, {g} GPUs, global batch {batch} sequences of {a.seq_len} tokens "
        f"({batch * a.seq_len / 1e6:.1f} M tokens per step), FSDP over the rest, pipeline schedules "
        f"{STUDY_SCHEDULES_NOTE}. Best: TP {DEGREES[best_cell[0]]} x PP {DEGREES[best_cell[1]]} at "
        f"{np.nanmax(grid):,.0f} tokens/s per GPU. The cells outlined in black are the study's "
        f"preferred model-parallel degree (F7: TP or PP of {f7_lo:g}-{f7_hi:g} with FSDP). Infeasible "
        "cells break a layout rule (TP must divide the heads, the global batch must fill the pipeline) "
        "or do not fit in memory.",
    ]
    return StudyOutput("mp-grid", "TP x PP grid", [figure], [table], md, {"rows": rows})


def _plot_grid(
    grid: np.ndarray,
    preferred: list[tuple[int, int]],
    a: Assumptions,
    path: Path,
    f7: tuple[float, float],
) -> Path:
    from matplotlib.patches import Rectangle

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 8))
    im = ax.imshow(grid, cmap="viridis", origin="lower", vmin=0, vmax=float(np.nanmax(grid)))
    ax.set_xticks(range(len(DEGREES)), [str(d) for d in DEGREES])
    ax.set_yticks(range(len(DEGREES)), [str(d) for d in DEGREES])
    ax.set_xlabel("pipeline-parallel degree (PP)")
    ax.set_ylabel("tensor-parallel degree (TP)")
    ax.grid(False)
    for i in range(len(DEGREES)):
        for j in range(len(DEGREES)):
            text = "infeasible" if np.isnan(grid[i, j]) else f"{grid[i, j]:,.0f}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=9,
                color="white"
                if np.isnan(grid[i, j]) or grid[i, j] < np.nanmax(grid) * 0.6
                else "black",
            )
    for n, (i, j) in enumerate(preferred):
        ax.add_patch(
            Rectangle(
                (j - 0.47, i - 0.47),
                0.94,
                0.94,
                fill=False,
                edgecolor="black",
                linewidth=2.5,
                label=f"study's preferred degree (F7): TP or PP {f7[0]:g}-{f7[1]:g} with FSDP"
                if n == 0
                else None,
            )
        )
    bi, bj = np.unravel_index(np.nanargmax(grid), grid.shape)
    ax.scatter(
        [bj], [bi - 0.3], marker="^", s=80, color="red", zorder=5, label="scalelab's best cell"
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=9, frameon=False)
    fig.colorbar(
        im, ax=ax, label="tokens/s per GPU (best micro-batch, schedule, recompute; from 0)"
    )
    ax.set_title(
        f"TP x PP with FSDP: {a.model}, {a.mp_grid_gpus} GPUs, global batch {a.mp_grid_global_batch} "
        f"x {a.seq_len} tokens\n(PP schedules: GPipe, 1F1B, interleaved, as PyTorch 2.3.1's stack had)",
        fontsize=11,
    )
    fig.tight_layout()
    return save_figure(fig, path, data=True)


# A GEMM efficiency fitted at this value sits on the V100 fit's upper bound (docs/calibration.md:
# "gemm_efficiency 0.90 (bound)"), so the data did not determine it and MFU built on it is suspect.
GEMM_EFFICIENCY_FIT_BOUND = 0.90


def published_best_hfu(gpu_prefix: str) -> tuple[float, str] | None:
    """The highest recompute-inclusive utilisation (HFU %) published for a GPU, and its source."""
    import csv
    from importlib import resources

    text = resources.files("scalelab").joinpath("data/published_runs.csv").read_text()
    rows = [
        (float(r["hfu_pct"]), r["source"])
        for r in csv.DictReader(text.splitlines())
        if r["gpu_type"].startswith(gpu_prefix) and r["hfu_pct"]
    ]
    return max(rows) if rows else None


def run_hardware(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    model, _ = load(a)
    g = a.hardware_scale_gpus
    rows = []
    for name, label in HARDWARE:
        progress(f"hardware: {label}")
        cluster = load_cluster(name)
        r = predict_fitting(model, cluster, fsdp_at(g, a))
        best = best_layout(
            model,
            cluster,
            g,
            a.sequences_per_gpu * g,
            a.seq_len,
            Constraints(precision=a.precision, pp_schedule=STUDY_SCHEDULES),
        )
        at_bound = cluster.params.gemm_efficiency >= GEMM_EFFICIENCY_FIT_BOUND
        assumed = is_assumed(cluster.source) or is_assumed(cluster.params.source)
        rows.append(
            {
                "gpu": label,
                "cluster": name,
                "layout": describe(r["layout"]),
                "mfu": r["mfu"],
                "tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"],
                "exposed_comm_fraction": r["exposed_comm_fraction"],
                "power_w_per_gpu": r["power_w_per_gpu"],
                TOKENS_PER_J: r[TOKENS_PER_J],
                "fits": r["fits"],
                "gemm_efficiency": cluster.params.gemm_efficiency,
                "flag": "GEMM efficiency on its fit bound"
                if at_bound
                else ("assumed compute efficiencies" if assumed else ""),
                "best_layout": describe(best["layout"]) if best else "-",
                "best_tokens_per_s_per_gpu": best["tokens_per_s_per_gpu"] if best else float("nan"),
            }
        )
    table = write_csv(out / "hardware.csv", rows)
    paper = paper_values()
    study_mfu = {
        label: float(paper[fid]["value"])
        for fid, label in (("F4", "A100"), ("F5", "H100"))
        if fid in paper
    }
    # Published utilisation beside every GPU whose MFU is flagged as suspect.
    published = {
        r["gpu"]: hit
        for r in rows
        if r["flag"].startswith("GEMM") and (hit := published_best_hfu(r["gpu"])) is not None
    }
    figure = _plot_hardware(rows, study_mfu, published, a, out / "hardware.png")
    flagged = [r for r in rows if r["flag"]]
    md = [
        "## Hardware generations",
        f"![hardware]({figure.name})",
        markdown_table(
            [
                (
                    r["gpu"] + (f" ({r['flag']})" if r["flag"] else ""),
                    r["layout"],
                    f"{r['mfu'] * 100:.1f}",
                    f"{study_mfu[r['gpu']]:.2f}" if r["gpu"] in study_mfu else "-",
                    f"{r['tokens_per_s_per_gpu']:,.0f}",
                    f"{r['exposed_comm_fraction'] * 100:.1f}",
                    f"{r[TOKENS_PER_J]:.2f}",
                    r["best_layout"],
                )
                for r in rows
            ],
            [
                "GPU",
                "FSDP layout",
                "MFU %",
                "study MFU %",
                "tokens/s/GPU",
                "exposed comm %",
                "tokens/J",
                "best searched layout",
            ],
        ),
        "Faster GPUs finish each layer's compute sooner while the network grew less, so more of the FSDP "
        "communication is exposed and MFU falls from one generation to the next.",
    ]
    for r in flagged:
        if r["flag"].startswith("GEMM"):
            md.append(
                f"**{r['gpu']}: {r['mfu'] * 100:.0f} % MFU is not credible.** Its GEMM efficiency "
                f"({r['gemm_efficiency']:.2f}) sits on the fit's upper bound: the {r['gpu']} rows it was "
                "fitted to did not determine it. "
                + (
                    f"The best published {r['gpu']} run in published_runs.csv reaches "
                    f"{published[r['gpu']][0]:.0f} % HFU (recomputation counted; "
                    f"{published[r['gpu']][1][:60]}), i.e. about {published[r['gpu']][0] * 3 / 4:.0f} % MFU "
                    "with full recomputation: about half of this bar."
                    if r["gpu"] in published
                    else ""
                )
            )
        else:
            md.append(
                f"**{r['gpu']}** uses assumed compute efficiencies (no public training runs in this "
                "package): drawn hatched and lighter."
            )
    return StudyOutput("hardware", "Hardware", [figure], [table], md, {"rows": rows})


def _plot_hardware(
    rows: list[dict[str, Any]],
    study_mfu: dict[str, float],
    published: dict[str, tuple[float, str]],
    a: Assumptions,
    path: Path,
) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(19, 6.5))
    labels = [r["gpu"] for r in rows]
    x = list(range(len(rows)))
    for ax, (key, ylabel, scale) in zip(
        axes,
        (
            ("mfu", "MFU (%)", 100),
            ("tokens_per_s_per_gpu", "tokens/s per GPU", 1),
            ("exposed_comm_fraction", "exposed communication (% of step time)", 100),
            (TOKENS_PER_J, "tokens per joule (GPU board energy)", 1),
        ),
        strict=True,
    ):
        bars = ax.bar(
            x, [r[key] * scale for r in rows], color="tab:blue", label="scalelab, pure FSDP"
        )
        for bar, r in zip(bars, rows, strict=True):
            if r["flag"]:
                bar.set_hatch("//")
                bar.set_alpha(0.45)
        ax.bar_label(bars, fmt="%.1f" if scale == 100 else "%.0f", fontsize=8)
        if key == "mfu":
            for i, r in enumerate(rows):
                if r["flag"]:
                    ax.text(
                        i,
                        r[key] * scale * 0.27,
                        r["flag"]
                        .replace(
                            "GEMM efficiency on its fit bound",
                            "GEMM efficiency on\nits fit bound:\noverstated",
                        )
                        .replace("assumed compute efficiencies", "assumed compute\nefficiencies"),
                        ha="center",
                        va="center",
                        rotation=90,
                        fontsize=8.5,
                        color="black",
                        bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
                    )
        ax.set_xticks(
            x, [lab + ("*" if r["flag"] else "") for lab, r in zip(labels, rows, strict=True)]
        )
        ax.set_ylabel(ylabel)
        ax.set_xlabel(f"GPU ({a.hardware_scale_gpus} GPUs each)")
        ax.set_title(ylabel.split(" (")[0])
        if key == "mfu":
            pts = [(labels.index(k), v) for k, v in study_mfu.items() if k in labels]
            ax.scatter(
                [p[0] for p in pts],
                [p[1] for p in pts],
                label="study's measured MFU (F4 A100, F5 H100)",
                **STUDY_MARKER,
            )
            for gpu, (hfu, _source) in published.items():
                ax.scatter(
                    [labels.index(gpu)],
                    [hfu],
                    marker="D",
                    s=70,
                    facecolor="none",
                    edgecolor="black",
                    zorder=8,
                    label=f"best published {gpu} run: {hfu:.0f} % HFU (recompute counted; "
                    "published_runs.csv)",
                )
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    flags = [f"{r['gpu']}*: {r['flag']}" for r in rows if r["flag"]]
    from matplotlib.patches import Patch

    handles, names = axes[0].get_legend_handles_labels()
    # the bars' own handle takes the first bar's style, which may be a flagged (hatched) one
    handles = [
        Patch(facecolor="tab:blue") if n == "scalelab, pure FSDP" else h
        for h, n in zip(handles, names, strict=True)
    ]
    handles.append(Patch(facecolor="tab:blue", alpha=0.45, hatch="//", label="flagged (see note)"))
    names.append("hatched, light = flagged: " + "; ".join(flags))
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=9, frameon=False)
    fig.suptitle(
        f"Hardware generations, pure FSDP, {a.model} on {a.hardware_scale_gpus} GPUs each "
        f"({a.sequences_per_gpu} x {a.seq_len} tokens per GPU)",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0.1, 1, 0.96))
    return save_figure(fig, path, data=True)
