"""The TP x PP grid at fixed scale and the hardware generations at equal scale."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.config.catalog import load_cluster
from scalelab.search import Constraints
from scalelab.studies.common import (
    DEFAULT,
    Assumptions,
    StudyOutput,
    best_layout,
    describe,
    fsdp_at,
    load,
    markdown_table,
    predict_fitting,
    pyplot,
    save_figure,
    write_csv,
)

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
                Constraints(precision=a.precision, tp=[tp], pp=[pp], cp=[1], sharding=["fsdp"]),
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
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 7))
    im = ax.imshow(grid, cmap="viridis", origin="lower")
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
                fontsize=8,
                color="white"
                if np.isnan(grid[i, j]) or grid[i, j] < np.nanmax(grid) * 0.6
                else "black",
            )
    fig.colorbar(im, ax=ax, label="tokens/s per GPU (best micro-batch, schedule, recompute)")
    ax.set_title(f"TP x PP with FSDP: {a.model}, {g} GPUs, global batch {batch}")
    figure = save_figure(fig, out / "mp_grid.png")
    best_cell = np.unravel_index(np.nanargmax(grid), grid.shape)
    md = [
        "## TP x PP grid",
        f"![mp grid]({figure.name})",
        f"Best: TP {DEGREES[best_cell[0]]} x PP {DEGREES[best_cell[1]]} at {np.nanmax(grid):,.0f} tokens/s per GPU. "
        "Infeasible cells break a layout rule (TP must divide the heads, the global batch must fill the pipeline) "
        "or do not fit in memory.",
    ]
    return StudyOutput("mp-grid", "TP x PP grid", [figure], [table], md, {"rows": rows})


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
            Constraints(precision=a.precision),
        )
        rows.append(
            {
                "gpu": label,
                "cluster": name,
                "layout": describe(r["layout"]),
                "mfu": r["mfu"],
                "tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"],
                "exposed_comm_fraction": r["exposed_comm_fraction"],
                "power_w_per_gpu": r["power_w_per_gpu"],
                "tokens_per_joule": r["tokens_per_joule"],
                "fits": r["fits"],
                "best_layout": describe(best["layout"]) if best else "-",
                "best_tokens_per_s_per_gpu": best["tokens_per_s_per_gpu"] if best else float("nan"),
            }
        )
    table = write_csv(out / "hardware.csv", rows)
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(17, 5))
    labels = [r["gpu"] for r in rows]
    for ax, (key, title, scale) in zip(
        axes,
        (
            ("mfu", "MFU (%)", 100),
            ("tokens_per_s_per_gpu", "tokens/s per GPU", 1),
            ("exposed_comm_fraction", "exposed communication (%)", 100),
            ("tokens_per_joule", "tokens per joule (GPU)", 1),
        ),
        strict=True,
    ):
        bars = ax.bar(labels, [r[key] * scale for r in rows], color="tab:blue")
        ax.bar_label(bars, fmt="%.1f" if scale == 100 else "%.0f", fontsize=8)
        ax.set_title(title)
    fig.suptitle(
        f"Hardware generations, pure FSDP, {a.model} on {g} GPUs each ({a.sequences_per_gpu} x {a.seq_len} tokens per GPU)"
    )
    fig.tight_layout()
    figure = save_figure(fig, out / "hardware.png")
    md = [
        "## Hardware generations",
        f"![hardware]({figure.name})",
        markdown_table(
            [
                (
                    r["gpu"],
                    r["layout"],
                    f"{r['mfu'] * 100:.1f}",
                    f"{r['tokens_per_s_per_gpu']:,.0f}",
                    f"{r['exposed_comm_fraction'] * 100:.0f}",
                    f"{r['tokens_per_joule']:.2f}",
                    r["best_layout"],
                )
                for r in rows
            ],
            [
                "GPU",
                "FSDP layout",
                "MFU %",
                "tokens/s/GPU",
                "exposed comm %",
                "tokens/J",
                "best searched layout",
            ],
        ),
        "Faster GPUs finish each layer's compute sooner while the network grew less, so more of the FSDP "
        "communication is exposed and MFU falls from one generation to the next.",
    ]
    return StudyOutput("hardware", "Hardware", [figure], [table], md, {"rows": rows})
