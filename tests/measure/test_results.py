"""The result record: statistics, atomic writes, refusal of bad files, the DataFrame and exports."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from scalelab.errors import InputError
from scalelab.results import (
    SCHEMA_VERSION,
    Record,
    export,
    load_record,
    load_records,
    record_name,
    stats,
    summarise,
    write_record,
)


def make_record(name: str = "r1", tokens_per_s: float = 100.0, status: str = "ok") -> Record:
    return Record(
        kind="bench",
        run_id="0123456789abcdef",
        name=name,
        created_utc="2026-12-02T10:00:00Z",
        status=status,  # type: ignore[arg-type]
        workload={"model": "llama-tiny", "seq_len": 32},
        layout={"gpus": 2, "sharding": "fsdp"},
        cluster=None,
        measurements={"repeats": [{"step_time_s": [0.1, 0.2], "loss": [5.0, float("nan")]}]},
        summary={"tokens_per_s": stats([tokens_per_s, tokens_per_s + 2])},
        notes={"energy_j": "no CUDA device"},
    )


def test_stats_by_hand() -> None:
    s = stats([1.0, 2.0, 3.0])
    assert s["mean"] == 2.0 and s["n"] == 3
    assert s["std"] == pytest.approx(1.0)
    half = 4.3026527 * 1.0 / math.sqrt(3)  # t(0.975, 2 dof), from tables
    assert s["ci95_low"] == pytest.approx(2.0 - half)
    assert s["ci95_high"] == pytest.approx(2.0 + half)
    one = stats([5.0, None])
    assert one == {"mean": 5.0, "std": None, "ci95_low": None, "ci95_high": None, "n": 1}
    assert stats([])["mean"] is None


@pytest.mark.parametrize(("n", "t975"), [(32, 2.0395), (61, 2.0003), (121, 1.9799)])
def test_stats_use_the_student_t_beyond_30_degrees_of_freedom(n: int, t975: float) -> None:
    """The t quantile at 31-120 degrees of freedom is not the normal's 1.96 (the old table's
    fallback): 2.040 at 31, 2.000 at 60, 1.980 at 120 (scipy.stats.t.ppf)."""
    values = [float(i % 2) for i in range(n)]
    s = stats(values)
    half = (s["ci95_high"] - s["ci95_low"]) / 2
    assert half == pytest.approx(t975 * s["std"] / math.sqrt(n), rel=1e-4)


def test_a_nonnegative_quantity_never_gets_a_negative_lower_bound() -> None:
    """Two repeats of a step time (t = 12.7): the interval is clipped at 0 and flagged."""
    assert stats([0.1, 0.3])["ci95_low"] < 0
    clipped = stats([0.1, 0.3], nonnegative=True)
    assert clipped["ci95_low"] == 0.0 and clipped["ci95_clipped"] is True
    assert (
        summarise([{"step_time_s": 0.1}, {"step_time_s": 0.3}], ["step_time_s"])["step_time_s"][
            "ci95_low"
        ]
        == 0.0
    )


def test_write_and_load_roundtrip(tmp_path: Path) -> None:
    record = make_record()
    path = write_record(record, tmp_path)
    assert path == tmp_path / "r1.json"
    assert [p.name for p in tmp_path.iterdir()] == ["r1.json"], "temporary file left behind"
    loaded = load_record(path)
    assert loaded.summary["tokens_per_s"]["mean"] == 101.0
    assert loaded.measurements["repeats"][0]["loss"] == [5.0, None], "NaN must become null"
    json.loads(path.read_text())  # strict JSON


def test_first_writer_wins_without_overwrite(tmp_path: Path) -> None:
    write_record(make_record(status="failed"), tmp_path, overwrite=False)
    with pytest.raises(FileExistsError):
        write_record(make_record(status="ok"), tmp_path, overwrite=False)
    assert load_record(tmp_path / "r1.json").status == "failed"
    assert len(list(tmp_path.iterdir())) == 1


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = write_record(make_record(), tmp_path)
    data = json.loads(path.read_text())
    data["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="newer than this scalelab reads") as err:
        load_record(path)
    assert err.value.field == "record"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"schema_version": 1, "kind": "ben', "not a valid JSON record"),
        ("[1, 2]", "no schema_version"),
    ],
)
def test_corrupt_records_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_record(path)


def test_load_records_dataframe_and_exports(tmp_path: Path) -> None:
    write_record(make_record("a", 100.0), tmp_path)
    write_record(make_record("b", 200.0), tmp_path / "sub")
    (tmp_path / ".c.json.tmp-1234").write_text('{"half": ')  # a writer killed mid-write
    (tmp_path / "traces").mkdir()
    df = load_records(tmp_path)
    assert len(df) == 2
    assert sorted(df["summary.tokens_per_s.mean"]) == [101.0, 201.0]
    assert set(df["layout.sharding"]) == {"fsdp"}
    assert "measurements.repeats" not in df.columns
    full = load_records(tmp_path, include_measurements=True)
    assert json.loads(full["measurements.repeats"].iloc[0])[0]["step_time_s"] == [0.1, 0.2]
    for suffix in (".parquet", ".csv"):
        out = export(df, tmp_path / "out" / f"records{suffix}")
        back = pd.read_parquet(out) if suffix == ".parquet" else pd.read_csv(out)
        assert sorted(back["summary.tokens_per_s.mean"]) == [101.0, 201.0]
    with pytest.raises(InputError, match=r"\.parquet or \.csv"):
        export(df, tmp_path / "records.xlsx")


def test_record_name_is_sortable_and_safe() -> None:
    name = record_name("bench", "llama/tiny fsdp", "2026-12-02T10:00:00Z", "0123456789abcdef")
    assert name == "20261202T100000-bench-llama_tiny_fsdp-01234567"


_SLOW_WRITER = """
import sys, time
from scalelab import results
from scalelab.results import Record

real_fsync = results.os.fsync
def slow_fsync(fd):
    print("WRITING", flush=True)
    time.sleep(60)
    real_fsync(fd)
results.os.fsync = slow_fsync
record = Record(kind="bench", run_id="f" * 16, name="killed", created_utc="2026-12-02T10:00:00Z",
                status="ok", measurements={"big": list(range(200000))})
results.write_record(record, sys.argv[1])
"""


def test_killed_writer_leaves_no_record(tmp_path: Path) -> None:
    """SIGKILL a process in the middle of writing a record: no *.json appears, the loader is clean."""
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=str(src))
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "WRITING"
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert leftovers and all(n.startswith(".killed.json.tmp-") for n in leftovers), leftovers
    assert not list(tmp_path.glob("*.json"))
    assert load_records(tmp_path).empty
