"""The mixture-of-experts runs (issue 16 item 5): typed, sourced, reported apart from the dense."""

from __future__ import annotations

import csv
import io
from importlib import resources

import pytest

from scalelab.runs.importer import target_tokens_per_s_per_gpu
from scalelab.runs.schema import MoERun, read_runs, write_runs
from scalelab.validate import moe_section, run_validation

DATA = resources.files("scalelab").joinpath("data")


def _runs() -> list[MoERun]:
    text = DATA.joinpath("published_runs_moe.csv").read_text()
    return [r for r in read_runs(text, kind=MoERun) if isinstance(r, MoERun)]


def test_moe_runs_round_trip_and_targets_follow_from_the_measurement() -> None:
    runs = _runs()
    assert runs and all(r.source and r.catalog_model for r in runs)
    assert write_runs(runs) == DATA.joinpath("published_runs_moe.csv").read_text()
    for run in runs:
        assert run.tokens_per_s_per_gpu == pytest.approx(target_tokens_per_s_per_gpu(run))
        assert run.model_spec().is_moe and run.layout().ep == run.ep


def test_every_moe_row_is_used_or_skipped_with_a_reason() -> None:
    section = moe_section()
    skipped = list(
        csv.DictReader(io.StringIO(DATA.joinpath("published_runs_moe_skipped.csv").read_text()))
    )
    assert all(r["reason"] and r["source"] for r in skipped)
    rows = {r["row"] for r in section["rows"]} | {s["row"] for s in section["skipped"]}
    assert len(rows) == section["rows_used"] + section["rows_skipped"]
    assert section["rows_used"] >= 3
    assert 0 < section["mape_tokens_per_gpu"] < 1


def test_moe_is_reported_apart_from_the_dense_headline() -> None:
    report = run_validation().to_dict()
    assert "moe" in report and report["rows_used"] >= 600
    assert all("Qwen3" not in s for s in report["by_source"])
