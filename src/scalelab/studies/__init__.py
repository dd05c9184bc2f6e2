"""The study's experiments as presets: each writes figures (PNG), CSVs and a report.md section."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalelab.errors import InputError
from scalelab.studies import collectives, grid, moe, scaling
from scalelab.studies.common import DEFAULT, Assumptions, StudyOutput, write_report
from scalelab.studies.html import write_html
from scalelab.suggest import unknown_name

Runner = Callable[[Path, Assumptions, Callable[[str], None]], StudyOutput]

STUDIES: dict[str, tuple[str, Runner]] = {
    "collectives": (
        "AllReduce/AllGather/ReduceScatter bus bandwidth vs nodes and size, with the study's Figure 2",
        collectives.run,
    ),
    "weak-scaling": (
        "llama2-7b on 8 -> 2048 GPUs at a fixed per-GPU batch: FSDP, FSDP + TP, HSDP, best layout",
        scaling.run_weak,
    ),
    "strong-scaling": (
        "global batch 32 on 16 -> 256 GPUs: the best feasible layout at each size",
        scaling.run_strong,
    ),
    "mp-grid": ("TP x PP heat-map at 256 GPUs, global batch 512", grid.run_mp_grid),
    "hardware": ("V100, A100, H100, H200, B200 at equal scale", grid.run_hardware),
    "model-size": ("1B, 7B, 13B, 70B", scaling.run_model_size),
    "hsdp": (
        "HSDP against FSDP and TP/PP at 128 -> 2048 GPUs (not run by the study)",
        scaling.run_hsdp,
    ),
}
# Presets beyond the study's experiments (not part of `paper`).
EXTRA_STUDIES: dict[str, tuple[str, Runner]] = {
    "moe": (
        "a mixture-of-experts model against a dense model of equal active parameters, "
        "64 -> 2048 GPUs: best EP/TP/PP/DP layout, AllToAll share, where EP stops paying",
        moe.run,
    ),
}
NAMES = (*STUDIES, *EXTRA_STUDIES, "paper")


def run_study(
    name: str,
    out: Path,
    progress: Callable[[str], None] = lambda s: None,
    assumptions: Assumptions = DEFAULT,
) -> dict[str, Any]:
    """Run one preset (or `paper`, all of them plus the findings); return what it wrote."""
    if name not in NAMES:
        raise InputError("study", unknown_name("study", name, NAMES))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError("out", f"cannot create {out}: {exc.strerror or exc}") from None
    if name == "paper":
        from scalelab.studies.paper import run_paper

        return run_paper(out, assumptions, progress)
    title, runner = (STUDIES | EXTRA_STUDIES)[name]
    result = runner(out, assumptions, progress)
    heading = f"scalelab study {name}: {title}"
    sections = [
        "Assumptions:\n" + "\n".join(f"- {line}" for line in assumptions.lines()),
        *result.markdown,
    ]
    report = write_report(out, heading, sections)
    page = write_html(out, heading, sections)
    return {
        "study": name,
        "report": str(report),
        "html": str(page),
        "figures": [str(f) for f in result.figures],
        "tables": [str(t) for t in result.tables],
        **({"rows": result.data["rows"]} if "rows" in result.data else {}),
    }
