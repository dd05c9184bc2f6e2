"""The sweep file: expansion into points, stable ids, best-K from search, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.cli import main
from scalelab.sweep.plan import expand
from scalelab.sweep.schema import load_sweep
from tests.sweep.conftest import EXAMPLES, TINY_SWEEP, write_sweep


def _points(tmp_path: Path, text: str) -> list:
    sweep, base = load_sweep(write_sweep(tmp_path, text))
    return expand(sweep, base)


def test_tiny_sweep_expands_to_models_x_gpus_with_stable_ids(tmp_path: Path) -> None:
    points = _points(tmp_path, TINY_SWEEP)
    assert [(p.model_name, p.gpus) for p in points] == [
        ("llama-tiny", 1), ("llama-tiny", 2), ("llama-tiny2", 1), ("llama-tiny2", 2),
    ]  # fmt: skip
    assert len({p.id for p in points}) == 4
    assert all(p.layout.global_batch == 2 * p.gpus for p in points)  # weak scaling
    # The same description gives the same ids, wherever the sweep file lives.
    again = _points(tmp_path / "elsewhere", TINY_SWEEP)
    assert [p.id for p in again] == [p.id for p in points]
    assert [p.name for p in again] == [p.name for p in points]
    # What changes the measurement changes the id; what does not, does not.
    more_steps = _points(tmp_path / "b", TINY_SWEEP.replace("steps: 2", "steps: 3"))
    assert not {p.id for p in more_steps} & {p.id for p in points}
    timeout = _points(
        tmp_path / "c", TINY_SWEEP.replace("repeats: 2}", "repeats: 2, timeout_s: 60}")
    )
    assert [p.id for p in timeout] == [p.id for p in points]
    # The model file is resolved beside the sweep file, and the job gets every setting.
    assert points[2].model == str((tmp_path / "llama-tiny2.yaml").resolve())
    job = points[2].job
    assert job.model.name == "llama-tiny2" and job.nproc_per_node == 1
    assert (job.options.steps, job.options.repeats) == (2, 2)
    assert points[0].tags()["series"] == ["fsdp"]


def test_runs_and_duplicate_layouts(tmp_path: Path) -> None:
    text = TINY_SWEEP.replace(
        "  - {sharding: fsdp}\n", "  - {sharding: fsdp}\n  - {sharding: fsdp, name: again}\n"
    ).replace("bench:", "runs: 2\nbench:")
    points = _points(tmp_path, text)
    # Two runs of each of 4 points; the same layout listed twice is one point in two series.
    assert len(points) == 8
    assert {p.run for p in points} == {0, 1}
    assert all(p.series == ("fsdp", "again") for p in points)


def test_best_k_from_search_at_each_scale(tmp_path: Path) -> None:
    text = """\
models: [llama2-7b]
cluster: h100-ib
nodes: [1, 4]
seq_len: 4096
layouts:
  - {sharding: fsdp}
  - {best: 2, constraints: {pp: [1]}}
"""
    points = _points(tmp_path, text)
    assert {p.gpus_per_node for p in points} == {8}  # the cluster's
    for nodes in (1, 4):
        at = [p for p in points if p.nodes == nodes]
        series = [s for p in at for s in p.series]
        assert "fsdp" in series and "best-1" in series and "best-2" in series
        assert all(p.layout.gpus == 8 * nodes and p.layout.pp == 1 for p in at)
        assert all(p.layout.precision == "bf16" for p in at)  # what bench runs


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("models: [no-such-model]\n", "models[0]"),
        ("models: [llama-tiny]\nnodes: [0]\n", "nodes[0]"),
        ("models: [llama-tiny]\nlayouts: [{sharding: zero9}]\n", "layouts[0].sharding"),
        ("models: [llama-tiny]\ngpus_per_node: 3\nlayouts: [{tp: 2}]\n", "layouts[0]"),
        ("models: [llama-tiny]\nbench: {steps: 0}\n", "bench.steps"),
        ("models: [llama-tiny]\nbench: {out_dir: x}\n", "bench.out_dir"),
        ('models: [llama-tiny]\nslurm: {partition: "a\\nb"}\n', "slurm.partition"),
        ("models: [llama-tiny]\nfrobnicate: 1\n", "frobnicate"),
        (
            "models: [llama-tiny]\nlayouts: [{best: 1, constraints: {tq: [2]}}]\n",
            "layouts[0].constraints",
        ),
        ("- just a list\n", "sweep"),
    ],
)
def test_bad_sweep_file_is_one_line_and_exit_2(
    text: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_sweep(tmp_path, text)
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(path), "--out", str(tmp_path / "out"), "--dry-run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"scalelab: error: {field}:"), err


def test_local_executor_refuses_several_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_sweep(tmp_path, "models: [llama-tiny]\nnodes: [2]\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", str(path), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "scalelab: error: nodes:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_dry_run_lists_points(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    path = write_sweep(tmp_path, TINY_SWEEP)
    main(["sweep", str(path), "--out", str(tmp_path / "out"), "--dry-run", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert [p["state"] for p in doc["points"]] == ["pending"] * 4
    assert not (tmp_path / "out").exists()


def test_readme_weak_scaling_grid(tmp_path: Path) -> None:
    """The README's SLURM sweep: llama2-7b on 1 -> 256 nodes of 8 H100, FSDP and the best 2."""
    sweep, base = load_sweep(EXAMPLES / "weak-scaling-slurm.yaml")
    points = expand(sweep, base)
    nodes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert sorted({p.nodes for p in points}) == nodes
    for n in nodes:
        at = [p for p in points if p.nodes == n]
        assert {s for p in at for s in p.series} == {"fsdp", "best-1", "best-2"}
        assert all(p.gpus == 8 * n and p.layout.global_batch == 8 * n for p in at)
        assert all(p.layout.seq_len == 4096 for p in at)
        fsdp = next(p for p in at if "fsdp" in p.series)
        assert (fsdp.layout.sharding, fsdp.layout.tp, fsdp.layout.pp) == ("fsdp", 1, 1)
    assert all(p.bench.steps == 50 and p.bench.repeats == 3 for p in points)
    assert sweep.slurm.partition == "h100" and sweep.slurm.setup
