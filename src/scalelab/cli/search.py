"""`scalelab search`: every layout of a job ranked, the plain-FSDP baseline, and the Pareto front."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from scalelab.cli.common import (
    ClusterOpt,
    EmitOpt,
    JsonOpt,
    ModelArg,
    SeqLenOpt,
    StackOpt,
    build_constraints,
    console,
    constraint_options,
    err_console,
    print_json,
)
from scalelab.cli.progress import progress
from scalelab.config.catalog import load_cluster, load_model, load_stack
from scalelab.config.layout import Layout
from scalelab.config.stack import DEFAULT_STACK
from scalelab.errors import InputError
from scalelab.search import OBJECTIVES, SAME_ANSWER_RTOL, describe, search

EmitDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--emit-dir",
        help="with --emit: write one file per ranked layout (the --top distinct answers) here",
    ),
]
_LISTED = 2  # equivalent layouts named under a row (the JSON lists more, and the count)
_SUFFIX = {"torchtitan": ".sh", "torchtitan-toml": ".toml", "megatron": ".sh", "bench": ".sh"}


def register(app: typer.Typer) -> None:
    app.command("search")(search_command)


@constraint_options
def search_command(
    model: ModelArg,
    cluster: ClusterOpt = "h100-ib",
    stack: StackOpt = DEFAULT_STACK,
    gpus: Annotated[int, typer.Option("--gpus", "-g", help="number of GPUs")] = 8,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="sequences per step (default: 1 per GPU)")
    ] = None,
    seq_len: SeqLenOpt = None,
    objective: Annotated[str, typer.Option(help="|".join(OBJECTIVES))] = "throughput",
    top: Annotated[
        int, typer.Option(help="how many distinct answers (different predictions) to show")
    ] = 5,
    emit: EmitOpt = None,
    emit_dir: EmitDirOpt = None,
    json_out: JsonOpt = False,
    **constraints: Any,
) -> None:
    """Search every layout of MODEL on GPUS GPUs that the stack runs and rank those that fit by
    OBJECTIVE: one row per distinct prediction, its equivalent layouts listed under it, ties
    broken by the stated preferences. --emit prints the best layout as the framework's config
    (--emit-dir writes one file per ranked layout).

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
    document = result.to_dict()
    if emit_dir is not None and emit is None:
        raise InputError("emit-dir", "needs --emit TARGET (the format of the files)")
    if emit is not None:
        document["emitted"] = _emit(document, emit, emit_dir, spec, cluster_spec.gpus_per_node)
    if json_out:
        print_json(document)
    elif emit is not None and emit_dir is None:
        err_console.print(
            f"best of {document['ranked']:,} ranked layouts: {describe(document['top'][0]['layout'])}",
            highlight=False,
            soft_wrap=True,
        )
        print(document["emitted"][0]["text"], end="")
    else:
        render(document)


def _emit(
    document: dict[str, Any], target: str, folder: Path | None, spec: Any, gpus_per_node: int
) -> list[dict[str, Any]]:
    """The ranked layouts as `target` configs (the best only without `folder`); written one file
    per layout into `folder`. A layout the framework cannot express: an InputError for the best
    alone, a note (and no file) in a folder."""
    from scalelab.cli.common import writable_folder
    from scalelab.config.frameworks import emit as emit_config
    from scalelab.io import atomic_write_text

    if not document["top"]:
        raise InputError("emit", "no layout is valid and fits: nothing to emit")
    rows = document["top"] if folder is not None else document["top"][:1]
    if folder is not None:
        writable_folder("emit-dir", folder)
    out: list[dict[str, Any]] = []
    for rank, row in enumerate(rows, 1):
        layout = Layout(**row["layout"])
        try:
            text = emit_config(target, layout, spec, gpus_per_node)
        except InputError as exc:
            if folder is None:
                raise
            out.append({"rank": rank, "error": f"{exc.field}: {exc.message}"})
            err_console.print(
                f"#{rank} not written: {exc.field}: {exc.message}", highlight=False, soft_wrap=True
            )
            continue
        entry: dict[str, Any] = {"rank": rank, "text": text}
        if folder is not None:
            path = folder / f"{rank:02d}-{layout.slug}{_SUFFIX[target]}"
            atomic_write_text(path, text)
            entry["path"] = str(path)
        out.append(entry)
    return out


def _row(table: Table, rank: str, r: dict[str, Any]) -> None:
    name = escape(describe(r["layout"]))
    if r.get("equivalent_count"):
        shown = ", ".join(r["equivalent"][:_LISTED])
        more = r["equivalent_count"] - len(r["equivalent"][:_LISTED])
        name += f"\n[dim]= {escape(shown)}{f' and {more:,} more' if more > 0 else ''}[/]"
    table.add_row(
        rank,
        name,
        f"{r['tokens_per_s']:,.0f}",
        f"{r['tokens_per_s_per_gpu']:,.0f}",
        f"{r['mfu'] * 100:.1f} %",
        f"{r['model_tflops_per_gpu']:,.0f}",
        f"{r['exposed_comm_fraction'] * 100:.0f} %",
        f"{r['memory_total_bytes'] / 2**30:.1f}",
        f"{r['memory_headroom_bytes'] / 2**30:.1f}",
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
        "TFLOP/s/GPU",
        "exposed comm",
        "GiB/GPU",
        "headroom GiB",
        "W/GPU",
        "tokens/J",
    ):
        t.add_column(col, justify="left" if col in ("#", "layout") else "right")
    return t


def render(r: dict[str, Any]) -> None:
    console.print(
        f"[bold]{escape(str(r['model']))}[/] on {r['gpus']} GPUs ({escape(str(r['cluster']))}, stack {escape(str(r.get('stack', '')))}), global batch {r['global_batch']} x "
        f"{r['seq_len']} tokens, objective {r['objective']}"
    )
    reasons = ", ".join(f"{k}: {v:,}" for k, v in r["invalid_by_reason"].items()) or "none"
    console.print(
        f"considered {r['considered']:,} layouts in {r['seconds']:.2f} s: {r['invalid']:,} invalid ({reasons}); "
        f"{r['not_fitting']:,} do not fit in memory; {r['ranked']:,} ranked, "
        f"{r['distinct_answers']:,} distinct answers"
    )
    table = _table("best layouts (one row per distinct prediction; = equivalent layouts)")
    for i, row in enumerate(r["top"], 1):
        _row(table, str(i), row)
    if r["baseline"] is not None:
        _row(table, "FSDP", r["baseline"])
    console.print(table)
    console.print(
        f"[dim]layouts within {SAME_ANSWER_RTOL:.1%} of an answer's prediction are that answer; its layout is "
        "chosen by: " + escape("; then ".join(r["tie_breaks"])) + ". TFLOP/s/GPU: model FLOPs "
        "(6N + attention per token, as MFU) per second per GPU.[/]"
    )
    for entry in r.get("emitted", []):
        if "path" in entry:
            console.print(f"#{entry['rank']}: {escape(entry['path'])}")
    for line in r["explanation"]:
        console.print(f"  - {line}")
    front = _table("Pareto front: throughput against energy per token")
    for row in r["pareto"]:
        _row(front, "", row)
    console.print(front)
