"""`scalelab validate`: the predictor against measured runs (published_runs.csv schema)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from scalelab.cli.common import JsonOpt, console, print_json
from scalelab.validate import run_validation

DataOpt = Annotated[
    Path | None,
    typer.Option(
        "--data", help="CSV in the schema of published_runs.csv (default: the shipped copy)"
    ),
]


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)


def validate(data: DataOpt = None, json_out: JsonOpt = False, rows: bool = False) -> None:
    """Predict every interpretable measured run and report the error of tokens/s per GPU."""
    report = run_validation(data)
    if json_out:
        print_json(report.to_dict(with_rows=rows))
        return
    table = Table(title=f"predicted vs measured tokens/s per GPU ({report.rows_used} rows)")
    for col in ("source", "rows", "MAPE", "median bias"):
        table.add_column(col, justify="left" if col == "source" else "right")
    for source, stats in report.by_source.items():
        table.add_row(
            source,
            str(stats["rows"]),
            f"{stats['mape'] * 100:.1f} %",
            f"{stats['bias'] * 100:+.1f} %",
        )
    table.add_row(
        "[bold]all[/]",
        str(report.rows_used),
        f"[bold]{report.mape_tokens_per_gpu * 100:.1f} %[/]",
        "",
    )
    console.print(table)
    rho = report.median_spearman
    console.print(
        f"rows within ±20 %: {report.within_20_pct * 100:.0f} %; median Spearman ρ of layouts within a sweep: "
        f"{'n/a' if rho is None else f'{rho:+.2f}'}"
    )
    console.print(
        f"memory verdicts: {report.rows_predicted_not_to_fit} of {report.rows_used} runs that really ran "
        "are predicted not to fit"
    )
    if report.skipped_by_reason:
        skipped = ", ".join(f"{reason}: {n}" for reason, n in report.skipped_by_reason.items())
        console.print(f"skipped {report.rows_skipped} rows ({skipped})")
