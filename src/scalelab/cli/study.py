"""`scalelab study NAME`: run one of the study's experiments (or all: `paper`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from scalelab.cli.common import JsonOpt, console, print_json
from scalelab.cli.progress import progress
from scalelab.studies import NAMES, run_study


def register(app: typer.Typer) -> None:
    app.command("study")(study)


def study(
    name: Annotated[str, typer.Argument(help="|".join(NAMES))],
    out: Annotated[
        Path | None, typer.Option("--out", help="output folder (default: scalelab-out/NAME)")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run a preset experiment: figures (PNG + JSON), CSVs, report.md and report.html in the output folder."""
    folder = out or Path("scalelab-out") / name
    with progress(f"scalelab study {name}", json_out=json_out) as step:
        result = run_study(name, folder, step)
    if json_out:
        print_json(
            {
                k: v
                for k, v in result.items()
                if k
                in ("findings", "figures", "report", "html", "tables", "study", "within", "rows")
            }
        )
        return
    if "findings" in result:
        for f in result["findings"]:
            mark = "[green]within[/]" if f["within"] else "[red]outside[/]"
            basis = f["basis"] + (f" {f['fitted_parameter']}" if f["fitted_parameter"] else "")
            console.print(
                f"  {f['id']}: study {f['paper_text']} {f['unit']}, scalelab {f['predicted_text']} "
                f"({f['tolerance']}; {basis}): {mark}"
            )
        console.print(f"{result['within']} of {len(result['findings'])} findings within tolerance")
    console.print(
        f"wrote {len(result['figures'])} figures and {len(result['tables'])} tables; report: "
        f"[bold]{escape(str(result['report']))}[/] and [bold]{escape(str(result['html']))}[/]"
    )
