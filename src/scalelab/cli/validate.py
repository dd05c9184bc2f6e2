"""`scalelab validate`: the predictor against measured runs, in-sample and leave-one-source-out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from scalelab.cli.common import JsonOpt, console, only_with, print_json, safe_print
from scalelab.cli.progress import progress

DataOpt = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="typed runs CSV, or a raw CSV in the published_runs.csv layout (read by the importer); "
        "default: the shipped typed runs",
    ),
]
ReviewOpt = Annotated[
    Path | None,
    typer.Option("--review", help="review sheet for a raw --data file (facts and assumptions)"),
]
ExplainOpt = Annotated[
    int | None,
    typer.Option(
        "--explain",
        help="print how row N (0-based; raw or typed file) was read, its prediction and the "
        "predicted step's time by part beside the measured figure",
    ),
]
SkippedOpt = Annotated[
    Path | None,
    typer.Option(
        "--skipped",
        help="write every reason each row was not used here (CSV: row, column, reason)",
    ),
]
CrossOpt = Annotated[
    bool,
    typer.Option(
        "--cross-validate", help="also refit without each source group and predict it (held out)"
    ),
]


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f} %"


def validate(
    data: DataOpt = None,
    review: ReviewOpt = None,
    json_out: JsonOpt = False,
    rows: Annotated[
        bool,
        typer.Option(
            "--rows",
            help="with --json, also list every run used: its prediction, measurement and error",
        ),
    ] = False,
    explain: ExplainOpt = None,
    cross_validate: CrossOpt = False,
    skipped_out: SkippedOpt = None,
) -> None:
    """Predict every readable measured run and report the error of tokens/s per GPU."""
    from scalelab.validate import explain as explain_row
    from scalelab.validate import run_validation

    only_with("--review", review is not None, "--data", data is not None)
    if skipped_out is not None:
        from scalelab.io import refuse_clobber

        refuse_clobber({"skipped": skipped_out}, {"data": data, "review": review})
    if explain is not None:
        for line in explain_row(explain, data, review):
            safe_print(line)
        return
    with progress("scalelab validate", json_out=json_out) as step:
        step("predicting every run" + (", then each source held out" if cross_validate else ""))
        report = run_validation(data, review, with_cross_validation=cross_validate)
    if skipped_out is not None:
        from scalelab.validate import write_skip_reasons

        write_skip_reasons(report.skipped, skipped_out)
    if json_out:
        print_json(report.to_dict(with_rows=rows))
        if report.rows_used == 0:
            raise SystemExit(2)
        return
    if report.rows_used == 0:
        if not report.rows_read:
            why = "the table has no rows"
        else:
            top = list(report.skipped_by_reason.items())[:5]
            why = (
                f"none of {report.rows_read} rows could be used ("
                + "; ".join(f"{reason}: {n}" for reason, n in top)
                + "; all reasons: --json, or scalelab runs import --skipped FILE)"
            )
        print(f"scalelab validate: data: {why}", file=sys.stderr)
        raise SystemExit(2)
    cv = report.cross_validated
    table = Table(title=f"predicted vs measured tokens/s per GPU ({report.rows_used} runs)")
    columns = ["source", "runs", "MAPE in-sample", "median bias"]
    if cv:
        columns += ["MAPE held out", "bias held out"]
    for col in columns:
        table.add_column(col, justify="left" if col == "source" else "right")
    for source, stats in report.by_source.items():
        cells = [source, str(stats["rows"]), _pct(stats["mape"]), f"{stats['bias'] * 100:+.1f} %"]
        if cv:
            held = cv["by_source"][source]
            cells += [_pct(held["mape"]), f"{held['bias'] * 100:+.1f} %"]
        table.add_row(*cells)
    total = [
        "[bold]all[/]",
        str(report.rows_used),
        f"[bold]{_pct(report.mape_tokens_per_gpu)}[/]",
        "",
    ]
    if cv:
        total += [f"[bold]{_pct(cv['mape_tokens_per_gpu'])}[/]", ""]
    table.add_row(*total)
    console.print(table)
    if report.cross_validation_skipped:
        console.print(f"not cross-validated: {report.cross_validation_skipped}")
    groups = report.by_assumption
    labels = {
        "all": "all rows",
        "only_what_the_row_names": "rows assuming only what they name",
        "nothing_assumed": "rows with nothing assumed",
    }
    console.print(
        "; ".join(
            f"{label}: {groups[key]['rows']} runs, MAPE {_pct(groups[key]['mape_tokens_per_gpu'])}"
            for key, label in labels.items()
            if key in groups
        )
    )
    rho = report.median_spearman
    console.print(
        f"runs within ±20 %: {report.within_20_pct * 100:.0f} %; median Spearman ρ of layouts within "
        f"{report.sweeps} sweeps: {'n/a' if rho is None else f'{rho:+.3f}'}"
    )
    mem = report.memory
    line = (
        f"memory: {mem['predicted_not_to_fit']} of {report.rows_used} runs that really ran are "
        "predicted not to fit"
    )
    if mem.get("unknown"):
        line += (
            f" ({mem['predicted_not_to_fit_on_stated_inputs']} on what they state; "
            f"{len(mem['unknown'])} unknown, resting on values the run does not state: rows "
            + ", ".join(str(u["row"]) for u in mem["unknown"])
            + ")"
        )
    if mem.get("runs_with_measured_peak"):
        line += (
            f"; predicted/measured peak over {mem['runs_with_measured_peak']} runs: median "
            f"{mem['ratio_median']:.2f} (10-90 %: {mem['ratio_p10']:.2f}-{mem['ratio_p90']:.2f})"
        )
    console.print(line)
    if report.skipped_by_reason:
        skipped = ", ".join(f"{reason}: {n}" for reason, n in report.skipped_by_reason.items())
        console.print(f"skipped {report.rows_skipped} rows ({skipped})")
    if report.moe is not None:
        _render_moe(report.moe)


def _render_moe(moe: dict[str, Any]) -> None:
    """The mixture-of-experts runs, apart from the dense headline."""
    table = Table(title=f"mixture-of-experts runs ({moe['rows_used']} used, apart from the above)")
    for col in ("row", "model", "layout", "measured", "predicted", "error"):
        table.add_column(col, justify="left" if col in ("model", "layout") else "right")
    for r in moe["rows"]:
        table.add_row(
            str(r["row"]),
            escape(r["model"]),
            escape(r["layout"]),
            f"{r['measured_tokens_per_s_per_gpu']:,.0f}",
            f"{r['predicted_tokens_per_s_per_gpu']:,.0f}",
            f"{r['error'] * 100:+.1f} %",
        )
    console.print(table)
    if moe["mape_tokens_per_gpu"] is not None:
        console.print(
            f"MoE MAPE {_pct(moe['mape_tokens_per_gpu'])}, mean error "
            f"{moe['mean_error'] * 100:+.1f} % over {moe['rows_used']} runs; skipped "
            f"{moe['rows_skipped']} (published_runs_moe_skipped.csv and layouts the predictor refuses)"
        )
