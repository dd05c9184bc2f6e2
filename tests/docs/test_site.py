"""The documentation is built and agrees with itself (issue 36 item 1): the README fits on a screen,
the site builds with `mkdocs build --strict` (no network), and every figure the pages quote is the
one in docs/figures.yaml, recomputed here where the code can recompute it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FIRST_COMMANDS = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && scalelab study paper",
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "
    'pip install -e ".[measure,report,slurm,fp8,test]" && pytest',
)


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "docs_figures.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_readme_fits_and_starts_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text) <= 12_000, len(text)
    assert text.splitlines()[2:6] == ["```bash", *FIRST_COMMANDS, "```"]


def test_pages_quote_the_figures_file_and_the_home_page_is_the_readme() -> None:
    result = _tool("--check")
    assert result.returncode == 0, result.stderr


def test_the_check_finds_a_page_that_disagrees(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "docs" / "figures.yaml").write_text("speed: {text: '5 s'}\n")
    (tmp_path / "README.md").write_text("in <!-- fig:speed -->4 s<!-- /fig -->\n")
    (tmp_path / "tools" / "docs_figures.py").write_text(
        (ROOT / "tools/docs_figures.py").read_text()
    )
    run = [sys.executable, str(tmp_path / "tools" / "docs_figures.py")]
    check = subprocess.run([*run, "--check"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "fig:speed says '4 s'" in check.stderr
    assert subprocess.run(run, capture_output=True, timeout=60).returncode == 0
    assert "<!-- fig:speed -->5 s<!-- /fig -->" in (tmp_path / "README.md").read_text()
    assert (
        (tmp_path / "docs" / "index.md")
        .read_text()
        .endswith("in <!-- fig:speed -->5 s<!-- /fig -->\n")
    )


def test_validate_figures_are_what_validate_computes() -> None:
    from scalelab.validate import run_validation

    figures = yaml.safe_load((ROOT / "docs" / "figures.yaml").read_text())
    report = run_validation()
    assert figures["validate_runs"]["text"] == str(report.rows_used)
    assert figures["validate_mape_in_sample"]["text"] == f"{report.mape_tokens_per_gpu * 100:.1f} %"
    assert figures["validate_within_20_pct"]["text"] == f"{report.within_20_pct * 100:.0f} %"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="the docs extra: pip install -e '.[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    assert "predict_layout" in reference and "load_records" in reference  # from the docstrings
    assert (tmp_path / "site" / "study" / "index.html").is_file()
