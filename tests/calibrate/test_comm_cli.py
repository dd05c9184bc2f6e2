import json
import sys

import pytest

from tests.conftest import run_cli_all

pytest.importorskip("torch")


@pytest.mark.distributed
def test_comm_sweep_on_gloo_then_calibrate(cli, tmp_path) -> None:
    """docs/calibration.md's laptop path (its commands are parsed by tests/docs): a real two-process gloo sweep, then a fitted cluster file."""
    runs = tmp_path / "runs"
    r = cli(
        "comm",
        "--nproc-per-node",
        "2",
        "--collectives",
        "all_reduce,all_gather,send_recv",
        "--sizes",
        "4K:1M:4",
        "--iters",
        "5",
        "--warmup",
        "1",
        "--out",
        str(runs),
        "--json",
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(r.stdout)
    assert record["kind"] == "comm" and record["status"] == "ok"
    rows = record["measurements"]["rows"]
    assert {x["collective"] for x in rows} == {"all_reduce", "all_gather", "send_recv"}
    for x in rows:
        factor = {"all_reduce": 1.0, "all_gather": 0.5, "send_recv": 1.0}[x["collective"]]  # n = 2
        assert x["busbw_GBps"] == pytest.approx(x["algbw_GBps"] * factor)
        assert x["algbw_GBps"] == pytest.approx(x["bytes"] / x["time_s"] / 1e9)
        assert x["time_s_min"] <= x["time_s"] <= x["time_s_max"]
    out = tmp_path / "cpu.yaml"
    c = cli("calibrate", str(runs), "--base", "cpu-gloo", "--out", str(out), "--json")
    assert c.returncode == 0, c.stderr
    fitted = json.loads(c.stdout)
    assert fitted["error_after"] < fitted["error_before"]
    assert out.exists()


BAD_FLAGS = [
    (["--collectives", "broadcast"], "collectives:"),
    (["--sizes", "lots"], "sizes:"),
    (["--iters", "0"], "iters:"),
    (["--sizes", "1K", "-b", "8"], "sizes:"),
    (["-b", "1M", "-e", "8"], "maxbytes:"),
    (["-b", "8", "-e", "1M", "-f", "1"], "stepfactor:"),
    (["-b", "1", "-e", "1G", "-i", "1"], "sizes:"),
    (["--check", "-1"], "check:"),
]


@pytest.fixture(scope="module")
def bad_flag_runs():
    """Every BAD_FLAGS command in its own process, two at a time (refused before torch's import)."""
    argvs = [("comm", *args) for args, _ in BAD_FLAGS]
    return dict(zip(argvs, run_cli_all(argvs), strict=True))


@pytest.mark.parametrize(("args", "needle"), BAD_FLAGS)
def test_comm_bad_flags(bad_flag_runs, args, needle) -> None:
    r = bad_flag_runs[("comm", *args)]
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--collectives", "broadcast"], "collectives"),
        (["--sizes", "lots"], "sizes"),
        (["--iters", "0"], "iters"),
        (["--nproc-per-node", "0"], "nproc-per-node"),
    ],
)
def test_comm_bad_flags_fail_before_torch_is_imported(
    args, field, capsys, monkeypatch, tmp_path
) -> None:
    """Bad flags are refused before `import torch` (~3 s a process): with torch (and the
    benchmark module, which imports it) unimportable, the line still names the flag."""
    from scalelab.cli import main

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "scalelab.measure.comm_bench", None)
    with pytest.raises(SystemExit) as exit_info:
        main(["comm", *args, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"scalelab: error: {field}:"), err
