"""`scalelab runs import`: a run table (any CSV export in the published-runs layout) or a
torchtitan training log with its job config, read into the typed run file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from scalelab.cli.common import JsonOpt, print_json, safe_print
from scalelab.errors import InputError

runs_app = typer.Typer(
    help="Typed training runs: import run tables or torchtitan logs.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(runs_app, name="runs")


@runs_app.command("import")
def import_runs(
    raw: Annotated[
        Path,
        typer.Argument(
            help="CSV in the published_runs.csv column layout, or (--from torchtitan) the log"
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="typed runs CSV to write")],
    source_kind: Annotated[
        str,
        typer.Option(
            "--from", help="what RAW is: 'table' (a run table) or 'torchtitan' (a training log)"
        ),
    ] = "table",
    config: Annotated[
        Path | None,
        typer.Option("--config", help="--from torchtitan: the job config TOML the run used"),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", min=1, help="--from torchtitan: GPUs, where the log has no mesh"),
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", min=1, help="--from torchtitan: GPUs per node")
    ] = None,
    network: Annotated[
        str, typer.Option("--network", help="--from torchtitan: links per node, e.g. 8x400Gb/s")
    ] = "",
    review: Annotated[
        Path | None,
        typer.Option("--review", help="review sheet: facts and assumptions the raw rows lack"),
    ] = None,
    skipped_out: Annotated[
        Path | None,
        typer.Option(
            "--skipped",
            help="also write every reason each skipped row was not read here (CSV: row, model, "
            "column, reason)",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Read every row with the written rules; rows that cannot be read are skipped with a reason."""
    from scalelab.io import refuse_clobber
    from scalelab.runs.importer import import_file, skip_counts, write_skipped
    from scalelab.runs.schema import write_runs

    refuse_clobber(
        {"out": out, "skipped": skipped_out}, {"raw": raw, "review": review, "config": config}
    )
    if source_kind == "torchtitan":
        from scalelab.runs.torchtitan_log import import_torchtitan

        if config is None:
            raise InputError("config", "--from torchtitan needs --config (the job config TOML)")
        readings = [import_torchtitan(raw, config, gpus, gpus_per_node, network)]
    elif source_kind == "table":
        readings = import_file(raw, review)
    else:
        raise InputError("from", f"{source_kind!r} is not one of: table, torchtitan")
    runs = [r.run for r in readings if r.run is not None]
    write_runs(runs, out)
    if skipped_out is not None:
        write_skipped(readings, skipped_out)
    reasons = skip_counts(readings)
    assumed = Counter(f for run in runs for f in set(run.assumed_fields))
    summary = {
        "rows": len(readings),
        "imported": len(runs),
        "imported_with_assumptions": sum(1 for run in runs if run.assumed),
        "skipped": len(readings) - len(runs),
        "skipped_by_reason": reasons,
        "rows_with_assumed_value": dict(assumed.most_common()),
        "out": str(out),
    }
    if json_out:
        print_json(summary)
        return
    safe_print(
        f"{len(runs)} of {len(readings)} rows imported to {out} "
        f"({summary['imported_with_assumptions']} with assumed values: validate --explain ROW)"
    )
    for reason, n in reasons.items():
        safe_print(f"  skipped {n}: {reason}")
