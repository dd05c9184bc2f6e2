"""`scalelab study moe` (issue 16 item 6), small and fast: the dense twin, EP's plateau, the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalelab.config.catalog import load_model
from scalelab.studies import moe, run_study


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"])
def test_dense_twin_has_the_active_parameters(name: str) -> None:
    model = load_model(name)
    twin = moe.dense_twin(model)
    assert not twin.is_moe
    assert twin.n_params == pytest.approx(model.active_params, rel=1e-3)
    assert twin.model_flops_per_token(4096) == pytest.approx(
        model.model_flops_per_token(4096), rel=1e-3
    )


def test_ep_stop_is_the_smallest_ep_near_the_best() -> None:
    per_ep = {1: 100.0, 2: 150.0, 4: 199.0, 8: 200.0, 16: 120.0}
    assert moe.ep_stop({e: {"tokens_per_s_per_gpu": v} for e, v in per_ep.items()}) == 4
    assert moe.ep_stop({}) is None


def test_rows_compare_moe_and_dense_and_price_every_ep() -> None:
    scale, per_ep = moe.rows(gpus_list=(16,), model_name="qwen3-30b-a3b")
    (row,) = scale
    assert row["moe_tokens_per_s_per_gpu"] > 0 and row["dense_tokens_per_s_per_gpu"] > 0
    assert 0 <= row["moe_all_to_all_share"] < 1
    eps = {r["ep"] for r in per_ep}
    assert {1, 2, 4, 8, 16} <= eps
    assert all(r["all_to_all_share"] == 0 for r in per_ep if r["ep"] == 1)
    assert all(r["all_to_all_share"] > 0 for r in per_ep if r["ep"] > 1)


def test_study_moe_writes_figures_tables_and_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(moe, "GPUS", (8, 16))
    monkeypatch.setattr(moe, "MOE_MODEL", "qwen3-30b-a3b")
    result = run_study("moe", tmp_path)
    for path in [*result["figures"], *result["tables"], result["report"]]:
        assert Path(path).is_file()
    assert {Path(f).name for f in result["figures"]} == {"moe_scaling.png", "moe_ep.png"}
    assert [r["gpus"] for r in result["rows"]] == [8, 16]
    data = json.loads((tmp_path / "moe_ep.json").read_text())
    assert data  # the figure's data beside the PNG
    assert "AllToAll" in Path(result["report"]).read_text()
