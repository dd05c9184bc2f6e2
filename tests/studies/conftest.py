"""One `scalelab study paper` run shared by every study test (about 20 s on a quiet machine)."""

import json
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def paper(tmp_path_factory) -> tuple[Path, dict]:
    from tests.conftest import run_cli

    out = tmp_path_factory.mktemp("paper")
    start = time.perf_counter()
    r = run_cli("study", "paper", "--out", str(out), "--json", timeout=300)
    seconds = time.perf_counter() - start
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    doc["_seconds"] = seconds
    return out, doc


def figure(out: Path, name: str) -> dict:
    """The figure-data JSON written beside `name`.png."""
    return json.loads((out / f"{name}.json").read_text())
