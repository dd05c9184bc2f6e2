"""`scalelab comm`: an nccl-tests-style sweep of collectives over message sizes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

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
        str | None,
        typer.Option(
            help="1K:4G (powers of two), 1M:1G:4 (x4 steps) or 1M,8M; default 1K:64M, or the "
            "range that -b/-e/-f/-i give"
        ),
    ] = None,
    minbytes: Annotated[
        str | None,
        typer.Option("--minbytes", "-b", help="nccl-tests' smallest size (default 32M)"),
    ] = None,
    maxbytes: Annotated[
        str | None,
        typer.Option("--maxbytes", "-e", help="nccl-tests' largest size (default 32M)"),
    ] = None,
    stepfactor: Annotated[
        int | None,
        typer.Option("--stepfactor", "-f", help="nccl-tests' factor between sizes"),
    ] = None,
    stepbytes: Annotated[
        str | None,
        typer.Option(
            "--stepbytes", "-i", help="nccl-tests' increment between sizes (default 1M without -f)"
        ),
    ] = None,
    iters: Annotated[
        int, typer.Option("--iters", "-n", help="measured iterations per size (median reported)")
    ] = 20,
    warmup: Annotated[
        int, typer.Option("--warmup", "--warmup_iters", "-w", help="warm-up iterations per size")
    ] = 5,
    check: Annotated[
        int,
        typer.Option(
            "--check",
            help="result checks per size and mode (nccl-tests' -c; -c is --cluster here): "
            "count the elements that differ from the expected result (#wrong); 0 skips them",
        ),
    ] = 1,
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
    """Measure collective algorithm and bus bandwidth (nccl-tests definitions), check the results
    and write a record; the table is nccl-tests' (out-of-place and in-place, #wrong, and the
    average bus bandwidth)."""
    writable_folder("out", out)  # first: a run whose record cannot be written is lost
    from scalelab.collectives import BENCHMARKED as COLLECTIVES
    from scalelab.measure.config import (
        check_nproc,
        check_timeout,
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
    size_list = _size_list(sizes, minbytes, maxbytes, stepfactor, stepbytes)
    if not size_list or max(size_list) > 64 * 2**30 or min(size_list) < 1:
        raise InputError("sizes", "need at least one size, each from 1 byte to 64G")
    positive("iters", iters)
    at_most("iters", iters, MAX_COUNT)
    if warmup < 0:
        raise InputError("warmup", f"must be 0 or more, not {warmup}")
    at_most("warmup", warmup, MAX_COUNT)
    if check < 0:
        raise InputError("check", f"must be 0 or more, not {check}")
    at_most("check", check, MAX_COUNT)
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
        check_iters=check,
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
    if rc or _check_failed(path):
        raise SystemExit(1)  # as nccl-tests exits non-zero on wrong elements


# Most sizes one sweep may list (an additive -i step over a wide range is the way to exceed it).
MAX_SIZES = 1000
# nccl-tests' defaults for -b and -e (README: "Default : 32M") and for -i ("Default : 1M").
_NCCL_TESTS_MINMAX = "32M"
_NCCL_TESTS_STEPBYTES = "1M"


def _size_list(
    sizes: str | None,
    minbytes: str | None,
    maxbytes: str | None,
    stepfactor: int | None,
    stepbytes: str | None,
) -> list[int]:
    """The message sizes: `--sizes`, or nccl-tests' -b/-e with -f (a factor) or -i (a step)."""
    from scalelab.measure.config import parse_size, parse_sizes

    nccl_style = any(v is not None for v in (minbytes, maxbytes, stepfactor, stepbytes))
    if sizes is not None and nccl_style:
        raise InputError("sizes", "give --sizes or -b/-e/-f/-i, not both")
    if stepfactor is not None and stepbytes is not None:
        raise InputError("stepfactor", "give -f (a factor) or -i (a step), not both")
    if not nccl_style:
        try:
            size_list = parse_sizes(sizes or "1K:64M")
        except ValueError as exc:
            raise InputError("sizes", str(exc)) from None
    else:
        bounds = {}
        for field, text in (
            ("minbytes", minbytes or _NCCL_TESTS_MINMAX),
            ("maxbytes", maxbytes or _NCCL_TESTS_MINMAX),
            ("stepbytes", stepbytes or _NCCL_TESTS_STEPBYTES),
        ):
            try:
                bounds[field] = parse_size(text)
            except ValueError as exc:
                raise InputError(field, str(exc)) from None
        low, high, step = bounds["minbytes"], bounds["maxbytes"], bounds["stepbytes"]
        if low < 1 or high < low:
            raise InputError("maxbytes", f"must be at least minbytes ({low:,}) and 1 or more")
        if stepfactor is not None and stepfactor < 2:
            raise InputError("stepfactor", f"must be 2 or more, not {stepfactor}")
        if step < 1:
            raise InputError("stepbytes", f"must be 1 or more, not {step}")
        size_list = []
        size = low
        while size <= high and len(size_list) <= MAX_SIZES:
            size_list.append(size)
            size = size * stepfactor if stepfactor else size + step
    if not size_list or max(size_list) > 64 * 2**30 or min(size_list) < 1:
        raise InputError("sizes", "need at least one size, each from 1 byte to 64G")
    at_most("sizes", len(size_list), MAX_SIZES)
    return size_list


def _check_failed(path: Path | None) -> bool:
    """The record's result check found wrong elements."""
    if path is None:
        return False
    from scalelab.results import load_record

    return bool(load_record(path).summary.get("out_of_bounds_values"))


def _report(path: Path | None, json_out: bool) -> None:
    record = record_for_display(path, json_out, "comm")
    if record is None or path is None:
        return
    for line in nccl_tests_lines(record):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if record.error:
        console.print(f"error: {record.error}", markup=False, highlight=False)
    console.print(f"record: {path}", markup=False, highlight=False, soft_wrap=True)


def nccl_float(value: float, width: int) -> str:
    """nccl-tests' `getFloatStr` (src/util.cu): two decimals, fewer when the number does not fit
    `width`, then e-notation. One difference: a positive value that two decimals would print as
    0.00 (a small message on a slow link) is printed in e-notation, so that it is not zero."""
    if 0 < abs(value) < 0.005:
        return f"{value:{width}.{1 if width >= 7 else 0}e}"
    for text in (f"{value:{width}.2f}", f"{value:{width}.1f}", f"{value:{width}.0f}"):
        if len(text) <= width:
            return text
    return f"{value:{width}.{1 if width >= 7 else 0}e}"


def _wrong(value: Any) -> str:
    return "   N/A" if value is None else f"{float(value):6g}"


def nccl_tests_lines(record: Any) -> list[str]:
    """The record as nccl-tests prints its results (src/util.cu: writeResultHeader, the body of
    each line, writeResultFooter): one block per collective, then the footer."""
    rows: list[dict[str, Any]] = record.measurements.get("rows", [])
    workload = record.workload
    lines = [
        f"# scalelab comm: {workload.get('backend', '')} on {workload.get('world_size')} ranks, "
        f"{workload.get('iters')} iterations ({record.status}); "
        f"check iterations: {workload.get('check_iters', 0)}"
    ]
    for collective in dict.fromkeys(r["collective"] for r in rows):
        lines += [
            "#",
            f"# Collective test: {collective}",
            "#",
            f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}           out-of-place"
            "                       in-place          ",
            f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  "
            f"{'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}  "
            f"{'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}",
            f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  "
            f"{'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}  "
            f"{'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}",
        ]
        for r in rows:
            if r["collective"] != collective:
                continue
            line = (
                f"{int(r['bytes']):12d}  {int(r.get('count', r['bytes'] // 4)):12d}  "
                f"{r.get('type', 'float'):>8}  {r.get('redop', ''):>6}  {r.get('root', -1):6d}"
            )
            for mode in (r, r.get("in_place")):
                if not isinstance(mode, dict):
                    line += " " * 32  # nccl-tests' writeBenchMarkLineNullBody
                    continue
                line += (
                    f"  {nccl_float(mode['time_s'] * 1e6, 7)}  {nccl_float(mode['algbw_GBps'], 6)}"
                    f"  {nccl_float(mode['busbw_GBps'], 6)}  {_wrong(mode.get('wrong'))}"
                )
            lines.append(line)
    summary = record.summary
    wrong = int(summary.get("out_of_bounds_values", 0) or 0)
    avg = summary.get("avg_busbw_GBps")
    lines += [
        f"# {'Out of bounds values':<20} : {wrong} {'FAILED' if wrong else 'OK'}",
        f"# {'Avg bus bandwidth':<20} : {'n/a' if avg is None else f'{avg:g}'} ",
        "#",
    ]
    return lines
