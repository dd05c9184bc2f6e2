"""validate's statistics work on arrays alone (the row adapters live in validate.cases)."""

from __future__ import annotations

import numpy as np
import pytest

from scalelab.validate.stats import by_source, memory_comparison, sweep_rhos, sweep_spearman


def test_by_source_by_hand() -> None:
    predicted = np.array([110.0, 90.0, 200.0])
    measured = np.array([100.0, 100.0, 100.0])
    out = by_source(["a", "a", "b"], predicted, measured)
    assert out["a"] == {"rows": 2, "mape": pytest.approx(0.1), "bias": pytest.approx(0.0)}
    assert out["b"] == {"rows": 1, "mape": pytest.approx(1.0), "bias": pytest.approx(1.0)}


def test_sweep_spearman_groups_by_key() -> None:
    measured = np.array([1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 5.0])
    predicted = np.array([1.0, 2.0, 3.0, 3.0, 2.0, 1.0, 9.0])
    rhos = sweep_spearman(["x", "x", "x", "y", "y", "y", "z"], predicted, measured)
    assert rhos == [pytest.approx(1.0), pytest.approx(-1.0)]  # "z" has one run: no rho


def test_memory_comparison_by_hand() -> None:
    out = memory_comparison(
        [40.0, None, 80.0], np.array([44.0, 10.0, 72.0]), np.array([True, False, True]),
        ["a", "b", "a"], [7, 8, 9],
    )  # fmt: skip
    assert out["runs_with_measured_peak"] == 2
    assert out["ratio_min"] == pytest.approx(0.9) and out["ratio_max"] == pytest.approx(1.1)
    assert out["predicted_not_to_fit_rows"] == [8]
    assert out["predicted_not_to_fit_by_source"] == {"b": 1}


def test_a_run_predicted_not_to_fit_on_values_it_does_not_state_is_unknown() -> None:
    """Two runs predicted not to fit: one on what it states, one resting on an assumed recompute
    (listed as unknown with its reason)."""
    out = memory_comparison(
        [None, None, None], np.array([90.0, 90.0, 10.0]), np.array([False, False, True]),
        ["a", "a", "b"], [3, 4, 5], [[], ["recompute not stated"], ["vocab_size not stated"]],
    )  # fmt: skip
    assert out["predicted_not_to_fit"] == 2
    assert out["predicted_not_to_fit_on_stated_inputs"] == 1
    assert out["unknown"] == [{"row": 4, "reasons": ["recompute not stated"]}]


def test_sweep_rhos_names_each_sweep_with_its_runs() -> None:
    keys = ["a", "a", "a", "b", "b", "b", "b", "c", "c"]
    measured = np.array([1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0, 1.0, 2.0])
    predicted = np.array([1.0, 2.0, 3.0, 4.0, 3.0, 2.0, 1.0, 1.0, 2.0])
    rhos = sweep_rhos(keys, predicted, measured)
    assert list(rhos) == ["a", "b"]  # "c" has 2 runs
    assert rhos["a"] == (3, pytest.approx(1.0)) and rhos["b"] == (4, pytest.approx(-1.0))
    assert sweep_spearman(keys, predicted, measured) == [rho for _, rho in rhos.values()]


def test_spearman_is_exact_where_rho_is_rational() -> None:
    """One adjacent swap in five runs is rho 0.9 exactly (1 - 6*2/120), not a float below it;
    ties use average ranks as scipy does (checked by hand: 0.5 / sqrt(0.75*1) for this pair)."""
    from scalelab.validate.stats import spearman

    assert spearman(np.array([1.0, 2, 3, 5, 4]), np.array([1.0, 2, 3, 4, 5])) == 0.9
    assert spearman(np.array([1.0, 1, 2]), np.array([1.0, 2, 3])) == pytest.approx(
        0.8660254037844386
    )
    assert np.isnan(spearman(np.array([2.0, 2, 2]), np.array([1.0, 2, 3])))
