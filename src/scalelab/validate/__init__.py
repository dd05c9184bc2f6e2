"""The predictor against measured training runs: in-sample and leave-one-source-out accuracy.

"validate" in scalelab means this: the predictor against published runs (a layout's rules are
checked by `scalelab.config.layout.check` / `rule_violations`). Three parts: `cases` (row adapters:
runs read, turned into the predictor's inputs and predicted), `stats` (statistics on arrays) and
`cross` (leave-one-source-out refits); this module assembles the report.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.errors import InputError
from scalelab.io import read_user_text
from scalelab.runs.importer import Reading, import_rows, read_raw_csv, read_review
from scalelab.runs.schema import Run, read_runs
from scalelab.validate.cases import (
    RAW_DATA,
    REVIEW_DATA,
    SKIPPED_DATA,
    TYPED_DATA,
    RunCase,
    case_from_run,
    is_typed_text,
    load_cases,
    load_moe_cases,
    load_runs,
    measured,
    memory_unstated,
    predict_cases,
    predict_cases_full,
    shipped_readings,
)
from scalelab.validate.cross import cross_validate
from scalelab.validate.stats import (
    average_ranks,
    by_source,
    memory_comparison,
    spearman,
    sweep_rhos,
    sweep_spearman,
)

__all__ = [
    "RAW_DATA",
    "REVIEW_DATA",
    "SKIPPED_DATA",
    "TYPED_DATA",
    "RunCase",
    "ValidationReport",
    "average_ranks",
    "by_source",
    "case_from_run",
    "cross_validate",
    "explain",
    "load_cases",
    "load_runs",
    "memory_comparison",
    "predict_cases",
    "predict_cases_full",
    "run_validation",
    "shipped_readings",
    "spearman",
    "sweep_rhos",
    "sweep_spearman",
    "write_skip_reasons",
]


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
    # Each sweep (source group, model, GPU, sequence length; >= 3 runs that vary): its runs and
    # rho in-sample, and held out where cross-validated (None otherwise).
    sweep_detail: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    moe: dict[str, Any] | None = None  # the MoE runs, apart (shipped data only)
    # Accuracy side by side on all rows and on rows by what they leave unstated (assumption_kind).
    by_assumption: dict[str, Any] = field(default_factory=dict)
    rows_read: int = 0  # rows of the table (used + skipped)
    cross_validation_skipped: str | None = None  # why --cross-validate could not run
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (row, reason), every reason

    def to_dict(self, with_rows: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rows_read": self.rows_read,
            "rows_used": self.rows_used,
            "rows_skipped": self.rows_skipped,
            "skipped_by_reason": self.skipped_by_reason,
            "rows_predicted_not_to_fit": self.rows_predicted_not_to_fit,
            "mape_tokens_per_gpu": self.mape_tokens_per_gpu if self.rows_used else None,
            "within_20_pct": self.within_20_pct if self.rows_used else None,
            "median_spearman_within_sweeps": self.median_spearman,
            "spearman_median": self.median_spearman,
            "sweeps": self.sweeps,
            "sweep_spearman": self.sweep_detail,
            "by_source": self.by_source,
            "memory": self.memory,
            "rows_with_assumed_value": self.assumed_fields,
            "by_assumption": self.by_assumption,
        }
        if self.cross_validated is not None:
            out["cross_validated"] = self.cross_validated
        if self.cross_validation_skipped is not None:
            out["cross_validation_skipped"] = self.cross_validation_skipped
        if self.moe is not None:
            out["moe"] = self.moe
        if with_rows:
            out["rows"] = self.rows
        return out


def run_validation(
    data: Path | None = None, review: Path | None = None, with_cross_validation: bool = False
) -> ValidationReport:
    cases, skipped = load_cases(data, review)
    skipped_rows = len({row for row, _ in skipped})
    by_reason = dict(Counter(reason for _, reason in skipped).most_common())
    if not cases:
        return replace(empty_report(skipped_rows, by_reason), skipped=skipped)
    predicted = predict_cases_full(cases)
    tps = predicted["tokens_per_s_per_gpu"]
    actual = measured(cases)
    bad = np.flatnonzero(~(np.isfinite(actual) & (actual > 0)))
    if bad.size:  # a Run cannot hold one; a guard against a negative MAPE or a null one
        case = cases[int(bad[0])]
        raise InputError(
            f"data: row {case.index}: tokens_per_s_per_gpu",
            f"must be a positive finite number, not {actual[bad[0]]}",
        )
    ape = np.abs(tps - actual) / actual
    sources = [c.source for c in cases]
    sweep_keys = [c.sweep for c in cases]
    in_sample = sweep_rhos(sweep_keys, tps, actual)
    rhos = [rho for _, rho in in_sample.values()]
    assumed = Counter(f for c in cases for f in set(c.run.assumed_fields))
    groups = len(set(sources))
    cv = cross_validate(cases) if with_cross_validation and groups >= 2 else None
    cv_skipped = (
        f"leave-one-source-out needs runs of at least two source groups (these have {groups})"
        if with_cross_validation and cv is None
        else None
    )
    out_of_sample = cv.pop("predicted") if cv else None
    held_out = sweep_rhos(sweep_keys, np.asarray(out_of_sample), actual) if out_of_sample else {}
    sweep_detail = [
        {
            "source": key[0],
            "model": key[1],
            "gpu": key[2],
            "seq_len": key[3],
            "runs": runs,
            "spearman": rho,
            "spearman_held_out": held_out[key][1] if key in held_out else None,
        }
        for key, (runs, rho) in sorted(in_sample.items(), key=lambda kv: (kv[1][1], kv[0]))
    ]
    rows_out = [
        {
            "row": c.index,
            "source": c.source,
            "model": c.model.name,
            "gpus": c.layout.gpus,
            "layout": c.layout.model_dump(mode="json"),
            "measured_tokens_per_s_per_gpu": float(actual[i]),
            "predicted_tokens_per_s_per_gpu": float(tps[i]),
            "error": float(tps[i] / actual[i] - 1.0),
            "predicted_fits": bool(predicted["fits"][i]),
            "predicted_memory_gib": float(predicted["memory_gib"][i]),
            "measured_peak_memory_gib": c.run.measured_peak_memory_gib,
            # none | named (only what the row names is filled in) | assumed (anything else)
            "assumption_kind": c.run.assumption_kind,
        }
        | (
            {"cross_validated_tokens_per_s_per_gpu": float(out_of_sample[i])}
            if out_of_sample
            else {}
        )
        for i, c in enumerate(cases)
    ]
    return ValidationReport(
        rows_read=len(cases) + skipped_rows,
        rows_used=len(cases),
        rows_skipped=skipped_rows,
        skipped_by_reason=by_reason,
        by_assumption=accuracy_by_assumption([c.run.assumption_kind for c in cases], ape),
        rows_predicted_not_to_fit=int((~predicted["fits"]).sum()),
        mape_tokens_per_gpu=float(ape.mean()),
        within_20_pct=float((ape <= 0.2).mean()),
        median_spearman=float(np.median(rhos)) if rhos else None,
        sweeps=len(rhos),
        by_source=by_source(sources, tps, actual),
        memory=memory_comparison(
            [c.run.measured_peak_memory_gib for c in cases],
            predicted["memory_gib"],
            predicted["fits"],
            sources,
            [c.index for c in cases],
            [memory_unstated(c) for c in cases],
        ),
        assumed_fields=dict(sorted(assumed.items(), key=lambda kv: (-kv[1], kv[0]))),
        cross_validated=cv,
        cross_validation_skipped=cv_skipped,
        skipped=skipped,
        sweep_detail=sweep_detail,
        rows=rows_out,
        moe=moe_section() if data is None else None,
    )


ASSUMPTION_GROUPS = {
    "all": ("none", "named", "assumed"),
    "nothing_assumed": ("none",),
    "only_what_the_row_names": ("none", "named"),
}


def accuracy_by_assumption(kinds: list[str], ape: np.ndarray) -> dict[str, Any]:
    """MAPE and share within 20 % on all rows, on rows with nothing assumed, and on rows whose
    unstated values all follow from what they name (a model family, a system, a framework)."""
    out: dict[str, Any] = {}
    for group, allowed in ASSUMPTION_GROUPS.items():
        mask = np.array([k in allowed for k in kinds], dtype=bool)
        rows = int(mask.sum())
        out[group] = {
            "rows": rows,
            "mape_tokens_per_gpu": float(ape[mask].mean()) if rows else None,
            "within_20_pct": float((ape[mask] <= 0.2).mean()) if rows else None,
        }
    return out


def write_skip_reasons(skipped: list[tuple[int, str]], path: Path) -> None:
    """Every reason each row was not used, one CSV line per reason: row, column, reason."""
    import csv
    import io

    from scalelab.io import atomic_write_text
    from scalelab.runs.importer import reason_field

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["row", "column", "reason"])
    for row, reason in sorted(skipped, key=lambda rr: rr[0]):
        writer.writerow([row, reason_field(reason), reason])
    atomic_write_text(path, out.getvalue())


def empty_report(rows_skipped: int, skipped_by_reason: dict[str, int]) -> ValidationReport:
    """The report of a table no row of which is usable (validate still answers, and exits 2)."""
    return ValidationReport(
        rows_read=rows_skipped,
        rows_used=0,
        rows_skipped=rows_skipped,
        skipped_by_reason=skipped_by_reason,
        rows_predicted_not_to_fit=0,
        mape_tokens_per_gpu=float("nan"),
        within_20_pct=float("nan"),
        median_spearman=None,
        sweeps=0,
        by_source={},
        memory={},
        assumed_fields={},
        by_assumption=accuracy_by_assumption([], np.zeros(0)),
    )


def moe_section() -> dict[str, Any]:
    """The predictor on the shipped mixture-of-experts runs, reported apart from the dense ones
    (their own MAPE and bias; not part of the headline or the cross-validation)."""
    cases, skipped = load_moe_cases()
    predicted = predict_cases_full(cases) if cases else None
    actual = measured(cases)
    tps = predicted["tokens_per_s_per_gpu"] if predicted is not None else np.zeros(0)
    err = tps / actual - 1.0 if cases else np.zeros(0)
    return {
        "rows_used": len(cases),
        "rows_skipped": len(skipped),
        "skipped": [{"row": r, "reason": why} for r, why in skipped],
        "mape_tokens_per_gpu": float(np.abs(err).mean()) if cases else None,
        "mean_error": float(err.mean()) if cases else None,
        "by_source": by_source([c.source for c in cases], tps, actual) if cases else {},
        "rows": [
            {
                "row": c.index,
                "source": c.source,
                "model": c.model.name,
                "layout": c.layout.description,
                "measured_tokens_per_s_per_gpu": float(actual[i]),
                "predicted_tokens_per_s_per_gpu": float(tps[i]),
                "error": float(err[i]),
                "predicted_fits": bool(predicted["fits"][i]) if predicted is not None else None,
            }
            for i, c in enumerate(cases)
        ],
    }


# The predicted step's parts shown by --explain (perf.predict keys, seconds per step).
BREAKDOWN_PARTS = (
    ("compute (incl. recompute)", "compute_s"),
    ("  of which recompute", "recompute_s"),
    ("optimizer", "optimizer_s"),
    ("exposed communication", "exposed_comm_s"),
    ("pipeline bubble", "pp_bubble_s"),
    ("host overhead", "overhead_s"),
)


def _readings(data: Path | None, review: Path | None) -> list[Reading]:
    """How each row of the shipped data, a raw table or a typed file was read."""
    if data is None:
        return shipped_readings()
    if not data.is_file():
        raise InputError("data", f"no such file: {data}")
    if review is not None and not review.is_file():
        raise InputError("review", f"no such file: {review}")
    text = read_user_text("data", data)
    if is_typed_text(text):
        return [typed_reading(run) for run in read_runs(text.removeprefix("\ufeff"), "data")]
    entries = read_review(read_user_text("review", review)) if review else []
    return import_rows(read_raw_csv(text), entries)


def typed_reading(run: Run) -> Reading:
    """A typed run as a reading: every field as the file states it, its assumptions listed."""
    reading = Reading(run.row, {"model": run.model, "source": run.source}, run=run)
    assumed = set(run.assumed_fields)
    for name, value in run.model_dump().items():
        if name in ("row", "source", "model", "notes", "assumed"):
            continue
        reading.how.append((name, str(value), "ASSUMED" if name in assumed else "typed file"))
    return reading


def breakdown_lines(case: RunCase, measured_tps: float) -> list[str]:
    """The predicted step's time by part beside the measured step time (seconds per step)."""
    from scalelab.config.layout import LayoutTable
    from scalelab.perf.predict import predict

    p = predict(case.model, case.cluster, LayoutTable.from_layouts([case.layout]), case.stack)
    layout = case.layout
    measured_step = layout.global_batch * layout.seq_len / (measured_tps * layout.gpus)
    step = float(p["step_time_s"][0])
    lines = [f"  step time: predicted {step:.3f} s vs measured {measured_step:.3f} s"]
    for label, key in BREAKDOWN_PARTS:
        part = float(p[key][0])
        if part > 0:
            lines.append(f"    {label:<26} {part:9.3f} s  ({part / step:5.1%} of the step)")
    return lines


def explain(row: int, data: Path | None = None, review: Path | None = None) -> list[str]:
    """How one row was read (the importer's trace, or a typed file's fields) and, if used, what
    the predictor makes of it: tokens/s and the step's time by part beside the measured figure."""
    readings = _readings(data, review)
    by_row = {r.row: r for r in readings}
    if row not in by_row:
        rows = sorted(by_row)
        span = f"rows are {rows[0]}-{rows[-1]}" if rows else "the file has no rows"
        raise InputError("row", f"row {row} does not exist; {span}")
    reading = by_row[row]
    lines = reading.explain()
    if reading.run is not None:
        case = case_from_run(reading.run)
        if isinstance(case, str):
            lines.append(f"  validate skips it: {case}")
        else:
            p = predict_cases_full([case])
            tps = float(p["tokens_per_s_per_gpu"][0])
            measured = case.measured_tokens_per_s_per_gpu
            unstated = memory_unstated(case)
            verdict = "fits" if p["fits"][0] else "predicted NOT to fit"
            if not p["fits"][0] and unstated:
                verdict = "memory verdict unknown (" + "; ".join(unstated) + ")"
            lines.append(
                f"  predicted {tps:,.1f} tokens/s per GPU vs measured {measured:,.1f} "
                f"({tps / measured - 1:+.1%}); predicted memory {p['memory_gib'][0]:.1f} GiB, "
                f"{verdict}"
            )
            lines += breakdown_lines(case, measured)
        if reading.run.assumed:
            lines.append("  assumed (not stated by the row):")
            lines += [f"    - {a}" for a in reading.run.assumed.split(" | ") if a.strip()]
    return lines
