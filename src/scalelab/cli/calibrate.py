"""`scalelab calibrate`: fit a cluster profile to measured comm and bench records."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from scalelab.cli.common import JsonOpt, console, only_with, print_json, writable_folder
from scalelab.cli.progress import progress
from scalelab.errors import InputError
from scalelab.io import refuse_clobber


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)


def calibrate(
    records: Annotated[
        list[Path] | None,
        typer.Argument(help="record files or folders of records (comm and bench)"),
    ] = None,
    base: Annotated[
        str, typer.Option("--base", help="catalog cluster or YAML to start from")
    ] = "h100-ib",
    out: Annotated[Path, typer.Option("--out", help="cluster YAML to write")] = Path(
        "my-cluster.yaml"
    ),
    params: Annotated[
        str | None,
        typer.Option(
            "--params", help="comma-separated parameters to fit (default: what the records inform)"
        ),
    ] = None,
    json_out: JsonOpt = False,
    traces: Annotated[
        list[Path] | None,
        typer.Option(
            "--trace",
            help="a profiler trace (file or folder, repeatable) whose collectives carry message "
            "sizes: taken as comm records are (see `scalelab trace --bandwidth`)",
        ),
    ] = None,
    stack: Annotated[
        str,
        typer.Option(
            "--stack",
            help="the software stack the bench records ran (catalog name or YAML): their steps "
            "are predicted with its behaviour",
        ),
    ] = "generic",
    stack_params: Annotated[
        str | None,
        typer.Option(
            "--stack-params",
            help="comma-separated stack parameters to fit after the cluster's, with the fitted "
            "cluster held fixed (e.g. tp_layer_overhead_us); written to --stack-out",
        ),
    ] = None,
    stack_out: Annotated[
        Path, typer.Option("--stack-out", help="stack YAML to write (with --stack-params)")
    ] = Path("my-stack.yaml"),
) -> None:
    """Fit the base cluster's free parameters to the records and write a cluster YAML; with
    --stack-params, then fit those stack parameters apart and write a stack YAML."""
    from scalelab.calibrate import BOUNDS, fit, points_from_records, write_cluster_yaml
    from scalelab.config.catalog import load_cluster
    from scalelab.results import load_record, record_paths

    only_with(
        "--stack-out", stack_out != Path("my-stack.yaml"), "--stack-params", bool(stack_params)
    )
    cluster = load_cluster(base)
    paths: list[Path] = []
    for item in records or []:
        if item.is_dir():
            paths += record_paths(item)
        elif item.exists() or item.is_symlink():
            paths.append(item)  # a device or FIFO too: load_record says what it is
        else:
            raise InputError("records", f"no such file or folder: {item}")
    if not paths and not traces:
        raise InputError("records", "no record files found (give records or --trace)")
    # No output may be a file that is read (nor the other output): refused before any work.
    inputs: dict[str, Path | None] = {f"records ({p.name})": p for p in paths}
    for flag, text in (("base", base), ("stack", stack)):
        inputs[flag] = Path(text) if Path(text).is_file() else None
    inputs.update({f"trace ({t.name})": t for t in traces or [] if t.is_file()})
    refuse_clobber({"out": out, "stack-out": stack_out if stack_params else None}, inputs)
    from dataclasses import replace

    from scalelab.config.catalog import load_stack
    from scalelab.config.stack import STACK_PARAMS

    run_stack = load_stack(stack)
    loaded = [load_record(p) for p in paths]
    comm_points, step_points, skipped = points_from_records(loaded)
    step_points = [replace(p, stack=run_stack) for p in step_points]
    fit_stack_names = [n.strip() for n in (stack_params or "").split(",") if n.strip()]
    bad = [n for n in fit_stack_names if n not in STACK_PARAMS]
    if bad:
        raise InputError(
            "stack-params", f"cannot fit {', '.join(bad)}; choose from {', '.join(STACK_PARAMS)}"
        )
    if fit_stack_names and not step_points:
        raise InputError("stack-params", "stack parameters need bench records (step times)")
    comm_points += _trace_points(traces or [], cluster.gpus_per_node)
    names = None
    if params:
        names = [p.strip() for p in params.split(",") if p.strip()]
        unknown = [n for n in names if n not in BOUNDS]
        if unknown:
            raise InputError(
                "params", f"cannot fit {', '.join(unknown)}; choose from {', '.join(BOUNDS)}"
            )
    # Both outputs are checked before fitting, so a fit never ends with one file written and
    # the other refused.
    writable_folder("out", out.parent)
    if fit_stack_names:
        writable_folder("stack-out", stack_out.parent)
    with progress("scalelab calibrate", json_out=json_out) as step:
        step(
            f"fitting {cluster.name} to {len(comm_points)} comm and {len(step_points)} step points"
        )
        result = fit(cluster, comm_points, step_points, names)
        path = write_cluster_yaml(cluster, result, out, note=f"{len(loaded)} records")
        stack_fit: dict[str, Any] = {}
        if fit_stack_names:
            from scalelab.calibrate import fit_and_write_stack

            step(f"fitting {', '.join(fit_stack_names)} of stack {run_stack.name}")
            stack_fit = fit_and_write_stack(
                cluster, result, run_stack, step_points, fit_stack_names, stack_out, len(loaded)
            )
    if json_out:
        print_json({**result.to_dict(), "cluster_file": str(path), "skipped": skipped, **stack_fit})
        return
    table = Table(
        title=f"fitted parameters (base {cluster.name}; {len(comm_points)} collective points, {len(step_points)} step points)"
    )
    for col in ("parameter", "base", "fitted"):
        table.add_column(col, justify="left" if col == "parameter" else "right")
    for name in result.free:
        fitted = result.fitted.get(name)
        table.add_row(
            name,
            f"{result.before[name]:.4g}",
            "undetermined" if fitted is None else f"{fitted:.4g}",
        )
    console.print(table)
    res = Table(title="residuals (predicted / measured - 1)")
    for col in ("kind", "observation", "measured", "base", "fitted"):
        res.add_column(col, justify="left" if col in ("kind", "observation") else "right")
    for r in result.residuals[:60]:
        res.add_row(
            r["kind"],
            r["what"],
            f"{r['measured']:.4g}",
            f"{r['error_before'] * 100:+.1f} %",
            f"{r['error_after'] * 100:+.1f} %",
        )
    console.print(res)
    if result.undetermined:
        console.print(
            f"the records could not determine: {', '.join(result.undetermined)} (kept from {cluster.name})"
        )
    for group in result.collinear:
        console.print(
            f"moved only together by these records (not separately determined): {', '.join(group)}"
        )
    for name, reason in result.reasons.items():
        console.print(f"not fitted on CPU ranks, {name}: {reason}")
    if skipped:
        console.print(f"skipped records: {skipped}")
    console.print(
        f"mean |error| {result.error_before * 100:.1f} % -> {result.error_after * 100:.1f} %; wrote {path}"
    )
    if stack_fit:
        stack_text = ", ".join(f"{k} {v:.4g}" for k, v in stack_fit["stack_fitted"].items())
        console.print(
            f"stack {run_stack.name}: {stack_text} (cluster held fixed); wrote {stack_out}"
        )


def _trace_points(traces: list[Path], gpus_per_node: int) -> list[Any]:
    """Collective observations from profiler traces, as comm records' rows (the group is
    assumed to fill nodes: min(group size, GPUs per node) ranks per node)."""
    if not traces:
        return []
    from scalelab.calibrate import CommPoint
    from scalelab.trace import analyze
    from scalelab.trace.collectives import calibration_observations

    points = [
        CommPoint(
            collective=o.collective,
            nbytes=float(o.nbytes),
            ranks=o.ranks,
            ranks_per_node=min(o.ranks, gpus_per_node),
            time_s=o.time_s,
            source=f"trace {o.source}",
        )
        for o in calibration_observations(analyze(traces))
    ]
    if not points:
        raise InputError(
            "--trace", "no collective in the traces carries message size and group size metadata"
        )
    return points
