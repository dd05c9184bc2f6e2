"""Plot and table helpers shared by the study presets and the sweep report.

It sits beside `report/` and `studies/` (neither imports the other): a headless pyplot, one way to
save a figure (atomically, optionally with a JSON description of what was drawn, so that tests and
other tools can check a figure from data instead of pixels), the GPU-count axis, CSV and markdown
tables, and the visual conventions every study figure follows.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.io import atomic_write, atomic_write_text, csv_safe_cell

# The study's own measured values: one marker everywhere, black and large, above the model lines.
STUDY_MARKER: dict[str, Any] = {
    "marker": "*",
    "s": 220,
    "color": "black",
    "edgecolor": "white",
    "linewidths": 0.8,
    "zorder": 8,
}
# Curves the data do not support (extrapolated or drawn from assumed parameters): dashed, lighter.
WEAK_LINE: dict[str, Any] = {"linestyle": "--", "alpha": 0.45}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display), with the project's defaults."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {"figure.figsize": (11, 6.5), "axes.grid": True, "grid.alpha": 0.3, "font.size": 10}
    )
    return plt


def _num(value: Any) -> float | None:
    v = float(value)
    return None if math.isnan(v) or math.isinf(v) else v


def _points(values: Any) -> list[Any]:
    out: list[Any] = []
    for v in list(values):
        try:
            out.append(_num(v))
        except (TypeError, ValueError):
            out.append(str(v))
    return out


def figure_data(fig: Any) -> dict[str, Any]:
    """What a figure draws, per axes: titles, labels, limits, scales, legend, lines, markers, bars, texts."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Rectangle

    axes = []
    for ax in fig.axes:
        legend = ax.get_legend()
        lines = [
            {
                "label": line.get_label(),
                "x": _points(line.get_xdata()),
                "y": _points(line.get_ydata()),
                "linestyle": line.get_linestyle(),
                "alpha": line.get_alpha(),
                "marker": str(line.get_marker()),
                "color": line.get_color() if isinstance(line.get_color(), str) else None,
            }
            for line in ax.get_lines()
        ]
        markers = [
            {
                "label": c.get_label(),
                "offsets": [_points(p) for p in np.asarray(c.get_offsets())],
                "alpha": c.get_alpha(),
            }
            for c in ax.collections
            if isinstance(c, PathCollection)
        ]
        bars = [
            {
                "label": c.get_label(),
                "heights": [_num(p.get_height()) for p in c.patches],
                "hatches": [p.get_hatch() for p in c.patches],
                "alphas": [p.get_alpha() for p in c.patches],
            }
            for c in ax.containers
            if isinstance(c, BarContainer)
        ]
        in_bars = {id(patch) for c in ax.containers for patch in c}
        outlines = [
            {"label": patch.get_label(), "xy": _points(patch.get_xy()), "width": patch.get_width()}
            for patch in ax.patches
            if isinstance(patch, Rectangle) and id(patch) not in in_bars and not patch.get_fill()
        ]
        axes.append(
            {
                "title": ax.get_title(),
                "xlabel": ax.get_xlabel(),
                "ylabel": ax.get_ylabel(),
                "xlim": _points(ax.get_xlim()),
                "ylim": _points(ax.get_ylim()),
                "xscale": ax.get_xscale(),
                "yscale": ax.get_yscale(),
                "visible": ax.axison,
                "legend": [t.get_text() for t in legend.get_texts()] if legend else [],
                "legend_title": legend.get_title().get_text() if legend else "",
                "lines": lines,
                "markers": markers,
                "bars": bars,
                "outlines": outlines,
                "texts": [t.get_text() for t in ax.texts],
                "xticklabels": [t.get_text() for t in ax.get_xticklabels()],
                "yticklabels": [t.get_text() for t in ax.get_yticklabels()],
            }
        )
    suptitle = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    return {
        "suptitle": suptitle,
        "legends": [[t.get_text() for t in lg.get_texts()] for lg in fig.legends],
        "texts": [t.get_text() for t in fig.texts],
        "axes": axes,
    }


def save_figure(fig: Any, path: Path, data: bool = False) -> Path:
    """Write the figure as PNG (atomically); with `data`, also `<name>.json` from `figure_data`."""
    import matplotlib.pyplot as plt

    if data:
        atomic_write_text(
            path.with_suffix(".json"), json.dumps(figure_data(fig), indent=1, default=str) + "\n"
        )

    def write(tmp: Path) -> None:
        fig.savefig(tmp, dpi=130, bbox_inches="tight", format="png")

    atomic_write(path, write)
    plt.close(fig)
    return path


def gpu_axis(ax: Any, gpus: Iterable[int], label: str = "GPUs") -> None:
    """A log2 x-axis with one tick per GPU count."""
    values = list(gpus)
    ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([str(g) for g in values], rotation=0)
    ax.minorticks_off()
    ax.set_xlabel(label)


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Rows (dicts) as CSV, columns in first-seen order, written atomically; text that a
    spreadsheet would run as a formula (a model name `=cmd|...`) is escaped (`csv_safe_cell`)."""
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=[csv_safe_cell(k) for k in keys])
            writer.writeheader()
            writer.writerows(
                {csv_safe_cell(k): csv_safe_cell(v) for k, v in row.items()} for row in rows
            )

    return atomic_write(path, write)


def _cell(value: Any) -> str:
    """A table cell's text: a `|` escaped (GitHub's tables split on a bare one), one line."""
    return " ".join(str(value).split()).replace("|", "\\|")


def markdown_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A GitHub-flavoured markdown table; cells may hold `|`."""
    lines = [
        "| " + " | ".join(_cell(h) for h in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
