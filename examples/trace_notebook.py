"""From a folder of profiler traces (one per rank) to the figures, in notebook cells.

Open it in Jupyter or VS Code (the `# %%` lines are cells), or run it whole:

    python examples/trace_notebook.py TRACE_DIR [OUT_DIR]

Each table of `scalelab trace` is a pandas DataFrame (`report.to_pandas()`), in integer
nanoseconds like `--json`; the cells below turn them into five figures.
"""

# %% Analyse the run: one process per rank file, the ranks of one run.
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files, not windows (drop this line in a notebook)
import matplotlib.pyplot as plt

from scalelab.trace import analyze

TRACES = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tests/data/traces")
OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("trace-figures")
OUT.mkdir(parents=True, exist_ok=True)
MS = 1e6  # nanoseconds per millisecond

report = analyze(TRACES)
tables = report.to_pandas()
steps, kernels, idle, lags = (
    tables["steps"],
    tables["kernels"],
    tables["idle"],
    tables["stragglers"],
)
print(
    f"{len(report.ranks)} rank(s), {len(steps)} rank-steps; straggler:",
    report.stragglers.straggler if report.stragglers else None,
)

# %% Where a step's time goes, per rank (mean over its steps): the parts add up to the step.
parts = ["compute_ns", "exposed_comm_ns", "copy_only_ns", "idle_ns"]
mean_step = steps.groupby("rank")[parts].mean() / MS
ax = mean_step.plot.bar(stacked=True, figsize=(8, 4))
ax.set_ylabel("ms per step")
ax.set_title("mean step by part, per rank")
ax.legend([p.removesuffix("_ns").replace("_", " ") for p in parts])
plt.tight_layout()
plt.savefig(OUT / "step_breakdown.png", dpi=120)
plt.close()

# %% Exposed communication step by step: which steps lose time to communication.
ax = (steps.pivot_table(index="step", columns="rank", values="exposed_comm_ns") / MS).plot(
    marker="o", figsize=(8, 4)
)
ax.set_ylabel("exposed communication, ms")
ax.set_title("exposed communication per step")
plt.tight_layout()
plt.savefig(OUT / "exposed_per_step.png", dpi=120)
plt.close()

# %% Device time by kernel class (from kernel names: GEMM, attention, embedding, ...).
shares = kernels.drop_duplicates(["rank", "class"]).pivot_table(
    index="rank", columns="class", values="class_share_pct"
)
ax = shares.plot.barh(stacked=True, figsize=(8, 4))
ax.set_xlabel("% of summed device time")
ax.set_title("kernel classes per rank")
plt.tight_layout()
plt.savefig(OUT / "kernel_classes.png", dpi=120)
plt.close()

# %% Why the GPU sits idle (HTA's causes; kernel wait: gaps under 30 µs not waiting for the host).
causes = ["host_wait_ns", "kernel_wait_ns", "other_ns"]
ax = (idle.groupby("rank")[causes].sum() / MS).plot.bar(stacked=True, figsize=(8, 4))
ax.set_ylabel("idle ms (all streams)")
ax.set_title("idle time by cause")
plt.tight_layout()
plt.savefig(OUT / "idle_causes.png", dpi=120)
plt.close()

# %% Who makes the others wait: time each rank caused and waited (two or more ranks).
if not lags.empty:
    ax = (lags.set_index("rank")[["caused_ns", "waited_ns"]] / MS).plot.bar(figsize=(8, 4))
    ax.set_ylabel("ms")
    ax.set_title(f"stragglers: rank {report.stragglers.straggler} makes the others wait")
    plt.tight_layout()
    plt.savefig(OUT / "stragglers.png", dpi=120)
    plt.close()

print("figures in", OUT, sorted(p.name for p in OUT.glob("*.png")))
