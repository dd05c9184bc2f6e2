"""`scalelab runs import`: read a raw CSV of published runs into the typed run file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from scalelab.cli.common import JsonOpt, print_json, safe_print

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
        Path | None, typer.Option("--skipped", help="also write the skipped rows and reasons here")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Read every row with the written rules; rows that cannot be read are skipped with a reason."""
    from scalelab.io import refuse_clobber
    from scalelab.runs.importer import import_file, write_skipped
    from scalelab.runs.schema import write_runs

    refuse_clobber({"out": out, "skipped": skipped_out}, {"raw": raw, "review": review})
    readings = import_file(raw, review)
    runs = [r.run for r in readings if r.run is not None]
    write_runs(runs, out)
    if skipped_out is not None:
        write_skipped(readings, skipped_out)
    reasons = Counter(r.skipped for r in readings if r.skipped)
    summary = {
        "rows": len(readings),
        "imported": len(runs),
        "skipped": sum(reasons.values()),
        "skipped_by_reason": dict(reasons),
        "out": str(out),
    }
    if json_out:
        print_json(summary)
        return
    safe_print(f"{len(runs)} of {len(readings)} rows imported to {out}")
    for reason, n in reasons.most_common():
        safe_print(f"  skipped {n}: {reason}")
