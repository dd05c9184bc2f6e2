"""`scalelab search`: every layout of a job ranked, the plain-FSDP baseline, and the Pareto front."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from scalelab.cli.common import (
    ClusterOpt,
    JsonOpt,
    ModelArg,
    SeqLenOpt,
    StackOpt,
    build_constraints,
    console,
    constraint_options,
    print_json,
)
from scalelab.cli.progress import progress
from scalelab.config.catalog import load_cluster, load_model, load_stack
from scalelab.config.layout import Layout
from scalelab.search import OBJECTIVES, describe, search


def register(app: typer.Typer) -> None:
    app.command("search")(search_command)


@constraint_options
def search_command(
    model: ModelArg,
    cluster: ClusterOpt = "h100-ib",
    stack: StackOpt = "generic",
    gpus: Annotated[int, typer.Option("--gpus", "-g", help="number of GPUs")] = 8,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="sequences per step (default: 1 per GPU)")
    ] = None,
    seq_len: SeqLenOpt = None,
    objective: Annotated[str, typer.Option(help="|".join(OBJECTIVES))] = "throughput",
    top: Annotated[int, typer.Option(help="how many layouts to show")] = 5,
    json_out: JsonOpt = False,
    **constraints: Any,
) -> None:
    """Search every valid layout of MODEL on GPUS GPUs and rank those that fit by OBJECTIVE.

    The constraint flags (comma-separated allowed values) are generated from the fields of
    `scalelab.config.Layout` that `scalelab.search.Constraints` can restrict.
    """
    spec = load_model(model)
    cluster_spec = load_cluster(cluster)
    allowed = build_constraints(**constraints)
    with progress("scalelab search", json_out=json_out) as step:
        step(f"every layout of {spec.name} on {gpus} GPUs")
        result = search(
            spec,
            cluster_spec,
            gpus=gpus,
            global_batch=Layout.default_global_batch(max(gpus, 1))
            if global_batch is None
            else global_batch,
            seq_len=spec.seq_len if seq_len is None else seq_len,
            objective=objective,
            constraints=allowed,
            top_k=top,
            stack=load_stack(stack),
        )
    if json_out:
        print_json(result.to_dict())
    else:
        render(result.to_dict())


def _row(table: Table, rank: str, r: dict[str, Any]) -> None:
    table.add_row(
        rank,
        describe(r["layout"]),
        f"{r['tokens_per_s']:,.0f}",
        f"{r['tokens_per_s_per_gpu']:,.0f}",
        f"{r['mfu'] * 100:.1f} %",
        f"{r['exposed_comm_fraction'] * 100:.0f} %",
        f"{r['memory_total_bytes'] / 2**30:.1f}",
        f"{r['power_w_per_gpu']:.0f}",
        f"{r['tokens_per_j']:.2f}",
    )


def _table(title: str) -> Table:
    t = Table(title=title)
    for col in (
        "#",
        "layout",
        "tokens/s",
        "tokens/s/GPU",
        "MFU",
        "exposed comm",
        "GiB/GPU",
        "W/GPU",
        "tokens/J",
    ):
        t.add_column(col, justify="left" if col in ("#", "layout") else "right")
    return t


def render(r: dict[str, Any]) -> None:
    console.print(
        f"[bold]{escape(str(r['model']))}[/] on {r['gpus']} GPUs ({escape(str(r['cluster']))}, stack {escape(str(r.get('stack', 'generic')))}), global batch {r['global_batch']} x "
        f"{r['seq_len']} tokens, objective {r['objective']}"
    )
    reasons = ", ".join(f"{k}: {v:,}" for k, v in r["invalid_by_reason"].items()) or "none"
    console.print(
        f"considered {r['considered']:,} layouts in {r['seconds']:.2f} s: {r['invalid']:,} invalid ({reasons}); "
        f"{r['not_fitting']:,} do not fit in memory; {r['ranked']:,} ranked"
    )
    table = _table("best layouts")
    for i, row in enumerate(r["top"], 1):
        _row(table, str(i), row)
    if r["baseline"] is not None:
        _row(table, "FSDP", r["baseline"])
    console.print(table)
    for line in r["explanation"]:
        console.print(f"  - {line}")
    front = _table("Pareto front: throughput against energy per token")
    for row in r["pareto"]:
        _row(front, "", row)
    console.print(front)
