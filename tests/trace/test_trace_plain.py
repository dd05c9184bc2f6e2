"""The numpy-free default report (`scalelab.trace.plain`) gives the full analysis's numbers and
table on every test trace, and the default command imports no numpy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from trace_helpers import TRACES, write_trace, x

from scalelab.cli import trace as cli
from scalelab.trace import analyze, load, plain
from scalelab.trace.report import TraceReport

SRC = Path(__file__).resolve().parents[2] / "src"
ALL = sorted(p.name for p in TRACES.glob("*.json.gz"))
GPU = [name for name in ALL if not name.startswith("cpu-")]


def _table(report: TraceReport, *, per_step: bool) -> str:
    out = cli._Out()
    cli._render(out, report, per_step=per_step, stragglers=False, kernels=False, bandwidth=False)
    return "\n".join(out.parts)


@pytest.mark.parametrize("name", GPU)
def test_the_plain_report_equals_the_full_analysis(name: str) -> None:
    full = analyze(TRACES / name)
    fast = plain.report([TRACES / name])
    a, b = full.ranks[0], fast.ranks[0]
    for key in ("path", "rank", "world_size", "mode", "step_source", "n_events", "n_lanes"):
        assert getattr(a, key) == getattr(b, key), key
    assert (a.launched_before_profiling, a.notes) == (b.launched_before_profiling, b.notes)
    for key in ("total", "outside_steps", "before_steps", "after_steps"):
        assert getattr(a, key).to_dict() == getattr(b, key).to_dict(), key
    assert [s.to_dict() for s in a.steps] == [s.to_dict() for s in b.steps]
    assert full.summary.to_dict() == fast.summary.to_dict()
    for per_step in (False, True):
        assert _table(full, per_step=per_step) == _table(fast, per_step=per_step)


def test_what_the_plain_report_does_not_cover_is_left_to_the_full_analysis(
    tmp_path: Path,
) -> None:
    with pytest.raises(plain.UnsupportedError):
        plain.report([TRACES / "cpu-gloo-rank34-of-300.json.gz"])  # a CPU trace
    with pytest.raises(plain.UnsupportedError):  # two ranks: matched for stragglers
        plain.report(
            [TRACES / "sampled-rank0-of-128.json.gz", TRACES / "sampled-rank1-of-128.json.gz"]
        )
    odd = write_trace(  # a stream id that is a string: the full analysis reads it
        tmp_path / "odd.json",
        [
            x("k", 10.0, 5.0, cat="kernel", tid="stream 7"),
            x("ncclKernel_AllReduce", 12.0, 5.0, cat="kernel"),
        ],
    )
    with pytest.raises(plain.UnsupportedError):
        plain.report([odd])


def _importtime(*args: str) -> tuple[str, list[str]]:
    """The command's output and the modules it imported, in the order their imports ended."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "scalelab", "trace", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-500:]
    imported = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line]
    return done.stdout, imported


def test_the_default_command_does_not_import_numpy() -> None:
    path = TRACES / "a100-ddp-rank0-of-2.json.gz"
    out, imported = _importtime(str(path), "--per-step")
    assert "numpy" not in imported
    assert out == _table(analyze(path), per_step=True) + "\n"
    # what the plain path does not cover still works, with numpy
    out, imported = _importtime(str(path), "--kernels")
    assert "numpy" in imported and "kernel time by class" in out


def test_the_command_reads_its_file_beside_the_decoders_imports() -> None:
    """The command's start-up: the file's read (a thread, `threading`) starts before `typing`
    is imported (by msgspec), and msgspec comes without typing_extensions and `inspect`
    (~17 ms); no dataclass on the path (`dataclasses` imports `inspect` too)."""
    _, order = _importtime(str(TRACES / "a100-ddp-rank0-of-2.json.gz"))
    assert order.index("threading") < order.index("typing") < order.index("msgspec")
    # (importtime lists typing_extensions for the attempts refused; loaded, it imports inspect)
    for absent in ("inspect", "dataclasses", "numpy"):
        assert absent not in order, absent


def test_msgspec_imported_lean_then_typing_extensions_as_usual() -> None:
    """The lean import leaves no block behind: typing_extensions imports afterwards, and
    msgspec decodes."""
    script = (
        "import sys\n"
        "from scalelab.cli.trace import _import_msgspec_lean\n"
        "_import_msgspec_lean()\n"
        "assert 'msgspec' in sys.modules and 'typing_extensions' not in sys.modules\n"
        "import msgspec, typing_extensions\n"
        "class P(msgspec.Struct):\n"
        "    x: int\n"
        "    y: 'str | None' = None\n"
        "print(msgspec.json.Decoder(P).decode(b'{\"x\": 3}'), typing_extensions.__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.split() == ["P(x=3,", "y=None)", "typing_extensions"]


def test_a_msgspec_that_needs_typing_extensions_is_imported_as_usual(tmp_path: Path) -> None:
    """Should a msgspec release import typing_extensions unconditionally, the lean import
    gives up and the usual import runs (a stand-in package that does so)."""
    stand_in = tmp_path / "msgspec"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text("import typing_extensions\nLEAN = False\n")
    script = (
        "import sys\n"
        "from scalelab.cli.trace import _import_msgspec_lean\n"
        "_import_msgspec_lean()\n"
        "assert 'msgspec' not in sys.modules\n"
        "assert sys.modules.get('typing_extensions', 1) is not None\n"
        "import msgspec\n"
        "print(msgspec.LEAN, sys.modules['typing_extensions'].__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), str(SRC)))}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.split() == ["False", "typing_extensions"]


def test_the_full_analysis_without_the_kernel_report_is_otherwise_the_same() -> None:
    path = TRACES / "a100-ddp-rank0-of-2.json.gz"
    full, lean = analyze(path).to_dict(), analyze(path, kernels=False).to_dict()
    assert full["ranks"][0].pop("kernels") is not None
    assert lean["ranks"][0].pop("kernels") is None
    assert full == lean


def test_a_file_over_the_size_limit_takes_the_numpy_analysis(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = TRACES / "a100-ddp-rank0-of-2.json.gz"
    calls: list[object] = []
    monkeypatch.setattr(plain, "rank_report", lambda *a: calls.append(a) or _real_rank_report(*a))
    assert cli.run([str(path)]) == 0
    assert calls and capsys.readouterr().out == _table(analyze(path), per_step=False) + "\n"
    monkeypatch.setattr(load, "PLAIN_MAX_BYTES", 1000)
    calls.clear()
    assert cli.run([str(path)]) == 0
    assert not calls and capsys.readouterr().out == _table(analyze(path), per_step=False) + "\n"


_real_rank_report = plain.rank_report


def test_microseconds_to_nanoseconds_in_bulk_is_one_by_one() -> None:
    """`_to_ns` (C-level maps) gives `_us_to_ns` of each value (whole and fraction apart), on
    timestamps of every magnitude, with up to three decimals and with none."""
    import random

    rng = random.Random(14)
    values = [rng.random() * 10 ** rng.randint(0, 15) for _ in range(20_000)]
    values += [round(rng.random() * 2e12, 3) for _ in range(20_000)]
    values += [0.0, 0.0005, 0.0015, 0.5, 1.0, 2.5, 4458676983543.183, 1661203463029566.0]
    values += [2.0**52, 2.0**53 - 1]
    assert plain._to_ns(values) == [plain._us_to_ns(v) for v in values]
    assert plain._to_ns([-1.5, 2.0]) == [plain._us_to_ns(-1.5), 2000]
