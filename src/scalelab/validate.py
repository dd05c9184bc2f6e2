"""The predictor against measured training runs: in-sample and leave-one-source-out accuracy.

Runs come typed (`scalelab.runs`): the shipped `published_runs_typed.csv`, another typed file, or a
raw CSV in the `published_runs.csv` column layout read by the generic importer. This module only
does statistics: it predicts every run with its cluster's parameters, reports the error of tokens/s
per GPU per source group, the rank correlation of layouts within sweeps, memory against measured
peaks, and (`cross_validate`) refits the cluster parameters without each source group in turn.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from scalelab.config.catalog import load_cluster
from scalelab.config.hardware import ClusterSpec
from scalelab.config.layout import Layout, LayoutTable, validate
from scalelab.config.model import ModelSpec
from scalelab.errors import InputError
from scalelab.perf.predict import predict
from scalelab.runs.importer import Reading, import_rows, read_raw_csv, read_review
from scalelab.runs.schema import Run, is_typed_header, read_runs

TYPED_DATA = "data/published_runs_typed.csv"
SKIPPED_DATA = "data/published_runs_skipped.csv"
RAW_DATA = "data/published_runs.csv"
REVIEW_DATA = "data/published_runs_review.csv"

# Parameters refitted by the cross-validation: the compute efficiencies that docs/calibration.md
# fits to published runs (collective parameters come from nccl-tests sweeps, not from these runs).
CV_PARAMETERS = ("gemm_efficiency", "attention_efficiency", "hbm_efficiency")
CV_FP8_PARAMETER = "fp8_efficiency_ratio"
CV_GROUPS_PER_SOURCE = 4  # model/hardware groups per source group in one fit (for speed)
CV_MAX_NFEV = 4  # solver evaluations per fit (30 give the same held-out MAPE to 0.1 point)
CV_MIN_CLUSTER_ROWS = 10  # fewer rows of a cluster from other sources: fit on all of them pooled


@dataclass
class RunCase:
    """One run the predictor can express: the run and its predictor inputs."""

    run: Run
    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout

    @property
    def index(self) -> int:
        return self.run.row

    @property
    def source(self) -> str:
        return self.run.source_group

    @property
    def measured_tokens_per_s_per_gpu(self) -> float:
        return self.run.tokens_per_s_per_gpu

    @property
    def sweep(self) -> tuple[str, str, str, int]:
        """Sweeps are defined by the data: same source group, model, GPU and sequence length."""
        return (self.run.source_group, self.run.model, self.run.gpu, self.run.seq_len)


@dataclass
class ValidationReport:
    rows_used: int
    rows_skipped: int
    skipped_by_reason: dict[str, int]
    rows_predicted_not_to_fit: int
    mape_tokens_per_gpu: float
    within_20_pct: float
    median_spearman: float | None
    sweeps: int
    by_source: dict[str, dict[str, Any]]
    memory: dict[str, Any]
    assumed_fields: dict[str, int]
    cross_validated: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self, with_rows: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rows_used": self.rows_used,
            "rows_skipped": self.rows_skipped,
            "skipped_by_reason": self.skipped_by_reason,
            "rows_predicted_not_to_fit": self.rows_predicted_not_to_fit,
            "mape_tokens_per_gpu": self.mape_tokens_per_gpu,
            "within_20_pct": self.within_20_pct,
            "median_spearman_within_sweeps": self.median_spearman,
            "spearman_median": self.median_spearman,
            "sweeps": self.sweeps,
            "by_source": self.by_source,
            "memory": self.memory,
            "rows_with_assumed_value": self.assumed_fields,
        }
        if self.cross_validated is not None:
            out["cross_validated"] = self.cross_validated
        if with_rows:
            out["rows"] = self.rows
        return out


# Loading ---------------------------------------------------------------------------------------


def _package_text(name: str) -> str:
    return resources.files("scalelab").joinpath(name).read_text()


def shipped_readings() -> list[Reading]:
    """The shipped raw file read by the importer with the shipped review sheet (for --explain)."""
    return import_rows(
        read_raw_csv(_package_text(RAW_DATA)), read_review(_package_text(REVIEW_DATA))
    )


def load_runs(
    data: Path | None = None, review: Path | None = None
) -> tuple[list[Run], list[tuple[int, str]]]:
    """Runs and the (row, reason) of every row that could not be read.

    No `data`: the shipped typed file and the skips recorded beside it. A typed file (first column
    schema_version) is read as it is; any other CSV goes through the importer (with `review`).
    """
    if data is None:
        runs = read_runs(_package_text(TYPED_DATA))
        records = csv.DictReader(io.StringIO(_package_text(SKIPPED_DATA)))
        return runs, [(int(r["row"]), r["reason"]) for r in records]
    if not data.is_file():
        raise InputError("data", f"no such file: {data}")
    text = data.read_text()
    first = text.splitlines()[0] if text.strip() else ""
    if is_typed_header(first.split(",")):
        return read_runs(text, "data"), []
    if review is not None and not review.is_file():
        raise InputError("review", f"no such file: {review}")
    entries = read_review(review.read_text()) if review else []
    readings = import_rows(read_raw_csv(text), entries)
    runs = [r.run for r in readings if r.run is not None]
    return runs, [(r.row, r.skipped) for r in readings if r.skipped]


def case_from_run(run: Run) -> RunCase | str:
    """The predictor's inputs for a run, or why the predictor cannot express it."""
    try:
        model = run.model_spec()
        cluster = run.cluster_spec()
        layout = run.layout()
    except (ValidationError, ValueError) as exc:
        return f"not expressible by the predictor ({str(exc).splitlines()[0]})"
    errors = validate(layout, model, cluster)
    if errors:
        return f"layout not valid for the predictor ({errors[0].field})"
    return RunCase(run, model, cluster, layout)


def load_cases(
    data: Path | None = None, review: Path | None = None
) -> tuple[list[RunCase], list[tuple[int, str]]]:
    runs, skipped = load_runs(data, review)
    cases: list[RunCase] = []
    for run in runs:
        case = case_from_run(run)
        if isinstance(case, str):
            skipped.append((run.row, case))
        else:
            cases.append(case)
    return cases, skipped


# Prediction ------------------------------------------------------------------------------------


def predict_cases_full(
    cases: list[RunCase], params: dict[str, dict[str, float]] | None = None
) -> dict[str, np.ndarray]:
    """Tokens/s per GPU, the memory verdict and the predicted peak memory (GiB) of every case.

    `params` overrides cluster parameters by catalog cluster name (for cross-validation).
    """
    out = {
        "tokens_per_s_per_gpu": np.zeros(len(cases)),
        "fits": np.zeros(len(cases), dtype=bool),
        "memory_gib": np.zeros(len(cases)),
    }
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    clusters: dict[str, ClusterSpec] = {}
    for i, case in enumerate(cases):
        cluster = case.cluster
        update = (params or {}).get(case.run.cluster)
        if update:
            cluster = cluster.model_copy(
                update={"params": cluster.params.model_copy(update=update)}
            )
        key = cluster.model_dump_json()
        clusters[key] = cluster
        groups[(case.model.model_dump_json(), key)].append(i)
    for (_, key), idx in groups.items():
        table = LayoutTable.from_layouts([cases[i].layout for i in idx])
        prediction = predict(cases[idx[0]].model, clusters[key], table)
        out["tokens_per_s_per_gpu"][idx] = prediction["tokens_per_s_per_gpu"]
        out["fits"][idx] = prediction["fits"]
        out["memory_gib"][idx] = prediction["memory_total_bytes"] / 2**30
    return out


def predict_cases(cases: list[RunCase]) -> np.ndarray:
    """Predicted tokens/s per GPU of each case with its catalog cluster's parameters."""
    return predict_cases_full(cases)["tokens_per_s_per_gpu"]


# Statistics ------------------------------------------------------------------------------------


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given the mean of the ranks they span (as scipy.stats.rankdata)."""
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    ranks = np.empty(len(values))
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho with average ranks for ties; nan when either side is constant."""
    ra, rb = average_ranks(a), average_ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def sweep_spearman(cases: list[RunCase], predicted: np.ndarray) -> list[float]:
    """Rho of predicted against measured within each sweep of at least 3 runs that vary."""
    sweeps: dict[tuple[str, str, str, int], list[int]] = defaultdict(list)
    for i, c in enumerate(cases):
        sweeps[c.sweep].append(i)
    measured = np.array([c.measured_tokens_per_s_per_gpu for c in cases])
    rhos = [spearman(predicted[idx], measured[idx]) for idx in sweeps.values() if len(idx) >= 3]
    return [r for r in rhos if not math.isnan(r)]


def _by_source(cases: list[RunCase], predicted: np.ndarray) -> dict[str, dict[str, Any]]:
    measured = np.array([c.measured_tokens_per_s_per_gpu for c in cases])
    ape = np.abs(predicted - measured) / measured
    out: dict[str, dict[str, Any]] = {}
    for src in sorted({c.source for c in cases}):
        mask = np.array([c.source == src for c in cases])
        out[src] = {
            "rows": int(mask.sum()),
            "mape": float(ape[mask].mean()),
            "bias": float(np.median(predicted[mask] / measured[mask]) - 1.0),
        }
    return out


def memory_comparison(cases: list[RunCase], predicted: dict[str, np.ndarray]) -> dict[str, Any]:
    """Predicted over measured peak memory where a run states it; runs predicted not to fit."""
    idx = [i for i, c in enumerate(cases) if c.run.measured_peak_memory_gib is not None]
    ratios = np.array(
        [predicted["memory_gib"][i] / (cases[i].run.measured_peak_memory_gib or 1.0) for i in idx]
    )
    not_fit = [i for i in range(len(cases)) if not predicted["fits"][i]]
    by_source = Counter(cases[i].source for i in not_fit)
    out: dict[str, Any] = {
        "runs_with_measured_peak": len(idx),
        "predicted_not_to_fit": len(not_fit),
        "predicted_not_to_fit_by_source": dict(sorted(by_source.items())),
        "predicted_not_to_fit_rows": [cases[i].index for i in not_fit],
    }
    if len(idx):
        out |= {
            "ratio_median": float(np.median(ratios)),
            "ratio_p10": float(np.percentile(ratios, 10)),
            "ratio_p90": float(np.percentile(ratios, 90)),
            "ratio_min": float(ratios.min()),
            "ratio_max": float(ratios.max()),
        }
    return out


# Cross-validation ------------------------------------------------------------------------------


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
    from scalelab.calibrate import StepPoint, fit
    from scalelab.config.hardware import ClusterParams

    train = _spread(train, CV_GROUPS_PER_SOURCE)
    per_source = Counter(c.source for c in train)
    scale = math.sqrt(len(train) / len(per_source))
    points = [
        StepPoint(
            c.model,
            c.layout,
            c.layout.global_batch
            * c.layout.seq_len
            / (c.measured_tokens_per_s_per_gpu * c.layout.gpus),
            source=c.source,
            weight=scale / math.sqrt(per_source[c.source]),
            hardware=c.cluster,
        )
        for c in train
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
        test = [cases[i] for i in test_idx]
        predicted[test_idx] = predict_cases_full(test, params)["tokens_per_s_per_gpu"]
        detail[held_out] = {
            "clusters": how,
            "fitted": {k: {n: round(v, 4) for n, v in p.items()} for k, p in params.items()},
        }
    measured = np.array([c.measured_tokens_per_s_per_gpu for c in cases])
    ape = np.abs(predicted - measured) / measured
    by_source = _by_source(cases, predicted)
    for src, stats in by_source.items():
        stats.update(detail[src])
    rhos = sweep_spearman(cases, predicted)
    return {
        "mape_tokens_per_gpu": float(ape.mean()),
        "mape_source_balanced": float(np.mean([s["mape"] for s in by_source.values()])),
        "within_20_pct": float((ape <= 0.2).mean()),
        "spearman_median": float(np.median(rhos)) if rhos else None,
        "by_source": by_source,
        "method": (
            f"leave one source group out; refit {', '.join(CV_PARAMETERS)} (+ {CV_FP8_PARAMETER} "
            f"where fp8 runs remain) with calibrate's core ({CV_MAX_NFEV} solver evaluations), on "
            f"the runs of at most {CV_GROUPS_PER_SOURCE} model/hardware groups per source group, "
            "each source group weighted equally"
        ),
        "predicted": predicted.tolist(),
    }


# The report ------------------------------------------------------------------------------------


def run_validation(
    data: Path | None = None, review: Path | None = None, with_cross_validation: bool = False
) -> ValidationReport:
    cases, skipped = load_cases(data, review)
    if not cases:
        raise InputError("data", "no row could be interpreted (see skipped reasons with --json)")
    predicted = predict_cases_full(cases)
    tps = predicted["tokens_per_s_per_gpu"]
    measured = np.array([c.measured_tokens_per_s_per_gpu for c in cases])
    ape = np.abs(tps - measured) / measured
    rhos = sweep_spearman(cases, tps)
    assumed = Counter(f for c in cases for f in set(c.run.assumed_fields))
    cv = cross_validate(cases) if with_cross_validation else None
    out_of_sample = cv.pop("predicted") if cv else None
    rows_out = [
        {
            "row": c.index,
            "source": c.source,
            "model": c.model.name,
            "gpus": c.layout.gpus,
            "layout": c.layout.model_dump(mode="json"),
            "measured_tokens_per_s_per_gpu": float(measured[i]),
            "predicted_tokens_per_s_per_gpu": float(tps[i]),
            "error": float(tps[i] / measured[i] - 1.0),
            "predicted_fits": bool(predicted["fits"][i]),
            "predicted_memory_gib": float(predicted["memory_gib"][i]),
            "measured_peak_memory_gib": c.run.measured_peak_memory_gib,
        }
        | (
            {"cross_validated_tokens_per_s_per_gpu": float(out_of_sample[i])}
            if out_of_sample
            else {}
        )
        for i, c in enumerate(cases)
    ]
    return ValidationReport(
        rows_used=len(cases),
        rows_skipped=len(skipped),
        skipped_by_reason=dict(Counter(reason for _, reason in skipped)),
        rows_predicted_not_to_fit=int((~predicted["fits"]).sum()),
        mape_tokens_per_gpu=float(ape.mean()),
        within_20_pct=float((ape <= 0.2).mean()),
        median_spearman=float(np.median(rhos)) if rhos else None,
        sweeps=len(rhos),
        by_source=_by_source(cases, tps),
        memory=memory_comparison(cases, predicted),
        assumed_fields=dict(sorted(assumed.items(), key=lambda kv: -kv[1])),
        cross_validated=cv,
        rows=rows_out,
    )


def explain(row: int, data: Path | None = None, review: Path | None = None) -> list[str]:
    """How one row was read (the importer's trace) and, if used, what the predictor makes of it."""
    if data is None:
        readings = shipped_readings()
    else:
        if not data.is_file():
            raise InputError("data", f"no such file: {data}")
        if review is not None and not review.is_file():
            raise InputError("review", f"no such file: {review}")
        entries = read_review(review.read_text()) if review else []
        text = data.read_text()
        if is_typed_header(text.splitlines()[0].split(",")):
            raise InputError(
                "data", "--explain reads a raw CSV (a typed file has nothing to explain)"
            )
        readings = import_rows(read_raw_csv(text), entries)
    if not 0 <= row < len(readings):
        raise InputError("row", f"row {row} does not exist; rows are 0-{len(readings) - 1}")
    reading = readings[row]
    lines = reading.explain()
    if reading.run is not None:
        case = case_from_run(reading.run)
        if isinstance(case, str):
            lines.append(f"  validate skips it: {case}")
        else:
            p = predict_cases_full([case])
            tps = float(p["tokens_per_s_per_gpu"][0])
            measured = case.measured_tokens_per_s_per_gpu
            lines.append(
                f"  predicted {tps:,.1f} tokens/s per GPU vs measured {measured:,.1f} "
                f"({tps / measured - 1:+.1%}); predicted memory {p['memory_gib'][0]:.1f} GiB, "
                f"{'fits' if p['fits'][0] else 'predicted NOT to fit'}"
            )
        if reading.run.assumed:
            lines.append("  assumed (not stated by the row): " + reading.run.assumed)
    return lines
