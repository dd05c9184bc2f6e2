"""Refit the shipped clusters' parameters to public data with calibrate's core, and compare.

For each fit: the data, the fitted values beside the catalog's (clusters.yaml), and for the compute
fits the validate error (MAPE of tokens/s per GPU on that cluster's published rows) with the
parameters at their uncalibrated defaults and at the catalog values. This is the provenance of
the catalog; see docs/calibration.md.

Run: `python benchmarks/fit_catalog.py` (about a minute).
"""

from __future__ import annotations

import csv
from collections import Counter
from importlib import resources

import numpy as np

from scalelab.calibrate import CommPoint, StepPoint, fit, fit_stack
from scalelab.config.catalog import load_cluster, load_stack
from scalelab.config.hardware import ClusterParams
from scalelab.validate import load_cases, predict_cases


def _csv(name: str) -> list[dict[str, str]]:
    return list(
        csv.DictReader(
            resources.files("scalelab").joinpath(f"data/{name}").read_text().splitlines()
        )
    )


def fig2_points() -> list[CommPoint]:
    pts = []
    for r in _csv("paper_fig2_allreduce_busbw.csv"):
        n = int(r["num_nodes"]) * int(r["gpus_per_node"])
        nbytes = float(r["message_bytes"])
        time_s = nbytes * 2 * (n - 1) / n / (float(r["busbw_GBps"]) * 1e9)
        pts.append(CommPoint("all_reduce", nbytes, n, int(r["gpus_per_node"]), time_s, "fig2"))
    return pts


def node_sweep_points(prefix: str) -> list[CommPoint]:
    pts = []
    for r in _csv("collectives_busbw.csv"):
        if (
            r["gpu_type"].startswith(prefix)
            and r["num_nodes"] == "1"
            and r["num_gpus"] == "8"
            and r["collective"] == "all_reduce"
            and r["message_bytes"]
            and r["busbw_GBps"]
        ):
            nbytes = float(r["message_bytes"])
            time_s = (
                nbytes * 2 * 7 / 8 / (float(r["busbw_GBps"]) * 1e9)
            )  # nccl-tests busbw definition
            pts.append(CommPoint("all_reduce", nbytes, 8, 8, time_s, prefix))
    return pts


def run_cases(prefix: str) -> list:
    return [case for case in load_cases()[0] if case.cluster.name.startswith(prefix)]


def step_points(cases: list) -> list[StepPoint]:
    """Each source weighs the same (rows weighted 1/sqrt(rows of their source)): one codebase's
    many rows must not set the hardware's efficiency alone. Each row keeps its own node type."""
    per_source = Counter(c.source for c in cases)
    scale = np.sqrt(len(cases) / len(per_source))
    return [c.step_point(weight=scale / np.sqrt(per_source[c.source])) for c in cases]


def mape(cases: list, params: dict | None) -> float:
    moved = []
    for c in cases:
        cluster = (
            c.cluster
            if params is None
            else c.cluster.model_copy(update={"params": c.cluster.params.model_copy(update=params)})
        )
        moved.append(type(c)(c.run, c.model, cluster, c.layout, c.stack))
    measured = np.array([c.measured_tokens_per_s_per_gpu for c in cases])
    return float(np.mean(np.abs(predict_cases(moved) / measured - 1)))


def show(title: str, cluster_name: str, result, extra: str = "") -> None:
    catalog = load_cluster(cluster_name).params.model_dump()
    print(f"\n## {title} ({cluster_name}) {extra}")
    print("| parameter | fitted now | catalog |")
    print("|---|---:|---:|")
    for name in result.free:
        now = result.fitted.get(name)
        print(
            f"| {name} | {'undetermined' if now is None else f'{now:.4g}'} | {catalog[name]:.4g} |"
        )
    print(
        f"mean |error| of the fitted observations: {result.error_before * 100:.1f} % -> {result.error_after * 100:.1f} %"
    )


def main() -> None:
    h100 = load_cluster("h100-ib")
    a100 = load_cluster("a100-ib")
    show(
        "NVLink, 8-GPU A100 all_reduce sweep",
        "a100-ib",
        fit(
            a100,
            node_sweep_points("A100"),
            [],
            [
                "nvlink_bus_efficiency",
                "nvlink_step_latency_us",
                "base_latency_us",
                "bandwidth_ramp_mib",
            ],
        ),
    )
    show(
        "NVLink, 8-GPU H200 all_reduce sweep",
        "h100-ib",
        fit(
            h100,
            node_sweep_points("H200 (8x"),
            [],
            [
                "nvlink_bus_efficiency",
                "nvlink_step_latency_us",
                "base_latency_us",
                "bandwidth_ramp_mib",
            ],
        ),
    )
    show(
        "network, the study's Figure 2 AllReduce",
        "h100-ib",
        fit(
            h100,
            fig2_points(),
            [],
            [
                "net_bus_efficiency",
                "net_base_latency_us",
                "tree_level_latency_us",
                "net_scale_degradation",
            ],
        ),
    )
    defaults = ClusterParams().model_dump()
    for prefix, names in (
        ("a100-ib", ["gemm_efficiency", "attention_efficiency", "hbm_efficiency"]),
        ("v100-ib", ["gemm_efficiency", "gemm_half_gflop", "hbm_efficiency"]),
        ("h100-hbm2e", ["gemm_efficiency", "attention_efficiency", "hbm_efficiency"]),
    ):
        cases = run_cases(prefix)
        base = load_cluster(cases[0].cluster.name)
        result = fit(base, [], step_points(cases), names)
        uncalibrated = {n: defaults[n] for n in names}
        show(
            "compute, published runs",
            cases[0].cluster.name,
            result,
            f"- {len(cases)} rows; validate MAPE with default parameters {mape(cases, uncalibrated) * 100:.1f} %, "
            f"refit now {mape(cases, result.fitted) * 100:.1f} %, catalog {mape(cases, None) * 100:.1f} %",
        )
    stack_fits()


# Stack parameters fitted on the runs of the stack's own source (in-sample numbers: validate's
# cross-validation drops them when that source is held out). (stack, FP8 recipe or None, names.)
STACK_FITS: tuple[tuple[str, str | None, list[str]], ...] = (
    ("aleph-alpha-scaling", None, ["tp_layer_overhead_us"]),
    ("torchtitan", "fp8-tensorwise", ["fp8_efficiency_ratio"]),
    ("torchtitan", "fp8-blockwise", ["fp8_efficiency_ratio"]),
)


def stack_fits() -> None:
    """Each stack's fitted numbers (calibrate.fit_stack), the clusters' parameters held fixed."""
    cases = load_cases()[0]
    for name, recipe, names in STACK_FITS:
        chosen = [
            c
            for c in cases
            if c.stack.name == name and (recipe is None or str(c.run.precision) == recipe)
        ]
        points = [c.step_point(stack=c.stack.unfitted()) for c in chosen]
        fitted = fit_stack(points, names)
        stack = load_stack(name)
        catalog = (
            {"fp8_efficiency_ratio": stack.fp8_recipe_ratios.get(recipe)}
            if recipe
            else stack.params.model_dump()
        )
        groups = sorted({c.source for c in chosen})
        print(
            f"\n## stack {name}{f' ({recipe})' if recipe else ''}: {len(chosen)} runs of {groups}"
        )
        print("| parameter | fitted now | catalog |")
        print("|---|---:|---:|")
        for n in names:
            print(f"| {n} | {fitted[n]:.4g} | {catalog.get(n)} |")


if __name__ == "__main__":
    main()
