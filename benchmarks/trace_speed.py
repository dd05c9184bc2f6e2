"""How fast is `scalelab trace` against Holistic Trace Analysis, and how does it scale to a job?

Three measurements (each prints the machine and its load; record the latest in docs/benchmarks.md):

* synthetic (default): Kineto traces of at least a million events (`scalelab.trace.synthetic`),
  timed as a library call, `analyze(files)` with the typed decoder and with the generic one (what
  the typed decoder earns), against HTA's `get_comm_comp_overlap()` in HTA's own environment
  (`--hta-python`, default /work/venv-hta/bin/python; HTA 0.5), imports excluded on both sides;
  both tools' overlap percentages must be equal.
* `--real DIR`: file by file, the `scalelab trace FILE` command against a whole HTA process (the
  issue's criterion): CPU time (user + system, the process and every process it waited for) and
  wall clock, best of --repeat, and their ratio.
* `--job N`: N rank files made from a real trace (`synthetic.write_job`: rank ids rewritten,
  clocks shifted, one rank late; `--job-source`), analysed by `scalelab trace DIR --json` as a
  whole process: wall clock, CPU time, the peak of the whole process tree's resident memory
  (sampled every 50 ms from /proc) and of its largest process, and the straggler found.

    PYTHONPATH=src python benchmarks/trace_speed.py [--events 1000000] [--ranks 1]
    PYTHONPATH=src python benchmarks/trace_speed.py --real tests/data/traces --real-only --repeat 3
    PYTHONPATH=src python benchmarks/trace_speed.py --job 1024 --real-only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scalelab.trace import analyze
from scalelab.trace.load import Parser
from scalelab.trace.synthetic import write_job, write_synthetic_trace

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
    files: list[Path], repeat: int, parser: Parser = "auto"
) -> tuple[float, dict[str, float | None]]:
    best = float("inf")
    overlap: dict[str, float | None] = {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        report = analyze(files, parser=parser)
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


def run_process(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(wall s, CPU s, exit code) of one process, its CPU time with every process it waited for
    (`os.wait4`: a pool's workers are joined by the command, so they count)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        print(err.decode()[-300:], file=sys.stderr)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def best_of(repeat: int, argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(best wall s, best CPU s) of `repeat` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu, code = run_process(argv, env)
        if code != 0:
            raise SystemExit(f"{' '.join(argv[:4])} ... failed (exit {code})")
        walls.append(wall)
        cpus.append(cpu)
    return min(walls), min(cpus)


def compare_real(
    folder: Path, python: str, repeat: int, min_events: int, pattern: str = "*.json*"
) -> None:
    """`scalelab trace FILE` (a whole process) against a whole HTA process, file by file."""
    env = _command_env()
    print(f"\nreal traces in {folder}; {_uptime()}")
    print(
        f"best of {repeat}; CPU = user + system of the process and its children; the target "
        f"applies to files with more than {min_events:,} events (*)"
    )
    print(
        f"{'file':30} {'events':>8} {'cmd wall s':>10} {'cmd CPU s':>9} {'HTA wall s':>10} "
        f"{'HTA CPU s':>9} {'CPU x':>6} {'wall x':>6}"
    )
    have_hta = Path(python).exists()
    for path in sorted(folder.glob(pattern)):
        n_events = analyze(path).ranks[0].n_events
        cmd_wall, cmd_cpu = best_of(
            repeat, [sys.executable, "-m", "scalelab", "trace", str(path)], env
        )
        if have_hta:
            with tempfile.TemporaryDirectory() as tmp:
                shutil.copy(path, tmp)
                hta_wall, hta_cpu = best_of(repeat, [python, "-c", _HTA_SCRIPT, tmp])
        else:
            hta_wall = hta_cpu = float("nan")
        mark = "*" if n_events > min_events else " "
        print(
            f"{mark}{path.name.removesuffix('.json.gz'):29} {n_events:>8,} {cmd_wall:>10.3f} "
            f"{cmd_cpu:>9.3f} {hta_wall:>10.2f} {hta_cpu:>9.2f} {hta_cpu / cmd_cpu:>6.1f} "
            f"{hta_wall / cmd_wall:>6.1f}",
            flush=True,
        )
    if not have_hta:
        print(f"HTA skipped: no interpreter at {python} (see --hta-python)")
    print(_uptime())


def _tree_rss_bytes(root: int) -> tuple[int, int]:
    """(resident bytes of `root` and all its descendants, of the largest one) from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total = largest = 0
    todo = [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        largest = max(largest, rss.get(pid, 0))
        todo += children.get(pid, [])
    return total, largest


def time_job(n_ranks: int, source: Path, workdir: Path | None, workers: int | None) -> None:
    """N rank files from one real trace, analysed by the command as a whole process."""
    folder = workdir or Path(tempfile.gettempdir()) / f"scalelab-trace-job-{n_ranks}-{source.stem}"
    late = n_ranks * 2 // 3
    marker = folder / f".made-{n_ranks}"
    if not marker.exists():
        t0 = time.perf_counter()
        write_job(source, folder, n_ranks, late_rank=late, late_us=2_000)
        marker.write_text("")
        print(f"wrote {n_ranks} rank files from {source.name} in {time.perf_counter() - t0:.0f} s")
    size_mb = sum(p.stat().st_size for p in folder.glob("*.json.gz")) / 1e6
    print(
        f"\njob: {n_ranks} ranks of {source.name} ({size_mb:,.0f} MB gzipped) in {folder}; {_uptime()}"
    )
    env = _command_env()
    argv = [sys.executable, "-m", "scalelab", "trace", str(folder), "--json"]
    if workers:
        argv += ["--workers", str(workers)]
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.PIPE)
        peak_total = peak_one = 0
        while proc.poll() is None:
            total, largest = _tree_rss_bytes(proc.pid)
            peak_total, peak_one = max(peak_total, total), max(peak_one, largest)
            time.sleep(0.05)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode != 0:
        assert proc.stderr is not None
        raise SystemExit(f"scalelab trace failed: {proc.stderr.read().decode()[-300:]}")
    json_mb = out.stat().st_size / 1e6
    document = json.loads(out.read_text())
    out.unlink()
    found = document["stragglers"]
    print(
        f"scalelab trace DIR --json: {wall:.1f} s wall, {cpu:.1f} s CPU; peak resident memory "
        f"{peak_total / 2**30:.2f} GiB (the whole process tree), {peak_one / 2**30:.2f} GiB (its "
        f"largest process); {len(document['ranks'])} ranks, straggler: rank "
        f"{found['straggler'] if found else None} (made late: {late}); {json_mb:,.0f} MB of JSON"
    )
    print(_uptime())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events per rank")
    parser.add_argument("--ranks", type=int, default=1, help="trace files (one per rank)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (best is kept)")
    parser.add_argument("--hta-python", default=DEFAULT_HTA_PYTHON)
    parser.add_argument("--hta-timeout", type=float, default=300.0, help="seconds per HTA run")
    parser.add_argument("--workdir", type=Path, default=None, help="where the traces are kept")
    parser.add_argument("--real", type=Path, default=None, help="compare on these real traces")
    parser.add_argument("--real-only", action="store_true", help="skip the synthetic comparison")
    parser.add_argument("--min-events", type=int, default=10_000, help="target threshold")
    parser.add_argument("--files", default="*.json*", help="glob of the real traces to time")
    parser.add_argument("--job", type=int, default=0, help="also time a job of this many ranks")
    parser.add_argument(
        "--job-source",
        type=Path,
        default=Path(__file__).resolve().parents[1]
        / "tests/data/traces/sampled-rank0-of-128.json.gz",
        help="the real trace each rank of --job is made from",
    )
    parser.add_argument("--workers", type=int, default=None, help="--job: the command's --workers")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    if not args.real_only:
        compare_synthetic(args)
    if args.real is not None:
        compare_real(args.real, args.hta_python, args.repeat, args.min_events, args.files)
    if args.job:
        time_job(args.job, args.job_source, args.workdir if args.real_only else None, args.workers)


def compare_synthetic(args: argparse.Namespace) -> None:
    """The library call on a million-event synthetic trace, both decoders, against HTA's."""
    folder = (
        args.workdir
        or Path(tempfile.gettempdir()) / f"scalelab-trace-speed-{args.events}x{args.ranks}"
    )
    files, n_events = make_traces(folder, args.events, args.ranks)
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    print(
        f"traces: {len(files)} file(s), {n_events:,} events, {size_mb:,.0f} MB of JSON in {folder}"
    )
    typed_s, typed_overlap = time_scalelab(files, args.repeat)
    print(
        f"scalelab, typed decoder (msgspec structs): {typed_s:.2f} s (best of {args.repeat}), "
        f"{n_events / typed_s / 1e6:.2f} M events/s, overlap % {typed_overlap}"
    )
    general_s, general_overlap = time_scalelab(files, args.repeat, parser="general")
    print(
        f"scalelab, generic decoder (msgspec into dicts): {general_s:.2f} s "
        f"(best of {args.repeat}); the typed decoder saves {general_s / typed_s:.2f}x"
    )
    hta = time_hta(folder, args.hta_python, 1, args.hta_timeout)
    if isinstance(hta, str):
        print(hta)
        return
    hta_s = float(hta["seconds"])  # type: ignore[arg-type]
    hta_overlap = hta["overlap_pct"]
    print(f"HTA {hta['version']}: {hta_s:.2f} s, overlap % {hta_overlap}")
    print(f"speed-up: {hta_s / typed_s:.1f}x")
    if hta_overlap != typed_overlap or general_overlap != typed_overlap:
        print("overlap percentages DIFFER")
        sys.exit(1)
    print("same overlap percentages: yes")


if __name__ == "__main__":
    main()
