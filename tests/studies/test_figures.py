"""Each figure of `scalelab study paper`, checked from the data it drew (the JSON beside the PNG)."""

import ast
import csv
from pathlib import Path

import pytest

from scalelab.studies.collectives import measured_fig2
from scalelab.studies.findings import paper_values
from tests.studies.conftest import figure

SRC = Path(__file__).resolve().parents[2] / "src" / "scalelab"
NAMES = (
    "findings",
    "collectives_busbw",
    "weak_scaling",
    "strong_scaling",
    "mp_grid",
    "hardware",
    "model_size",
    "hsdp",
)


def data_axes(fig: dict) -> list[dict]:
    """Visible panels that plot data (not colour bars, not switched-off panels)."""
    return [a for a in fig["axes"] if a["visible"] and (a["lines"] or a["markers"] or a["bars"])]


def labels(fig: dict) -> list[str]:
    out = [t for lg in fig["legends"] for t in lg]
    for a in fig["axes"]:
        out += a["legend"]
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_axis_has_a_unit_and_starts_at_zero(paper, name) -> None:
    out, _ = paper
    fig = figure(out, name)
    for a in data_axes(fig):
        assert a["xlabel"], (name, a["title"])
        if name == "findings":
            assert a["yticklabels"] == ["scalelab", "study"]  # two rows, no quantity on y
            assert a["xlim"][0] <= 0 <= a["xlim"][1] or a["xlim"][1] == 0, a["title"]
        elif name == "mp_grid":
            continue  # categorical TP x PP cells; its colour scale is checked below
        else:
            assert a["ylabel"], (name, a["title"])
            assert a["ylim"][0] == 0, (name, a["title"], a["ylim"])
        assert "(share of step) (%)" not in a["ylabel"] + a["title"]


@pytest.mark.parametrize("name", NAMES)
def test_one_legend_per_panel_or_one_for_the_figure(paper, name) -> None:
    out, _ = paper
    fig = figure(out, name)
    per_panel = [a for a in fig["axes"] if a["legend"]]
    if fig["legends"]:
        assert not per_panel, name
    else:
        assert per_panel, name


def test_findings_each_in_its_own_unit_with_tolerance_and_basis(paper) -> None:
    out, doc = paper
    fig = figure(out, "findings")
    panels = [a for a in fig["axes"] if a["visible"]]
    found = {f["id"]: f for f in doc["findings"]}
    assert len(panels) == len(found)
    for a in panels:
        fid = a["title"].split(":")[0]
        f = found[fid]
        assert f["basis"].upper() in a["title"]
        if f["fitted_parameter"]:
            assert f["fitted_parameter"] in a["title"]
        unit = a["xlabel"]
        assert {"%": "%", "GPUs": "GPUs", "degree": "degree", "ratio": "ratio"}[f["unit"]] in unit
        study = [m for m in a["markers"] if m["label"].startswith("study")]
        ranges = [ln for ln in a["lines"] if ln["label"].startswith("study")]
        if f["paper"] is None:
            assert ranges and ranges[0]["x"] == [f["paper_low"], f["paper_high"]]
        else:
            assert study and study[0]["offsets"][0][0] == pytest.approx(f["paper"])
        mine = [m for m in a["markers"] if m["label"].startswith("scalelab")]
        if f["predicted"] is None:
            assert any("none" in t for t in a["texts"])
        else:
            assert mine[0]["label"] == f"scalelab ({f['basis']})"
            assert mine[0]["offsets"][0][0] == pytest.approx(f["predicted"])
    assert "F7: " in " ".join(a["title"] for a in panels)
    legend = " ".join(labels(fig))
    for word in ("PREDICTED", "FITTED", "DERIVED", "tolerance"):
        assert word in legend


def test_collectives_draw_every_measured_point_and_weaken_the_extrapolation(paper) -> None:
    out, _ = paper
    fig = figure(out, "collectives_busbw")
    ar, ag, size = fig["axes"][:3]
    fig2 = measured_fig2()
    assert len({p["message_bytes"] for p in fig2}) == 11
    model = [ln for ln in ar["lines"] if not ln["label"].startswith("_")]
    assert len(model) == 11  # every message size the study measured
    drawn = sum(len(m["offsets"]) for m in ar["markers"])
    assert drawn == len(fig2)
    assert ar["xlim"][0] > 2 and ag["xlim"][0] > 2  # the study measured from 4 nodes
    assert ag["lines"] and all(ln["linestyle"] == "--" and ln["alpha"] < 1 for ln in ag["lines"])
    assert "extrapolated" in ag["legend_title"] and "ReduceScatter" in ag["legend_title"]
    measured = [
        m for m in size["markers"] if "measured" in m["label"] or "nccl-tests" in m["label"]
    ]
    assert len(measured) >= 3 and sum(len(m["offsets"]) for m in measured) > 20
    assert any("extrapolated" in ln["label"] for ln in size["lines"])


def test_weak_scaling_shows_the_studys_values_and_every_family(paper) -> None:
    out, _ = paper
    fig = figure(out, "weak_scaling")
    legend = " ".join(labels(fig))
    for fid in ("F1", "F2", "F3", "F5", "F8", "F9"):
        assert f"study {fid}" in legend
    assert "pure FSDP" in legend and "FSDP + TP 2-4" in legend
    assert "ideal scaling" in legend
    best = next(t for t in labels(fig) if t.startswith("best searched layout"))
    rows = list(csv.DictReader((out / "weak_scaling.csv").open()))
    for fam in {r["family"] for r in rows if r["series"] == "best searched layout"}:
        assert fam in best
    if any(r["family"].startswith("HSDP") for r in rows if r["series"] == "best searched layout"):
        assert "not run by the study" in best
    per_gpu = next(a for a in fig["axes"] if a["ylabel"] == "tokens/s per GPU")
    f1 = next(m for m in per_gpu["markers"] if m["label"].startswith("study F1"))
    base = next(r for r in rows if r["series"].startswith("pure FSDP") and r["gpus"] == "128")
    expected = float(base["tokens_per_s_per_gpu"]) * (
        1 + float(paper_values()["F1"]["value"]) / 100
    )
    assert f1["offsets"][0] == [2048, pytest.approx(expected)]


def test_strong_scaling_labels_the_layouts_inside_and_the_schedules(paper) -> None:
    out, _ = paper
    fig = figure(out, "strong_scaling")
    legend = " ".join(labels(fig))
    assert "PyTorch 2.3.1" in legend and "infeasible" in legend
    ax1, ax2 = fig["axes"]
    assert ax1["ylabel"] and ax2["ylabel"]
    box = " ".join(ax2["texts"])
    rows = list(csv.DictReader((out / "strong_scaling.csv").open()))
    for r in rows:
        if "the study's stack" in r["series"]:
            assert r["layout"] in box
            assert r["pp_schedule"] in ("", "gpipe", "1f1b", "interleaved")
    x_marks = next(m for m in ax1["markers"] if "infeasible" in m["label"])
    assert [p[0] for p in x_marks["offsets"]] == [64, 128, 256]


def test_mp_grid_states_sequence_length_and_marks_the_studys_degrees(paper) -> None:
    out, _ = paper
    fig = figure(out, "mp_grid")
    grid = fig["axes"][0]
    assert "4096 tokens" in grid["title"]
    outlined = [o for o in grid["outlines"]]
    assert len(outlined) == 4  # TP 2, TP 4, PP 2, PP 4 (the other degree 1)
    assert any("F7" in t for t in grid["legend"])
    colorbar = fig["axes"][1]
    assert colorbar["ylim"][0] == 0


def test_hardware_marks_the_study_and_flags_what_is_suspect_or_assumed(paper) -> None:
    from scalelab.config.catalog import load_cluster
    from scalelab.studies.common import is_assumed
    from scalelab.studies.grid import GEMM_EFFICIENCY_FIT_BOUND

    out, _ = paper
    fig = figure(out, "hardware")
    mfu = fig["axes"][0]
    study = next(m for m in mfu["markers"] if m["label"].startswith("study"))
    assert [p[1] for p in study["offsets"]] == [59.67, 40.77]
    bars = mfu["bars"][0]
    gpus = [t.rstrip("*") for t in mfu["xticklabels"]]
    rows = list(csv.DictReader((out / "hardware.csv").open()))
    report = (out / "report.md").read_text()
    for r in rows:
        cluster = load_cluster(r["cluster"])
        at_bound = cluster.params.gemm_efficiency >= GEMM_EFFICIENCY_FIT_BOUND
        assumed = is_assumed(cluster.source + cluster.params.source)
        flagged = bars["hatches"][gpus.index(r["gpu"])] == "//"
        assert flagged == (at_bound or assumed), r["gpu"]
        if (
            at_bound
        ):  # today V100 (0.90, docs/calibration.md): flagged on the figure and in the report
            assert any("fit bound" in t for t in mfu["texts"])
            assert f"{r['gpu']}: " in report and "fit's upper bound" in report
    assert any(r["flag"] for r in rows)


def test_model_size_flags_the_assumed_shape_and_missing_points(paper) -> None:
    out, _ = paper
    fig = figure(out, "model_size")
    legend = labels(fig)
    assert all("ASSUMED" in t for t in legend if t.startswith("llama2-1b"))
    rows = list(csv.DictReader((out / "model_size.csv").open()))
    if any(r["fits"] == "False" for r in rows):
        assert any("does not fit" in t for t in legend)
    assert len(fig["legends"]) == 1  # one legend, below both panels


def test_hsdp_series_are_what_their_labels_say(paper) -> None:
    out, _ = paper
    rows = list(csv.DictReader((out / "hsdp.csv").open()))
    mp = [r for r in rows if r["series"].startswith("best FSDP + TP/PP")]
    assert mp and all("TP" in r["family"] or "PP" in r["family"] for r in mp)
    assert all(r["family"].startswith("FSDP") for r in mp)
    hsdp = [r for r in rows if "HSDP" in r["series"]]
    assert all(r["family"].startswith("HSDP") for r in hsdp)
    fsdp = [r for r in rows if r["series"].startswith(("pure FSDP", "FSDP,"))]
    assert all(r["family"] == "FSDP" for r in fsdp)
    report = (out / "report.md").read_text()
    verdict = report.split("## HSDP")[1]
    assert next(r["layout"] for r in mp if r["gpus"] == "2048") in verdict


def test_report_does_not_import_the_study_presets() -> None:
    for path in (SRC / "report").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("scalelab.studies"), path
