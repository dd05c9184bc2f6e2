"""Leave-one-source-out cross-validation: refit the cluster parameters without each source group."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any

import numpy as np

from scalelab.config.catalog import load_cluster
from scalelab.config.hardware import ClusterSpec
from scalelab.validate.cases import RunCase, measured, predict_cases_full
from scalelab.validate.stats import by_source, sweep_spearman

# Parameters refitted by the cross-validation: the compute efficiencies that docs/calibration.md
# fits to published runs (collective parameters come from nccl-tests sweeps, not from these runs).
CV_PARAMETERS = ("gemm_efficiency", "attention_efficiency", "hbm_efficiency")
CV_FP8_PARAMETER = "fp8_efficiency_ratio"
CV_GROUPS_PER_SOURCE = 4  # model/hardware groups per source group in one fit (for speed)
CV_MAX_NFEV = 4  # solver evaluations per fit (30 give the same held-out MAPE to 0.1 point)
CV_MIN_CLUSTER_ROWS = 10  # fewer rows of a cluster from other sources: fit on all of them pooled


def _spread(cases: list[RunCase], groups_per_source: int) -> list[RunCase]:
    """Every run of at most `groups_per_source` (model, hardware) groups per source group, evenly
    spaced in file order: the predictor evaluates a group in one call, so this bounds a fit's cost
    while keeping every source's layouts of those models."""
    by_source: dict[str, dict[str, list[RunCase]]] = defaultdict(dict)
    for c in sorted(cases, key=lambda c: c.index):
        key = c.model.model_dump_json() + c.cluster.model_dump_json()
        by_source[c.source].setdefault(key, []).append(c)
    out: list[RunCase] = []
    for groups in by_source.values():
        ordered = list(groups.values())
        picks = np.linspace(0, len(ordered) - 1, min(groups_per_source, len(ordered)))
        for i in sorted(set(picks.round().astype(int).tolist())):
            out += ordered[i]
    return out


def _fit(base: ClusterSpec, train: list[RunCase]) -> dict[str, float]:
    """calibrate's core on step times, each source group weighted equally; every run keeps its
    own GPU and node. fp8_efficiency_ratio is refitted only when the runs include fp8 ones and
    otherwise set to its unfitted default (the catalog's value may come from the held-out runs)."""
    from scalelab.calibrate import fit
    from scalelab.config.hardware import ClusterParams

    train = _spread(train, CV_GROUPS_PER_SOURCE)
    per_source = Counter(c.source for c in train)
    scale = math.sqrt(len(train) / len(per_source))
    points = [
        c.step_point(source=c.source, weight=scale / math.sqrt(per_source[c.source])) for c in train
    ]
    names = list(CV_PARAMETERS)
    has_fp8 = any(str(c.layout.precision) == "fp8" for c in train)
    if has_fp8:
        names.append(CV_FP8_PARAMETER)
    # Start from the unfitted defaults: the catalog's values were fitted with the held-out runs.
    defaults = ClusterParams().model_dump()
    start = base.model_copy(
        update={"params": base.params.model_copy(update={n: defaults[n] for n in names})}
    )
    fitted = dict(fit(start, [], points, names, max_nfev=CV_MAX_NFEV).fitted)
    if not has_fp8:
        fitted[CV_FP8_PARAMETER] = float(ClusterParams().fp8_efficiency_ratio)
    return fitted


def cross_validate(cases: list[RunCase]) -> dict[str, Any]:
    """Leave one source group out and predict it with parameters fitted without it.

    For each cluster the held-out runs use: its compute parameters refitted on the other groups'
    runs of that cluster (at least CV_MIN_CLUSTER_ROWS of them); otherwise the parameters fitted,
    in the same fold, on the cluster with the most runs of the other groups (transfer across
    GPUs: no measurement of this hardware is left to fit on)."""
    groups = sorted({c.source for c in cases})
    predicted = np.zeros(len(cases))
    detail: dict[str, dict[str, Any]] = {}
    cache: dict[tuple[str, frozenset[str]], dict[str, float]] = {}

    def fitted_on(cluster: str, train: list[RunCase]) -> dict[str, float]:
        key = (cluster, frozenset(c.source for c in train))
        if key not in cache:
            cache[key] = _fit(load_cluster(cluster), train)
        return cache[key]

    for held_out in groups:
        test_idx = [i for i, c in enumerate(cases) if c.source == held_out]
        train = [c for c in cases if c.source != held_out]
        per_cluster: dict[str, list[RunCase]] = defaultdict(list)
        for c in train:
            per_cluster[c.run.cluster].append(c)
        richest = max(per_cluster, key=lambda k: len(per_cluster[k]))
        params: dict[str, dict[str, float]] = {}
        how: dict[str, str] = {}
        for name in sorted({cases[i].run.cluster for i in test_idx}):
            same = per_cluster.get(name, [])
            if len(same) >= CV_MIN_CLUSTER_ROWS:
                params[name] = fitted_on(name, same)
                how[name] = (
                    f"refit on {len(same)} runs of {len({c.source for c in same})} other source groups"
                )
            else:
                params[name] = fitted_on(richest, per_cluster[richest])
                how[name] = (
                    f"no other source group on this cluster: parameters fitted on {richest} "
                    f"({len(per_cluster[richest])} runs of other source groups)"
                )
        # A stack's numbers fitted on the held-out group are not used for it (behaviours stay).
        test = [
            replace(c, stack=c.stack.unfitted()) if held_out in c.stack.fitted_on else c
            for c in (cases[i] for i in test_idx)
        ]
        predicted[test_idx] = predict_cases_full(test, params)["tokens_per_s_per_gpu"]
        detail[held_out] = {
            "clusters": how,
            "fitted": {k: {n: round(v, 4) for n, v in p.items()} for k, p in params.items()},
        }
    actual = measured(cases)
    ape = np.abs(predicted - actual) / actual
    per_source = by_source([c.source for c in cases], predicted, actual)
    for src, stats in per_source.items():
        stats.update(detail[src])
    rhos = sweep_spearman([c.sweep for c in cases], predicted, actual)
    return {
        "mape_tokens_per_gpu": float(ape.mean()),
        "mape_source_balanced": float(np.mean([s["mape"] for s in per_source.values()])),
        "within_20_pct": float((ape <= 0.2).mean()),
        "spearman_median": float(np.median(rhos)) if rhos else None,
        "by_source": per_source,
        "method": (
            f"leave one source group out; refit {', '.join(CV_PARAMETERS)} (+ {CV_FP8_PARAMETER} "
            f"where fp8 runs remain) with calibrate's core ({CV_MAX_NFEV} solver evaluations), on "
            f"the runs of at most {CV_GROUPS_PER_SOURCE} model/hardware groups per source group, "
            "each source group weighted equally"
        ),
        "predicted": predicted.tolist(),
    }
