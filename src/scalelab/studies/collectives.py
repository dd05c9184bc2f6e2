"""Collective bus bandwidth against node count and message size, beside the study's Figure 2."""

from __future__ import annotations

import csv
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.perf import comm
from scalelab.studies.common import (
    DEFAULT,
    Assumptions,
    StudyOutput,
    load,
    markdown_table,
    pyplot,
    save_figure,
    write_csv,
)

NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SIZES_MIB = (8, 32, 128, 512, 2048)
KINDS = (
    (comm.ALL_REDUCE, "AllReduce", "-"),
    (comm.ALL_GATHER, "AllGather", "--"),
    (comm.REDUCE_SCATTER, "ReduceScatter", ":"),
)


def measured_fig2() -> list[dict[str, Any]]:
    text = resources.files("scalelab").joinpath("data/paper_fig2_allreduce_busbw.csv").read_text()
    return [
        {
            "message_bytes": float(r["message_bytes"]),
            "num_nodes": float(r["num_nodes"]),
            "busbw_GBps": float(r["busbw_GBps"]),
        }
        for r in csv.DictReader(text.splitlines())
    ]


def run(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    progress("collectives: bus bandwidth model")
    _, cluster = load(a)
    gpn = cluster.gpus_per_node
    rows: list[dict[str, Any]] = []
    for kind, label, _ in KINDS:
        for size in SIZES_MIB:
            nodes = np.array(NODES)
            g = comm.GroupShape(ranks=nodes * gpn, ranks_per_domain=np.full(len(nodes), gpn))
            bw = (
                comm.bus_bandwidth_achieved(kind, np.full(len(nodes), size * 2.0**20), g, cluster)
                / 1e9
            )
            rows += [
                {
                    "collective": label,
                    "message_mib": size,
                    "nodes": int(n),
                    "gpus": int(n) * gpn,
                    "busbw_GBps": round(float(b), 1),
                }
                for n, b in zip(nodes, bw, strict=True)
            ]
    table = write_csv(out / "collectives_busbw.csv", rows)

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6))
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(SIZES_MIB)))
    for _, label, style in KINDS:
        for size, color in zip(SIZES_MIB, colors, strict=True):
            pts = [r for r in rows if r["collective"] == label and r["message_mib"] == size]
            ax1.plot(
                [p["nodes"] for p in pts],
                [p["busbw_GBps"] for p in pts],
                style,
                color=color,
                label=f"{label} {size} MiB" if label == "AllReduce" else None,
            )
    fig2 = measured_fig2()
    for size, color in zip(SIZES_MIB, colors, strict=True):
        pts = [p for p in fig2 if p["message_bytes"] == size * 2**20]
        if pts:
            ax1.scatter(
                [p["num_nodes"] for p in pts],
                [p["busbw_GBps"] for p in pts],
                color=color,
                marker="o",
                edgecolor="black",
                zorder=5,
            )
    ax1.plot([], [], "k-", label="AllReduce (model)")
    ax1.plot([], [], "k--", label="AllGather (model)")
    ax1.plot([], [], "k:", label="ReduceScatter (model)")
    ax1.scatter(
        [], [], color="white", edgecolor="black", label="AllReduce measured (study, Fig. 2)"
    )
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(NODES)
    ax1.set_xticklabels([str(n) for n in NODES])
    ax1.set_xlabel(f"nodes ({gpn} GPUs each)")
    ax1.set_ylabel("bus bandwidth (GB/s, nccl-tests definition)")
    ax1.set_title(f"Bus bandwidth against scale ({cluster.name}); color = message size")
    ax1.legend(fontsize=8, ncol=2)

    sizes = np.logspace(np.log10(64 * 1024), np.log10(16 * 2**30), 40)
    for n, color in zip((1, 16, 256), ("tab:blue", "tab:orange", "tab:red"), strict=True):
        g = comm.GroupShape(
            ranks=np.full(len(sizes), n * gpn), ranks_per_domain=np.full(len(sizes), gpn)
        )
        for kind, label, style in KINDS[:2]:
            bw = comm.bus_bandwidth_achieved(kind, sizes, g, cluster) / 1e9
            ax2.plot(
                sizes / 2**20,
                bw,
                style,
                color=color,
                label=f"{label}, {n} node{'s' if n > 1 else ''}",
            )
    ax2.set_xscale("log")
    ax2.set_xlabel("message size (MiB)")
    ax2.set_ylabel("bus bandwidth (GB/s)")
    ax2.set_title("Bus bandwidth against message size")
    ax2.legend(fontsize=8)
    figure = save_figure(fig, out / "collectives_busbw.png")

    ar_512 = {
        r["message_mib"]: r["busbw_GBps"]
        for r in rows
        if r["collective"] == "AllReduce" and r["nodes"] == 512
    }
    ag_512 = {
        r["message_mib"]: r["busbw_GBps"]
        for r in rows
        if r["collective"] == "AllGather" and r["nodes"] == 512
    }
    md = [
        "## Collectives: bus bandwidth against scale",
        f"![collectives]({figure.name})",
        "Model lines use the cluster's fitted parameters; dots are the study's measured AllReduce bus bandwidths "
        "(Figure 2, read from the plot, ±10 GB/s). AllReduce runs as a tree across nodes (latency grows with "
        "log2 of the nodes); AllGather and ReduceScatter run as rings, whose latency grows with every rank.",
        markdown_table(
            [(s, ar_512[s], ag_512[s]) for s in SIZES_MIB],
            [
                "message (MiB)",
                "AllReduce busbw at 512 nodes (GB/s)",
                "AllGather busbw at 512 nodes (GB/s)",
            ],
        ),
    ]
    return StudyOutput("collectives", "Collectives", [figure], [table], md)
