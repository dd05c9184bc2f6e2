"""How fast is `scalelab trace` against Holistic Trace Analysis on the same large trace?

Builds synthetic Kineto traces (`scalelab.trace.synthetic`: host steps, launches, compute kernels
on several streams, NCCL kernels on their own streams, copies) of at least a million events, then
times, on the same files:

* scalelab: `scalelab.trace.analyze(files)` in this interpreter (parse + analysis), best of N,
  with its typed fast path (msgspec) when installed and again with the general path (orjson);
* HTA: `TraceAnalysis(trace_dir).get_comm_comp_overlap()` in HTA's own environment (a separate
  venv, `--hta-python`, default /work/venv-hta/bin/python), run as a subprocess, parse + analysis
  timed inside it (interpreter start and imports excluded on both sides).

It prints events, seconds each, the speed-up, and both tools' overlap percentages, which must be
equal. Without HTA it says so and times scalelab alone. `--real DIR` also times both, file by
file, on real traces (where HTA's overlap differs by definition: it drops the last profiler step
and kernels it cannot correlate); there it also times the `scalelab trace FILE` command, a new
process each time, against HTA's library call and against a whole HTA process. Record results
in docs/benchmarks.md with the date, the machine and its load (printed).

    PYTHONPATH=src python benchmarks/trace_speed.py [--events 1000000] [--ranks 1] [--real tests/data/traces]
    PYTHONPATH=src python benchmarks/trace_speed.py --real tests/data/traces --real-only --repeat 5 --hta-repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scalelab.trace import analyze
from scalelab.trace.load import Parser, typed_parser_available
from scalelab.trace.synthetic import write_synthetic_trace

DEFAULT_HTA_PYTHON = os.environ.get("SCALELAB_HTA_PYTHON", "/work/venv-hta/bin/python")

# Run inside HTA's venv: parse the folder and compute the overlap, timed without the imports.
_HTA_SCRIPT = r"""
import json, logging, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
from importlib.metadata import version
t0 = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
overlap = analysis.get_comm_comp_overlap(visualize=False)
seconds = time.perf_counter() - t0
print(json.dumps({
    "seconds": seconds,
    "version": version("HolisticTraceAnalysis"),
    "overlap_pct": {str(int(r)): float(p) for r, p in zip(overlap["rank"], overlap["comp_comm_overlap_pctg"])},
}))
"""


def make_traces(folder: Path, n_events: int, n_ranks: int) -> tuple[list[Path], int]:
    """Write (or reuse) one synthetic trace per rank; return the files and the total events."""
    folder.mkdir(parents=True, exist_ok=True)
    files, total = [], 0
    for rank in range(n_ranks):
        path = folder / f"synthetic-rank{rank}.json"
        stamp = folder / f".synthetic-rank{rank}.events"
        if path.exists() and stamp.exists():
            total += int(stamp.read_text())
        else:
            count = write_synthetic_trace(path, n_events=n_events, rank=rank, world_size=n_ranks)
            stamp.write_text(str(count))
            total += count
        files.append(path)
    return files, total


def time_scalelab(
    files: list[Path], repeat: int, parser: Parser = "auto", workers: int | None = None
) -> tuple[float, dict[str, float | None]]:
    best = float("inf")
    overlap: dict[str, float | None] = {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        report = analyze(files, parser=parser, workers=workers)
        best = min(best, time.perf_counter() - t0)
        overlap = {
            str(r.rank): None if r.total.overlap_pct is None else round(r.total.overlap_pct, 2)
            for r in report.ranks
        }
    return best, overlap


def time_hta(folder: Path, python: str, repeat: int, timeout_s: float) -> dict[str, object] | str:
    """HTA's figures, or a sentence saying why there are none."""
    if not Path(python).exists():
        return f"HTA skipped: no interpreter at {python} (see --hta-python)"
    best: dict[str, object] | None = None
    for _ in range(repeat):
        try:
            done = subprocess.run(
                [python, "-c", _HTA_SCRIPT, str(folder)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"HTA skipped: it ran past {timeout_s:.0f} s"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return f"HTA skipped: it failed ({last})"
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if best is None or result["seconds"] < best["seconds"]:  # type: ignore[operator]
            best = result
    assert best is not None
    return best


def _uptime() -> str:
    try:
        load = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (1, 5, 15 min)"


def _command_env() -> dict[str, str]:
    """The command as an installed package runs: its modules byte-compiled (pip does that at
    install; this sandbox sets PYTHONDONTWRITEBYTECODE, which would recompile every run)."""
    src = Path(__file__).resolve().parents[1] / "src"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(src / "scalelab")],
        env=env,
        check=False,
        capture_output=True,
    )
    return env


def time_command(path: Path, repeat: int, env: dict[str, str]) -> float:
    """Wall clock of `python -m scalelab trace FILE` (table output), a new process each time."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "scalelab", "trace", str(path)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            check=False,
        )
        best = min(best, time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"scalelab trace {path} failed: {done.stderr.decode()[-300:]}")
    return best


_FIRST_CALL = (
    "import sys, time\n"
    "from scalelab.trace import analyze\n"
    "t0 = time.perf_counter()\n"
    "analyze(sys.argv[1])\n"
    "print(time.perf_counter() - t0)\n"
)


def time_first_call(path: Path, repeat: int, env: dict[str, str]) -> float:
    """The library call as a process's first (imports excluded, as HTA's are): it forks the
    second process that a later call finds kept (`background._Helper`), and meets the
    copy-on-write faults that a kept one no longer has. Best of `repeat` new processes."""
    best = float("inf")
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, "-c", _FIRST_CALL, str(path)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"analyze({path}) failed: {done.stderr[-300:]}")
        best = min(best, float(done.stdout))
    return best


def time_hta_process(folder: Path, python: str) -> float:
    """Wall clock of a whole HTA process (interpreter, imports, parse, overlap)."""
    t0 = time.perf_counter()
    subprocess.run([python, "-c", _HTA_SCRIPT, str(folder)], capture_output=True, check=False)
    return time.perf_counter() - t0


def _warm_up(path: Path, env: dict[str, str], seconds: float = 3.0) -> None:
    """Untimed runs of the first file (library call and command) for a few seconds. On the
    2-core build VM the first file timed after idle paid for the machine's warming: a100-ddp
    measured 0.057 s (library) / 0.137 s (command) first in a full run and 0.052 / 0.132 s in
    a run of it alone right after; another time 0.060 / 0.128 s, then 0.058 / 0.116-0.119 s
    (2026-12-04). HTA, timed later, runs warm."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        analyze(path)
        time_command(path, 1, env)


def compare_real(
    folder: Path,
    python: str,
    repeat: int,
    hta_repeat: int,
    timeout_s: float,
    min_events: int,
    pattern: str = "*.json*",
    hta_process: bool = False,
) -> None:
    """Both tools, file by file, on real traces (HTA reads a folder: one temporary folder each).

    Columns: scalelab's library call (`analyze`, best of --repeat; as it runs by default, which
    decodes a large file in two processes on a machine with two cores or more, and in one
    process, `workers=1`; and as the first call of a new process, best of --repeat processes:
    later calls find the second process kept, `background._Helper`), the `scalelab trace FILE`
    command (a new process each time, best of --repeat), HTA's library call
    (`get_comm_comp_overlap`, parse + analysis, imports excluded, best of --hta-repeat) and a
    whole HTA process (one run). Ratios: HTA's library call over scalelab's library call, and
    over scalelab's whole command (the stricter comparison: the command pays Python's and
    numpy's start-up, HTA's library time does not).
    """
    env = _command_env()
    print(f"\nreal traces in {folder}; {_uptime()}")
    print(
        f"scalelab best of {repeat}, HTA library best of {hta_repeat}; targets apply to files "
        f"with more than {min_events:,} events"
    )
    header = (
        f"{'file':30} {'events':>8} {'lib s':>7} {'1st s':>7} {'lib1 s':>7} {'cmd s':>7} "
        f"{'HTA s':>7} {'HTA proc s':>10} {'lib x':>6} {'1st x':>6} {'lib1 x':>6} {'cmd x':>6} "
        f"{'cmd x proc':>10} {'overlap %':>9} {'HTA %':>7}"
    )
    print(header)
    paths = sorted(folder.glob(pattern))
    if paths:
        _warm_up(paths[0], env)
    for path in paths:
        seconds, overlap = time_scalelab([path], repeat)
        one_process_s, _ = time_scalelab([path], repeat, workers=1)
        first_s = time_first_call(path, repeat, env)
        command_s = time_command(path, repeat, env)
        report = analyze(path)
        (pct,) = overlap.values()
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(path, tmp)
            hta = time_hta(Path(tmp), python, hta_repeat, timeout_s)
            hta_proc = (
                time_hta_process(Path(tmp), python)
                if hta_process and not isinstance(hta, str)
                else float("nan")
            )
        n_events = report.ranks[0].n_events
        if isinstance(hta, str):
            hta_s, hta_pct = float("nan"), hta.split(":")[0]
        else:
            hta_s = float(hta["seconds"])  # type: ignore[arg-type]
            hta_pct = ", ".join(f"{v:g}" for v in hta["overlap_pct"].values())  # type: ignore[attr-defined]
        mark = "*" if n_events > min_events else " "
        print(
            f"{mark}{path.name.removesuffix('.json.gz'):29} {n_events:>8,} {seconds:>7.3f} "
            f"{first_s:>7.3f} {one_process_s:>7.3f} {command_s:>7.3f} {hta_s:>7.2f} "
            f"{hta_proc:>10.2f} {hta_s / seconds:>6.1f} {hta_s / first_s:>6.1f} "
            f"{hta_s / one_process_s:>6.1f} {hta_s / command_s:>6.1f} "
            f"{hta_proc / command_s:>10.1f} "
            f"{'—' if pct is None else pct:>9} {hta_pct:>7}",
            flush=True,
        )
    print(f"(* more than {min_events:,} events); {_uptime()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events per rank")
    parser.add_argument("--ranks", type=int, default=1, help="trace files (one per rank)")
    parser.add_argument("--repeat", type=int, default=3, help="scalelab runs (best is kept)")
    parser.add_argument("--hta-repeat", type=int, default=1, help="HTA runs (best is kept)")
    parser.add_argument("--hta-python", default=DEFAULT_HTA_PYTHON)
    parser.add_argument("--hta-timeout", type=float, default=300.0, help="seconds per HTA run")
    parser.add_argument("--workdir", type=Path, default=None, help="where the traces are kept")
    parser.add_argument("--real", type=Path, default=None, help="also compare on these real traces")
    parser.add_argument(
        "--real-only", action="store_true", help="skip the synthetic trace (with --real)"
    )
    parser.add_argument("--min-events", type=int, default=10_000, help="target threshold")
    parser.add_argument("--files", default="*.json*", help="glob of the real traces to time")
    parser.add_argument(
        "--hta-process", action="store_true", help="also time one whole HTA process per file"
    )
    args = parser.parse_args()
    if args.real_only:
        if args.real is None:
            parser.error("--real-only needs --real DIR")
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}"
        )
        compare_real(
            args.real,
            args.hta_python,
            args.repeat,
            args.hta_repeat,
            args.hta_timeout,
            args.min_events,
            args.files,
            args.hta_process,
        )
        return

    folder = (
        args.workdir
        or Path(tempfile.gettempdir()) / f"scalelab-trace-speed-{args.events}x{args.ranks}"
    )
    files, n_events = make_traces(folder, args.events, args.ranks)
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(
        f"traces: {len(files)} file(s), {n_events:,} events, {size_mb:,.0f} MB of JSON in {folder}"
    )

    path = "typed fast path (msgspec)" if typed_parser_available() else "general path (orjson)"
    scalelab_s, scalelab_overlap = time_scalelab(files, args.repeat)
    print(
        f"scalelab, {path}: {scalelab_s:.2f} s (best of {args.repeat}), "
        f"{n_events / scalelab_s / 1e6:.2f} M events/s, overlap % {scalelab_overlap}"
    )
    if typed_parser_available():
        general_s, general_overlap = time_scalelab(files, args.repeat, parser="general")
        print(
            f"scalelab, general path (orjson): {general_s:.2f} s (best of {args.repeat}), "
            f"overlap % {general_overlap}"
        )

    hta = time_hta(folder, args.hta_python, args.hta_repeat, args.hta_timeout)
    if isinstance(hta, str):
        print(hta)
        return
    hta_s = float(hta["seconds"])  # type: ignore[arg-type]
    hta_overlap = hta["overlap_pct"]
    print(
        f"HTA {hta['version']}: {hta_s:.2f} s (best of {args.hta_repeat}), overlap % {hta_overlap}"
    )
    print(f"speed-up: {hta_s / scalelab_s:.1f}x")
    if typed_parser_available():
        print(f"speed-up of the general path alone: {hta_s / general_s:.1f}x")
    same = hta_overlap == scalelab_overlap
    print(f"same overlap percentages: {'yes' if same else 'NO'}")
    if args.real is not None:
        compare_real(
            args.real,
            args.hta_python,
            args.repeat,
            args.hta_repeat,
            args.hta_timeout,
            args.min_events,
            args.files,
            args.hta_process,
        )
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
