"""validate's statistics, on arrays only: rank correlation with ties, errors per source group,
memory against measured peaks. The row adapters (`scalelab.validate.cases`) build the arrays."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given the mean of the ranks they span (`scipy.stats.rankdata`)."""
    from scipy.stats import rankdata

    return np.asarray(rankdata(np.asarray(values, dtype=float), method="average"))


# Digits a rho is rounded to: far below any difference that matters, and enough to give a
# rational rho its nearest float (see `spearman`).
_RHO_DIGITS = 12


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho with average ranks for ties (`scipy.stats.spearmanr`); nan when either side
    is constant.

    Rounded to 12 decimals, so that a rho that is a simple fraction comes out as its nearest
    float: five runs with one adjacent pair swapped give 0.9, not scipy's 0.8999999999999998,
    which a target of "at least 0.9" would read as missed."""
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return math.nan  # scipy would warn (ConstantInputWarning) and give nan
    return round(float(spearmanr(a, b).statistic), _RHO_DIGITS)


def sweep_rhos(
    sweeps: Sequence[K], predicted: np.ndarray, measured: np.ndarray
) -> dict[K, tuple[int, float]]:
    """(runs, rho) of predicted against measured for each sweep (rows with the same key) of at
    least 3 runs whose measured and predicted values both vary, in first-seen order."""
    groups: dict[K, list[int]] = defaultdict(list)
    for i, key in enumerate(sweeps):
        groups[key].append(i)
    out: dict[K, tuple[int, float]] = {}
    for key, idx in groups.items():
        if len(idx) >= 3:
            rho = spearman(predicted[idx], measured[idx])
            if not math.isnan(rho):
                out[key] = (len(idx), rho)
    return out


def sweep_spearman(
    sweeps: Sequence[Hashable], predicted: np.ndarray, measured: np.ndarray
) -> list[float]:
    """Rho of predicted against measured within each sweep (rows with the same key) of at least 3
    runs that vary."""
    return [rho for _, rho in sweep_rhos(sweeps, predicted, measured).values()]


def by_source(
    sources: Sequence[str], predicted: np.ndarray, measured: np.ndarray
) -> dict[str, dict[str, Any]]:
    """Rows, mean absolute percentage error and median bias of each source group."""
    ape = np.abs(predicted - measured) / measured
    labels = np.array(sources, dtype=object)
    out: dict[str, dict[str, Any]] = {}
    for src in sorted(set(sources)):
        mask = labels == src
        out[src] = {
            "rows": int(mask.sum()),
            "mape": float(ape[mask].mean()),
            "bias": float(np.median(predicted[mask] / measured[mask]) - 1.0),
        }
    return out


def memory_comparison(
    measured_peak_gib: Sequence[float | None],
    predicted_gib: np.ndarray,
    fits: np.ndarray,
    sources: Sequence[str],
    rows: Sequence[int],
    unstated: Sequence[Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Predicted over measured peak memory where a run states it; runs predicted not to fit.

    `unstated`: per run, what its memory verdict rests on that the run does not state (empty:
    nothing). A run predicted not to fit with such reasons is listed as unknown with them; the
    others are predicted not to fit on what they state."""
    idx = [i for i, peak in enumerate(measured_peak_gib) if peak is not None]
    ratios = np.array([predicted_gib[i] / (measured_peak_gib[i] or 1.0) for i in idx])
    not_fit = [i for i in range(len(fits)) if not fits[i]]
    per_source = Counter(sources[i] for i in not_fit)
    why = unstated if unstated is not None else [()] * len(fits)
    unknown = [i for i in not_fit if why[i]]
    out: dict[str, Any] = {
        "runs_with_measured_peak": len(idx),
        "predicted_not_to_fit": len(not_fit),
        "predicted_not_to_fit_by_source": dict(sorted(per_source.items())),
        "predicted_not_to_fit_rows": [rows[i] for i in not_fit],
        "predicted_not_to_fit_on_stated_inputs": len(not_fit) - len(unknown),
        "unknown": [{"row": rows[i], "reasons": list(why[i])} for i in unknown],
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
