"""The study's findings, predicted under one set of assumptions, each checked against a tolerance."""

from __future__ import annotations

import csv
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from scalelab.config.catalog import load_cluster
from scalelab.search import Constraints
from scalelab.studies.common import (
    DEFAULT,
    Assumptions,
    best_layout,
    fsdp_at,
    load,
    predict_fitting,
)

CROSSOVER_GPUS = (16, 32, 64, 128, 256, 512, 1024, 2048)
SHORT = {
    "F1": "per-GPU tokens/s, 128 -> 2048 GPUs",
    "F2": "GPU power, 128 -> 2048 GPUs",
    "F3": "TP gain over FSDP at 2048 GPUs",
    "F4": "MFU on A100",
    "F5": "MFU on H100",
    "F6": "MP beats FSDP beyond (GPUs)",
    "F7": "best TP/PP degree at 2048",
    "F8": "global tokens/s, 2048 / 128",
    "F9": "energy per token, 2048 / 128",
}


@dataclass(frozen=True)
class Finding:
    id: str
    quantity: str
    paper: float
    predicted: float
    unit: str
    tolerance: str
    low: float
    high: float
    how: str

    @property
    def short(self) -> str:
        return SHORT.get(self.id, self.quantity)

    @property
    def within(self) -> bool:
        return self.low <= self.predicted <= self.high

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "quantity": self.quantity,
            "paper": self.paper,
            "predicted": self.predicted,
            "unit": self.unit,
            "tolerance": self.tolerance,
            "within": self.within,
            "how": self.how,
        }


def paper_values() -> dict[str, dict[str, str]]:
    text = resources.files("scalelab").joinpath("data/paper_findings.csv").read_text()
    return {r["id"]: r for r in csv.DictReader(text.splitlines())}


def _mp_best(a: Assumptions, gpus: int, tps: list[int], pps: list[int]) -> dict[str, Any] | None:
    model, cluster = load(a)
    return best_layout(
        model,
        cluster,
        gpus,
        a.sequences_per_gpu * gpus,
        a.seq_len,
        Constraints(precision=a.precision, tp=tps, pp=pps, cp=[1], sharding=["fsdp"]),
    )


def _fsdp(a: Assumptions, gpus: int, cluster_name: str | None = None) -> dict[str, Any]:
    model, cluster = load(a)
    if cluster_name is not None:
        cluster = load_cluster(cluster_name)
    return predict_fitting(model, cluster, fsdp_at(gpus, a))


def model_parallel_best(a: Assumptions, gpus: int) -> dict[str, Any] | None:
    """Best FSDP layout with TP or PP of degree 2..16 (and no CP)."""
    candidates = [
        _mp_best(a, gpus, [2, 4, 8, 16], [1]),
        _mp_best(a, gpus, [1, 2, 4, 8, 16], [2, 4, 8, 16]),
    ]
    found = [c for c in candidates if c is not None]
    return max(found, key=lambda r: r["tokens_per_s"]) if found else None


def compute(
    a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> list[Finding]:
    paper = paper_values()
    progress("findings: weak scaling 128 -> 2048")
    f128, f2048 = _fsdp(a, 128), _fsdp(a, 2048)
    f1 = 100 * (f2048["tokens_per_s_per_gpu"] / f128["tokens_per_s_per_gpu"] - 1)
    f2 = 100 * (f2048["power_w_per_gpu"] / f128["power_w_per_gpu"] - 1)
    progress("findings: tensor parallelism at 2048")
    tp_best = _mp_best(a, 2048, [2, 4], [1])
    f3 = 100 * (tp_best["tokens_per_s"] / f2048["tokens_per_s"] - 1) if tp_best else float("nan")
    progress("findings: hardware")
    f4 = 100 * _fsdp(a, a.hardware_scale_gpus, "a100-ib")["mfu"]
    f5 = 100 * _fsdp(a, a.hardware_scale_gpus, a.cluster)["mfu"]
    crossover = float("nan")
    for g in CROSSOVER_GPUS:
        progress(f"findings: crossover at {g} GPUs")
        mp = model_parallel_best(a, g)
        if mp is not None and mp["tokens_per_s"] > _fsdp(a, g)["tokens_per_s"]:
            crossover = float(g)
            break
    progress("findings: best model-parallel degree at 2048")
    mp2048 = model_parallel_best(a, 2048)
    degree = float(max(mp2048["layout"]["tp"], mp2048["layout"]["pp"])) if mp2048 else float("nan")
    f8 = 16 * (1 + f1 / 100)
    f9 = (1 + f2 / 100) / (1 + f1 / 100)
    p = {k: float(v["value"]) for k, v in paper.items() if k != "F7"}
    f8_lo, f8_hi = 16 * (1 + (p["F1"] - 5) / 100), 16 * (1 + (p["F1"] + 5) / 100)
    f9_box = [
        (1 + (p["F2"] + d2) / 100) / (1 + (p["F1"] + d1) / 100)
        for d1, d2 in itertools.product((-5, 5), (-3, 3))
    ]

    def q(fid: str) -> str:
        return paper[fid]["quantity"]

    return [
        Finding(
            "F1",
            q("F1"),
            p["F1"],
            f1,
            "%",
            "±5 points",
            p["F1"] - 5,
            p["F1"] + 5,
            "pure FSDP, tokens/s per GPU at 2048 vs 128 GPUs",
        ),
        Finding(
            "F2",
            q("F2"),
            p["F2"],
            f2,
            "%",
            "±3 points",
            p["F2"] - 3,
            p["F2"] + 3,
            "pure FSDP, GPU board power at 2048 vs 128 GPUs",
        ),
        Finding(
            "F3",
            q("F3"),
            p["F3"],
            f3,
            "%",
            "±15 points",
            p["F3"] - 15,
            p["F3"] + 15,
            f"best FSDP + TP 2-4 ({tp_best['layout']['tp'] if tp_best else '-'}) vs pure FSDP, global tokens/s at 2048 GPUs",
        ),
        Finding(
            "F4",
            q("F4"),
            p["F4"],
            f4,
            "%",
            "±5 points",
            p["F4"] - 5,
            p["F4"] + 5,
            f"pure FSDP on a100-ib at {a.hardware_scale_gpus} GPUs",
        ),
        Finding(
            "F5",
            q("F5"),
            p["F5"],
            f5,
            "%",
            "±5 points",
            p["F5"] - 5,
            p["F5"] + 5,
            f"pure FSDP on {a.cluster} at {a.hardware_scale_gpus} GPUs",
        ),
        Finding(
            "F6",
            q("F6"),
            p["F6"],
            crossover,
            "GPUs",
            "crossover between 64 and 256",
            64,
            256,
            "smallest GPU count at which the best FSDP + TP/PP layout beats pure FSDP",
        ),
        Finding(
            "F7",
            q("F7"),
            3.0,
            degree,
            "degree",
            "best TP or PP degree of 2 or 4",
            2,
            4,
            "TP or PP degree of the best FSDP + TP/PP layout at 2048 GPUs (paper: 2-4)",
        ),
        Finding(
            "F8",
            q("F8"),
            p["F8"],
            f8,
            "ratio",
            "from F1's ±5 points",
            f8_lo,
            f8_hi,
            "16 x (1 + F1), global throughput gain of 16x the GPUs",
        ),
        Finding(
            "F9",
            q("F9"),
            p["F9"],
            f9,
            "ratio",
            "from F1's and F2's tolerances",
            min(f9_box),
            max(f9_box),
            "(1 + F2) / (1 + F1), GPU energy per token",
        ),
    ]


SENSITIVITY = (
    {"sequences_per_gpu": 1, "seq_len": 2048},
    {"sequences_per_gpu": 1, "seq_len": 4096},
    {"sequences_per_gpu": 2, "seq_len": 2048},
    {"sequences_per_gpu": 2, "seq_len": 4096},
    {"sequences_per_gpu": 1, "seq_len": 4096, "hardware_scale_gpus": 8},
    {"sequences_per_gpu": 1, "seq_len": 4096, "hardware_scale_gpus": 256},
)


def sensitivity(
    a: Assumptions = DEFAULT, progress: Callable[[str], None] = lambda s: None
) -> list[dict[str, Any]]:
    """The findings under other choices of what the study does not state."""
    rows = []
    for change in SENSITIVITY:
        variant = replace(a, **change)  # type: ignore[arg-type]
        progress(f"sensitivity: {change}")
        found = compute(variant)
        rows.append(
            {
                "assumption": ", ".join(f"{k}={v}" for k, v in change.items()),
                "chosen": variant == a,
                **{f.id: f.predicted for f in found if f.id <= "F7"},
                "within": sum(f.within for f in found if f.id <= "F7"),
            }
        )
    return rows
