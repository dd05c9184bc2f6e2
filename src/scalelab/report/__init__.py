"""`scalelab report`: tables, figures and an HTML page from a folder of bench records.

No torch here: a report is made wherever the records are copied to. `data` turns records into
one row per (model, series, GPUs) with 95 % intervals, `figures` draws each metric against GPU
count, `html` writes the page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.io import atomic_write_text


@dataclass
class ReportResult:
    out: Path
    records: int
    ok: int
    failed: int
    configurations: int
    html: Path
    figures: dict[str, Path]
    tables: list[Path]
    exports: list[Path]
    notes: list[str] = field(default_factory=list)
    tensorboard_runs: list[Path] = field(default_factory=list)
    cancelled: int = 0  # stopped from outside (scancel, Ctrl-C): not failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "records": self.records,
            "ok": self.ok,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "configurations": self.configurations,
            "html": str(self.html),
            "figures": {k: str(v) for k, v in self.figures.items()},
            "tables": [str(p) for p in self.tables],
            "exports": [str(p) for p in self.exports],
            "notes": self.notes,
            "tensorboard_runs": [str(p) for p in self.tensorboard_runs],
        }


def build_report(
    records_dir: str | Path,
    out: str | Path | None = None,
    *,
    predict: bool = False,
    cluster: str | None = None,
    tensorboard: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> ReportResult:
    """Load every bench record under `records_dir` and write the report into `out`; with
    `tensorboard`, also TensorBoard event files there (one run per record and repeat); `progress`
    is told each step as it starts (the CLI shows it on stderr)."""
    import pandas as pd

    from scalelab.config.catalog import load_cluster
    from scalelab.plotting import write_csv
    from scalelab.report import data, figures, html
    from scalelab.results import export, record_row

    src = Path(records_dir)
    dest = Path(out) if out is not None else src / "report"
    if cluster is not None:
        load_cluster(cluster)  # a bad name is one clear line before any work
    if tensorboard is not None:
        from scalelab.report.tensorboard import _writer_class

        _writer_class()  # no writer installed: one clear line before any work
    step = progress or (lambda text: None)
    step("reading records")
    loaded = data.load(src)
    obs = data.observations(loaded)
    if predict:
        step(f"predicting {len(obs)} records")
    notes = data.add_predictions(obs, cluster) if predict else []
    tensorboard_runs: list[Path] = []
    if tensorboard is not None:
        from scalelab.report.tensorboard import write_tensorboard

        tensorboard_runs = write_tensorboard(obs, tensorboard)
    rows = data.aggregate(obs)
    dest.mkdir(parents=True, exist_ok=True)

    frame_rows = []
    for path, record in loaded:
        row = record_row(record)
        row["path"] = str(path)
        frame_rows.append(row)
    df = pd.DataFrame(frame_rows)
    step("writing records.parquet and records.csv")
    exports = [export(df, dest / "records.parquet"), export(df, dest / "records.csv")]
    summary = [r.flat() for r in rows]
    tables = [write_csv(dest / "summary.csv", summary)] if summary else []
    step(f"figures of {len(rows)} configurations")
    figs = figures.all_figures(rows, dest, predict)
    loss = figures.loss_figure(obs, dest / "loss.png")
    if loss is not None:
        figs["loss"] = loss
    breakdown = figures.breakdown_figure(obs, dest / "step_breakdown.png")
    if breakdown is not None:
        figs["breakdown"] = breakdown
    step("index.html")
    page = html.page(
        title=f"scalelab report: {src.resolve().name}",
        source=str(src),
        rows=rows,
        obs=obs,
        figures=figs,
        out=dest,
        predicted=predict,
        unmeasured=data.unmeasured_reasons(obs),
        notes=notes,
        exports=[*exports, *tables],
        prediction_clusters=data.prediction_clusters(obs),
    )
    index = atomic_write_text(dest / "index.html", page)
    ok = sum(1 for o in obs if o.status == "ok")
    cancelled = sum(1 for o in obs if o.status == "cancelled")
    return ReportResult(
        out=dest,
        records=len(obs),
        ok=ok,
        failed=len(obs) - ok - cancelled,
        cancelled=cancelled,
        configurations=len(rows),
        html=index,
        figures=figs,
        tables=tables,
        exports=exports,
        notes=notes,
        tensorboard_runs=tensorboard_runs,
    )


__all__ = ["ReportResult", "build_report"]
