"""A local sweep of tiny CPU points end to end: kill and resume, a failing point, the report.

2 models × world sizes 1 and 2 (4 points, 2 repeats inside each bench run). The sweep is killed
(SIGKILL to its process group) as soon as its first record appears, then run again: the finished
points are skipped, the rest run (two at a time: --max-parallel 2), and no half-written file is ever
left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from scalelab.results import load_record, record_paths
from tests.sweep.conftest import TINY_SWEEP, child_env, dump_dom, scalelab, write_sweep

pytestmark = pytest.mark.distributed


def _fail_keep_retry(folder: Path) -> dict[str, Any]:
    """A one-point sweep whose point fails on purpose (the harness's fault hook: rank 0 raises at
    step 1), run again (the failure is kept), then with --retry-failed."""
    sweep = write_sweep(
        folder,
        "models: [llama-tiny]\nbench: {steps: 2, warmup: 1, repeats: 1, seed: 7}\n",
        "fail.yaml",
    )
    out = folder / "out"
    runs: dict[str, Any] = {"out": out}
    runs["failed"] = scalelab(
        "sweep", str(sweep), "--out", str(out), "--json", SCALELAB_FAULT="0:1"
    )
    if runs["failed"].stdout.strip():
        point = json.loads(runs["failed"].stdout)["points"][0]
        runs["failed_record"] = load_record(point["record"]) if point.get("record") else None
    runs["kept"] = scalelab("sweep", str(sweep), "--out", str(out), "--json")
    if runs.get("failed_record") is not None:
        runs["kept_record"] = load_record(point["record"])
    runs["retried"] = scalelab("sweep", str(sweep), "--out", str(out), "--json", "--retry-failed")
    return runs


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the tiny sweep, kill it after its first record, and resume it. Meanwhile, in a second
    thread, `_fail_keep_retry` (one-process points: mostly one core's work, so on 2 cores the two
    take little more than the first alone)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        failing = pool.submit(_fail_keep_retry, tmp_path_factory.mktemp("fail"))
        result = _kill_and_resume(tmp_path_factory.mktemp("sweep"))
        result["fail_keep_retry"] = failing.result()
    return result


def _kill_and_resume(folder: Path) -> dict[str, Any]:
    sweep = write_sweep(folder, TINY_SWEEP)
    out = folder / "out"
    cmd = [sys.executable, "-m", "scalelab", "sweep", str(sweep), "--out", str(out)]
    proc = subprocess.Popen(
        cmd,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    first: list[Path] = []
    while time.monotonic() < deadline and proc.poll() is None:
        first = list(out.glob("*.json"))
        if first:
            break
        time.sleep(0.05)
    assert first, "no record appeared before the deadline"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_with = {p.name: load_record(p).status for p in out.glob("*.json")}
    time.sleep(1.0)  # the killed point's processes end (they die with the sweep)
    # Resumed two points at a time (--max-parallel 2): the processes' start-up is mostly one core's
    # work, so on 2 cores the three points left take about two points' time.
    resumed = scalelab(
        "sweep", str(sweep), "--out", str(out), "--max-parallel", "2", "--json", timeout=300
    )
    return {
        "out": out,
        "sweep": sweep,
        "killed_with": killed_with,
        "resumed": resumed,
    }


def test_resume_after_kill_skips_done_points_and_completes(swept: dict[str, Any]) -> None:
    resumed = swept["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    doc = json.loads(resumed.stdout)
    points = doc["points"]
    assert doc["complete"] and len(points) == 4
    assert all(p["state"] == "ok" for p in points)
    ok_before = {name for name, status in swept["killed_with"].items() if status == "ok"}
    assert ok_before, swept["killed_with"]
    skipped = {Path(p["record"]).name for p in points if p["action"] == "skipped"}
    ran = {Path(p["record"]).name for p in points if p["action"] == "ran"}
    assert skipped == ok_before  # exactly what was done before the kill
    assert len(ran) == 4 - len(ok_before)

    out: Path = swept["out"]
    records = {p.name: load_record(p) for p in record_paths(out)}
    assert set(records) == {Path(p["record"]).name for p in points}
    # No half-written file: only whole records in the folder, no temporary left behind.
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    for name, record in records.items():
        assert record.status == "ok"
        assert name == f"{record.name}.json"
        tags = record.workload["tags"]
        assert tags["sweep"] == "tiny" and tags["series"] == ["fsdp"]
        assert record.layout is not None and record.layout["gpus"] == tags["gpus_per_node"]
        assert record.summary["tokens_per_s"]["n"] == 2  # 2 repeats, so an interval
        assert record.summary["tokens_per_s"]["ci95_low"] is not None
    # A third run runs nothing.
    again = scalelab("sweep", str(swept["sweep"]), "--out", str(out), "--json")
    assert again.returncode == 0
    assert {p["action"] for p in json.loads(again.stdout)["points"]} == {"skipped"}


def test_failed_point_is_recorded_kept_and_retried(swept: dict[str, Any]) -> None:
    runs = swept["fail_keep_retry"]
    failed, out = runs["failed"], runs["out"]
    assert failed.returncode == 1, failed.stderr[-3000:]
    point = json.loads(failed.stdout)["points"][0]
    assert point["state"] == "failed" and "injected failure" in point["detail"]
    record = runs["failed_record"]
    assert record.status == "failed" and "rank 0" in (record.error or "")

    kept = runs["kept"]
    assert kept.returncode == 1
    assert json.loads(kept.stdout)["points"][0]["action"] == "skipped"
    assert runs["kept_record"].created_utc == record.created_utc

    retried = runs["retried"]
    assert retried.returncode == 0, retried.stderr[-3000:]
    again = json.loads(retried.stdout)["points"][0]
    assert again["state"] == "ok" and again["action"] == "retried"
    assert load_record(again["record"]).status == "ok"
    # The failed attempt is kept out of the way, where loaders do not look.
    attempts = list((out / ".sweep" / "attempts").glob("*.json"))
    assert len(attempts) == 1 and load_record(attempts[0]).status == "failed"
    assert len(record_paths(out)) == 1


def test_report_of_the_sweep(swept: dict[str, Any], tmp_path: Path) -> None:
    # CPU records name no cluster: --predict alone does not predict them for some GPU cluster.
    # Both reports in their own processes, at once (two cores).
    report = tmp_path / "report"
    records = str(swept["out"])
    with ThreadPoolExecutor(max_workers=2) as pool:
        alone_run = pool.submit(
            scalelab, "report", records, "--out", str(tmp_path / "r0"), "--predict", "--json"
        )
        done = scalelab(
            "report", records, "--out", str(report), "--predict", "--cluster", "h100-ib", "--json"
        )
        alone = alone_run.result()
    assert alone.returncode == 0, alone.stderr[-3000:]
    notes = json.loads(alone.stdout)["notes"]
    assert len(notes) == 4 and all("names no cluster" in n for n in notes), notes
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["records"] == 4 and doc["ok"] == 4 and doc["configurations"] == 4
    assert "Predicted for cluster <b>h100-ib</b>" in (report / "index.html").read_text()
    for name in ("index.html", "records.parquet", "records.csv", "summary.csv"):
        assert (report / name).is_file(), name
    # Throughput against GPU count, measured and predicted; no energy on CPU.
    assert {"tokens_per_s_per_gpu", "tokens_per_s", "ratio"} <= set(doc["figures"])
    dom = dump_dom(report / "index.html")
    n = len(doc["figures"])
    assert f'data-figures-total="{n}"' in dom and f'data-figures-loaded="{n}"' in dom, dom[:400]
    assert 'data-figures-broken=""' in dom
    assert "no CUDA device" in dom  # why power and energy are absent
