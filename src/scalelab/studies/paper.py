"""`scalelab study paper`: every experiment, and the study's findings beside scalelab's predictions."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalelab.plotting import STUDY_MARKER, markdown_table, pyplot, save_figure, write_csv
from scalelab.studies import STUDIES, findings
from scalelab.studies.common import Assumptions, StudyOutput, write_report
from scalelab.studies.html import write_html

UNIT_AXIS = {
    "%": "per cent",
    "GPUs": "GPUs",
    "degree": "TP or PP degree",
    "ratio": "ratio (x)",
}
# How each basis looks: marker of scalelab's value and the panel's background.
BASIS_STYLE = {
    "predicted": {"marker": "o", "face": "#ffffff", "word": "PREDICTED (out of sample)"},
    "derived": {"marker": "D", "face": "#eef3fb", "word": "DERIVED (arithmetic on F1/F2)"},
    "fitted": {"marker": "s", "face": "#eeeeee", "word": "FITTED (in sample)"},
}


def _axis_label(f: findings.Finding) -> str:
    if f.unit == "%":
        return "MFU (%)" if "MFU" in f.quantity else "change (%)"
    return UNIT_AXIS.get(f.unit, f.unit)


def findings_figure(found: list[findings.Finding], out: Path) -> Path:
    """One panel per finding, each in its own unit: the study, scalelab, the tolerance, the basis."""
    plt = pyplot()
    fig, axes = plt.subplots(3, 3, figsize=(17, 11))
    for ax, f in zip(axes.flat, found, strict=False):
        style = BASIS_STYLE[f.basis]
        ax.set_facecolor(style["face"])
        ax.axvspan(f.low, f.high, color="tab:green", alpha=0.18, label="tolerance band")
        if f.paper_low == f.paper_high:
            ax.scatter([f.paper_low], [1], **STUDY_MARKER, label="study (as reported)")
        else:
            ax.plot(
                [f.paper_low, f.paper_high],
                [1, 1],
                color="black",
                linewidth=6,
                solid_capstyle="butt",
                label="study (a range, as reported)",
            )
        values = [0.0, f.low, f.high, f.paper_low, f.paper_high]
        if math.isnan(f.predicted):
            ax.text(
                0.5,
                0.3,
                "scalelab: none\n(no crossover up to 2048 GPUs)",
                transform=ax.transAxes,
                ha="center",
                color="tab:red",
                fontsize=10,
            )
        else:
            values.append(f.predicted)
            color = "tab:green" if f.within else "tab:red"
            ax.scatter(
                [f.predicted],
                [0],
                marker=style["marker"],
                s=130,
                color=color if f.basis == "predicted" else "white",
                edgecolor=color,
                linewidths=2.5,
                zorder=7,
                label=f"scalelab ({f.basis})",
            )
            ax.annotate(
                f"{f.predicted_text}",
                (f.predicted, 0),
                xytext=(0, 12),
                textcoords="offset points",
                ha="center",
                fontsize=9,
            )
        ax.annotate(
            f.paper_text,
            ((f.paper_low + f.paper_high) / 2, 1),
            xytext=(0, 12),
            textcoords="offset points",
            ha="center",
            fontsize=9,
        )
        lo, hi = min(values), max(values)
        if f.id == "F8":
            hi = max(hi, 16.0)
            ax.axvline(16, color="black", linestyle=":", linewidth=1)
            ax.text(16, 0.5, " ideal 16x", fontsize=8, va="center")
        if f.id == "F9":
            ax.axvline(1, color="black", linestyle=":", linewidth=1)
            ax.text(1, 0.5, " ideal 1x", fontsize=8, va="center")
        pad = 0.12 * (hi - lo or 1.0)
        ax.set_xlim(min(0.0, lo - pad) if lo < 0 else 0.0, hi + pad if hi > 0 else 0.0)
        ax.set_ylim(-0.6, 1.6)
        if f.unit == "degree":
            ax.set_xticks(range(0, int(ax.get_xlim()[1]) + 1))
        ax.set_yticks([0, 1], ["scalelab", "study"])
        ax.grid(axis="y", visible=False)
        ax.set_xlabel(_axis_label(f))
        title = "\n".join(textwrap.wrap(f"{f.id}: {f.short}", 46))
        verdict = "within" if f.within else "OUTSIDE"
        extra = f": {f.fitted_parameter}" if f.fitted_parameter else ""
        ax.set_title(
            f"{title}\n{style['word']}{extra} · {verdict} ({f.tolerance})",
            fontsize=9.5,
            color="black" if f.within else "tab:red",
        )
    for ax in list(axes.flat)[len(found) :]:
        ax.axis("off")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Line2D([], [], marker="*", color="black", linestyle="", markersize=14, label="study (as reported)"),
        Patch(color="tab:green", alpha=0.18, label="tolerance band"),
        Line2D([], [], marker="o", color="tab:green", linestyle="", markersize=10,
               label="scalelab, PREDICTED: no parameter set from this finding (white panel)"),
        Line2D([], [], marker="s", markerfacecolor="white", markeredgecolor="tab:green",
               markeredgewidth=2.5, linestyle="", markersize=10,
               label="scalelab, FITTED: a parameter was set so that it holds (grey panel)"),
        Line2D([], [], marker="D", markerfacecolor="white", markeredgecolor="tab:green",
               markeredgewidth=2.5, linestyle="", markersize=9,
               label="scalelab, DERIVED: arithmetic on F1/F2 (blue panel)"),
        Line2D([], [], marker="o", color="tab:red", linestyle="", markersize=10,
               label="red: outside the tolerance"),
    ]  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=9, frameon=False)
    counts = {b: [f for f in found if f.basis == b] for b in BASIS_STYLE}
    fig.suptitle(
        f"The study's findings and scalelab's: {sum(f.within for f in found)} of {len(found)} within "
        "tolerance; "
        + ", ".join(
            f"{b} {sum(f.within for f in fs)} of {len(fs)}" for b, fs in counts.items() if fs
        ),
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    return save_figure(fig, out / "findings.png", data=True)


def findings_table(found: list[findings.Finding]) -> str:
    return markdown_table(
        [
            (
                f.id,
                f.quantity,
                f.paper_text + ("" if f.unit == "ratio" else f" {f.unit}"),
                f.predicted_text + ("" if f.unit == "ratio" or math.isnan(f.predicted) else f" {f.unit}"),
                f.tolerance,
                "yes" if f.within else "**no**",
                f.basis + (f" (`{f.fitted_parameter}`)" if f.fitted_parameter else ""),
                f.how,
            )
            for f in found
        ],
        ["id", "quantity", "study", "scalelab", "tolerance", "within", "basis", "how scalelab computes it"],
    )  # fmt: skip


def headline(
    outputs: dict[str, StudyOutput], found: list[findings.Finding], a: Assumptions
) -> list[str]:
    """The review's questions, answered with numbers from this run."""
    hsdp = outputs["hsdp"].data
    names = hsdp["series"]
    change = hsdp["change_pct"]
    best_h, best_mp = hsdp["best_hsdp_2048"], hsdp["best_mp_2048"]
    strong = outputs["strong-scaling"].data
    strong_rows = strong["rows"]
    feasible = sorted({r["gpus"] for r in strong_rows if r["series"].startswith("pure FSDP")})
    loss = outputs["weak-scaling"].data["loss"]
    grow = loss["step_growth_s"] or float("nan")
    f = {x.id: x for x in found}
    need = findings.f2_power_needed(a)
    fitted = [x.id for x in found if x.basis == "fitted"]
    predicted = [x for x in found if x.basis == "predicted"]
    lines = [
        "**The review's questions, answered by scalelab's model** (predictions, not measurements; "
        f"{a.model} on {a.cluster}, {a.sequences_per_gpu} x {a.seq_len} tokens per GPU):",
        "- **Does HSDP flatten the diminishing-returns curve?** "
        + ("Yes" if change[names[3]] > change[names[0]] else "No")
        + f", in the model: from 128 to 2048 GPUs per-GPU throughput changes by "
        f"{change[names[3]]:+.1f} % with the best HSDP layout, against {change[names[0]]:+.1f} % with "
        f"pure FSDP and {change[names[4]]:+.1f} % with the best FSDP + TP/PP layout. At 2048 GPUs the "
        f"best HSDP layout ({best_h['layout']}, {best_h['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU) "
        f"is {hsdp['gain_over_mp_pct']:+.1f} % over the best TP/PP layout ({best_mp['layout']}, "
        f"{best_mp['tokens_per_s_per_gpu']:,.0f}) and {hsdp['gain_over_fsdp_pct']:+.1f} % over pure FSDP. "
        "The study did not run HSDP.",
        f"- **Is pure FSDP feasible in the strong-scaling regime?** Only up to "
        f"{max(feasible) if feasible else 0} GPUs: with a global batch of {a.strong_scaling_global_batch} "
        f"sequences the data-parallel degree cannot exceed {a.strong_scaling_global_batch}, so at "
        + ", ".join(str(g) for g in strong["infeasible"])
        + " GPUs every feasible layout uses TP, PP or CP.",
        f"- **How much of the per-GPU loss is exposed communication, how much slowed compute?** "
        f"Pure FSDP's step grows by {loss['step_growth_s'] * 1e3:.0f} ms from 128 to 2048 GPUs "
        f"(per-GPU throughput {f['F1'].predicted_text} %): {loss['exposed_comm_s'] * 1e3:.0f} ms "
        f"({100 * loss['exposed_comm_s'] / grow:.0f} %) is exposed communication, "
        f"{loss['compute_s'] * 1e3:.0f} ms ({100 * loss['compute_s'] / grow:.0f} %) is compute slowed "
        "by the communication it overlaps"
        + (
            f", {loss['other_s'] * 1e3:.0f} ms other (optimizer, overhead)."
            if abs(loss["other_s"]) * 1e3 >= 0.5
            else "."
        ),
        f"- **What F2 asks of a GPU in communication alone:** at 2048 GPUs pure FSDP spends "
        f"{100 * need['comm_only_share_2048']:.0f} % of its step in communication only and "
        f"{100 * need['busy_share_2048']:.0f} % busy; the study's F2 would need a GPU spinning in NCCL "
        f"kernels alone to draw {need['needed_w']:.0f} W ({need['needed_w_at_tolerance']:.0f} W at "
        f"the tolerance's edge), against {need['comm_only_w']:.0f} W from the power states and "
        f"{need['compute_w']:.0f} W computing. A power reading during all_gather_perf at scale would "
        "settle which is wrong: the power state or the share of the loss that is idle waiting.",
        f"- **How far to trust the findings' agreement:** {', '.join(fitted)} are in-sample (a catalog "
        "parameter was set from each; see the basis column); "
        + ", ".join(f"{x.id} {'within' if x.within else 'OUTSIDE'}" for x in predicted)
        + " are out-of-sample predictions.",
    ]
    return ["\n".join(lines)]


def sensitivity_table(sens: list[dict[str, Any]]) -> str:
    return markdown_table(
        [
            (
                r["assumption"] + (" (chosen)" if r["chosen"] else ""),
                *(r[k] for k in ("F1", "F2", "F3", "F4", "F5", "F6", "F7")),
                f"{r['within']} / 7",
            )
            for r in sens
        ],
        ["assumption", "F1 %", "F2 %", "F3 %", "F4 %", "F5 %", "F6 GPUs", "F7 degree", "within"],
    )


def run_paper(out: Path, a: Assumptions, progress: Callable[[str], None]) -> dict[str, Any]:
    figures: list[Path] = []
    tables: list[Path] = []
    outputs: dict[str, StudyOutput] = {}
    for name, (_title, runner) in STUDIES.items():
        result = runner(out, a, progress)
        outputs[name] = result
        figures += result.figures
        tables += result.tables
    found = findings.compute(a, progress)
    sens = findings.sensitivity(a, progress)
    param_sens = findings.parameter_sensitivity(a, progress)
    tables.append(write_csv(out / "findings.csv", [f.to_dict() for f in found]))
    tables.append(write_csv(out / "sensitivity.csv", sens))
    tables.append(write_csv(out / "parameter_sensitivity.csv", param_sens))
    fig = findings_figure(found, out)
    figures.insert(0, fig)
    within = sum(f.within for f in found)
    sections = headline(outputs, found, a)
    sections.append(
        "## The study's findings\n"
        "The study's findings (`paper_findings.csv`, from the review of arXiv 2411.13055) beside scalelab's "
        f"predictions: **{within} of {len(found)} within tolerance**. The basis says how far the "
        "agreement means anything: *predicted* (no parameter was set from the finding), *derived* "
        "(arithmetic on other findings' predictions) or *fitted* (the named catalog parameter was "
        "chosen so that it holds; see docs/calibration.md).\n\n"
        + f"![findings]({fig.name})\n\n"
        + findings_table(found)
    )
    sections.append(
        "## Assumptions (one set for every finding and experiment)\n"
        + "\n".join(f"- {x}" for x in a.lines())
    )
    sections.append(
        "## Sensitivity to what the study does not state\n"
        "Each row recomputes F1-F7 under another choice; F6 is 'none' where no crossover happens up "
        "to 2048 GPUs.\n\n" + sensitivity_table(sens)
    )
    sections.append(
        "## Sensitivity to uncertain parameters\n"
        "Each row recomputes F1-F7 with one cluster parameter moved by its stated uncertainty "
        "(the chosen assumptions otherwise).\n\n" + sensitivity_table(param_sens)
    )
    for result in outputs.values():
        sections += result.markdown
    title = "scalelab study paper: Hardware Scaling Trends and Diminishing Returns, reproduced"
    report = write_report(out, title, sections)
    page = write_html(out, title, sections)
    return {
        "study": "paper",
        "report": str(report),
        "html": str(page),
        "findings": [f.to_dict() for f in found],
        "within": within,
        "figures": [str(f) for f in figures],
        "tables": [str(t) for t in tables],
    }
