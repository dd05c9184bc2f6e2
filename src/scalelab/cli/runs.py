"""`scalelab runs import`: read a raw CSV of published runs into the typed run file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from scalelab.cli.common import JsonOpt, print_json

runs_app = typer.Typer(help="Typed published training runs: import raw CSVs.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(runs_app, name="runs")


@runs_app.command("import")
def import_runs(
    raw: Annotated[Path, typer.Argument(help="CSV in the published_runs.csv column layout")],
    out: Annotated[Path, typer.Option("--out", help="typed runs CSV to write")],
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
    from scalelab.runs.importer import import_file, skip_counts, write_skipped
    from scalelab.runs.schema import write_runs

    readings = import_file(raw, review)
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
    print(
        f"{len(runs)} of {len(readings)} rows imported to {out} "
        f"({summary['imported_with_assumptions']} with assumed values: validate --explain ROW)"
    )
    for reason, n in reasons.items():
        print(f"  skipped {n}: {reason}")
