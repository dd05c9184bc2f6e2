"""`scalelab report`: tables, figures and an HTML page from a folder of bench records."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from scalelab.cli.common import JsonOpt, console, only_with, print_json
from scalelab.cli.progress import progress

DirArg = Annotated[
    Path,
    typer.Argument(
        help="folder of records (a sweep's --out, or bench's)", show_default=False, metavar="DIR"
    ),
]
OutOpt = Annotated[
    Path | None, typer.Option("--out", "-o", help="folder of the report (default: DIR/report)")
]
PredictOpt = Annotated[
    bool, typer.Option("--predict", help="add the predictor's numbers beside the measured ones")
]
ClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster", "-c",
        help="cluster to predict on (default: the record's prediction or cluster, else h100-ib)",
    ),
]  # fmt: skip


TensorBoardOpt = Annotated[
    Path | None,
    typer.Option(
        "--tensorboard",
        help="also write TensorBoard event files into this folder: one run per record and "
        "repeat (loss, grad norm, step time, tokens/s, MFU, memory per step) and the prediction "
        "as a flat line where there is one; view with `tensorboard --logdir DIR`",
        metavar="DIR",
    ),
]


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    directory: DirArg,
    out: OutOpt = None,
    predict: PredictOpt = False,
    cluster: ClusterOpt = None,
    tensorboard: TensorBoardOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Per-GPU and global throughput, MFU, exposed communication, GPU power and tokens per joule
    against GPU count, with 95 % intervals from the repeats; an HTML page (index.html) showing
    them, summary.csv, and every record as records.parquet and records.csv; with --tensorboard,
    TensorBoard runs (one per record and repeat)."""
    from scalelab.report import build_report

    only_with("--cluster", cluster is not None, "--predict", predict)
    with progress("scalelab report", json_out=json_out) as step:
        result = build_report(
            directory, out, predict=predict, cluster=cluster, tensorboard=tensorboard, progress=step
        )
    if json_out:
        print_json(result.to_dict())
        return
    console.print(
        f"{result.records} records ({result.ok} ok, {result.failed} failed or OOM"
        + (f", {result.cancelled} cancelled" if result.cancelled else "")
        + "), "
        f"{result.configurations} configurations, {len(result.figures)} figures"
    )
    for note in result.notes:
        console.print(f"[dim]{note}[/]")
    console.print(f"report: {result.html}")
    if tensorboard is not None:
        console.print(
            f"TensorBoard: {len(result.tensorboard_runs)} runs in {tensorboard} "
            f"(tensorboard --logdir {tensorboard})"
        )
