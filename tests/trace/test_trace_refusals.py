"""Wrong input refused with one line naming the files: ranks of different runs, a rank given
twice, a GPU trace without its device events, impossible durations (issue 33, item 6)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from trace_helpers import TRACES, write_trace, x

from scalelab.errors import InputError
from scalelab.trace import analyze
from scalelab.trace.synthetic import write_job

PAIR = ("sampled-rank0-of-128.json.gz", "sampled-rank1-of-128.json.gz")
DAY_US = 86_400 * 1_000_000


def _document(name: str) -> dict[str, Any]:
    return json.loads(gzip.decompress((TRACES / name).read_bytes()))


def _shifted(document: dict[str, Any], shift_us: float) -> dict[str, Any]:
    for ev in document["traceEvents"]:
        if isinstance(ev.get("ts"), (int, float)):
            ev["ts"] += shift_us
    return document


def test_a_pair_of_ranks_of_one_run_is_matched(tmp_path: Path) -> None:
    for name in PAIR:
        shutil.copy(TRACES / name, tmp_path / name)
    report = analyze(tmp_path)
    assert report.stragglers is not None and len(report.ranks) == 2


def test_ranks_of_two_runs_589_days_apart_are_refused(tmp_path: Path) -> None:
    """Before: a straggler that 'made the others wait' 589 days."""
    shutil.copy(TRACES / PAIR[0], tmp_path / PAIR[0])
    late = tmp_path / "sampled-rank1-of-128.json"
    late.write_text(json.dumps(_shifted(_document(PAIR[1]), 589 * DAY_US)))
    with pytest.raises(InputError, match=r"589\.\d days before .*sampled-rank1.*do not overlap"):
        analyze(tmp_path)
    # as traces of different jobs they are analysed apart
    assert analyze(tmp_path, unrelated=True).stragglers is None


def test_ranks_of_runs_with_different_world_sizes_are_refused(tmp_path: Path) -> None:
    for name in ("rank3-of-8.json.gz", "rank1-of-2.json.gz"):
        shutil.copy(TRACES / name, tmp_path / name)
    with pytest.raises(InputError, match=r"world size 2\).*world size 8\).*different runs"):
        analyze(tmp_path, kernels=False)


def test_the_same_folder_twice_is_refused(tmp_path: Path) -> None:
    """Before: analysed as four ranks."""
    for name in PAIR:
        shutil.copy(TRACES / name, tmp_path / name)
    with pytest.raises(InputError, match=r"same file: give each rank's trace once"):
        analyze([tmp_path, tmp_path])


def test_a_rank_given_twice_under_two_names_is_refused(tmp_path: Path) -> None:
    shutil.copy(TRACES / PAIR[0], tmp_path / PAIR[0])
    shutil.copy(TRACES / PAIR[0], tmp_path / "copy-of-rank0.json.gz")
    with pytest.raises(
        InputError, match=r"copy-of-rank0.json.gz and .*sampled-rank0.* both rank 0"
    ):
        analyze(tmp_path)


def test_a_gpu_trace_with_its_device_events_stripped_is_refused(tmp_path: Path) -> None:
    """Before: analysed as a CPU trace (host operators as compute)."""
    document = _document("amd-mi250-rocm.json.gz")
    device = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
    document["traceEvents"] = [e for e in document["traceEvents"] if e.get("cat") not in device]
    path = tmp_path / "stripped.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match=r"stripped.json.*14 GPU launch calls .* no kernel"):
        analyze(path)


def test_a_cpu_trace_is_still_a_cpu_trace() -> None:
    assert analyze(TRACES / "cpu-gloo-rank34-of-300.json.gz").ranks[0].mode == "cpu"


@pytest.mark.parametrize("category", ["kernel", "cuda_runtime", "user_annotation"])
def test_an_impossible_negative_duration_is_refused(tmp_path: Path, category: str) -> None:
    """Before: a huge negative duration silently emptied its step."""
    events = [
        x("ProfilerStep#1", 0, 100, cat="user_annotation", pid=1, tid=1),
        x("cudaLaunchKernel", 1, 2, cat="cuda_runtime", pid=1, tid=1, correlation=1),
        x("sm90_xmma_gemm", 5, 10, cat="kernel", pid=0, tid=7, correlation=1),
    ]
    bad = next(i for i, e in enumerate(events) if e["cat"] == category)
    events[bad]["dur"] = -1e9
    path = write_trace(tmp_path / "negative.json", events)
    with pytest.raises(InputError, match=rf"negative.json: traceEvents\[{bad}\]\.dur.*negative"):
        analyze(path)


def test_single_rank_bandwidth_is_a_lower_bound_and_a_whole_group_is_not(tmp_path: Path) -> None:
    alone = analyze(TRACES / "a100-ddp-rank0-of-2.json.gz").ranks[0].bandwidth
    assert alone and all(row.lower_bound for row in alone)
    assert all(row.to_dict()["lower_bound"] is True for row in alone)
    # two of 128 ranks: the others may still be late
    for name in PAIR:
        shutil.copy(TRACES / name, tmp_path / name)
    assert all(row.lower_bound for r in analyze(tmp_path).ranks for row in r.bandwidth)
    # both ranks of a 2-rank group: times after the last arrival
    write_job(TRACES / "a100-ddp-rank0-of-2.json.gz", tmp_path / "job", 2, late_rank=1, late_us=40)
    together = [row for r in analyze(tmp_path / "job").ranks for row in r.bandwidth]
    assert together and not any(row.lower_bound for row in together if row.group_size == 2)


def test_an_endless_file_and_a_gzip_bomb_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34 class 3 through the trace reader: a link to /dev/zero is not read at all, and a
    small gzip that inflates past the input bound stops at the bound."""
    from scalelab.trace.load import read_bytes

    endless = tmp_path / "rank0.json"
    endless.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="not a regular file"):
        read_bytes(endless)
    monkeypatch.setenv("SCALELAB_MAX_INPUT_MIB", "1")
    bomb = tmp_path / "rank1.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (3 * 2**20) + b"]}"))
    assert bomb.stat().st_size < 2**15
    with pytest.raises(InputError, match="inflates to more than the 1 MiB"):
        read_bytes(bomb)
