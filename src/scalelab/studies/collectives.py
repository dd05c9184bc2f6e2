"""Collective bus bandwidth against node count and message size, beside the study's Figure 2."""

from __future__ import annotations

import csv
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.perf import comm
from scalelab.plotting import (
    WEAK_LINE,
    markdown_table,
    pyplot,
    save_figure,
    write_csv,
)
from scalelab.studies.common import DEFAULT, Assumptions, StudyOutput, load

# The study's Figure 2 spans 4-512 nodes and 11 message sizes (8 MiB-16 GiB); the model is drawn on
# the same grid, so every measured point has a model value beside it.
NODES = (4, 8, 16, 32, 64, 128, 256, 512)
SIZES_MIB = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384)
KINDS = (
    (comm.ALL_REDUCE, "AllReduce"),
    (comm.ALL_GATHER, "AllGather"),
    (comm.REDUCE_SCATTER, "ReduceScatter"),
)
SIZE_PANEL_NODES = (1, 4, 64, 512)
AG_SIZES_MIB = (8, 64, 512, 4096)


def size_label(mib: float) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


def measured_fig2() -> list[dict[str, Any]]:
    """The study's Figure 2 AllReduce bus bandwidths (read from the plot, ±10 GB/s)."""
    text = resources.files("scalelab").joinpath("data/paper_fig2_allreduce_busbw.csv").read_text()
    return [
        {
            "message_bytes": float(r["message_bytes"]),
            "num_nodes": float(r["num_nodes"]),
            "busbw_GBps": float(r["busbw_GBps"]),
        }
        for r in csv.DictReader(text.splitlines())
    ]


def measured_single_node(gpu_prefix: str) -> list[dict[str, Any]]:
    """One-node nccl-tests sweeps (collectives_busbw.csv) of a GPU whose NVLink the cluster shares."""
    text = resources.files("scalelab").joinpath("data/collectives_busbw.csv").read_text()
    out = []
    for r in csv.DictReader(text.splitlines()):
        if (
            r["gpu_type"].startswith(gpu_prefix)
            and r["num_nodes"] == "1"
            and r["message_bytes"]
            and r["busbw_GBps"]
        ):
            out.append(
                {
                    "collective": r["collective"],
                    "message_bytes": float(r["message_bytes"]),
                    "busbw_GBps": float(r["busbw_GBps"]),
                    "algo": r["algo"],
                }
            )
    return out


def _busbw(kind: str, nodes: np.ndarray, sizes_bytes: np.ndarray, cluster: Any) -> np.ndarray:
    gpn = cluster.gpus_per_node
    g = comm.GroupShape(ranks=nodes * gpn, ranks_per_domain=np.full(len(nodes), gpn))
    return np.asarray(comm.bus_bandwidth_achieved(kind, sizes_bytes, g, cluster)) / 1e9


def run(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    progress("collectives: bus bandwidth model")
    _, cluster = load(a)
    gpn = cluster.gpus_per_node
    nodes = np.array(NODES)
    rows: list[dict[str, Any]] = []
    for kind, label in KINDS:
        for size in SIZES_MIB:
            bw = _busbw(kind, nodes, np.full(len(nodes), size * 2.0**20), cluster)
            rows += [
                {
                    "collective": label,
                    "message_mib": size,
                    "nodes": int(n),
                    "gpus": int(n) * gpn,
                    "busbw_GBps": round(float(b), 1),
                    "basis": "fitted to the study's Figure 2"
                    if label == "AllReduce"
                    else "extrapolated (no measurement across nodes)",
                }
                for n, b in zip(nodes, bw, strict=True)
            ]
    table = write_csv(out / "collectives_busbw.csv", rows)
    ag_equals_rs = all(
        r1["busbw_GBps"] == r2["busbw_GBps"]
        for r1 in rows
        if r1["collective"] == "AllGather"
        for r2 in rows
        if r2["collective"] == "ReduceScatter"
        and (r2["message_mib"], r2["nodes"]) == (r1["message_mib"], r1["nodes"])
    )
    figure = _figure(rows, cluster, out, ag_equals_rs)
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
    fig2 = {
        (p["message_bytes"], p["num_nodes"]): p["busbw_GBps"] for p in measured_fig2()
    }  # fmt: skip
    md = [
        "## Collectives: bus bandwidth against scale",
        f"![collectives]({figure.name})",
        "Lines are the model with the cluster's parameters; black-edged dots are the study's measured "
        "AllReduce bus bandwidths (Figure 2, all 11 message sizes at 4-512 nodes, read from the plot, "
        "±10 GB/s). Across nodes the model runs AllReduce as NCCL's tree, whose latency grows with "
        "log2 of the nodes, fitted to Figure 2. On H100 nodes with NVSwitch, NCCL 2.20 (PyTorch 2.3.1) "
        "can also choose NVLSTree for a multi-node AllReduce (NVLink SHARP inside the node, a tree "
        "across nodes); its latency grows with log2 of the nodes as well, so Figure 2 cannot tell the "
        "two apart and the model does not distinguish them: 'tree' here means either. AllGather and "
        "ReduceScatter have no tree in NCCL 2.20 (PAT arrived in 2.23, for one rank per node): they run "
        "as rings, whose latency grows with every rank. No measurement of them across nodes is in this "
        "package (the study's AllGather panel was not read), so their curves are extrapolations, drawn "
        "dashed and lighter."
        + (
            " The model gives AllGather and ReduceScatter the same bus bandwidth (same ring, same "
            "steps), so they are one line."
            if ag_equals_rs
            else ""
        ),
        markdown_table(
            [
                (
                    size_label(s),
                    ar_512[s],
                    fig2.get((s * 2.0**20, 512.0), "-"),
                    ag_512[s],
                )
                for s in SIZES_MIB
            ],
            [
                "message",
                "AllReduce busbw at 512 nodes, model (GB/s)",
                "AllReduce at 512 nodes, study Fig. 2 (GB/s)",
                "AllGather busbw at 512 nodes, model, extrapolated (GB/s)",
            ],
        ),
    ]
    return StudyOutput(
        "collectives", "Collectives", [figure], [table], md, {"ag_equals_rs": ag_equals_rs}
    )


def _figure(rows: list[dict[str, Any]], cluster: Any, out: Path, ag_equals_rs: bool) -> Path:
    plt = pyplot()
    gpn = cluster.gpus_per_node
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(20, 9.5))
    colors = dict(zip(SIZES_MIB, plt.cm.viridis(np.linspace(0, 0.92, len(SIZES_MIB))), strict=True))
    fig2 = measured_fig2()
    for size in SIZES_MIB:
        pts = [r for r in rows if r["collective"] == "AllReduce" and r["message_mib"] == size]
        ax1.plot(
            [p["nodes"] for p in pts],
            [p["busbw_GBps"] for p in pts],
            "-",
            color=colors[size],
            label=f"{size_label(size)}",
        )
        meas = [p for p in fig2 if p["message_bytes"] == size * 2.0**20]
        ax1.scatter(
            [p["num_nodes"] for p in meas],
            [p["busbw_GBps"] for p in meas],
            color=colors[size],
            edgecolor="black",
            s=36,
            zorder=5,
            label=f"_study {size_label(size)}",
        )
    ax1.scatter(
        [], [], color="white", edgecolor="black", s=36, label="study, Figure 2 (measured, ±10 GB/s)"
    )
    ax1.set_title("AllReduce: model (lines, fitted) vs the study's Figure 2 (dots)")
    ag_label = "AllGather = ReduceScatter" if ag_equals_rs else "AllGather"
    for size in SIZES_MIB:
        pts = [r for r in rows if r["collective"] == "AllGather" and r["message_mib"] == size]
        ax2.plot(
            [p["nodes"] for p in pts],
            [p["busbw_GBps"] for p in pts],
            color=colors[size],
            label=size_label(size),
            **WEAK_LINE,
        )
        if not ag_equals_rs:
            rs = [
                r for r in rows if r["collective"] == "ReduceScatter" and r["message_mib"] == size
            ]
            ax2.plot(
                [p["nodes"] for p in rs],
                [p["busbw_GBps"] for p in rs],
                ":",
                color=colors[size],
                alpha=0.45,
                label=f"ReduceScatter {size_label(size)}",
            )
    ax2.set_title(
        f"{ag_label} (FSDP's collectives): model only, extrapolated\n"
        "(no measurement across nodes in this package)"
    )
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(NODES)
        ax.set_xticklabels([str(n) for n in NODES])
        ax.minorticks_off()
        ax.set_xlim(NODES[0] / 1.25, NODES[-1] * 1.25)
        ax.set_xlabel(f"nodes ({gpn} GPUs each; log scale; the study measured 4-512)")
        ax.set_ylabel("bus bandwidth (GB/s, nccl-tests definition)")
        ax.set_ylim(0, 500)

    sizes = np.logspace(np.log10(1 * 2**20), np.log10(16 * 2**30), 48)
    node_colors = dict(
        zip(SIZE_PANEL_NODES, ("tab:blue", "tab:green", "tab:orange", "tab:red"), strict=True)
    )
    for n, color in node_colors.items():
        arr = np.full(len(sizes), n)
        ar = _busbw(comm.ALL_REDUCE, arr, sizes, cluster)
        ag = _busbw(comm.ALL_GATHER, arr, sizes, cluster)
        where = "1 node" if n == 1 else f"{n} nodes"
        ax3.plot(sizes / 2**20, ar, "-", color=color, label=f"AllReduce, {where} (model)")
        ax3.plot(
            sizes / 2**20,
            ag,
            color=color,
            label=f"{ag_label}, {where} (model" + (")" if n == 1 else ", extrapolated)"),
            **WEAK_LINE,
        )
        meas = [p for p in fig2 if p["num_nodes"] == n]
        if meas:
            ax3.scatter(
                [p["message_bytes"] / 2**20 for p in meas],
                [p["busbw_GBps"] for p in meas],
                color=color,
                edgecolor="black",
                s=36,
                zorder=5,
                label=f"AllReduce, {where}: study, Figure 2 (measured)",
            )
    single = measured_single_node("H200 (8x")
    sweep = [p for p in single if p["collective"] == "all_reduce" and p["message_bytes"] >= 2**20]
    ax3.scatter(
        [p["message_bytes"] / 2**20 for p in sweep],
        [p["busbw_GBps"] for p in sweep],
        marker="s",
        facecolor="none",
        edgecolor="tab:blue",
        s=30,
        zorder=5,
        label="AllReduce, 1 node: H200 nccl-tests (NVLink 4 as H100; stas00/ml-engineering)",
    )
    gathers = [p for p in single if p["collective"] == "all_gather"]
    ax3.scatter(
        [p["message_bytes"] / 2**20 for p in gathers],
        [p["busbw_GBps"] for p in gathers],
        marker="D",
        facecolor="none",
        edgecolor="tab:blue",
        s=40,
        zorder=5,
        label="AllGather, 1 node: H200 nccl-tests (ring)",
    )
    ax3.set_xscale("log")
    ax3.set_xlabel("message size (MiB, log scale)")
    ax3.set_ylabel("bus bandwidth (GB/s, nccl-tests definition)")
    ax3.set_ylim(0, 500)
    ax3.set_title("Bus bandwidth against message size")
    below = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.13), "frameon": False}
    ax1.legend(fontsize=8, ncol=4, title="message size (lines: model)", title_fontsize=8, **below)
    ax2.legend(
        fontsize=8, ncol=4, title=f"{ag_label}, model, extrapolated", title_fontsize=8, **below
    )
    ax3.legend(fontsize=7.5, ncol=1, **below)
    fig.suptitle(
        f"NCCL bus bandwidth on {cluster.name} ({gpn} GPUs per node): solid = fitted model, "
        "dashed and light = extrapolated model, black-edged dots and open marks = measurements",
        fontsize=11,
    )
    fig.tight_layout()
    return save_figure(fig, out / "collectives_busbw.png", data=True)
