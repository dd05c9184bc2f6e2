"""GPU power from the time a step spends in each power state (GPU board power, as NVML reports).

A step's time splits into four states, each drawing its own power:

- **compute** (kernels on every SM): idle + (TDP − idle) x `compute_power_fraction`;
- **compute under interference** (compute beside a resident NCCL kernel): the same draw — every SM
  is still busy, some of them with the collective's channels — for longer, since the compute runs
  `overlap_interference` slower;
- **communication only** (exposed communication: only NCCL kernels run): idle + (TDP − idle) x
  `compute_power_fraction` x the share of the GPU the collective keeps busy (its channels' SMs and
  its HBM copies: `ClusterSpec.comm_sm_share + comm_hbm_share`, 0.21 on an H100 cluster). Derived,
  not measured: a power reading during nccl-tests all_gather_perf would settle it;
- **idle** (pipeline bubble, host overhead): the board's idle power (`GPUSpec.idle_w`).

The step's power is their time-weighted mean. A GPU slowed by interference keeps drawing compute
power, a GPU waiting on the network draws little: the split between the two, as the job grows,
is what the study's per-GPU power (F2) measures. GPU power only, like NVML: not the node.
"""

from __future__ import annotations

import numpy as np

from scalelab.config.hardware import ClusterSpec


def state_powers_w(cluster: ClusterSpec) -> dict[str, float]:
    """Board power (W) of each state on this cluster's GPU."""
    gpu, p = cluster.gpu, cluster.params
    dynamic = gpu.tdp_w - gpu.idle_w
    compute = gpu.idle_w + dynamic * p.compute_power_fraction
    comm_share = min(1.0, cluster.comm_sm_share + cluster.comm_hbm_share)
    return {
        "compute": compute,
        "interfered": compute,
        "comm_only": gpu.idle_w + dynamic * p.compute_power_fraction * comm_share,
        "idle": gpu.idle_w,
    }


def state_shares(
    *, step_time_s: np.ndarray, compute_s: np.ndarray, comm_only_s: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shares of the step that are busy (compute, interfered or not), communication only and
    idle, clipped as `average_power_w` clips them."""
    step = np.maximum(step_time_s, 1e-30)
    busy = np.clip(compute_s / step, 0.0, 1.0)
    comm = np.clip(comm_only_s / step, 0.0, 1.0 - busy)
    return busy, comm, 1.0 - busy - comm


def comm_only_power_for_ratio(
    cluster: ClusterSpec,
    before: tuple[float, float, float],
    after: tuple[float, float, float],
    ratio: float,
) -> float:
    """The communication-only power (W) that would make power(after) / power(before) = `ratio`,
    the other states keeping their draws: the power is linear in it, so
    (a2 + c2 P) / (a1 + c1 P) = ratio solves for P. `before` / `after` are `state_shares`.
    What F2 would need of a GPU spinning in NCCL kernels (docs/calibration.md)."""
    w = state_powers_w(cluster)
    (b1, c1, i1), (b2, c2, i2) = before, after
    a1 = b1 * w["compute"] + i1 * w["idle"]
    a2 = b2 * w["compute"] + i2 * w["idle"]
    return float((ratio * a1 - a2) / (c2 - ratio * c1))


def average_power_w(
    cluster: ClusterSpec,
    *,
    step_time_s: np.ndarray,
    compute_s: np.ndarray,
    interfered_s: np.ndarray,
    comm_only_s: np.ndarray,
) -> np.ndarray:
    """Time-weighted mean power of a step: compute (including the interfered part, which
    `compute_s` contains), communication only, and idle for the rest."""
    w = state_powers_w(cluster)
    busy, comm, idle = state_shares(
        step_time_s=step_time_s, compute_s=compute_s, comm_only_s=comm_only_s
    )
    interfered = np.clip(interfered_s / np.maximum(step_time_s, 1e-30), 0.0, busy)
    clean = busy - interfered
    return (
        clean * w["compute"]
        + interfered * w["interfered"]
        + comm * w["comm_only"]
        + idle * w["idle"]
    )
