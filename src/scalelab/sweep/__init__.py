"""`scalelab sweep`: run a grid of `scalelab bench` points locally or on SLURM, resumably.

`spec` reads the sweep file and expands it into points with stable ids, `executors` runs points
(local torchrun subprocesses, or SLURM jobs through submitit), `run` skips what is done, runs
the rest and records every outcome.
"""

from scalelab.sweep.run import PointStatus, Progress, SweepResult, run_sweep
from scalelab.sweep.spec import Point, SweepFile, expand, load_sweep

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
