import json
from pathlib import Path

import pytest

from scalelab.studies import run_study

PNG = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 20_000, path


@pytest.fixture(scope="module")
def paper(tmp_path_factory) -> tuple[Path, dict]:
    from tests.conftest import run_cli

    out = tmp_path_factory.mktemp("paper")
    r = run_cli("study", "paper", "--out", str(out), "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def test_paper_writes_every_figure_and_the_findings(paper) -> None:
    out, doc = paper
    assert set(doc) >= {"findings", "figures"}
    ids = [f["id"] for f in doc["findings"]]
    assert ids[:7] == ["F1", "F2", "F3", "F4", "F5", "F6", "F7"]
    for f in doc["findings"]:
        assert set(f) >= {"id", "paper", "predicted", "tolerance", "within"}
    names = {Path(p).name for p in doc["figures"]}
    assert names >= {
        "findings.png",
        "collectives_busbw.png",
        "weak_scaling.png",
        "strong_scaling.png",
        "mp_grid.png",
        "hardware.png",
        "model_size.png",
        "hsdp.png",
    }
    for p in doc["figures"]:
        assert_png(Path(p))
    report = (out / "report.md").read_text()
    for name in names:
        assert f"]({name})" in report
    assert "Sensitivity" in report and "Assumptions" in report
    assert not list(out.glob(".*.tmp"))


def test_findings_reproduce_the_direction_of_the_study(paper) -> None:
    _, doc = paper
    f = {x["id"]: x for x in doc["findings"]}
    assert f["F1"]["predicted"] < -20  # per-GPU throughput falls at scale
    assert f["F2"]["predicted"] < 0  # power falls less than throughput
    assert f["F3"]["predicted"] > 20  # TP beats FSDP at 2048
    assert f["F4"]["predicted"] > f["F5"]["predicted"]  # A100 MFU above H100's
    assert sum(x["within"] for x in doc["findings"]) >= 6


def test_strong_scaling_says_why_fsdp_is_infeasible(tmp_path) -> None:
    result = run_study("strong-scaling", tmp_path)
    report = Path(result["report"]).read_text()
    assert "cannot exceed 32 sequences" in report
    rows = (tmp_path / "strong_scaling.csv").read_text().splitlines()
    assert any(",256," in r and "best searched layout" in r for r in rows)


def test_a_single_preset_writes_its_own_report(tmp_path) -> None:
    result = run_study("collectives", tmp_path)
    assert_png(tmp_path / "collectives_busbw.png")
    assert "collectives_busbw.png" in Path(result["report"]).read_text()
    assert (tmp_path / "collectives_busbw.csv").read_text().startswith("collective,")


def test_unknown_study_is_refused(cli) -> None:
    r = cli("study", "everything")
    assert r.returncode == 2 and "study: unknown study 'everything'" in r.stderr


def test_an_output_folder_that_cannot_be_made_is_one_line(cli, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    r = cli("study", "collectives", "--out", str(blocker / "sub"))
    assert r.returncode == 2
    assert (
        r.stderr.strip().startswith("scalelab: error: out: cannot create")
        and "Traceback" not in r.stderr
    )
