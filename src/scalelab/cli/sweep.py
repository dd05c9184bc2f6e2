"""`scalelab sweep`: run a sweep file's grid of bench points, locally or on SLURM, resumably."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from scalelab.cli.common import JsonOpt, choice, console, err_console, only_with, print_json
from scalelab.errors import InputError
from scalelab.sweep.run import PointStatus
from scalelab.sweep.run import Progress as SweepProgress

SweepArg = Annotated[
    Path, typer.Argument(help="the sweep file (YAML)", show_default=False, metavar="SWEEP")
]
ExecutorOpt = Annotated[
    str, typer.Option("--executor", "-e", help="local (torchrun here) | slurm (submitit)")
]
MaxParallelOpt = Annotated[
    int | None,
    typer.Option(
        "--max-parallel",
        help="points at once (local: default 1, so runs do not disturb each other; slurm: the job array's throttle)",
    ),
]
OutOpt = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="folder of the records (default: runs/<sweep name>)"),
]
RetryOpt = Annotated[
    bool, typer.Option("--retry-failed", help="run failed and OOM points again (kept otherwise)")
]
DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="list the points and their state; run nothing")
]
PartitionOpt = Annotated[str | None, typer.Option("--partition", help="SLURM partition")]
AccountOpt = Annotated[str | None, typer.Option("--account", help="SLURM account")]
TimeOpt = Annotated[
    int | None, typer.Option("--time-min", help="SLURM time limit per point, minutes")
]
GpnOpt = Annotated[
    int | None,
    typer.Option("--gpus-per-node", help="GPUs (processes) per node; overrides the file"),
]

_DRAWN = ("ok", "failed", "oom", "running", "interrupted", "pending")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)


class RichProgress(SweepProgress):
    """A progress bar on stderr: done, running, failed, remaining; one line per finished point."""

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("[bold]sweep[/]"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=False,
        )
        self.task: Any = None

    @staticmethod
    def _counts(statuses: Sequence[PointStatus]) -> tuple[int, str]:
        n = {k: 0 for k in _DRAWN}
        for s in statuses:
            n[s.state] = n.get(s.state, 0) + 1
        finished = n["ok"] + n["failed"] + n["oom"]
        text = (
            f"done {n['ok']} · running {n['running']} · failed {n['failed'] + n['oom']}"
            f" · remaining {n['pending'] + n['interrupted']}"
        )
        return finished, text

    def begin(self, statuses: Sequence[PointStatus]) -> None:
        finished, text = self._counts(statuses)
        self.bar.start()
        self.task = self.bar.add_task("sweep", total=len(statuses), completed=finished, counts=text)

    def update(self, status: PointStatus, statuses: Sequence[PointStatus]) -> None:
        finished, text = self._counts(statuses)
        self.bar.update(self.task, completed=finished, counts=text)
        if status.state != "running":
            color = "green" if status.state == "ok" else "red"
            took = f" in {status.seconds:.1f} s" if status.seconds is not None else ""
            detail = "" if status.state == "ok" else f": {status.detail}"
            self.bar.console.print(
                f"[{color}]{status.state}[/] {escape(status.point.describe())}{took}{escape(detail)}"
            )

    def end(self, statuses: Sequence[PointStatus]) -> None:
        self.bar.stop()


def sweep(
    sweep_file: SweepArg,
    executor: ExecutorOpt = "local",
    max_parallel: MaxParallelOpt = None,
    out: OutOpt = None,
    retry_failed: RetryOpt = False,
    dry_run: DryRunOpt = False,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    time_min: TimeOpt = None,
    gpus_per_node: GpnOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Run every point of SWEEP (models x nodes x layouts x runs) with `scalelab bench`.

    A point whose record exists with status ok is skipped, so running the same command again
    resumes an interrupted sweep. Failed and OOM points are recorded and kept (--retry-failed
    runs them again). Exit code 0 when every point is ok, 1 when some failed, 130 when
    interrupted.
    """
    from scalelab.sweep.executors import LocalExecutor, SlurmExecutor
    from scalelab.sweep.plan import expand
    from scalelab.sweep.run import classify, run_sweep
    from scalelab.sweep.schema import load_sweep

    choice("executor", executor, ("local", "slurm"))
    for flag, value in (
        ("--partition", partition),
        ("--account", account),
        ("--time-min", time_min),
    ):
        only_with(flag, value is not None, "--executor slurm", executor == "slurm")
    spec, base = load_sweep(sweep_file)
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise InputError("gpus-per-node", f"must be a positive integer, not {gpus_per_node}")
        spec = spec.model_copy(update={"gpus_per_node": gpus_per_node})
    slurm_update = {
        k: v
        for k, v in (("partition", partition), ("account", account), ("time_min", time_min))
        if v is not None
    }
    if time_min is not None and time_min < 1:
        raise InputError("time-min", f"must be a positive integer, not {time_min}")
    if slurm_update:
        spec = spec.model_copy(update={"slurm": spec.slurm.model_copy(update=slurm_update)})
    points = expand(spec, base)
    out_dir = out if out is not None else Path("runs") / str(spec.name)
    runner: LocalExecutor | SlurmExecutor
    if executor == "local":
        runner = LocalExecutor(max_parallel or 1)
    else:
        runner = SlurmExecutor(spec.slurm, max_parallel)

    if dry_run:
        runner.check(points, out_dir)
        statuses = [
            classify(out_dir, p, retry_failed=False)
            if out_dir.is_dir()
            else PointStatus(p, "pending")
            for p in points
        ]
        if json_out:
            print_json(
                {
                    "out": str(out_dir),
                    "executor": executor,
                    "points": [s.to_dict() for s in statuses],
                }
            )
            return
        _table(statuses, f"{spec.name}: {len(points)} points (dry run)")
        return

    result = run_sweep(
        points,
        out_dir,
        runner,
        retry_failed=retry_failed,
        progress=None if json_out else RichProgress(),
        sweep_name=str(spec.name),
    )
    if json_out:
        print_json(result.to_dict())
    else:
        _table(result.statuses, f"{spec.name}: {len(points)} points in {out_dir}")
        counts, actions = result.count(), result.actions()
        console.print(
            f"ok {counts.get('ok', 0)}, failed {counts.get('failed', 0) + counts.get('oom', 0)}, "
            f"not run {counts.get('pending', 0) + counts.get('interrupted', 0)}; "
            f"skipped {actions.get('skipped', 0)} recorded before; {result.seconds:.1f} s"
        )
        if not result.complete and not result.interrupted:
            console.print("[dim]--retry-failed runs the failed points again[/]")
    if result.interrupted:
        err_console.print("scalelab sweep: interrupted; run the same command again to resume")
        raise SystemExit(130)
    if not result.complete:
        raise SystemExit(1)


def _table(statuses: Sequence[PointStatus], title: str) -> None:
    table = Table(title=title)
    for col in ("point", "model", "layout", "nodes x GPUs", "run", "state", "detail"):
        table.add_column(col)
    for s in statuses:
        p = s.point
        color = {"ok": "green", "failed": "red", "oom": "red"}.get(s.state, "yellow")
        table.add_row(
            p.id[:10],
            p.model_name,
            f"{p.layout.slug} ({', '.join(p.series)})",
            f"{p.nodes} x {p.gpus_per_node}",
            str(p.run),
            f"[{color}]{s.state}[/]",
            escape(s.detail[:100]),
        )
    console.print(table)
