"""`scalelab predict`: one layout's step time, throughput, MFU, breakdown, memory and power."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from scalelab.cli.common import (
    ClusterOpt,
    EmitOpt,
    FromOpt,
    JsonOpt,
    OptionalModelArg,
    StackOpt,
    build_layout,
    console,
    err_console,
    layout_options,
    print_json,
    read_from,
)
from scalelab.config.catalog import load_cluster, load_model, load_stack
from scalelab.config.stack import DEFAULT_STACK
from scalelab.errors import InputError
from scalelab.perf.predict import predict_layout

GpusOpt = Annotated[
    int | None, typer.Option("--gpus", "-g", help="number of GPUs (default 8, or --from's)")
]


def register(app: typer.Typer) -> None:
    app.command("predict")(predict)


@layout_options()
def predict(
    model: OptionalModelArg = None,
    cluster: ClusterOpt = "h100-ib",
    stack: StackOpt = DEFAULT_STACK,
    gpus: GpusOpt = None,
    from_file: FromOpt = None,
    emit: EmitOpt = None,
    json_out: JsonOpt = False,
    **layout: Any,
) -> None:
    """Predict one training step of MODEL on GPUS GPUs of CLUSTER with the given layout.

    The layout flags are generated from `scalelab.config.Layout`'s fields. With --from FILE the
    layout, model and batch come from a torchtitan argument list or TOML job file, a Megatron-LM
    argument list or a `scalelab bench` line (the layout flags are then not read). A layout that
    does not fit in the GPU's memory is still predicted (for what-if use), and says so first.
    """
    cluster_spec = load_cluster(cluster)
    source: dict[str, Any] | None = None
    if from_file is not None:
        ingested = read_from(from_file, gpus=gpus, model=model)
        spec, built = ingested.model, ingested.layout
        source = {
            "file": str(from_file),
            "framework": ingested.framework,
            "defaults": ingested.defaults,
        }
    else:
        if model is None:
            raise InputError("model", "name a model (see `scalelab models`) or give --from FILE")
        spec = load_model(model)
        seq_len = layout.pop("seq_len", None)
        seq_len = spec.seq_len if seq_len is None else seq_len
        built = build_layout(gpus=8 if gpus is None else gpus, seq_len=seq_len, **layout)
    result = predict_layout(spec, cluster_spec, built, load_stack(stack))
    result |= fit_summary(result)
    if source is not None:
        result["from"] = source
    emitted = None
    if emit is not None:
        from scalelab.config.frameworks import emit as emit_config

        emitted = emit_config(emit, built, spec, cluster_spec.gpus_per_node)
        result["emitted"] = {"target": emit, "text": emitted}
    if not result["fits"]:
        err_console.print(f"scalelab predict: {fit_line(result)}", highlight=False, soft_wrap=True)
    if json_out:
        print_json(result)
        return
    if emitted is not None:
        err_console.print(headline(result), highlight=False, soft_wrap=True)
        print(emitted, end="")
        return
    render_prediction(result)


def fit_summary(r: dict[str, Any]) -> dict[str, Any]:
    """The top-level memory verdict: needed, available and headroom in GiB beside `fits`."""
    needed, available = r["memory_total_bytes"] / 2**30, r["memory_capacity_bytes"] / 2**30
    return {
        "fits": bool(r["fits"]),
        "memory_needed_gib": needed,
        "memory_available_gib": available,
        "memory_headroom_gib": available - needed,
    }


def fit_line(r: dict[str, Any]) -> str:
    """One line saying that a layout does not fit, with the numbers."""
    return (
        f"DOES NOT FIT: the layout needs {r['memory_needed_gib']:,.1f} GiB per GPU, the "
        f"{r['gpu']} has {r['memory_available_gib']:,.1f} GiB; the throughput below is what-if only"
    )


def headline(r: dict[str, Any]) -> str:
    """The prediction in one line: tokens/s, MFU and model TFLOP/s per GPU, memory."""
    return (
        f"{r['tokens_per_s']:,.0f} tokens/s, MFU {r['mfu'] * 100:.1f} %, "
        f"{r['model_tflops_per_gpu']:,.1f} model TFLOP/s per GPU, "
        f"{r['memory_needed_gib']:,.1f} of {r['memory_available_gib']:,.1f} GiB"
        + ("" if r["fits"] else " (DOES NOT FIT)")
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"


def render_prediction(r: dict[str, Any]) -> None:
    """Rich tables for one prediction."""
    lay = r["layout"]
    if not r["fits"]:
        console.print(f"[bold red]{escape(fit_line(r))}[/]")
    source = r.get("from")
    if source:
        console.print(f"from {escape(source['file'])} ({escape(source['framework'])})")
        for key, text in source["defaults"].items():
            console.print(
                f"  [dim]unstated, the framework's default: {escape(key)} = {escape(text)}[/]"
            )
    console.print(
        f"[bold]{escape(str(r['model']))}[/] on {lay['gpus']} x {escape(str(r['gpu']))} "
        f"({escape(str(r['cluster']))}, stack {escape(str(r.get('stack', '')))}): "
        f"sharding {lay['sharding']}, tp {lay['tp']}, pp {lay['pp']} ({lay['pp_schedule']}), cp {lay['cp']}, "
        f"dp {int(r['data_parallel'])}, micro-batch {lay['micro_batch']} x {int(r['n_microbatches'])}, "
        f"global batch {lay['global_batch']} x {lay['seq_len']} tokens, recompute {lay['recompute']}, {lay['precision']}"
        + (f", ep {lay['ep']}, expert tp {lay['expert_tp']}" if lay.get("ep", 1) > 1 else "")
    )
    head = Table(title="throughput")
    for col in (
        "step time",
        "tokens/s",
        "tokens/s/GPU",
        "MFU",
        "model TFLOP/s/GPU",
        "HFU",
        "exposed comm",
        "power/GPU",
        "tokens/J",
    ):
        head.add_column(col, justify="right")
    head.add_row(
        _ms(r["step_time_s"]),
        f"{r['tokens_per_s']:,.0f}",
        f"{r['tokens_per_s_per_gpu']:,.0f}",
        f"{r['mfu'] * 100:.1f} %",
        f"{r['model_tflops_per_gpu']:,.1f}",
        f"{r['hfu'] * 100:.1f} %",
        f"{r['exposed_comm_s'] * 1e3:,.1f} ms ({r['exposed_comm_fraction'] * 100:.0f} %)",
        f"{r['power_w_per_gpu']:.0f} W",
        f"{r['tokens_per_j']:.2f}",
    )
    console.print(head)
    bd = Table(title="where the step goes (per GPU)")
    bd.add_column("part")
    bd.add_column("total", justify="right")
    bd.add_column("exposed (on the critical path)", justify="right")
    rows = [
        ("compute (incl. recompute)", r["compute_s"], r["compute_s"]),
        ("  of which recompute", r["recompute_s"], r["recompute_s"]),
        ("FSDP/ZeRO AllGather", r["dp_all_gather_s"], r["dp_all_gather_exposed_s"]),
        ("gradient ReduceScatter/AllReduce", r["dp_grad_reduce_s"], r["dp_grad_reduce_exposed_s"]),
        ("ZeRO parameter AllGather", r["zero_param_all_gather_s"], r["zero_param_all_gather_s"]),
        ("tensor-parallel collectives", r["tp_comm_s"], r["tp_comm_s"]),
        (
            "context-parallel K/V ring (exposed part)",
            r["cp_comm_exposed_s"],
            r["cp_comm_exposed_s"],
        ),
        ("pipeline send/recv", r["pp_p2p_s"], r["pp_p2p_s"]),
        ("pipeline bubble", r["pp_bubble_s"], r["pp_bubble_s"]),
        *(
            [("MoE dispatch/combine AllToAll", r["moe_all_to_all_s"], r["moe_all_to_all_s"])]
            if r.get("moe_all_to_all_s")
            else []
        ),
        ("optimizer step", r["optimizer_s"], r["optimizer_s"]),
        ("fixed per-step overhead", r["overhead_s"], r["overhead_s"]),
    ]
    for name, total, exposed in rows:
        bd.add_row(name, _ms(total), _ms(exposed))
    console.print(bd)
    mem = Table(title="memory per GPU")
    for col in (
        "parameters",
        "gradients",
        "optimizer",
        "activations",
        "FSDP/bf16 buffers",
        "reserve",
        "total",
        "HBM",
        "fits",
    ):
        mem.add_column(col, justify="right")
    mem.add_row(
        _gib(r["memory_parameters_bytes"]),
        _gib(r["memory_gradients_bytes"]),
        _gib(r["memory_optimizer_bytes"]),
        _gib(r["memory_activations_bytes"]),
        _gib(r["memory_fsdp_buffers_bytes"]),
        _gib(r["memory_reserve_bytes"]),
        _gib(r["memory_total_bytes"]),
        _gib(r["memory_capacity_bytes"]),
        "[green]yes[/]" if r["fits"] else "[red]NO[/]",
    )
    console.print(mem)
    console.print("[dim]assumptions: " + "; ".join(r["assumptions"]) + "[/]")
