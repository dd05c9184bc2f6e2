"""`scalelab models` and `scalelab hardware`: list the catalogs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from scalelab.cli.common import JsonOpt, console, print_json

if TYPE_CHECKING:
    from scalelab.config.hardware import ClusterSpec, GPUSpec

from scalelab.config.catalog import (
    cluster_names,
    gpu_names,
    load_cluster,
    load_gpu,
    load_model,
    model_names,
)


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("hardware")(hardware)
    app.command("stacks")(stacks)


def stacks(json_out: JsonOpt = False) -> None:
    """List the software stacks `--stack` selects: what each framework offers and overlaps."""
    from scalelab.config.catalog import load_stack, stack_names

    specs = [load_stack(name) for name in stack_names()]
    if json_out:
        print_json({"stacks": [s.model_dump(mode="json") for s in specs]})
        return
    table = Table(title="software stacks (--stack; any other: a YAML file)")
    for col in (
        "name",
        "schedules",
        "shardings",
        "grads reduced every micro-batch",
        "TP overlap",
        "PP p2p overlap",
        "max tp/pp/cp",
    ):
        table.add_column(col)
    for s in specs:
        limits = "/".join("any" if v >= 2**20 else str(v) for v in (s.max_tp, s.max_pp, s.max_cp))
        table.add_row(
            s.name,
            ", ".join(str(x) for x in s.schedules) or "none",
            ", ".join(str(x) for x in s.shardings),
            ", ".join(str(x) for x in s.microbatch_grad_sync) or "-",
            "yes" if s.tp_comm_overlap else "no",
            "yes" if s.pp_p2p_overlap else "no",
            limits,
        )
    console.print(table)


def models(json_out: JsonOpt = False) -> None:
    """List the model catalog: shapes, exact parameter counts (total and active) and sources.

    Mixture-of-experts models are listed with their active parameters; predict, search and bench
    take them with expert parallelism (`--ep`, `--expert-tp`)."""
    specs = [load_model(name) for name in model_names()]
    if json_out:
        print_json(
            [
                {**s.model_dump(), "n_params": s.n_params, "active_params": s.active_params}
                for s in specs
            ]
        )
        return
    table = Table(title="models (any other: a YAML file with the same fields)")
    for col in (
        "name",
        "params",
        "active",
        "experts",
        "layers",
        "d_model",
        "heads",
        "kv",
        "d_ff",
        "vocab",
        "ffn",
        "seq",
    ):
        table.add_column(col, justify="right" if col not in ("name", "ffn") else "left")
    for s in specs:
        table.add_row(
            s.name,
            f"{s.n_params:,}",
            f"{s.active_params:,}",
            f"{s.experts_per_token}/{s.n_experts}+{s.n_shared_experts}" if s.is_moe else "-",
            str(s.n_layers),
            str(s.d_model),
            str(s.n_heads),
            str(s.n_kv_heads),
            str(s.d_ff),
            str(s.vocab_size),
            s.ffn,
            str(s.seq_len),
        )
    console.print(table)
    console.print(
        "experts: top-k / routed + shared. MoE models take --ep and --expert-tp in predict, "
        "search and bench (bench refuses multi-head latent attention and QK norm)."
    )


SourcesOpt = Annotated[
    bool,
    typer.Option(
        "--sources",
        help="print where every number comes from (datasheets, fits, assumptions) instead of the "
        "tables; with --json the sources are always in the document",
    ),
]


def hardware(json_out: JsonOpt = False, sources: SourcesOpt = False) -> None:
    """List the GPU and cluster catalogs with their datasheet numbers.

    A peak is shown only for a precision the GPU has units for (no fp8 before Hopper and CDNA 3, no
    bf16 on V100); a job in such a precision is priced at the GPU's 16-bit rate."""
    gpus = [load_gpu(name) for name in gpu_names()]
    clusters = [load_cluster(name) for name in cluster_names()]
    if json_out:
        print_json(
            {
                "gpus": [g.model_dump() for g in gpus],
                "clusters": [
                    {**c.model_dump(exclude={"gpu"}), "gpu": c.gpu.name} for c in clusters
                ],
            }
        )
        return
    if sources:
        _print_sources(gpus, clusters)
        return
    gt = Table(title="GPUs (dense peaks; - where the GPU has no units for the precision)")
    for col in (
        "name",
        "fp16 TF/s",
        "bf16 TF/s",
        "fp8 TF/s",
        "block-scaled TF/s",
        "HBM GiB",
        "HBM GB/s",
        "NVLink GB/s/dir",
        "NVLS",
        "TDP W",
        "idle W",
        "CUDA device name",
    ):
        gt.add_column(col, justify="left" if col in ("name", "CUDA device name") else "right")
    for g in gpus:
        gt.add_row(
            g.name,
            *(
                f"{g.peak_tflops[p]:.0f}" if p in g.peak_tflops else "-"
                for p in ("fp16", "bf16", "fp8")
            ),
            ", ".join(
                f"{fmt} {g.peak_tflops[fmt]:.0f}"
                for fmt in ("mxfp8", "nvfp4", "mxfp4")
                if fmt in g.peak_tflops
            )
            or "-",
            f"{g.hbm_gib:g}",
            f"{g.hbm_gbs:g}",
            f"{g.nvlink_gbs:g}",
            "yes" if g.nvls else "no",
            f"{g.tdp_w:g}",
            f"{g.idle_w:g}",
            ", ".join(g.cuda_names) or "-",
        )
    ct = Table(title="clusters (any other: a YAML file, e.g. from `scalelab calibrate`)")
    for col in ("name", "gpu", "GPUs/node", "NVLink domain", "NICs", "network GB/s/GPU"):
        ct.add_column(col, justify="left" if col in ("name", "gpu", "NICs") else "right")
    for c in clusters:
        ct.add_row(
            c.name,
            c.gpu.name,
            str(c.gpus_per_node),
            str(c.nvlink_domain),
            f"{c.nics_per_node} x {c.nic_gbps:g} Gb/s",
            f"{c.nic_bytes_per_s_per_gpu / 1e9:g}",
        )
    console.print(gt)
    console.print(ct)


def _print_sources(gpus: list[GPUSpec], clusters: list[ClusterSpec]) -> None:
    """One row per catalog entry and what its numbers rest on, as the YAML files state it."""
    gt = Table(title="GPUs: where the numbers come from (config/catalog/gpus.yaml)")
    gt.add_column("name", no_wrap=True)
    gt.add_column("source")
    for g in gpus:
        gt.add_row(g.name, g.source or "-")
    ct = Table(title="clusters: where the numbers come from (config/catalog/clusters.yaml)")
    ct.add_column("name", no_wrap=True)
    ct.add_column("what")
    ct.add_column("source")
    for c in clusters:
        ct.add_row(c.name, "wiring and NICs", c.source or "-")
        if c.host_source:
            ct.add_row("", "host CPU", c.host_source)
        if c.params.source:
            ct.add_row("", "predictor parameters", c.params.source)
    console.print(gt)
    console.print(ct)
