"""`scalelab study paper`: every experiment, and the study's findings beside scalelab's predictions."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalelab.studies import STUDIES, findings
from scalelab.studies.common import (
    Assumptions,
    markdown_table,
    pyplot,
    save_figure,
    write_csv,
    write_report,
)


def _fmt(value: float, unit: str) -> str:
    if value != value:
        return "none"
    if unit in ("GPUs", "degree"):
        return f"{value:.0f}"
    if unit == "ratio":
        return f"{value:.2f}"
    return (
        f"{value:+.2f}"
        if (unit == "%" and value < 0) or (unit == "%" and value > 0 and "change" in unit)
        else f"{value:.2f}"
    )


def findings_figure(found: list[findings.Finding], out: Path) -> Path:
    plt = pyplot()
    pct = [f for f in found if f.unit == "%"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [3, 2]})
    x = range(len(pct))
    ax1.bar([i - 0.2 for i in x], [f.paper for f in pct], 0.4, label="paper", color="tab:gray")
    ax1.bar(
        [i + 0.2 for i in x],
        [f.predicted for f in pct],
        0.4,
        label="scalelab",
        color=["tab:green" if f.within else "tab:red" for f in pct],
    )
    ax1.errorbar(
        list(x),
        [(f.low + f.high) / 2 for f in pct],
        yerr=[(f.high - f.low) / 2 for f in pct],
        fmt="none",
        ecolor="black",
        capsize=6,
        label="tolerance",
    )
    ax1.set_xticks(
        list(x), [f"{f.id}\n" + "\n".join(textwrap.wrap(f.short, 18)) for f in pct], fontsize=9
    )
    ax1.axhline(0, color="black", linewidth=0.8)
    ax1.set_ylabel("percent")
    ax1.set_title("Findings in percent: paper vs scalelab (green: within tolerance)")
    ax1.legend()
    other = [f for f in found if f.unit in ("GPUs", "degree", "ratio")]
    ax2.axis("off")
    cells = [
        [
            f.id,
            f.short,
            "2-4" if f.id == "F7" else _fmt(f.paper, f.unit),
            _fmt(f.predicted, f.unit),
            "yes" if f.within else "NO",
        ]
        for f in other
    ]
    table = ax2.table(
        cellText=cells,
        colLabels=["id", "finding", "paper", "scalelab", "within"],
        loc="center",
        cellLoc="left",
        colWidths=[0.08, 0.52, 0.13, 0.15, 0.12],
    )
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 2.0)
    for (row, _col), cell in table.get_celld().items():
        if row > 0 and cells[row - 1][-1] == "NO":
            cell.set_facecolor("#f8d0d0")
    ax2.set_title("Other findings")
    fig.suptitle(f"{sum(f.within for f in found)} of {len(found)} findings within tolerance")
    fig.tight_layout()
    return save_figure(fig, out / "findings.png")


def run_paper(out: Path, a: Assumptions, progress: Callable[[str], None]) -> dict[str, Any]:
    sections = []
    figures: list[Path] = []
    tables: list[Path] = []
    outputs = []
    for _title, runner in STUDIES.values():
        result = runner(out, a, progress)
        outputs.append(result)
        figures += result.figures
        tables += result.tables
    found = findings.compute(a, progress)
    sens = findings.sensitivity(a, progress)
    tables.append(write_csv(out / "findings.csv", [f.to_dict() for f in found]))
    tables.append(write_csv(out / "sensitivity.csv", sens))
    fig = findings_figure(found, out)
    figures.insert(0, fig)
    within = sum(f.within for f in found)
    sections.append(
        "The study's findings (`paper_findings.csv`, from the review of arXiv 2411.13055) beside scalelab's "
        f"predictions: **{within} of {len(found)} within tolerance**.\n\n"
        + f"![findings]({fig.name})\n\n"
        + markdown_table(
            [
                (
                    f.id,
                    f.quantity,
                    ("2-4" if f.id == "F7" else _fmt(f.paper, f.unit))
                    + ("" if f.unit == "ratio" else f" {f.unit}"),
                    _fmt(f.predicted, f.unit),
                    f.tolerance,
                    "yes" if f.within else "**no**",
                    f.how,
                )
                for f in found
            ],
            [
                "id",
                "quantity",
                "paper",
                "scalelab",
                "tolerance",
                "within",
                "how scalelab computes it",
            ],
        )
    )
    sections.append(
        "## Assumptions (one set for every finding and experiment)\n"
        + "\n".join(f"- {x}" for x in a.lines())
    )
    sections.append(
        "## Sensitivity to what the study does not state\n"
        + markdown_table(
            [
                (
                    r["assumption"] + (" (chosen)" if r["chosen"] else ""),
                    *(
                        _fmt(r[k], "%" if k <= "F5" else "GPUs")
                        for k in ("F1", "F2", "F3", "F4", "F5", "F6", "F7")
                    ),
                    f"{r['within']} / 7",
                )
                for r in sens
            ],
            [
                "assumption",
                "F1 %",
                "F2 %",
                "F3 %",
                "F4 %",
                "F5 %",
                "F6 GPUs",
                "F7 degree",
                "within",
            ],
        )
    )
    for result in outputs:
        sections += result.markdown
    report = write_report(
        out,
        "scalelab study paper: Hardware Scaling Trends and Diminishing Returns, reproduced",
        sections,
    )
    return {
        "study": "paper",
        "report": str(report),
        "findings": [f.to_dict() for f in found],
        "within": within,
        "figures": [str(f) for f in figures],
        "tables": [str(t) for t in tables],
    }
