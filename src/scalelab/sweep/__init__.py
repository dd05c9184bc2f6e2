"""`scalelab sweep`: run a grid of `scalelab bench` points locally or on SLURM, resumably.

`schema` reads the sweep file, `plan` expands it into points (a `BenchJob` each, with a stable
id), `executors` runs points' jobs (local torchrun subprocesses, or SLURM jobs through submitit), `run` skips what is done, runs
the rest and records every outcome.
"""

from scalelab.sweep.plan import Point, expand
from scalelab.sweep.run import PointStatus, Progress, SweepResult, run_sweep
from scalelab.sweep.schema import SweepFile, load_sweep

__all__ = [
    "Point",
    "PointStatus",
    "Progress",
    "SweepFile",
    "SweepResult",
    "expand",
    "load_sweep",
    "run_sweep",
]
