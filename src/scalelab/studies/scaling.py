"""Weak scaling, strong scaling, model size and the HSDP experiment the study did not run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scalelab.config.catalog import load_model
from scalelab.plotting import (
    STUDY_MARKER,
    WEAK_LINE,
    gpu_axis,
    markdown_table,
    pyplot,
    save_figure,
    write_csv,
)
from scalelab.search import Constraints, describe, search
from scalelab.studies.common import (
    DEFAULT,
    STUDY_SCHEDULES,
    STUDY_SCHEDULES_NOTE,
    TOKENS_PER_J,
    WEAK_SCALING_GPUS,
    Assumptions,
    StudyOutput,
    best_layout,
    families_label,
    family,
    fsdp_at,
    is_assumed,
    load,
    predict_fitting,
)
from scalelab.studies.findings import model_parallel_best, paper_values

# (key, y-axis label, scale to the unit shown)
METRICS = (
    ("tokens_per_s", "global tokens/s (millions)", 1e-6),
    ("tokens_per_s_per_gpu", "tokens/s per GPU", 1.0),
    ("mfu", "MFU (%)", 100.0),
    ("exposed_comm_fraction", "exposed communication (% of step time)", 100.0),
    ("power_w_per_gpu", "GPU power (W per GPU, board only)", 1.0),
    (TOKENS_PER_J, "tokens per joule (GPU board energy)", 1.0),
)

FSDP = "pure FSDP (reshard after forward, micro-batch 1): the study's baseline"
FSDP_TP = "FSDP + TP 2-4 (best of TP 2 and TP 4, PP 1): the arm of F3"
HSDP_NODE = "HSDP, shard inside a node (not run by the study)"
BEST = "best searched layout"


def _row(series: str, gpus: int, r: dict[str, Any]) -> dict[str, Any]:
    pipelined = r["layout"]["pp"] > 1
    return {
        "series": series,
        "gpus": gpus,
        "layout": describe(r["layout"]),
        "family": family(r["layout"]),
        "pp_schedule": r["layout"]["pp_schedule"] if pipelined else "",
        **{k: r[k] for k, _, _ in METRICS},
        "step_time_s": r["step_time_s"],
        "compute_s": r["compute_s"],
        "exposed_comm_s": r["exposed_comm_s"],
        "fits": r.get("fits", True),
    }


def _study_constraints(a: Assumptions, **kw: Any) -> Constraints:
    return Constraints(precision=a.precision, pp_schedule=STUDY_SCHEDULES, **kw)


def weak_scaling_rows(
    a: Assumptions = DEFAULT,
    gpus_list: tuple[int, ...] = WEAK_SCALING_GPUS,
    progress: Callable[[str], None] = lambda s: None,
) -> list[dict[str, Any]]:
    model, cluster = load(a)
    rows = []
    for g in gpus_list:
        progress(f"weak scaling: {g} GPUs")
        batch = a.sequences_per_gpu * g
        rows.append(_row(FSDP, g, predict_fitting(model, cluster, fsdp_at(g, a))))
        tp = best_layout(
            model,
            cluster,
            g,
            batch,
            a.seq_len,
            _study_constraints(a, tp=[2, 4], pp=[1], cp=[1], sharding=["fsdp"]),
        )
        if tp is not None:
            rows.append(_row(FSDP_TP, g, tp))
        rows.append(
            _row(HSDP_NODE, g, predict_fitting(model, cluster, fsdp_at(g, a, sharding="hsdp")))
        )
        best = best_layout(model, cluster, g, batch, a.seq_len, _study_constraints(a))
        if best is not None:
            rows.append(_row(BEST, g, best))
    return rows


def best_label(rows: Sequence[dict[str, Any]], series: str = BEST) -> str:
    """The best-layout series named by the families it actually is, and what the study lacked."""
    mine = [r for r in rows if r["series"] == series]
    label = f"{series}: {families_label(list(mine))}" if mine else series
    if any(r["family"].startswith("HSDP") for r in mine):
        label += " (HSDP: not run by the study)"
    return label


def _legend_below(fig: Any, axes: Sequence[Any], ncol: int = 2) -> None:
    """One legend for the whole figure, below the panels (outside the data)."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if not lab.startswith("_"):
                handles.setdefault(lab, h)
    fig.legend(
        list(handles.values()),
        list(handles),
        loc="lower center",
        ncol=ncol,
        fontsize=9,
        frameon=False,
        bbox_to_anchor=(0.5, 0.0),
    )


def _study_anchor(a: Assumptions, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The study's weak-scaling changes placed on scalelab's pure FSDP at 128 GPUs.

    The study gives changes from 128 to 2048 GPUs (F1, F2, F3, F8, F9), not absolute values; so its
    2048-GPU points are drawn from scalelab's own 128-GPU value (the anchor, drawn hollow).
    """
    paper = {k: v["value"] for k, v in paper_values().items()}
    base = next(r for r in rows if r["series"] == FSDP and r["gpus"] == 128)
    f1, f2, f3 = (float(paper[k]) / 100 for k in ("F1", "F2", "F3"))
    per_gpu = base["tokens_per_s_per_gpu"] * (1 + f1)
    return {
        "base": base,
        "tokens_per_s": [
            ("study F8: global 10.0x from 128 to 2048 GPUs", base["tokens_per_s"] * float(paper["F8"]))
        ],
        "tokens_per_s_per_gpu": [
            (f"study F1: pure FSDP {float(paper['F1']):+.1f} % from 128 to 2048 GPUs", per_gpu),
            (f"study F3: TP {float(paper['F3']):+.1f} % over pure FSDP at 2048 GPUs", per_gpu * (1 + f3)),
        ],
        "power_w_per_gpu": [
            (f"study F2: GPU power {float(paper['F2']):+.2f} % from 128 to 2048 GPUs",
             base["power_w_per_gpu"] * (1 + f2)),
        ],
        TOKENS_PER_J: [
            ("study F9: energy per token 1.50x from 128 to 2048 GPUs",
             base[TOKENS_PER_J] / float(paper["F9"])),
        ],
        "mfu_f5": float(paper["F5"]),
    }  # fmt: skip


def plot_weak(rows: list[dict[str, Any]], a: Assumptions, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(17, 11))
    gpus = sorted({r["gpus"] for r in rows})
    anchor = _study_anchor(a, rows)
    styles = {
        FSDP: {"color": "tab:blue", "marker": "o"},
        FSDP_TP: {"color": "tab:orange", "marker": "s"},
        HSDP_NODE: {"color": "tab:green", "marker": "^", **WEAK_LINE},
        BEST: {"color": "tab:purple", "marker": "D", "linestyle": ":", "alpha": 0.7},
    }
    labels = {FSDP: FSDP, FSDP_TP: FSDP_TP, HSDP_NODE: HSDP_NODE, BEST: best_label(rows)}
    first = {s: min((r for r in rows if r["series"] == s), key=lambda r: r["gpus"]) for s in styles}
    for ax, (key, label, scale) in zip(axes.flat, METRICS, strict=True):
        for series, style in styles.items():
            pts = sorted((r for r in rows if r["series"] == series), key=lambda r: r["gpus"])
            ax.plot(
                [p["gpus"] for p in pts],
                [p[key] * scale for p in pts],
                label=labels[series],
                **style,
            )
        base8 = first[FSDP]
        if key == "tokens_per_s":
            ax.plot(
                gpus,
                [base8[key] * scale * g / base8["gpus"] for g in gpus],
                "k:",
                linewidth=1,
                label=f"ideal scaling (linear from pure FSDP at {base8['gpus']} GPUs)",
            )
        if key == "tokens_per_s_per_gpu":
            ax.axhline(
                base8[key],
                color="black",
                linestyle=":",
                linewidth=1,
                label=f"ideal per GPU (flat at pure FSDP's {base8['gpus']}-GPU value)",
            )
        for text, value in anchor.get(key, []):
            ax.scatter([2048], [value * scale], label=text, **STUDY_MARKER)
            ax.annotate(
                text.split(":")[0].replace("study ", ""),
                (2048, value * scale),
                xytext=(-10, 7),
                textcoords="offset points",
                ha="right",
                fontsize=9,
                fontweight="bold",
            )
        if key in anchor:
            ax.scatter(
                [128],
                [anchor["base"][key] * scale],
                marker="*",
                s=220,
                facecolor="none",
                edgecolor="black",
                zorder=8,
                label="anchor: the study gives changes from 128 GPUs; they start at scalelab's 128-GPU value",
            )
        if key == "mfu":
            ax.scatter(
                [a.hardware_scale_gpus],
                [anchor["mfu_f5"]],
                label=f"study F5: H100 MFU {anchor['mfu_f5']:.2f} % (scale not stated; drawn at "
                f"{a.hardware_scale_gpus} GPUs, the assumed one)",
                **STUDY_MARKER,
            )
            ax.annotate(
                "F5",
                (a.hardware_scale_gpus, anchor["mfu_f5"]),
                xytext=(0, -16),
                textcoords="offset points",
                ha="center",
                fontsize=9,
                fontweight="bold",
            )
        gpu_axis(ax, gpus, "GPUs (log scale)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.05)
        ax.set_title(label.split(" (")[0], fontsize=11)
    _legend_below(fig, axes.flat)
    fig.suptitle(
        f"Weak scaling of {a.model} on {a.cluster}: {a.sequences_per_gpu} x {a.seq_len} tokens per GPU, "
        "global batch = GPUs x "
        + str(a.sequences_per_gpu)
        + " (lines: scalelab; black stars: the study)",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0.14, 1, 0.97))
    return save_figure(fig, path, data=True)


def step_loss(base: dict[str, Any], far: dict[str, Any]) -> dict[str, float]:
    """How the step time grew between two rows: exposed communication vs slowed compute vs other."""
    grow = far["step_time_s"] - base["step_time_s"]
    comm_s = far["exposed_comm_s"] - base["exposed_comm_s"]
    compute_s = far["compute_s"] - base["compute_s"]
    return {
        "step_growth_s": grow,
        "exposed_comm_s": comm_s,
        "compute_s": compute_s,
        "other_s": grow - comm_s - compute_s,
    }


def run_weak(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    rows = weak_scaling_rows(a, progress=progress)
    table = write_csv(out / "weak_scaling.csv", rows)
    fig = plot_weak(rows, a, out / "weak_scaling.png")
    fsdp = {r["gpus"]: r for r in rows if r["series"] == FSDP}
    tp = {r["gpus"]: r for r in rows if r["series"] == FSDP_TP}
    best = {r["gpus"]: r for r in rows if r["series"] == BEST}
    loss = step_loss(fsdp[128], fsdp[2048])
    md = [
        "## Weak scaling",
        f"![weak scaling]({fig.name})",
        "Black stars are the study's findings. The study reports changes from 128 to 2048 GPUs, not "
        "absolute values, so its stars start from scalelab's own pure-FSDP value at 128 GPUs (hollow "
        "star). The best searched layout is named by the layout family it is at each size; HSDP was not "
        f"run by the study. Pipeline schedules are {STUDY_SCHEDULES_NOTE}.",
        markdown_table(
            [
                (
                    g,
                    f"{fsdp[g]['tokens_per_s_per_gpu']:,.0f}",
                    f"{fsdp[g]['mfu'] * 100:.1f}",
                    f"{fsdp[g]['exposed_comm_fraction'] * 100:.1f}",
                    f"{fsdp[g]['power_w_per_gpu']:.0f}",
                    f"{tp[g]['tokens_per_s_per_gpu']:,.0f} ({tp[g]['layout']})" if g in tp else "-",
                    best[g]["layout"] if g in best else "-",
                    f"{best[g]['tokens_per_s_per_gpu']:,.0f}" if g in best else "-",
                )
                for g in sorted(fsdp)
            ],
            [
                "GPUs",
                "FSDP tokens/s/GPU",
                "FSDP MFU %",
                "FSDP exposed comm %",
                "FSDP W/GPU",
                "FSDP + TP 2-4 tokens/s/GPU",
                "best layout",
                "best tokens/s/GPU",
            ],
        ),
    ]
    return StudyOutput(
        "weak-scaling", "Weak scaling", [fig], [table], md, {"rows": rows, "loss": loss}
    )


STRONG_STUDY = (
    "best layout, the study's stack (PyTorch 2.3.1 PP schedules: GPipe, 1F1B, interleaved)"
)
STRONG_ANY = (
    "best layout with any schedule, ZBV included (PyTorch >= 2.6; not available to the study)"
)
STRONG_FSDP = "pure FSDP (TP = PP = CP = 1; best micro-batch and reshard)"


def run_strong(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    model, cluster = load(a)
    batch = a.strong_scaling_global_batch
    gpus_list = (16, 32, 64, 128, 256)
    rows: list[dict[str, Any]] = []
    notes = []
    infeasible: list[int] = []
    for g in gpus_list:
        progress(f"strong scaling: {g} GPUs")

        def top(constraints: Constraints, g: int = g) -> Any:
            return search(
                model,
                cluster,
                gpus=g,
                global_batch=batch,
                seq_len=a.seq_len,
                constraints=constraints,
                top_k=1,
            )

        study = top(_study_constraints(a))
        anysched = top(Constraints(precision=a.precision))
        fsdp_res = top(
            Constraints(precision=a.precision, tp=[1], pp=[1], cp=[1], sharding=["fsdp"])
        )
        if study.top:
            rows.append(_row(STRONG_STUDY, g, study.top[0]))
        if anysched.top:
            rows.append(_row(STRONG_ANY, g, anysched.top[0]))
        if fsdp_res.top:
            rows.append(_row(STRONG_FSDP, g, fsdp_res.top[0]))
        else:
            infeasible.append(g)
            reasons = (
                ", ".join(f"{k} ({v})" for k, v in fsdp_res.invalid_by_reason.items())
                or "does not fit"
            )
            notes.append(
                f"{g} GPUs: pure FSDP is infeasible: {reasons}; the data-parallel degree cannot "
                f"exceed {batch} sequences, so model parallelism is required"
            )
    table = write_csv(out / "strong_scaling.csv", rows)
    study_pts = {r["gpus"]: r for r in rows if r["series"] == STRONG_STUDY}
    any_pts = {r["gpus"]: r for r in rows if r["series"] == STRONG_ANY}
    differs = [
        g
        for g in any_pts
        if g in study_pts and any_pts[g]["tokens_per_s"] > study_pts[g]["tokens_per_s"] * 1.001
    ]
    figure = _plot_strong(rows, a, out / "strong_scaling.png", infeasible, differs)
    md = [
        "## Strong scaling",
        f"![strong scaling]({figure.name})",
        f"The best layout is searched with {STUDY_SCHEDULES_NOTE}. "
        + (
            "With any schedule (ZBV included) the best layout would be faster at "
            + ", ".join(
                f"{g} GPUs ({any_pts[g]['layout']}, "
                f"{100 * (any_pts[g]['tokens_per_s'] / study_pts[g]['tokens_per_s'] - 1):+.1f} %)"
                for g in differs
            )
            + "; drawn dashed and lighter as not available to the study."
            if differs
            else "Allowing ZBV changes no winner."
        ),
        markdown_table(
            [
                (
                    r["gpus"],
                    r["series"],
                    r["layout"],
                    f"{r['tokens_per_s']:,.0f}",
                    f"{r['tokens_per_s_per_gpu']:,.0f}",
                    f"{r['mfu'] * 100:.1f}",
                )
                for r in rows
                if r["series"] != STRONG_ANY or r["gpus"] in differs
            ],
            ["GPUs", "series", "layout", "tokens/s", "tokens/s/GPU", "MFU %"],
        ),
    ]
    md += [f"- {n}" for n in notes]
    return StudyOutput(
        "strong-scaling",
        "Strong scaling",
        [figure],
        [table],
        md,
        {"rows": rows, "notes": notes, "infeasible": infeasible, "new_schedule_wins": differs},
    )


def _plot_strong(
    rows: list[dict[str, Any]],
    a: Assumptions,
    path: Path,
    infeasible: list[int],
    differs: list[int],
) -> Path:
    plt = pyplot()
    batch = a.strong_scaling_global_batch
    gpus_list = sorted({r["gpus"] for r in rows} | set(infeasible))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 7.5))
    styles = {
        STRONG_STUDY: {"color": "tab:blue", "marker": "o", "linestyle": "-"},
        STRONG_FSDP: {"color": "tab:orange", "marker": "s", "linestyle": "-"},
        STRONG_ANY: {"color": "tab:purple", "marker": "D", **WEAK_LINE},
    }
    for series, style in styles.items():
        pts = sorted((r for r in rows if r["series"] == series), key=lambda r: r["gpus"])
        if series == STRONG_ANY:
            if not differs:
                continue
            pts = [p for p in pts if p["gpus"] in differs]
        ax1.plot(
            [p["gpus"] for p in pts],
            [p["tokens_per_s"] / 1e6 for p in pts],
            label=f"{series}: {families_label(pts)}" if pts else series,
            **style,
        )
        ax2.plot(
            [p["gpus"] for p in pts],
            [p["tokens_per_s_per_gpu"] for p in pts],
            label=f"{series}: {families_label(pts)}" if pts else series,
            **style,
        )
    study = sorted((r for r in rows if r["series"] == STRONG_STUDY), key=lambda r: r["gpus"])
    by_gpus = {r["gpus"]: r for r in study}
    for r in rows:
        if r["series"] == STRONG_ANY and r["gpus"] in differs and r["gpus"] in by_gpus:
            gain = 100 * (r["tokens_per_s"] / by_gpus[r["gpus"]]["tokens_per_s"] - 1)
            ax2.annotate(
                f"with ZBV (not in PyTorch 2.3.1):\n{r['layout']}, {gain:+.1f} %",
                (r["gpus"], r["tokens_per_s_per_gpu"]),
                xytext=(-20, -75),
                textcoords="offset points",
                ha="right",
                fontsize=8,
                color="tab:purple",
                arrowprops={"arrowstyle": "->", "color": "tab:purple"},
            )
    if study:
        base = study[0]
        ax1.plot(
            gpus_list,
            [base["tokens_per_s"] / 1e6 * g / base["gpus"] for g in gpus_list],
            "k:",
            linewidth=1,
            label=f"ideal scaling (linear from {base['gpus']} GPUs)",
        )
    for ax in (ax1, ax2):
        if infeasible:
            ax.scatter(
                infeasible,
                [0] * len(infeasible),
                marker="x",
                s=90,
                color="tab:orange",
                clip_on=False,
                zorder=6,
                label=f"pure FSDP infeasible: data-parallel degree would exceed the {batch} sequences",
            )
        gpu_axis(ax, gpus_list, "GPUs (log scale)")
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.08)
    ax1.set_ylabel("global tokens/s (millions)")
    ax2.set_ylabel("tokens/s per GPU")
    ax1.set_title("global tokens/s")
    ax2.set_title("tokens/s per GPU")
    lines = "\n".join(f"{p['gpus']:>4} GPUs: {p['layout']}" for p in study)
    ax2.text(
        0.02,
        0.03,
        "best layout, the study's stack:\n" + lines,
        transform=ax2.transAxes,
        fontsize=8,
        family="monospace",
        va="bottom",
        bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "#999"},
    )
    _legend_below(fig, (ax1, ax2), ncol=1)
    fig.suptitle(
        f"Strong scaling of {a.model} on {a.cluster}: global batch {batch} x {a.seq_len} tokens, "
        f"{gpus_list[0]}-{gpus_list[-1]} GPUs",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0.13, 1, 0.96))
    return save_figure(fig, path, data=True)


MODELS = ("llama2-1b", "llama2-7b", "llama2-13b", "llama2-70b")


def run_model_size(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    _, cluster = load(a)
    rows = []
    gpus_list = (8, 32, 128, 512, 2048)
    assumed = {name: is_assumed(load_model(name).source) for name in MODELS}
    for name in MODELS:
        model = load_model(name)
        for g in gpus_list:
            progress(f"model size: {name} on {g} GPUs")
            r = predict_fitting(model, cluster, fsdp_at(g, a))
            rows.append({**_row(f"{name} pure FSDP", g, r), "model": name})
            best = best_layout(
                model, cluster, g, a.sequences_per_gpu * g, a.seq_len, _study_constraints(a)
            )
            if best is not None:
                rows.append({**_row(f"{name} best layout", g, best), "model": name})
            else:
                rows.append(
                    {"series": f"{name} best layout", "gpus": g, "model": name, "fits": False}
                )
    table = write_csv(out / "model_size.csv", rows)
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 7.5))
    colors = dict(zip(MODELS, ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True))
    missing: list[tuple[str, int]] = []
    for name, color in colors.items():
        tag = " (ASSUMED shape)" if assumed[name] else ""
        for kind, style in (("pure FSDP", "--"), ("best layout", "-")):
            series = f"{name} {kind}"
            mine = sorted((r for r in rows if r["series"] == series), key=lambda r: r["gpus"])
            pts = [r for r in mine if r["fits"]]
            missing += [(series, r["gpus"]) for r in mine if not r["fits"]]
            kw: dict[str, Any] = {"linestyle": style, "marker": "o", "color": color}
            if assumed[name]:
                kw["alpha"] = 0.45
            best_fams = families_label(pts) if kind == "best layout" and pts else ""
            label = f"{series}{' (' + best_fams + ')' if best_fams else ''}{tag}"
            for ax, key in ((ax1, "mfu"), (ax2, "exposed_comm_fraction")):
                ax.plot([p["gpus"] for p in pts], [p[key] * 100 for p in pts], label=label, **kw)
            for r in mine:
                if not r["fits"]:
                    for ax in (ax1, ax2):
                        ax.scatter(
                            [r["gpus"]],
                            [0],
                            marker="x",
                            s=80,
                            color=color,
                            clip_on=False,
                            zorder=6,
                            label="x at 0: no point, the layout does not fit in GPU memory "
                            "(even with full recomputation)",
                        )
                    ax1.annotate(
                        f"{name} {kind}: does not fit",
                        (r["gpus"], 0),
                        xytext=(8, 8 + 14 * sum(1 for m in missing if m[1] == r["gpus"])),
                        textcoords="offset points",
                        fontsize=8,
                        color=color,
                    )
    for ax in (ax1, ax2):
        gpu_axis(ax, gpus_list, "GPUs (log scale)")
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.05)
    ax1.set_ylabel("MFU (%)")
    ax2.set_ylabel("exposed communication (% of step time)")
    ax1.set_title("MFU by model size (dashed: pure FSDP, solid: best layout)")
    ax2.set_title("exposed communication by model size")
    _legend_below(fig, (ax1, ax2), ncol=2)
    fig.suptitle(
        f"Model size on {a.cluster}: {a.sequences_per_gpu} x {a.seq_len} tokens per GPU (weak scaling)\n"
        + (
            "light lines: an ASSUMED model shape ("
            + ", ".join(
                f"{n}: {load_model(n).source.split('.')[1].strip()}" for n in MODELS if assumed[n]
            )
            + "); "
            if any(assumed.values())
            else ""
        )
        + "HSDP, where a best layout uses it, was not run by the study",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0.16, 1, 0.96))
    figure = save_figure(fig, out / "model_size.png", data=True)
    md = [
        "## Model size",
        f"![model size]({figure.name})",
        "Larger models do more compute per byte of parameters communicated (per-layer FLOPs grow with "
        "tokens x d_model^2, FSDP traffic with d_model^2), so they keep their MFU to larger scales."
        + (
            " The 1B shape is an assumption (TinyLlama-1.1B; Meta released no Llama-2 1B), drawn lighter."
            if any(assumed.values())
            else ""
        )
        + (
            " Missing points (x at 0): "
            + ", ".join(f"{s} on {g} GPUs" for s, g in missing)
            + " do not fit in GPU memory, even with full recomputation."
            if missing
            else ""
        ),
    ]
    return StudyOutput(
        "model-size", "Model size", [figure], [table], md, {"rows": rows, "missing": missing}
    )


HSDP_SERIES = (
    ("pure FSDP (reshard after forward, micro-batch 1): the study's baseline", "tab:blue", "o"),
    ("FSDP, best reshard and micro-batch (TP = PP = 1)", "tab:cyan", "v"),
    ("HSDP, shard inside a node (8 GPUs)", "tab:olive", "^"),
    ("best HSDP (any shard group, reshard, micro-batch)", "tab:green", "D"),
    ("best FSDP + TP/PP (TP x PP >= 2, PyTorch 2.3.1 schedules)", "tab:red", "s"),
)


def run_hsdp(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    model, cluster = load(a)
    gpus_list = (128, 256, 512, 1024, 2048)
    names = [s for s, _, _ in HSDP_SERIES]
    rows = []
    for g in gpus_list:
        progress(f"hsdp: {g} GPUs")
        batch = a.sequences_per_gpu * g
        found: list[dict[str, Any] | None] = [
            predict_fitting(model, cluster, fsdp_at(g, a)),
            best_layout(
                model,
                cluster,
                g,
                batch,
                a.seq_len,
                Constraints(precision=a.precision, tp=[1], pp=[1], cp=[1], sharding=["fsdp"]),
            ),
            predict_fitting(model, cluster, fsdp_at(g, a, sharding="hsdp")),
            best_layout(
                model,
                cluster,
                g,
                batch,
                a.seq_len,
                Constraints(precision=a.precision, tp=[1], pp=[1], cp=[1], sharding=["hsdp"]),
            ),
            model_parallel_best(a, g),
        ]
        rows += [_row(s, g, r) for s, r in zip(names, found, strict=True) if r is not None]
    table = write_csv(out / "hsdp.csv", rows)
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 7.5))
    base = next(r for r in rows if r["series"] == names[0] and r["gpus"] == gpus_list[0])
    for s, color, marker in HSDP_SERIES:
        pts = sorted((r for r in rows if r["series"] == s), key=lambda r: r["gpus"])
        label = s + (f" [{families_label(pts)}]" if s == names[-1] else "")
        ax1.plot(
            [p["gpus"] for p in pts],
            [p["tokens_per_s_per_gpu"] for p in pts],
            marker=marker,
            color=color,
            label=label,
        )
        ax2.plot(
            [p["gpus"] for p in pts],
            [100 * p["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"] for p in pts],
            marker=marker,
            color=color,
            label=label,
        )
    for ax in (ax1, ax2):
        gpu_axis(ax, gpus_list, "GPUs (log scale)")
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.05)
    ax1.set_ylabel("tokens/s per GPU")
    ax2.set_ylabel(f"% of pure FSDP's tokens/s per GPU at {gpus_list[0]} GPUs")
    ax1.set_title("tokens/s per GPU")
    ax2.set_title(f"relative to pure FSDP at {gpus_list[0]} GPUs")
    _legend_below(fig, (ax1, ax2), ncol=2)
    fig.suptitle(
        f"HSDP against FSDP and FSDP + TP/PP ({a.model}, {a.cluster}, {a.sequences_per_gpu} x "
        f"{a.seq_len} tokens per GPU): HSDP was not run by the study",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0.12, 1, 0.96))
    figure = save_figure(fig, out / "hsdp.png", data=True)

    def at(s: str, g: int) -> dict[str, Any]:
        return next(r for r in rows if r["series"] == s and r["gpus"] == g)

    def change(s: str) -> float:
        return 100 * (
            at(s, gpus_list[-1])["tokens_per_s_per_gpu"]
            / at(s, gpus_list[0])["tokens_per_s_per_gpu"]
            - 1
        )

    present = [s for s in names if any(r["series"] == s for r in rows)]
    changes = {s: change(s) for s in present}
    last = gpus_list[-1]
    hsdp_best, mp, fsdp = at(names[3], last), at(names[4], last), at(names[0], last)
    gain_mp = 100 * (hsdp_best["tokens_per_s_per_gpu"] / mp["tokens_per_s_per_gpu"] - 1)
    gain_fsdp = 100 * (hsdp_best["tokens_per_s_per_gpu"] / fsdp["tokens_per_s_per_gpu"] - 1)
    verdict = (
        f"From {gpus_list[0]} to {last} GPUs per-GPU throughput changes by "
        + "; ".join(f"{v:+.1f} % with {s}" for s, v in changes.items())
        + f". At {last} GPUs the best HSDP layout ({hsdp_best['layout']}) gives "
        f"{hsdp_best['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU: {gain_fsdp:+.1f} % over pure FSDP and "
        f"{gain_mp:+.1f} % over the best FSDP + TP/PP layout ({mp['layout']}). HSDP keeps the sharded "
        "AllGather/ReduceScatter inside a shard group (fewer ranks, so fewer latency-bound ring steps) "
        "and crosses the replicas with one gradient AllReduce per layer, which NCCL runs as a tree "
        "(or NVLSTree) whose latency grows with log2 of the nodes; so "
        + (
            f"it flattens the diminishing-returns curve: {changes[names[3]] - changes[names[0]]:+.1f} "
            f"points against pure FSDP and {changes[names[3]] - changes[names[4]]:+.1f} points against "
            "the best FSDP + TP/PP."
            if changes[names[3]] > changes[names[0]]
            else "in this model it does not flatten the curve."
        )
    )
    md = ["## HSDP: the experiment the study did not run", f"![hsdp]({figure.name})", verdict]
    return StudyOutput(
        "hsdp",
        "HSDP",
        [figure],
        [table],
        md,
        {
            "rows": rows,
            "change_pct": changes,
            "series": names,
            "best_hsdp_2048": hsdp_best,
            "best_mp_2048": mp,
            "fsdp_2048": fsdp,
            "gain_over_mp_pct": gain_mp,
            "gain_over_fsdp_pct": gain_fsdp,
        },
    )
