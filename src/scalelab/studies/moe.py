"""`scalelab study moe`: a mixture-of-experts model against a dense model of equal active parameters.

At 64 -> 2048 GPUs (weak scaling, the study's sequences per GPU) the searched best layout of each
(EP, TP, PP, CP, DP for the MoE model; TP, PP, CP, DP for the dense one): throughput per GPU, MFU,
the share of the MoE step spent in dispatch/combine AllToAll, and, per EP degree, the best
throughput the search finds, so that the EP degree where throughput stops growing can be read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.config.catalog import load_model
from scalelab.config.model import ModelSpec
from scalelab.plotting import gpu_axis, markdown_table, pyplot, save_figure, write_csv
from scalelab.search import Constraints, describe, priced_space
from scalelab.studies.common import DEFAULT, Assumptions, StudyOutput, best_layout, load

MOE_MODEL = "qwen3-235b-a22b"
GPUS: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)
# More EP stops paying once the best layout with more EP is within this of the best over EP.
EP_PLATEAU = 0.01


def dense_twin(model: ModelSpec) -> ModelSpec:
    """A dense model with the MoE model's attention, layers and vocabulary and (to the nearest FFN
    column) its active parameters: one FFN per layer as wide as the active experts together."""
    data = model.model_dump()
    data.update(
        name=f"{model.name}-dense-twin",
        n_experts=0,
        experts_per_token=0,
        n_shared_experts=0,
        d_ff_expert=None,
        first_dense_layers=0,
        moe_layer_step=1,
        router_bias=False,
        source=f"dense twin of {model.name}: equal active parameters (scalelab study moe)",
    )
    one = ModelSpec(**(data | {"d_ff": 1})).n_params
    per_column = ModelSpec(**(data | {"d_ff": 2})).n_params - one
    d_ff = max(1, round((model.active_params - one) / per_column) + 1)
    return ModelSpec(**(data | {"d_ff": d_ff}))


def _best_per_ep(valid: Any, pred: Any) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    fits = pred["fits"]
    for e in sorted({int(x) for x in valid.ep}):
        idx = np.flatnonzero(fits & (valid.ep == e))
        if len(idx):
            i = int(idx[np.argmax(pred["tokens_per_s_per_gpu"][idx])])
            out[e] = {
                "tokens_per_s_per_gpu": float(pred["tokens_per_s_per_gpu"][i]),
                "all_to_all_share": float(pred["moe_all_to_all_s"][i] / pred["step_time_s"][i]),
                "layout": describe(valid.layout(i).model_dump()),
            }
    return out


def ep_stop(per_ep: dict[int, dict[str, Any]]) -> int | None:
    """The smallest EP degree whose best throughput is within EP_PLATEAU of the best over EP."""
    if not per_ep:
        return None
    top = max(v["tokens_per_s_per_gpu"] for v in per_ep.values())
    return min(e for e, v in per_ep.items() if v["tokens_per_s_per_gpu"] >= (1 - EP_PLATEAU) * top)


def rows(
    a: Assumptions = DEFAULT,
    gpus_list: tuple[int, ...] = GPUS,
    progress: Callable[[str], None] = lambda s: None,
    model_name: str = MOE_MODEL,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per scale: the MoE model's and its dense twin's best layouts; per scale and EP: the best."""
    _, cluster = load(a)
    moe = load_model(model_name)
    dense = dense_twin(moe)
    constraints = Constraints(precision=a.precision)
    scale_rows: list[dict[str, Any]] = []
    ep_rows: list[dict[str, Any]] = []
    for gpus in gpus_list:
        progress(f"moe: {moe.name} and its dense twin on {gpus} GPUs")
        batch = gpus * a.sequences_per_gpu
        valid, pred = priced_space(
            moe, cluster, gpus=gpus, global_batch=batch, seq_len=a.seq_len, constraints=constraints
        )
        per_ep = _best_per_ep(valid, pred) if pred is not None else {}
        stop = ep_stop(per_ep)
        row: dict[str, Any] = {"gpus": gpus, "global_batch": batch, "ep_stop": stop}
        if pred is not None and pred["fits"].any():
            fit = np.flatnonzero(pred["fits"])
            i = int(fit[np.argmax(pred["tokens_per_s"][fit])])
            layout = valid.layout(i)
            row |= {
                "moe_layout": describe(layout.model_dump()),
                "moe_ep": layout.ep,
                "moe_tokens_per_s_per_gpu": float(pred["tokens_per_s_per_gpu"][i]),
                "moe_mfu": float(pred["mfu"][i]),
                "moe_all_to_all_share": float(pred["moe_all_to_all_s"][i] / pred["step_time_s"][i]),
            }
        d = best_layout(dense, cluster, gpus, batch, a.seq_len, constraints)
        if d is not None:
            row |= {
                "dense_layout": describe(d["layout"]),
                "dense_tokens_per_s_per_gpu": d["tokens_per_s_per_gpu"],
                "dense_mfu": d["mfu"],
            }
        if "moe_tokens_per_s_per_gpu" in row and d is not None:
            row["moe_over_dense"] = row["moe_tokens_per_s_per_gpu"] / d["tokens_per_s_per_gpu"]
        scale_rows.append(row)
        ep_rows += [{"gpus": gpus, "ep": e, **v} for e, v in per_ep.items()]
    return scale_rows, ep_rows


def _figures(
    scale_rows: list[dict[str, Any]], ep_rows: list[dict[str, Any]], name: str, out: Path
) -> list[Path]:
    plt = pyplot()
    gpus = [r["gpus"] for r in scale_rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for key, label, marker in (
        ("moe_tokens_per_s_per_gpu", f"{name} (MoE), best EP/TP/PP/CP/DP layout", "o"),
        ("dense_tokens_per_s_per_gpu", "dense twin (equal active parameters), best layout", "s"),
    ):
        ys = [r.get(key, np.nan) for r in scale_rows]
        ax1.plot(gpus, ys, marker=marker, label=label)
    ax1.set_ylabel("tokens/s per GPU (predicted)")
    ax1.set_title("throughput per GPU")
    ax1.set_ylim(bottom=0)
    gpu_axis(ax1, gpus)
    ax1.legend(fontsize=8, loc="lower right")
    ax2.plot(
        gpus,
        [100 * r.get("moe_all_to_all_share", np.nan) for r in scale_rows],
        marker="o",
        color="tab:red",
    )
    ax2.set_ylabel("AllToAll dispatch + combine (% of step time)")
    ax2.set_title("MoE: share of the step in AllToAll (best layout)")
    ax2.set_ylim(bottom=0)
    gpu_axis(ax2, gpus)
    fig.tight_layout()
    first = save_figure(fig, out / "moe_scaling.png", data=True)

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for g in gpus:
        pts = sorted((r["ep"], r["tokens_per_s_per_gpu"]) for r in ep_rows if r["gpus"] == g)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{g} GPUs")
    for r in scale_rows:
        stop = r.get("ep_stop")
        match = [e for e in ep_rows if e["gpus"] == r["gpus"] and e["ep"] == stop]
        if match:
            ax.scatter([stop], [match[0]["tokens_per_s_per_gpu"]], s=120, facecolors="none",
                       edgecolors="black")  # fmt: skip
    gpu_axis(ax, sorted({r["ep"] for r in ep_rows}) or [1], "expert-parallel degree (EP, ranks)")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("best tokens/s per GPU at that EP (predicted)")
    ax.set_title(f"{name}: where EP stops paying (circled)")
    if ep_rows:
        ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    second = save_figure(fig, out / "moe_ep.png", data=True)
    return [first, second]


def run(
    out: Path, a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> StudyOutput:
    name = MOE_MODEL
    scale_rows, ep_rows = rows(a, GPUS, progress, model_name=name)
    figures = _figures(scale_rows, ep_rows, name, out)
    tables = [
        write_csv(out / "moe_scaling.csv", scale_rows),
        write_csv(out / "moe_ep.csv", ep_rows),
    ]
    table = markdown_table(
        [
            [
                r["gpus"],
                r.get("moe_layout", "none fits"),
                f"{r.get('moe_tokens_per_s_per_gpu', float('nan')):,.0f}",
                f"{100 * r.get('moe_mfu', float('nan')):.1f} %",
                f"{100 * r.get('moe_all_to_all_share', float('nan')):.1f} %",
                r.get("ep_stop"),
                r.get("dense_layout", "none fits"),
                f"{r.get('dense_tokens_per_s_per_gpu', float('nan')):,.0f}",
                f"{r.get('moe_over_dense', float('nan')):.2f}",
            ]
            for r in scale_rows
        ],
        [
            "GPUs",
            "MoE best layout",
            "MoE tokens/s/GPU",
            "MoE MFU",
            "AllToAll share",
            "EP stops paying at",
            "dense twin best layout",
            "dense tokens/s/GPU",
            "MoE / dense",
        ],
    )
    md = [
        f"## Mixture of experts: {name} against its dense twin",
        f"![moe scaling]({figures[0].name})",
        f"![moe ep]({figures[1].name})",
        table,
        "The dense twin keeps the MoE model's attention, layers and vocabulary and one FFN per layer "
        "as wide as the active experts together (equal active parameters, so equal model FLOPs per "
        "token). MoE assumptions (perf/moe.py): dispatch and combine are NCCL AllToAll, not "
        "overlapped with compute; the slowest EP rank gets 1.25x the mean tokens (Switch/GShard "
        "capacity factor); grouped GEMMs pad each expert's rows to a 128-row tile (assumed). "
        f"'EP stops paying at' is the smallest EP whose best layout is within {EP_PLATEAU:.0%} of "
        "the best over every EP degree. Predicted, not measured.",
    ]
    return StudyOutput(
        name="moe",
        title=f"{name} vs a dense model of equal active parameters, 64 -> 2048 GPUs",
        figures=figures,
        tables=tables,
        markdown=md,
        data={"rows": scale_rows, "ep_rows": ep_rows},
    )
