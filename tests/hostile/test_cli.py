"""Every verb against hostile and careless input (the table in `cases.py`).

Each case runs through `scalelab.cli.main`, the console entry point, in this process (the same
code path as `python -m scalelab`, without a fresh interpreter per case); `test_as_a_user_would`
runs a sample as real subprocesses. Each must end with exit code 2 and exactly one line on
stderr naming the field or file, with no traceback and nothing written to its output folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scalelab.cli import main
from tests.hostile.cases import CASES, Case, build

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    build(d)
    return d


def _leftovers(d: Path, case: Case) -> list[str]:
    """Files a failed case left: anything in its output folder, or a temporary file anywhere."""
    found = [str(p) for p in d.rglob("*.tmp")] + [str(p) for p in d.rglob(".scalelab-probe-*")]
    if case.out is not None and (d / case.out).exists():
        found += [str(p) for p in (d / case.out).rglob("*") if p.is_file()]
    return found


def _check(case: Case, d: Path, code: object, stderr: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, f"{case.id}: a traceback\n{stderr}"
    assert code == 2, f"{case.id}: exit {code}, stderr {stderr!r}"
    assert len(lines) == 1, f"{case.id}: {len(lines)} lines on stderr:\n{stderr}"
    assert lines[0].startswith("scalelab: error: "), lines[0]
    assert case.names in lines[0], f"{case.id}: the line does not name {case.names!r}: {lines[0]}"
    assert not _leftovers(d, case), f"{case.id}: left {_leftovers(d, case)}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_line_and_exit_2(
    case: Case, folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(folder)
    monkeypatch.setenv("COLUMNS", "200")
    code: object = 0
    try:
        main(case.argv(folder))
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    _check(case, folder, code, captured.err)


# A sample as a user runs them (fresh processes; verbs that import torch to start are left to the
# in-process table, which runs every case).
SUBPROCESS = [
    "predict-model-binary",
    "validate-cut",
    "bench-out-file",
    "trace-nested",
    "trace-folder-bad",
    "calibrate-nested",
    "report-repeat-str",
]


def test_as_a_user_would(folder: Path) -> None:
    by_id = {c.id: c for c in CASES}
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)

    def run(case: Case) -> tuple[Case, subprocess.CompletedProcess[str]]:
        proc = subprocess.run(
            [sys.executable, "-m", "scalelab", *case.argv(folder)],
            capture_output=True, text=True, timeout=120, env=env, cwd=folder,
        )  # fmt: skip
        return case, proc

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, [by_id[i] for i in SUBPROCESS]))
    for case, proc in results:
        _check(case, folder, proc.returncode, proc.stderr)


@pytest.mark.parametrize(
    "exc",
    [
        RecursionError("maximum recursion depth exceeded"),
        OverflowError("int too large to convert to float"),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
    ],
    ids=lambda e: type(e).__name__,
)
@pytest.mark.parametrize("verb", ["trace", "search"])
def test_the_net_under_every_reader(
    verb: str,
    exc: BaseException,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parse error that a reader does not turn into an InputError is still one line, exit 2
    (trace's reader and the other verbs' alike)."""
    import scalelab.cli.search
    import scalelab.trace

    def fail(*args: object, **kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(scalelab.trace, "analyze", fail)
    monkeypatch.setattr(scalelab.cli.search, "load_model", fail)
    with pytest.raises(SystemExit) as info:
        main([verb, "x"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("scalelab: error: input: "), err
    assert type(exc).__name__ in err


def test_trace_skip_bad(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder with two good and two bad traces: by default exit 2 naming the first bad file and
    how many are bad; with --skip-bad the good ones are analysed and the bad ones listed."""
    import json

    bad = str(folder / "traces-bad")
    with pytest.raises(SystemExit) as info:
        main(["trace", bad])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert "rank2.json" in err and "1 more bad file of 4: rank3.json" in err and "--skip-bad" in err

    main(["trace", bad, "--skip-bad", "--json"])
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert [Path(r["path"]).name for r in document["ranks"]] == ["rank0.json", "rank1.json"]
    assert [Path(s["path"]).name for s in document["skipped"]] == ["rank2.json", "rank3.json"]
    assert all("not valid JSON" in s["reason"] for s in document["skipped"])
    assert captured.err.count("scalelab trace: skipped ") == 2

    with pytest.raises(SystemExit) as info:  # no good file: still exit 2
        main(["trace", str(folder / "bin.json"), "--skip-bad"])
    assert info.value.code == 2
