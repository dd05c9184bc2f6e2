"""`scalelab comm`: an nccl-tests-style sweep of collectives over message sizes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from scalelab.cli.common import (
    MAX_COUNT,
    JsonOpt,
    at_most,
    console,
    positive,
    record_for_display,
    writable_folder,
)
from scalelab.errors import InputError


def register(app: typer.Typer) -> None:
    app.command("comm")(comm)


def comm(
    collectives: Annotated[
        str,
        typer.Option(
            help="comma-separated: all_reduce,all_gather,reduce_scatter,all_to_all,send_recv"
        ),
    ] = "all_reduce,all_gather,reduce_scatter",
    sizes: Annotated[
        str, typer.Option(help="1K:4G (powers of two), 1M:1G:4 (x4 steps) or 1M,8M")
    ] = "1K:64M",
    iters: Annotated[int, typer.Option(help="measured iterations per size (median reported)")] = 20,
    warmup: Annotated[int, typer.Option(help="warm-up iterations per size")] = 5,
    nproc_per_node: Annotated[
        int, typer.Option("--nproc-per-node", help="processes to launch here with torchrun")
    ] = 2,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="collective timeout")] = 300.0,
    oversubscribe: Annotated[
        bool,
        typer.Option(
            "--oversubscribe", help="on CPU, allow more ranks than cores (up to 8 per core)"
        ),
    ] = False,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="cluster name to record (for calibrate)")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="folder for the record")] = Path("runs"),
    json_out: JsonOpt = False,
) -> None:
    """Measure collective algorithm and bus bandwidth (nccl-tests definitions) and write a record."""
    writable_folder("out", out)  # first: a run whose record cannot be written is lost
    from scalelab.collectives import BENCHMARKED as COLLECTIVES
    from scalelab.measure.config import (
        check_nproc,
        check_timeout,
        parse_sizes,
        under_torchrun,
        visible_gpus,
    )

    # Everything is checked before torch is imported (~3 s): bad input fails at once.
    chosen = [c.strip() for c in collectives.split(",") if c.strip()]
    bad = [c for c in chosen if c not in COLLECTIVES]
    if bad or not chosen:
        raise InputError(
            "collectives", f"'{collectives}' must list values from {', '.join(COLLECTIVES)}"
        )
    try:
        size_list = parse_sizes(sizes)
    except ValueError as exc:
        raise InputError("sizes", str(exc)) from None
    if not size_list or max(size_list) > 64 * 2**30 or min(size_list) < 1:
        raise InputError("sizes", "need at least one size, each from 1 byte to 64G")
    positive("iters", iters)
    at_most("iters", iters, MAX_COUNT)
    if warmup < 0:
        raise InputError("warmup", f"must be 0 or more, not {warmup}")
    at_most("warmup", warmup, MAX_COUNT)
    check_timeout("timeout-s", timeout_s)
    if not under_torchrun():
        positive("nproc-per-node", nproc_per_node)
        check_nproc(nproc_per_node, visible_gpus(), oversubscribe)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError(
            "comm", "the collective benchmark needs PyTorch: pip install 'scalelab[measure]'"
        ) from None
    from scalelab.measure.job import CommJob
    from scalelab.measure.worker import run_worker

    job = CommJob(
        collectives=chosen,
        sizes_bytes=size_list,
        iters=iters,
        warmup=warmup,
        timeout_s=timeout_s,
        cluster=cluster,
        nproc_per_node=nproc_per_node,
        out=str(out),
    )
    if under_torchrun() or nproc_per_node == 1:
        rc, path = run_worker(job)
        if under_torchrun() and int(os.environ.get("RANK", "0")) != 0:
            if rc:
                raise SystemExit(1)
            return
    else:
        from scalelab.measure.launch import launch_job

        rc, path = launch_job(job, out)
    _report(path, json_out)
    if rc:
        raise SystemExit(1)


def _report(path: Path | None, json_out: bool) -> None:
    record = record_for_display(path, json_out, "comm")
    if record is None or path is None:
        return
    rows: list[dict[str, Any]] = record.measurements.get("rows", [])
    table = Table(
        title=f"{record.workload.get('backend', '')} collectives on {record.workload.get('world_size')} ranks ({record.status})"
    )
    for col in ("collective", "size", "time", "algbw GB/s", "busbw GB/s"):
        table.add_column(col, justify="left" if col == "collective" else "right")
    for r in rows:
        table.add_row(
            r["collective"],
            _size(r["bytes"]),
            f"{r['time_s'] * 1e6:,.1f} µs",
            f"{r['algbw_GBps']:.3f}",
            f"{r['busbw_GBps']:.3f}",
        )
    console.print(table)
    if record.error:
        console.print(f"error: {record.error}")
    console.print(f"record: {path}")


def _size(nbytes: int) -> str:
    for unit, factor in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return f"{nbytes}B"
